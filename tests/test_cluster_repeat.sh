#!/usr/bin/env bash
# test_cluster_repeat.sh: two more copies of one batch reach a drafter group. A batch queued
# again while its first copy is being trained is published twice; the coordinator takes a READY
# copy back out of the ring, but not one a drafter already holds, so the group can meet a batch it
# trained (or one a peer holds in the same step). Here, with the ring full of READY slots, slot 0's
# batch is copied over slots 1 and 2 (their own batches are then published in no slot: the
# orphan sweep queues them again), then a two-rank group starts. The repeats must be left out,
# not trained again: the run completes with every batch trained exactly once (each repeat was
# once trained again and counted as a duplicate).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 200 || exit 1
cl_ini_add drafter.world_size=2 drafter.collective_timeout_ms=2000   # the orphan sweep's grace: 2 s + 2 x dead_after_ms
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')
cl_start target0 target-d -c "$CL_INI" -i 0
for ((i = 0; i < 300; i++)); do [[ $(cl_ring_states 4) == "READY READY READY READY" ]] && break; sleep 0.1; done
[[ $(cl_ring_states 4) == "READY READY READY READY" ]] || fail "the ring did not fill: $(cl_ring_states 4)"
rep=$("$CL_PY" - "/dev/shm/dflash-$CL_NAME" <<'PY'
import os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
slot_off, stride = struct.unpack("<QQ", os.pread(fd, 16, 32))
first = os.pread(fd, stride, slot_off)
for s in (1, 2):
    os.pwrite(fd, first, slot_off + s * stride)
print(struct.unpack("<Q", first[:8])[0])
PY
) || fail "could not copy the slot"
cl_log "batch $rep in slots 0, 1 and 2"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait_exit coord 120 || fail "the run did not complete: coordinator '$CL_RC', $(cl_json 's["batches"]')"
for n in target0 drafter0 drafter1; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC'"; done
left=$(cat "$CL_DIR"/drafter[01].log | grep -c "batch $rep: its copy with lease [0-9]* is a repeat")
[[ $left == 2 ]] || fail "$left of 2 repeats of batch $rep left out"
grep -q "trained again" "$CL_DIR/coord.log" && fail "the coordinator saw a batch trained twice"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
echo "ok: two repeats of batch $rep left out; $total batches trained once each"
