#!/usr/bin/env bash
# test_cluster_model_swap.sh: another target model of the same shapes (a re-download, a fine-tune)
# where the run's was. Nothing told them apart: a target on other weights published their hidden
# states beside the others', and a run resumed with model.path swapped trained its drafter
# on the new model's states from a checkpoint made on the old one's, all without a word. The
# ledger keeps the weights' fingerprint and the WELCOME carries it:
#  - a target whose model.path has other weights refuses itself (exit 78, its error recorded,
#    not fatal): the cluster goes on;
#  - a coordinator started with model.path swapped refuses the ledger (exit 78), naming both
#    fingerprints, the ledger unchanged; with the model back the run goes on.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 1500 || exit 1
cl_ini_add drafter.checkpoint_every=5 data.epochs=50
"$CL_PY" "$CL_SRC/tools/mkmodel.py" "$T/other" --vocab 256 --std 0.03 >/dev/null || fail "cannot make the other model"
cmp -s "$CL_DIR/model/config.json" "$T/other/config.json" || fail "the other model's config.json differs"
cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 's["group"]["checkpoint"]["step"] >= 5' 120 coord || fail "no checkpoint"
fp=$(sed -n 's/.*weights fingerprint \([0-9a-f]\{16\}\).*/\1/p' "$CL_DIR/target0.log" | head -n 1)
[[ -n $fp ]] || fail "target0 does not log its weights' fingerprint"
[[ $(printf '%016x' "$(cl_sql "select value from meta where key='model_fingerprint'")") == "$fp" ]] ||
  fail "the ledger keeps fingerprint '$(cl_sql "select value from meta where key='model_fingerprint'")', target0 has $fp"
grep -q "embedding and LM head from $CL_DIR/model, weights fingerprint $fp" "$CL_DIR/drafter0.log" ||
  fail "drafter0 does not log the same fingerprint: $(grep -i fingerprint "$CL_DIR/drafter0.log")"

# a second target on the other weights
cl_start target1 target-d -c "$CL_INI" -i 1 -o model.path="$T/other"
cl_wait_exit target1 60
[[ $CL_RC == 78 ]] || fail "a target on other weights exited '$CL_RC', not 78: $(grep -v ' = \|^#' "$CL_DIR/target1.log" | tail -2)"
other=$(sed -n 's/.*weights fingerprint \([0-9a-f]\{16\}\).*/\1/p' "$CL_DIR/target1.log" | head -n 1)
[[ -n $other && $other != "$fp" ]] || fail "the other model's fingerprint '$other' (the run's $fp)"
line="$T/other (model.path): weights of fingerprint $other, the run's target has $fp (other weights): point model.path at the run's model"
grep -qF "$line" "$CL_DIR/target1.log" || fail "target1 did not say why: $(grep -v ' = \|^#' "$CL_DIR/target1.log" | tail -2)"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors 2>&1 | grep -qF "$line" || fail "the error is not recorded"
step=$(cl_json 'step()')
cl_wait 'step() >= '"$((step + 5))"' and s["state"] == "running"' 60 coord || fail "the cluster did not go on"

# the run resumed with model.path swapped
"$CL_BIN/dflashctl" -s "$CL_SOCK" --wait stop "swap" >/dev/null 2>&1 || fail "stop --wait"
for n in coord target0 drafter0; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC' at the stop"; done
db=$CL_DIR/state/$CL_NAME-ledger.db
sum=$(md5sum "$db" | cut -d' ' -f1)
cl_ini_add model.path="$T/other"
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_exit coord2 30
[[ $CL_RC == 78 ]] || fail "a coordinator on other weights exited '$CL_RC', not 78: $(grep -v ' = \|^#' "$CL_DIR/coord2.log" | tail -2)"
grep -qF "$db was written for target weights of fingerprint $fp, $T/other (model.path) has $other (other weights): put the run's model back, or move the ledger away to start a new run (with the drafters' checkpoint folder)" \
  "$CL_DIR/coord2.log" || fail "the coordinator did not say why: $(grep -v ' = \|^#' "$CL_DIR/coord2.log" | tail -2)"
[[ $(md5sum "$db" | cut -d' ' -f1) == "$sum" ]] || fail "the refused start changed the ledger"
# weights there that do not read (cut short): refused, not left unchecked; the ledger unchanged
mkdir "$T/broken"
cp "$CL_DIR/model/config.json" "$T/broken/"
head -c 3000 "$CL_DIR/model/model.safetensors" >"$T/broken/model.safetensors"
cl_ini_add model.path="$T/broken"
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait_exit coord3 30
[[ $CL_RC == 78 ]] || fail "a coordinator on weights cut short exited '$CL_RC', not 78: $(grep -v ' = \|^#' "$CL_DIR/coord3.log" | tail -2)"
grep -qF "model.path $T/broken: the weights do not read (" "$CL_DIR/coord3.log" ||
  fail "the coordinator did not say why: $(grep -v ' = \|^#' "$CL_DIR/coord3.log" | tail -2)"
[[ $(md5sum "$db" | cut -d' ' -f1) == "$sum" ]] || fail "the refused start changed the ledger"
cl_ini_add model.path="$CL_DIR/model"
# a coordinator's host with the small JSON files alone (config.json and a shard index, as a download
# of '*.json' leaves): a warning, the ledger's fingerprint stands
mkdir "$T/cfgonly"
cp "$CL_DIR/model/config.json" "$T/cfgonly/"
printf '{"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}\n' \
  >"$T/cfgonly/model.safetensors.index.json"
step=$(cl_sql "select value from meta where key='ckpt_step'")
cl_start coord coordinator-d -c "$CL_INI" -o model.path="$T/cfgonly"
cl_wait 's["state"] == "running"' 30 coord || fail "the coordinator did not come back with config.json alone"
grep -q "model.path $T/cfgonly: cannot read the weights (.*): the coordinator does not check them" "$CL_DIR/coord.log" ||
  fail "no warning for config.json alone: $(grep -i weights "$CL_DIR/coord.log" | tail -2)"
grep -q "target weights: fingerprint $fp (the ledger's)" "$CL_DIR/coord.log" || fail "the ledger's fingerprint is not taken"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["checkpoint"]["step"] >= '"$((step + 5))" 120 coord || fail "the run did not go on with its model back"
echo "ok: a target on other weights refused (78, recorded, the cluster went on); the run resumed on other weights refused ($fp vs $other), the ledger unchanged"
