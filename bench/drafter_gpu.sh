#!/usr/bin/env bash
# drafter_gpu.sh: the CUDA drafter check in one run on a CUDA host (one or two GPUs), from the
# repo root: a full build (nvcc: sm_90a code + compute_90 PTX) in its own build dir, every GPU test
# (tests/run.sh 'cuda|gpukern|nccl|gpu_cluster|target_revoke|cluster_repeat|exit_report'; the two-GPU ones skip on one GPU), the realistic-
# shape parity against PyTorch (bench/drafter_parity_gpu.sh) first so its test runs in that pass,
# compute-sanitizer (memcheck of the tiny drafter steps, memcheck + racecheck of the attention and the
# norm-backward tests),
# the attention kernels' speed, then bench/drafter_bench against tools/bench_drafter_torch.py: side by
# side on GPUs 0 and 1 when there are two, else one after the other on GPU 0 (ours, PyTorch, ours).
# Logs: summary.txt and all.log in $OUT when set, else build-cd2/gpu-logs. DRAFTER_GPU_BUDGET (s,
# default 520) bounds the whole run: steps that no longer fit are reported NOT RUN.
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
BUDGET=${DRAFTER_GPU_BUDGET:-520}
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
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

step build 200 make -j${JOBS:-32} BUILD=$B
ldd $B/tests/test_drafter_nccl 2>/dev/null | grep -q 'libnccl[^ ]* => /' && note "built with NCCL" || note "built WITHOUT NCCL"
mkdir -p "$LOG/parity"
step parity 150 env OUT=$LOG/parity bash bench/drafter_parity_gpu.sh
grep -h "loss\|cosine\|PASS\|FAIL" "$LOG/parity/test.log" 2>/dev/null | tail -n 6 | tee -a "$SUMMARY"
[[ -d /tmp/dflash-drafter-parity ]] && export DFLASH_DRAFTER_PARITY_DIR=/tmp/dflash-drafter-parity
step gpu_tests 300 env BUILD=$B TEST_TIMEOUT=150 tests/run.sh 'cuda|gpukern|nccl|gpu_cluster|target_revoke|cluster_repeat|exit_report'
grep -h "^PASS\|^FAIL\|^SKIP\|passed" "$LOG/gpu_tests.log" | tee -a "$SUMMARY"
TL=$B/test-logs
grep -h "^wgmma\|^mma\|^simple\|^warpgroup" "$TL/test_gpukern_dflash_attn.log" | tee -a "$SUMMARY"
grep -h "^golden\|^long\|^hd128\|async twin" "$TL/test_drafter_cuda.log" | tee -a "$SUMMARY"
grep -h "step [0-9]\|gradients:\|after 3 steps\|joined\|lone rank\|^SKIP" "$TL/test_drafter_nccl.log" | tee -a "$SUMMARY"
step memcheck_drafter_cuda 120 "$SAN" --tool memcheck --error-exitcode 3 $B/tests/test_drafter_cuda
grep -h "ERROR SUMMARY" "$LOG/memcheck_drafter_cuda.log" | tee -a "$SUMMARY"
step memcheck_dflash_attn 90 env GK_TEST_QUICK=1 "$SAN" --tool memcheck --error-exitcode 3 $B/tests/test_gpukern_dflash_attn
grep -h "ERROR SUMMARY" "$LOG/memcheck_dflash_attn.log" | tee -a "$SUMMARY"
step racecheck_dflash_attn 120 env GK_TEST_QUICK=1 "$SAN" --tool racecheck --error-exitcode 3 $B/tests/test_gpukern_dflash_attn
grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" "$LOG/racecheck_dflash_attn.log" | tee -a "$SUMMARY"
step memcheck_norm_bwd 90 "$SAN" --tool memcheck --error-exitcode 3 $B/tests/test_gpukern_norm_bwd
grep -h "ERROR SUMMARY" "$LOG/memcheck_norm_bwd.log" | tee -a "$SUMMARY"
step racecheck_norm_bwd 90 "$SAN" --tool racecheck --error-exitcode 3 $B/tests/test_gpukern_norm_bwd
grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" "$LOG/racecheck_norm_bwd.log" | tee -a "$SUMMARY"
step attn_bench 60 $B/tests/test_gpukern_dflash_attn --bench
grep -h BENCH "$LOG/attn_bench.log" | grep -v simple | tee -a "$SUMMARY"

ratio() {   # ratio OURS_LOG TORCH_LOG
  local c t m
  c=$(awk '/RESULT cuda_step_ms/{print $3}' "$1")
  for m in sdpa flex; do
    t=$(awk "/RESULT torch_${m}_step_ms/{print \$3}" "$2")
    [[ -n $c && -n $t ]] && note "$(awk -v c=$c -v t=$t -v m=$m 'BEGIN{printf "speed-up vs torch %s: %.2fx (%.1f ms vs %.1f ms)", m, t/c, c, t}')"
  done
}
left=$(( BUDGET - ($(date +%s) - t_start) - 10 ))
if (( left > 100 && NGPU >= 2 )); then
  ( step torch_bench $left python3 tools/bench_drafter_torch.py --device 1 --attn both --budget $(( left - 60 )) ) &
  tp=$!
  step drafter_bench $left $B/bench/drafter_bench -d 0 -w 3 -i 10
  wait $tp
elif (( left > 100 )); then
  step drafter_bench 60 $B/bench/drafter_bench -d 0 -w 3 -i 10
  left=$(( BUDGET - ($(date +%s) - t_start) - 40 ))
  step torch_bench $left python3 tools/bench_drafter_torch.py --device 0 --attn both --budget $(( left - 30 ))
  step drafter_bench2 60 $B/bench/drafter_bench -d 0 -w 3 -i 10
  grep -h "^RESULT cuda_step_ms\|^RESULT cuda_mfu" "$LOG/drafter_bench2.log" | sed 's/^/again: /' | tee -a "$SUMMARY"
else
  note "benches NOT RUN (budget)"
fi
if [[ -f $LOG/drafter_bench.log ]]; then
  grep -h "^drafter\|^setup\|^loss\|^model FLOPs\|^RESULT" "$LOG/drafter_bench.log" | tee -a "$SUMMARY"
  grep -h "^torch\|^sdpa\|^flex\|^RESULT" "$LOG/torch_bench.log" 2>/dev/null | tee -a "$SUMMARY"
  ratio "$LOG/drafter_bench.log" "$LOG/torch_bench.log"
  [[ -f $LOG/drafter_bench2.log ]] && ratio "$LOG/drafter_bench2.log" "$LOG/torch_bench.log"
fi
note "total $(( $(date +%s) - t_start ))s"
echo "==== summary ===="
cat "$SUMMARY"
