#!/usr/bin/env bash
# test_cluster_bad_payload.sh: slots whose payload a writer spoiled after publishing (a stale or
# buggy producer: the ring is shared memory). With the ring full of READY slots, one header gets
# an impossible sequence count, another a bad cu_seqlens, a third no lease number; then a drafter
# starts. It must not crash on them (it once indexed cu_seqlens with the count), each spoiled batch
# is handed back and published again (the one without a lease number names no copy: the
# coordinator's orphan sweep queues it again; its report once jammed the drafter's outbox), so the
# run still completes with every batch trained exactly once (it once stayed published in no slot,
# and the run never ended). Before the drafter starts, the full ring is held a while: the target
# waiting for a FREE slot keeps its heartbeat (its age at the coordinator stays short, and the
# coordinator takes it for dead at no time).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 200 || exit 1
cl_ini_add drafter.collective_timeout_ms=2000     # the orphan sweep's grace: 2 s + 2 x dead_after_ms
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')
cl_fill_ring || fail "the ring did not fill: $(cl_ring_states 4)"
"$CL_PY" - "/dev/shm/dflash-$CL_NAME" <<'PY' || fail "could not spoil the slots"
import os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
slot_off, stride = struct.unpack("<QQ", os.pread(fd, 16, 32))
base = lambda s: slot_off + s * stride
# ring_payload: batch_id u64, epoch u32, n_seqs u32, n_tokens u32, ...; cu_seqlens follow its 64 bytes
os.pwrite(fd, struct.pack("<I", 0x20000000), base(0) + 12)
os.pwrite(fd, struct.pack("<i", 5), base(1) + 64)
os.pwrite(fd, struct.pack("<I", 0), base(2) + 40)     # ring_payload.lease
for s in (0, 1, 2):
    print("slot %d: batch %d" % (s, struct.unpack("<Q", os.pread(fd, 8, base(s)))[0]))
PY
hold=$(cl_scaled 2)     # (heartbeat_ms is 200)
sleep "$hold"
cl_status || fail "no status"
age=$(cl_json 'int(targets()[0]["heartbeat_age_ms"])')
((age < hold * 500)) || fail "target0 waiting ${hold} s for a FREE slot: its last heartbeat is ${age} ms old"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit coord 120 || fail "the run did not complete: coordinator '$CL_RC', $(cl_json 's["batches"]')"
for n in target0 drafter0; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC'"; done
grep -q "beyond the ring's slots" "$CL_DIR/drafter0.log" || fail "no rejection of the impossible header"
grep -q "cu_seqlens" "$CL_DIR/drafter0.log" || fail "no rejection of the bad cu_seqlens"
grep -q "lease number 0" "$CL_DIR/drafter0.log" || fail "no rejection of the slot without a lease number"
cl_hb_lost target-d && fail "the target waiting for a FREE slot lost its heartbeat"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
echo "ok: three spoiled slots rejected and published again; $total batches trained once each"
