#!/usr/bin/env bash
# test_cluster_world_change.sh: the coordinator killed while a two-rank drafter group trains, and
# started again with drafter.world_size = 1. The running generation cannot go on at the new size:
# it ends once the ring is open (what it trained past its last checkpoint queued again), and the
# next one forms with one rank. (It had gone on as a generation of one: rank 1's reports refused,
# its batches left to the orphan sweep and trained again on a checkpoint that held them.) The
# epoch completes: every batch trained exactly once in the lineage, and dflash-replay finds the
# final checkpoint.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
unset WATCHDOG_PID NOTIFY_SOCKET

cl_init "$T/c" 400 || exit 1
. tests/lib/replay.sh
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=4
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and step() >= 6' 120 coord || fail "no training"
gen=$(cl_json 's["group"]["generation"]')
cl_kill coord KILL
cl_wait_exit coord 10
cl_ini_add drafter.world_size=1
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_log "$CL_DIR/coord2.log" "drafter group generation $gen ends \(drafter.world_size is 1 now, the generation has 2 ranks\)" 60 ||
  fail "generation $gen did not end: $(grep -h "generation" "$CL_DIR/coord2.log" | tail -n 3)"
cl_wait_log "$CL_DIR/coord2.log" "drafter group generation $((gen + 1)) formed: 1 ranks" 60 ||
  fail "no generation of one rank: $(grep -h "generation" "$CL_DIR/coord2.log" | tail -n 3)"
cl_wait_exit coord2 180 || fail "the run did not complete: coordinator exited with '$CL_RC'"
for n in target0 drafter0 drafter1; do cl_wait_exit $n 60 || true; done
cl_never "$CL_DIR/coord2.log" "refused: rank" "refused: rank" "a rank's report refused"
total=$(cl_sql 'SELECT count(*) FROM batches')
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
replay_expect 0 ": PASS$"
echo "ok: generation $gen ended at the new world size; $total batches trained exactly once"
