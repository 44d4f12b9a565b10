#!/usr/bin/env bash
# test_exit_report_cpu.sh: test_exit_report.sh on the CPU backend (no GPU needed). A daemon that
# fails after it has connected leaves its reason with the coordinator ("<ident> exits: <reason>",
# a non-fatal error kept in the error log, shown by `dflashctl errors`), not only in its own log.
# The failure is one an operator makes: a drafter shape (drafter.intermediate_size) too large for
# the address space the daemon may use (`ulimit -v`, systemd's LimitAS=). The drafter loads the
# target's embedding, connects, maps the ring, then cannot allocate the drafter: exit 1, through
# the exit report. The coordinator keeps running.
# Under ASan (which cannot start under an address-space limit) its allocator refuses the
# allocation instead: allocator_may_return_null with max_allocation_size_mb.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

# hidden 256, intermediate 2^20: each of the drafter's parameter, gradient and moment buffers is
# over 3 GiB; the address space allowed is 8 GiB (the daemon needs well under 2 GiB before it)
CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64" cl_init "$T/c" 50 || exit 1
cl_ini_add drafter.intermediate_size=1048576
cl_start_coord || fail "coordinator did not come up"
if grep -qa __asan_init "$CL_BIN/drafter-d"; then
  limit="export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1:max_allocation_size_mb=2048"
else
  limit="ulimit -v $((8 << 20))"
fi
# (cl_start with the limit in a subshell that becomes the daemon)
# (never without the limit: the drafter would take over 10 GiB)
(eval "$limit" || exit 99; export OPENBLAS_NUM_THREADS=1; exec "$CL_BIN/drafter-d" -c "$CL_INI" -i 0) \
  >>"$CL_DIR/drafter.log" 2>&1 &
CL_PIDS[drafter]=$!
cl_wait_exit drafter 60
[[ $CL_RC == 1 ]] || fail "drafter-d with a drafter larger than its address space exited with '$CL_RC', wanted 1"
cl_never "$CL_DIR/drafter.log" "ready: drafter" "ready: drafter" "the drafter came up: the allocation did not fail"
grep -q "out of memory" "$CL_DIR/drafter.log" || fail "the drafter's log does not say out of memory"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors >"$CL_DIR/errors.txt" || fail "dflashctl errors"
cat "$CL_DIR/errors.txt"
grep -q "drafter-d@0 exits: .*out of memory" "$CL_DIR/errors.txt" || fail "dflashctl errors does not show why drafter@0 exited"
grep -q "errors: 1 (0 fatal)" "$CL_DIR/errors.txt" || fail "wanted one non-fatal error"
cl_alive coord || fail "the coordinator did not stay up"
cl_status && [[ $(cl_json 's["state"]') == running ]] || fail "the cluster is not running: $(cl_json 's["state"]')"
echo "ok: drafter@0's exit reason is with the coordinator; the cluster runs on"
