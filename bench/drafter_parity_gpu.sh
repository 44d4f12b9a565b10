#!/usr/bin/env bash
# drafter_parity_gpu.sh: the CUDA drafter step against PyTorch at a realistic shape, in one run on a
# CUDA host, from the repo root (tools/device-env.sh supplies missing -dev packages): tools/parity_drafter_torch.py (hidden 1024,
# 2 layers, 16/8 heads x 128, vocab 32000, sequences 3072 + 2048 + 1008, 512 anchors each, block 16)
# writes the drafter checkpoint, the batch and the PyTorch bf16 / fp32 loss and gradients while
# tests/test_drafter_cuda_torch.c is built (nvcc, sm_90; the whole library: a list of just the sources
# it needs went stale when one moved); then the test runs on them.
# Logs: torch.log, build.log, test.log in $OUT when set, else build-parity/logs (its own build dir).
set -u
cd "$(dirname "$0")/.."
. tools/device-env.sh
export PYTHONUNBUFFERED=1 DFLASH_SRC=$PWD
B=build-parity
DIR=/tmp/dflash-drafter-parity
DEST=${OUT:-$B/logs}
rm -rf "$DIR"
mkdir -p "$DEST" "$B"
t_start=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# the PyTorch side runs while the test builds
( timeout -k 5 190 python3 tools/parity_drafter_torch.py --out "$DIR" >"$DEST/torch.log" 2>&1; echo $? >"$DEST/torch.rc" ) &
tp=$!
t0=$(date +%s)
timeout -k 5 190 make -j${JOBS:-16} BUILD=$B \
  $B/tests/test_drafter_cuda_torch >"$DEST/build.log" 2>&1
brc=$?
echo "build: rc $brc, $(( $(date +%s) - t0 ))s"
(( brc == 0 )) || tail -n 30 "$DEST/build.log"
wait $tp
trc=$(cat "$DEST/torch.rc" 2>/dev/null || echo missing)
echo "torch script: rc $trc, done at $(( $(date +%s) - t_start ))s"
cat "$DEST/torch.log" | tail -n 30

rc=1
if (( brc == 0 )) && [[ $trc == 0 ]]; then
  t0=$(date +%s)
  DFLASH_DRAFTER_PARITY_DIR=$DIR timeout -k 5 90 $B/tests/test_drafter_cuda_torch >"$DEST/test.log" 2>&1
  rc=$?
  echo "==== test_drafter_cuda_torch: rc $rc, $(( $(date +%s) - t0 ))s ===="
  cat "$DEST/test.log"
fi
echo "total $(( $(date +%s) - t_start ))s; result: $([[ $rc == 0 ]] && echo PASS || echo "FAIL (rc $rc)")"
exit $rc
