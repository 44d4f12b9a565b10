#!/usr/bin/env bash
# test_replay_world.sh: a run restarted with fewer drafters. Generation 1 trains on two ranks to a
# checkpoint; then every daemon is killed and the run goes on with drafter.world_size = 1
# (generation 2, one rank, its learning-rate horizon over one rank). dflash-replay replays each
# generation with its own size, as the ledger recorded it at its forming: generation 2 with the
# run's last config, generation 1 with -o drafter.world_size=2; a size other than the
# generation's is refused (exit 78), not replayed into a FAIL.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
unset WATCHDOG_PID NOTIFY_SOCKET

cl_init "$T/c" 240 || exit 1
. tests/lib/replay.sh
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=4 drafter.keep_checkpoints=0
cl_start_cluster 2 || fail "cluster did not come up"
cl_wait 's["group"]["active"] and s["group"]["checkpoint"]["step"] >= 8' 120 coord || fail "no checkpoint at step 8"
for n in coord drafter0 drafter1 target0 target1; do cl_kill $n KILL; done
for n in coord drafter0 drafter1 target0 target1; do cl_wait_exit $n 10; done
cl_log "every daemon killed; on with drafter.world_size = 1"
cl_ini_add drafter.world_size=1
cl_start_coord || fail "the coordinator did not come up again"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start target1 target-d -c "$CL_INI" -i 1
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit coord 240 || fail "coordinator exited with '$CL_RC'"
for n in target0 target1 drafter0; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
[[ $(cl_sql "SELECT value FROM meta WHERE key = 'gen1_world'") == 2 &&
   $(cl_sql "SELECT value FROM meta WHERE key = 'gen2_world'") == 1 ]] ||
  fail "generation sizes: $(cl_sql "SELECT key, value FROM meta WHERE key LIKE 'gen%_world'")"
g1=$(cl_sql 'SELECT dir FROM checkpoints WHERE gen = 1 AND dropped IS NULL ORDER BY rowid DESC LIMIT 1')

replay_expect 0 "steps of generation 2 replayed from .* max abs diff 0,.*: PASS$"
replay_expect 0 "steps of generation 1 replayed to $g1: .* max abs diff 0,.*: PASS$" --checkpoint "$g1" -o drafter.world_size=2
replay_expect 78 "drafter.world_size is 1, the run.s drafter group had 2 ranks in generation 1" --checkpoint "$g1"
replay_expect 78 "drafter.world_size is 2, the run.s drafter group had 1 ranks in generation 2" -o drafter.world_size=2
echo "ok: generations of 2 and 1 ranks replayed, each with its size"
