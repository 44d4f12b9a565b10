#!/usr/bin/env bash
# test_cluster_fence.sh: rank 0 of a 2-rank group is writing a checkpoint (drafter.debug_ckpt_delay_ms)
# when rank 1 is killed: the generation ends, rank 1 comes back and generation 2 forms, raising the
# checkpoint folder's fence before rank 0's write of generation 1 lands. That write is dropped with
# a notice ("not written"), never reported as an error, and generation 2 checkpoints on.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

delay=$(cl_scaled 4000)
cl_init "$T/c" 3000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=1 drafter.debug_ckpt_delay_ms=$delay
cl_start_cluster 2 || fail "cluster did not come up"
cl_wait 's["group"]["active"] and s["group"]["checkpoint"]["step"] >= 1' 120 coord || fail "no training"
sleep 1     # rank 0's next write is in flight (each waits $delay ms)
cl_log "SIGKILL to drafter 1, rank 0 writing"
cl_kill drafter1 KILL
cl_wait_exit drafter1 10
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] >= 2' 60 coord || fail "no generation 2"
cl_wait 's["group"]["checkpoint"]["generation"] >= 2' 60 coord || fail "generation 2 wrote no checkpoint"
grep -q "checkpoint of step [0-9]* not written: .*generation [0-9]* of the drafter group writes here now" \
  "$CL_DIR/drafter0.log" || fail "rank 0's write of generation 1 was not fenced out: $(grep -i checkpoint "$CL_DIR/drafter0.log" | tail -5)"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors >"$T/errors.txt" 2>&1 || fail "dflashctl errors: $(cat "$T/errors.txt")"
grep -q "dropped" "$T/errors.txt" && fail "the fenced write was reported as an error: $(cat "$T/errors.txt")"
cl_log "the fenced write was a notice; generation 2 checkpoints"
