#!/usr/bin/env bash
# gpu.sh: the whole CUDA target check on a CUDA host, in one run, from the repo root:
# build (nvcc, sm_90a and compute_90 PTX, as the Makefile), every GPU test, compute-sanitizer memcheck + racecheck on the tiny runs,
# transformers parity on a realistic Qwen3, then the Qwen3-8B-shape bench; a short table last.
#   bench/gpu.sh [step...]  steps: any of build tests san parity bench (default: all)
# Logs: summary.txt and all.log (every step's output, appended as it ends) in $OUT when set, else
# in build-gpu/gpu-logs. GPU_SH_BUDGET (s, default 560) bounds the whole run: each step's timeout
# shrinks to what is left, and steps that no longer fit are skipped.
set -u
cd "$(dirname "$0")/.."
steps=${*:-"build tests san parity bench"}
has() { [[ " $steps " == *" $1 "* ]]; }
. tools/device-env.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 DFLASH_SRC=$PWD
B=build-gpu
LOG=/tmp/dflash-gpu-logs
DEST=${OUT:-$B/gpu-logs}
rm -rf "$LOG"; mkdir -p "$LOG" "$B" "$DEST"
SUMMARY=$DEST/summary.txt ALL=$DEST/all.log
: >"$SUMMARY"; : >"$ALL"
t_start=$(date +%s)
BUDGET=${GPU_SH_BUDGET:-560}
note() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME TIMEOUT CMD...: runs CMD with a timeout (cut to the budget left), log in $LOG/NAME.log
# (appended to all.log), records pass/fail and time in the summary.
step() {
  local name=$1 to=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - t_start) ))
  if (( left < 15 )); then note "$(printf '%-28s %-12s' "$name" "NOT RUN (budget)")"; return 124; fi
  (( to > left )) && to=$left
  local t0=$(date +%s)
  timeout -k 5 "$to" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  local st=PASS; [[ $rc == 77 ]] && st=SKIP; [[ $rc != 0 && $rc != 77 ]] && st="FAIL(rc=$rc)"
  note "$(printf '%-28s %-12s %4ss' "$name" "$st" $(( $(date +%s) - t0 )))"
  { echo "==== $name: $st ===="; tail -c 200000 "$LOG/$name.log"; } >>"$ALL"
  [[ $rc == 0 ]] || tail -n 30 "$LOG/$name.log" | sed 's/^/    | /'
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUMMARY"
df -h /dev/shm /tmp | tail -n 2 | tee -a "$SUMMARY"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

GK_TESTS="embed rmsnorm rope swiglu gemm attention"
TARGETS="$B/tests/test_target_cuda $B/tests/test_target_cuda_hf $B/bench/target_bench"
for t in $GK_TESTS; do TARGETS="$TARGETS $B/tests/test_gpukern_$t"; done
if has build; then
  step build 300 make -j${JOBS:-16} BUILD=$B $TARGETS
fi

if has tests; then
  for t in $GK_TESTS; do step "test_gpukern_$t" 120 $B/tests/test_gpukern_$t; done
  step attention_bench 60 $B/tests/test_gpukern_attention --bench
  grep BENCH "$LOG/attention_bench.log" | tee -a "$SUMMARY"
  step test_target_cuda 120 $B/tests/test_target_cuda
  grep "worst rel err" "$LOG/test_target_cuda.log" | tee -a "$SUMMARY"
fi

if has san; then
  # the tiny run: golden models through the CUDA target (simple attention kernel, GEMMs, pipeline)
  step memcheck_target 240 "$SAN" --tool memcheck --error-exitcode 3 --leak-check no $B/tests/test_target_cuda
  step racecheck_target 240 "$SAN" --tool racecheck --error-exitcode 3 $B/tests/test_target_cuda
  # the tensor-core attention kernel (shared memory, cp.async, ldmatrix) on small packed batches
  GK_TEST_QUICK=1 step memcheck_attention 180 "$SAN" --tool memcheck --error-exitcode 3 $B/tests/test_gpukern_attention
  GK_TEST_QUICK=1 step racecheck_attention 180 "$SAN" --tool racecheck --error-exitcode 3 $B/tests/test_gpukern_attention
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $LOG/memcheck_*.log $LOG/racecheck_*.log | tee -a "$SUMMARY"
fi

if has parity; then
  P=/tmp/dflash-parity
  step hf_parity_data 240 python3 tools/bench_target_hf.py parity --out $P
  grep "transformers bf16 vs fp32" "$LOG/hf_parity_data.log" | tee -a "$SUMMARY"
  export DFLASH_HF_PARITY_DIR=$P
  step test_target_cuda_hf 120 $B/tests/test_target_cuda_hf
  unset DFLASH_HF_PARITY_DIR
  sed -n '/^layer/,$p' "$LOG/test_target_cuda_hf.log" | head -n 12 | tee -a "$SUMMARY"
  rm -rf $P
fi

if has bench; then
  shm_gb=$(df -BG --output=avail /dev/shm | tail -n 1 | tr -dc 0-9)
  M=/tmp/dflash-qwen3-8b; [[ ${shm_gb:-0} -gt 40 ]] && M=/dev/shm/dflash-qwen3-8b
  step hf_bench 420 python3 tools/bench_target_hf.py bench --out $M --batches ${BENCH_BATCHES:-5} --warmup 1
  step target_bench 300 $B/bench/target_bench --model $M --batches $M/batches.txt --warmup 1 --slots ${BENCH_SLOTS:-6}
  rm -rf $M
  grep -h "^RESULT\|loaded in\|ring " $LOG/hf_bench.log $LOG/target_bench.log | tee -a "$SUMMARY"
  a=$(awk '/RESULT a_forward_tok_s/{print $3}' $LOG/target_bench.log)
  b=$(awk '/RESULT b_ring_tok_s/{print $3}' $LOG/target_bench.log)
  c=$(awk '/RESULT hf_full36_tok_s/{print $3}' $LOG/hf_bench.log)
  c2=$(awk '/RESULT hf_trunc[0-9]*_tok_s/{print $3}' $LOG/hf_bench.log)
  [[ -n $a && -n $b && -n $c ]] && note "$(awk -v a=$a -v b=$b -v c=$c -v d=${c2:-0} 'BEGIN{printf "(b)/(a) = %.3f   (b)/(c) = %.2f   (b)/(c truncated) = %.2f", b/a, b/c, (d>0?b/d:0)}')"
fi

note "total $(( $(date +%s) - t_start ))s"
echo "==== summary ===="
cat "$SUMMARY"
