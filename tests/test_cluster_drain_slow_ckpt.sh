#!/usr/bin/env bash
# test_cluster_drain_slow_ckpt.sh: a two-rank group whose checkpoint writes take longer than
# drafter.collective_timeout_ms (slow storage: drafter.debug_ckpt_delay_ms). Rank 0 waits for the
# drain's checkpoint write while rank 1 waits for it at the next collective: rank 1 waits on while
# rank 0 marks itself busy, and the drain ends with that checkpoint, every rank and the coordinator
# exiting 0. (Rank 1 timed out and reported the group broken: when the write took longer than its
# wait for a RESTART, the generation ended, the checkpoint was not taken, the batches went back to
# be trained again and the drain was tried again, and again: the run never ended.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 6000 || exit 1
delay=$(($(cl_scaled 1) * 4000))
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=100000 data.epochs=20 \
  drafter.collective_timeout_ms=1000 drafter.debug_ckpt_delay_ms=$delay
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 'step() >= 10' 60 coord || fail "no training"
t0=$SECONDS
"$CL_BIN/dflashctl" -s "$CL_SOCK" --wait drain "slow storage" >"$CL_DIR/drain.txt" 2>&1 &
ctl=$!
for n in coord drafter0 drafter1 target0; do
  cl_wait_exit $n 90 || fail "$n exited with '$CL_RC' after the drain ($(grep -c 'collective' "$CL_DIR/drafter1.log") collective lines from rank 1)"
done
wait $ctl || fail "drain --wait: exit $?: $(cat "$CL_DIR/drain.txt")"
cl_log "drained in $((SECONDS - t0)) s: $(tail -n 1 "$CL_DIR/drain.txt")"
cl_never "$CL_DIR/drafter1.log" "collective failed" "collective failed" "rank 1 gave up waiting for rank 0's checkpoint write"
grep -q "lost before the final checkpoint" "$CL_DIR/coord.log" && fail "the group failed during the drain"
step=$(cl_sql "SELECT max(step) FROM checkpoints")
[[ -n $step ]] || fail "no checkpoint in the ledger"
tail -n 1 "$CL_DIR/drain.txt" | grep -q "^drain: the cluster is stopped: .*; lineage head: step $step .*/step-0*$step\$" ||
  fail "drain --wait said: $(cat "$CL_DIR/drain.txt")"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "batches left in flight"
echo "ok: the drain's checkpoint write ($delay ms, over collective_timeout_ms) was waited for by rank 1; the drain ended at step $step"
