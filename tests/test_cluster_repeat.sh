#!/usr/bin/env bash
# test_cluster_repeat.sh: two more copies of one batch reach a drafter group. A batch queued
# again while its first copy is being trained is published twice; the coordinator takes a READY
# copy back out of the ring, but not one a drafter already holds, so the group can meet a batch it
# trained (or one a peer holds in the same step). Here, with the ring full of READY slots, slot 0's
# batch is copied over slots 1 and 2 (their own batches are then published in no slot: the
# orphan sweep queues them again), then a two-rank group starts. The repeats must be left out
# (or, once the batch is trained, taken out of the ring by the coordinator), not trained again:
# the run completes with every batch trained exactly once (each repeat was once trained again
# and counted as a duplicate), and the two ranks' parameters agree at every checkpoint-due
# step (tests/soak/check_run.py). Then, on a CUDA build with a GPU, the same with
# one drafter on the CUDA backend (its steps are pipelined: a repeat may meet its batch in a step
# still in flight).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

# phase NAME WORLD [ini settings...]: a fresh cluster with the ring full, slot 0 copied over slots
# 1 and 2, then WORLD drafters; checks as above.
phase() {
  local name=$1 world=$2 i n
  shift 2
  cl_cleanup
  cl_init "$T/$name" 200 || exit 1
  # the orphan sweep's grace: 2 s + 2 x dead_after_ms
  cl_ini_add drafter.world_size="$world" drafter.collective_timeout_ms=2000 "$@"
  cl_start_coord || fail "coordinator did not come up"
  cl_ring_hold || fail "no ring"
  local total
  total=$(cl_json 's["batches"]["total"]')
  cl_fill_ring || fail "the ring did not fill: $(cl_ring_states 4)"
  local rep
  rep=$("$CL_PY" - "/dev/shm/dflash-$CL_NAME" <<'PY'
import os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
slot_off, stride = struct.unpack("<QQ", os.pread(fd, 16, 32))
first = os.pread(fd, stride, slot_off)
# ring_ctl (64-byte blocks from offset 4096): batch_id at 24, n_tokens at 32, as ring_publish sets them
ctl0 = os.pread(fd, 12, 4096 + 24)
for s in (1, 2):
    os.pwrite(fd, first, slot_off + s * stride)
    os.pwrite(fd, ctl0, 4096 + 64 * s + 24)
print(struct.unpack("<Q", first[:8])[0])
PY
) || fail "could not copy the slot"
  cl_log "$name: batch $rep in slots 0, 1 and 2"
  for ((i = 0; i < world; i++)); do cl_start drafter$i drafter-d -c "$CL_INI" -i $i; done
  cl_wait_exit coord 120 || fail "the run did not complete: coordinator '$CL_RC', $(cl_json 's["batches"]')"
  for ((i = 0; i < world; i++)); do cl_wait_exit drafter$i 30 || fail "drafter$i exited with '$CL_RC'"; done
  cl_wait_exit target0 30 || fail "target0 exited with '$CL_RC'"
  # Two ranks: every batch trained once, from the ledger, the final checkpoint and the metrics,
  # and the ranks' parameters the same at every checkpoint-due step.
  if ((world > 1)); then
    "$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" --min-hashed=3 ||
      fail "$name: exactly-once / replica check"
  fi
  # Each extra copy is left out by the drafters, or taken out of the ring by the coordinator
  # once the batch is trained (if no drafter took it first); the first two copies (slots 0 and
  # 1, the oldest) are taken together (one step of two ranks; on CUDA, one step enqueued and the
  # next staged, before any result), so at least one repeat reaches a drafter.
  local left out
  left=$(cat "$CL_DIR"/drafter*.log | grep -c "batch $((rep >> 32)):$((rep & 0xffffffff)): its copy with lease [0-9]* is a repeat")
  out=$(grep -c "batch $((rep >> 32)):$((rep & 0xffffffff)): its copy in slot [0-9]* taken out of the ring" "$CL_DIR/coord.log")
  ((left >= 1 && left + out == 2)) || fail "$name: of the 2 extra copies of batch $rep, $left left out by the drafters, $out taken out of the ring"
  cl_never "$CL_DIR/coord.log" "trained again" "trained again" "$name: the coordinator saw a batch trained twice"
  [[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "$name: not every batch is checkpointed"
  n=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
  [[ $n == "$total" ]] || fail "$name: $n of $total batches trained exactly once"
  echo "ok: $name: of two repeats of batch $rep, $left left out by the drafters, $out taken out of the ring; $total batches trained once each"
}

phase cpu 2 drafter.checkpoint_every=4    # a checkpoint-due step (its parameters hashed) every 4
if nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
  CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512 --layers 4" cl_init "$T/probe" 8 &&
  cl_ini_add drafter.backend=cuda && "$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -t >/dev/null 2>&1; then
  export NCCL_NVLS_ENABLE=0
  CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512 --layers 4" \
    phase cuda 1 drafter.backend=cuda
else
  echo "(no CUDA drafter here: the CUDA phase is not run)"
fi
