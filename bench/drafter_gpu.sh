#!/usr/bin/env bash
# drafter_gpu.sh: the CUDA drafter check on a 2-GPU machine, in one call, from the repo root: build
# (nvcc, sm_90, only what the drafter needs), the drafter's GPU tests, NCCL data parallel on GPUs 0+1,
# compute-sanitizer memcheck on the attention test, the attention kernels' speed, then
# bench/drafter_bench (GPU 0) and tools/bench_drafter_torch.py (GPU 1) side by side; a table last.
# Logs: summary.txt and all.log in $OUT when set, else build-cd2/gpu-logs. DRAFTER_GPU_BUDGET (s,
# default 400) bounds the whole run.
set -u
cd "$(dirname "$0")/.."
. tools/device-env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 DFLASH_SRC=$PWD
B=build-cd2
LOG=/tmp/dflash-drafter-logs
DEST=${OUT:-$B/gpu-logs}
rm -rf "$LOG"; mkdir -p "$LOG" "$B" "$DEST"
SUMMARY=$DEST/summary.txt ALL=$DEST/all.log
: >"$SUMMARY"; : >"$ALL"
t_start=$(date +%s)
BUDGET=${DRAFTER_GPU_BUDGET:-400}
note() { echo "$*" | tee -a "$SUMMARY"; }
step() {    # step NAME TIMEOUT CMD...
  local name=$1 to=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - t_start) ))
  if (( left < 10 )); then note "$(printf '%-26s %-12s' "$name" "NOT RUN (budget)")"; return 124; fi
  (( to > left )) && to=$left
  local t0=$(date +%s)
  timeout -k 5 "$to" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  local st=PASS; [[ $rc == 77 ]] && st=SKIP; [[ $rc != 0 && $rc != 77 ]] && st="FAIL(rc=$rc)"
  note "$(printf '%-26s %-12s %4ss' "$name" "$st" $(( $(date +%s) - t0 )))"
  { echo "==== $name: $st ===="; tail -c 60000 "$LOG/$name.log"; } >>"$ALL"
  [[ $rc == 0 || $rc == 77 ]] || tail -n 15 "$LOG/$name.log" | sed 's/^/    | /'
  return $rc
}

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

# Only the drafter's sources: other parts of the shared checkout may be mid-edit.
MIN_C="common/err.c ipc/nccl_coll.c model/drafter.c model/drafter_cpu.c model/objective.c model/optim.c model/cpu_ops.c model/safetensors.c model/hfconfig.c"
TESTS="test_gpukern_adamw test_gpukern_dflash_attn test_gpukern_lmhead_ce test_gpukern_norm_bwd test_drafter_cuda test_drafter_nccl"
TARGETS="$B/bench/drafter_bench"; for t in $TESTS; do TARGETS="$TARGETS $B/tests/$t"; done
step build 200 make -j${JOBS:-32} BUILD=$B LIB_SRC="$MIN_C" CU_SRC="$(echo gpukern/*.cu) model/drafter_cuda.cu" $TARGETS
grep -h "DFLASH_HAVE_NCCL" "$LOG/build.log" | head -n 1 | grep -q NCCL && note "built with NCCL" || note "built WITHOUT NCCL"

for t in $TESTS; do step "$t" 90 $B/tests/$t; done
grep -h "^mma\|^simple" "$LOG/test_gpukern_dflash_attn.log" | tee -a "$SUMMARY"
grep -h "^golden\|^long\|^hd128\|async twin" "$LOG/test_drafter_cuda.log" | tee -a "$SUMMARY"
grep -h "^step\|gradients:\|after 3 steps\|joined\|lone rank" "$LOG/test_drafter_nccl.log" | tee -a "$SUMMARY"
step attn_bench 60 $B/tests/test_gpukern_dflash_attn --bench
grep -h BENCH "$LOG/attn_bench.log" | tee -a "$SUMMARY"
GK_TEST_QUICK=1 step memcheck_dflash_attn 90 "$SAN" --tool memcheck --error-exitcode 3 $B/tests/test_gpukern_dflash_attn
grep -h "ERROR SUMMARY" "$LOG/memcheck_dflash_attn.log" | tee -a "$SUMMARY"

# The benches side by side: ours on GPU 0, PyTorch on GPU 1 (same machine, same run).
left=$(( BUDGET - ($(date +%s) - t_start) - 10 ))
if (( left > 60 )); then
  ( step torch_bench $left python3 tools/bench_drafter_torch.py --device 1 --attn both --budget $(( left - 60 )) ) &
  tp=$!
  step drafter_bench $left $B/bench/drafter_bench -d 0 -w 3 -i 10
  wait $tp
  grep -h "^drafter\|^setup\|^loss\|^model FLOPs\|^RESULT" "$LOG/drafter_bench.log" | tee -a "$SUMMARY"
  grep -h "^torch\|^sdpa\|^flex\|^RESULT" "$LOG/torch_bench.log" | tee -a "$SUMMARY"
  c=$(awk '/RESULT cuda_step_ms/{print $3}' "$LOG/drafter_bench.log")
  for m in sdpa flex; do
    t=$(awk "/RESULT torch_${m}_step_ms/{print \$3}" "$LOG/torch_bench.log")
    [[ -n $c && -n $t ]] && note "$(awk -v c=$c -v t=$t -v m=$m 'BEGIN{printf "speed-up vs torch %s: %.2fx (%.1f ms vs %.1f ms)", m, t/c, c, t}')"
  done
else
  note "benches NOT RUN (budget)"
fi
note "total $(( $(date +%s) - t_start ))s"
echo "==== summary ===="
cat "$SUMMARY"
