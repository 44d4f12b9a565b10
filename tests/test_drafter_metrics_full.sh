#!/usr/bin/env bash
# test_drafter_metrics_full.sh: a metrics file that cannot be written (drafter.metrics_path =
# /dev/full: every write fails with ENOSPC) is said once, naming the file and the step, and
# training goes on: the run completes and every daemon exits 0.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

[[ -w /dev/full ]] || { echo "SKIP: no /dev/full"; exit 77; }
cl_init "$T/c" 300 || exit 1
cl_ini_add drafter.metrics_path=/dev/full
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
for n in target0 drafter0 coord; do cl_wait_exit $n 120 || fail "$n exited with '$CL_RC'"; done
grep -q "run complete" "$CL_DIR/coord.log" || fail "the run did not complete"
n=$(grep -c "metrics file /dev/full: the line of step [0-9]* not written; lines are lost until one can be" "$CL_DIR/drafter0.log")
((n == 1)) || fail "the failed metrics writes were said $n times, wanted once: $(grep metrics "$CL_DIR/drafter0.log" | head -3)"
steps=$(cl_sql 'SELECT max(step) FROM checkpoints')
echo "ok: $steps steps trained with every metrics line failing, said once: $(grep -h "metrics file /dev/full" "$CL_DIR/drafter0.log" | sed 's/^<[0-9]>//')"
