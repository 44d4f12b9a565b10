#!/usr/bin/env bash
# profile_gpu.sh: where the CUDA drafter's training step spends its time, on a CUDA host, from
# the repo root: builds drafter_bench and the attention test (nvcc, sm_90), times the attention
# kernels (random and sorted anchors, the backward's query and key passes apart) and checks the
# LM head + CE kernels (test_gpukern_lmhead_ce), then runs
# drafter_bench with -p: the timed steps, then PROF_STEPS (default 5) steps with every phase of
# the step timed by events (drafter_cuda_opts.profile); arguments go to drafter_bench (e.g. -c 2048).
# Logs in $OUT (or build-prof/logs).
set -u
cd "$(dirname "$0")/.."
. tools/device-env.sh
export NCCL_NVLS_ENABLE=0
B=build-prof
DEST=${OUT:-$B/logs}
mkdir -p "$B" "$DEST"
make -j${JOBS:-16} BUILD=$B \
  $B/bench/drafter_bench $B/tests/test_gpukern_dflash_attn $B/tests/test_gpukern_lmhead_ce >"$DEST/build.log" 2>&1 || { tail -30 "$DEST/build.log"; exit 1; }
$B/tests/test_gpukern_lmhead_ce 2>&1 | tail -4 | tee "$DEST/lmhead_ce.log"
$B/tests/test_gpukern_dflash_attn --bench 2>&1 | tee "$DEST/attn.log" | grep -h "BENCH\|FAIL"
$B/bench/drafter_bench -d 0 -w 3 -i ${BENCH_ITERS:-6} -p ${PROF_STEPS:-5} "$@" 2>&1 | tee "$DEST/drafter_bench.log" |
  grep "RESULT\|^drafter\|^phases\|^PHASE"
