#!/usr/bin/env bash
# test_exit_report.sh: a daemon that fails after it has connected leaves its reason with the
# coordinator ("<ident> exits: <reason>", a non-fatal error kept in the error log, shown by
# `dflashctl errors`), not only in its own log. The failure is a real one an operator makes: a
# CUDA drafter started for a GPU index this host does not have. It exits 78 (a restart cannot
# mend it), the error is not fatal to the cluster: the coordinator keeps running.
# Needs a CUDA build and a GPU (exit 77 without).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
export NCCL_NVLS_ENABLE=0

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
(( ngpu > 0 )) || { echo "SKIP: no GPU"; exit 77; }
cl_init "$T/c" 50 || exit 1
cl_ini_add drafter.backend=cuda drafter.devices=$((ngpu + 1))
"$CL_BIN/drafter-d" -c "$CL_INI" -i "$ngpu" -t >/dev/null 2>&1 || { echo "SKIP: this build has no CUDA drafter"; exit 77; }
cl_start_coord || fail "coordinator did not come up"
cl_start drafter drafter-d -c "$CL_INI" -i "$ngpu"
cl_wait_exit drafter 120
[[ $CL_RC == 78 ]] || fail "drafter-d for GPU $ngpu (this host has $ngpu) exited with '$CL_RC', wanted 78"
grep -E "GPU $ngpu" "$CL_DIR/drafter.log" || fail "the drafter's log does not name GPU $ngpu"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors >"$CL_DIR/errors.txt" || fail "dflashctl errors"
cat "$CL_DIR/errors.txt"
grep -q "drafter-d@$ngpu exits: .*device $ngpu: $ngpu GPUs* visible" "$CL_DIR/errors.txt" || fail "dflashctl errors does not show why drafter@$ngpu exited"
grep -q "errors: 1 (0 fatal)" "$CL_DIR/errors.txt" || fail "wanted one non-fatal error"
cl_alive coord || fail "the coordinator did not stay up"
cl_status && [[ $(cl_json 's["state"]') == running ]] || fail "the cluster is not running: $(cl_json 's["state"]')"
echo "ok: drafter@$ngpu's exit reason is with the coordinator; the cluster runs on"
