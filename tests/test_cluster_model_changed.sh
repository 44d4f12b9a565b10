#!/usr/bin/env bash
# test_cluster_model_changed.sh: a target on other weights than the run's, let in while the
# coordinator could not read its own (model.path held config.json alone: its WELCOME carried no
# fingerprint), is refused once a restarted coordinator reads them: its reconnect's WELCOME names
# the run's weights and the target exits naming both fingerprints. (The fingerprint was compared
# at the first attach only: the target went on publishing another model's hidden states.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 2000 || exit 1
cl_ini_add data.epochs=20
mkdir -p "$CL_DIR/cmodel"
cp "$CL_DIR/model/config.json" "$CL_DIR/cmodel/"
"$CL_PY" "$CL_SRC/tools/mkmodel.py" "$CL_DIR/other" --vocab 256 --std 0.03 >/dev/null || fail "cannot make the other model"
cl_start coord coordinator-d -c "$CL_INI" -o model.path="$CL_DIR/cmodel"
cl_wait 's["state"] == "running"' 30 coord || fail "coordinator did not come up"
grep -q "cannot read the weights" "$CL_DIR/coord.log" || fail "the coordinator read weights in a folder of config.json alone"
cl_start target0 target-d -c "$CL_INI" -i 0 -o model.path="$CL_DIR/other"
cl_wait_log "$CL_DIR/target0.log" "ready: ring" 30 || fail "the target did not start"
sleep 1     # (publishing: no drafter takes its batches)
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_exit target0 60
# exit 1: systemd starts it again, and that start refuses the weights for good (exit 78)
[[ $CL_RC == 1 ]] || fail "the target on other weights: '$CL_RC' after the coordinator read the run's, not exit 1"
grep -q "the run's target weights have fingerprint [0-9a-f]\{16\} now, this daemon's model.path [0-9a-f]\{16\} (other weights)" \
  "$CL_DIR/target0.log" || fail "the target did not say why: $(tail -n 3 "$CL_DIR/target0.log")"
cl_start target0b target-d -c "$CL_INI" -i 0 -o model.path="$CL_DIR/other"
cl_wait_exit target0b 60
[[ $CL_RC == 78 ]] || fail "a target started again on other weights: '$CL_RC', not 78"
cl_kill coord2 TERM
cl_wait_exit coord2 30 || true
echo "ok: the target on other weights left once the coordinator knew the run's, and is refused at its start"
