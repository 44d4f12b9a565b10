#!/usr/bin/env bash
# test_replay_restart.sh: dflash-replay checks a generation after the first. A two-rank CPU run
# loses rank 1 (SIGKILL) after a few checkpoints: the group restarts from the last one as
# generation 2 and finishes the epoch. The replay of the final checkpoint loads the checkpoint
# generation 2 started from and redoes its steps bit for bit; a checkpoint of generation 1 still
# replays from a fresh drafter; a learning rate off the run's fails; with the start checkpoint
# removed, the replay names it (exit 78).
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
cl_log "SIGKILL to drafter 1"
cl_kill drafter1 KILL
cl_wait_exit drafter1 10
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
# the epoch completes: the coordinator drains the drafters for a final checkpoint and stops
cl_wait_exit coord 180 || fail "coordinator exited with '$CL_RC'"
for n in target0 target1 drafter0 drafter1; do
  cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
done
gen=$(cl_sql 'SELECT gen FROM checkpoints WHERE dropped IS NULL ORDER BY rowid DESC LIMIT 1')
((gen >= 2)) || fail "the final checkpoint is of generation $gen"
start=$(cl_sql "SELECT dir FROM checkpoints WHERE gen < $gen AND dropped IS NULL ORDER BY rowid DESC LIMIT 1")
first=$(cl_sql 'SELECT dir FROM checkpoints WHERE gen = 1 ORDER BY step LIMIT 1')
[[ -n $start && -n $first ]] || fail "no checkpoint of generation 1"
cl_log "final checkpoint of generation $gen, which started from $start"

replay_expect 0 "^dflash-replay: [0-9]+ steps of generation $gen replayed from $start to .*: master weights max abs diff 0,.*: PASS$"
replay_expect 0 "^dflash-replay: [0-9]+ steps of generation 1 replayed to $first: .*: PASS$" --checkpoint "$first"
replay_expect 1 ": FAIL$" -o drafter.lr=2.97e-3
mv "$start" "$T/start.moved"
replay_expect 78 "checkpoint $start, which generation $gen started from: No such file .*keep_checkpoints"
mv "$T/start.moved" "$start"
echo "ok: generation $gen replayed from its start checkpoint bit for bit"
