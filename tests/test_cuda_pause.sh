#!/usr/bin/env bash
# test_cuda_pause.sh: a pause reaches a CUDA drafter holding staged batches (slots copied to
# its GPU, or still being copied). They are handed back at once, not kept through the pause: a
# batch whose slot was released but that is neither trained nor handed back is published in no
# slot, and the coordinator's orphan sweep would queue it again after its grace (2 s + 2 x
# dead_after_ms), to be trained twice when the pause ends. Made deterministic with the ring hook:
# the drafter stops (SIGSTOP) at its first slot claim with the ring full, the cluster is paused,
# then it goes on. Needs a CUDA build and a GPU (exit 77 without).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
export NCCL_NVLS_ENABLE=0

nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "SKIP: no GPU"; exit 77; }
export CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512 --layers 4"
cl_init "$T/c" 200 || exit 1
cl_ini_add drafter.backend=cuda drafter.collective_timeout_ms=2000
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -t >/dev/null 2>&1 || { echo "SKIP: this build has no CUDA drafter"; exit 77; }
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')
cl_fill_ring || fail "the ring did not fill: $(cl_ring_states 4)"

DFLASH_RING_STOP_AT=claimed_read cl_start drafter0 drafter-d -c "$CL_INI" -i 0
pid=$(cl_pid drafter0)
for ((i = 0; i < 300; i++)); do
  [[ $(awk '{ print $3 }' /proc/"$pid"/stat 2>/dev/null) == T ]] && break
  sleep 0.1
done
[[ $(awk '{ print $3 }' /proc/"$pid"/stat 2>/dev/null) == T ]] || fail "the drafter did not stop at its first claim"
"$CL_BIN/dflashctl" -s "$CL_SOCK" pause "test: a pause while batches are staged" >/dev/null || fail "dflashctl pause"
cl_wait 's["state"] == "paused"' 10 || fail "the cluster did not pause"
cl_log "paused with the drafter stopped at its first claim; it goes on"
kill -CONT "$pid"
cl_wait_log "$CL_DIR/drafter0.log" "staged batch.* handed back" 10 || fail "the drafter did not hand back its staged batches"
sleep "$(cl_scaled 20)"     # past the orphan sweep's grace (8 s) and two of its rounds (4 s apart)
"$CL_BIN/dflashctl" -s "$CL_SOCK" resume >/dev/null || fail "dflashctl resume"
cl_wait_exit coord 120 || fail "the run did not complete: coordinator '$CL_RC', $(cl_json 's["batches"]')"
for n in target0 drafter0; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC'"; done
grep "not reported by any drafter" "$CL_DIR/coord.log" && fail "a staged batch was kept through the pause (the orphan sweep queued it again)"
cl_never "$CL_DIR/coord.log" "trained again" "trained again" "a batch was trained twice"
cl_never "$CL_DIR/drafter0.log" "is a repeat" "is a repeat" "a second copy of a batch reached the drafter"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
echo "ok: staged batches handed back at the pause; $total batches trained once each"
