#!/usr/bin/env bash
# test_cluster_model_config.sh: the run's model under other config.json settings (the same
# weights, another rope_theta: other hidden states) is refused, the setting named:
# 1. a target and a drafter whose model.path has the other config.json exit 78 at their start;
# 2. a coordinator started on it with the run's ledger exits 78, the ledger unchanged (a ledger
#    from before the settings were kept takes those of its next start);
# 3. a target let in while the coordinator knew no config (coordinator.ring_hidden, no
#    model.path) exits once a restarted coordinator reads the run's: its reconnect's WELCOME
#    carries the settings.
# (The weights' fingerprint alone was compared: each was let in.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 2000 || exit 1
cl_ini_add data.epochs=20
mkdir -p "$CL_DIR/tweak"
cp "$CL_DIR/model/"* "$CL_DIR/tweak/"
"$CL_PY" - "$CL_DIR/tweak/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_theta"] = 500000.0
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
said="$CL_DIR/tweak/config.json (model.path): rope_theta is 500000 here, 1000000 in the run (other settings): point model.path at the run's model"

# 1. at their start: the target alone leaves (the others may go on), the drafter fails the run
#    (its group cannot form without it), as on other weights
cl_start_coord || fail "coordinator did not come up"
for n in target0 drafter0; do
  cl_start $n ${n%0}-d -c "$CL_INI" -i 0 -o model.path="$CL_DIR/tweak"
  cl_wait_exit $n 60
  [[ $CL_RC == 78 ]] || fail "a $n on other config.json settings exited '$CL_RC', not 78: $(tail -n 2 "$CL_DIR/$n.log")"
  grep -qF "$said" "$CL_DIR/$n.log" || fail "$n did not say why: $(tail -n 2 "$CL_DIR/$n.log")"
  [[ $n == drafter0 ]] || cl_alive coord || fail "the coordinator left with the target"
done
cl_wait_exit coord 30
[[ $CL_RC == 78 ]] || fail "the coordinator exited with '$CL_RC' after the drafter's refusal, not 78"
grep -qF "cluster draining -> failed: drafter-d@0: $CL_DIR/tweak/config.json (model.path): rope_theta is 500000 here" \
  "$CL_DIR/coord.log" || fail "the run did not fail on the drafter's error: $(grep -v ' = \|^#' "$CL_DIR/coord.log" | tail -2)"
cl_log "a target and a drafter on another rope_theta: exit 78, the setting named"

# 2. the coordinator on the run's ledger
[[ $(cl_sql "SELECT value FROM meta WHERE key = 'model_config'") == *" rope_theta=1000000 "* ]] ||
  fail "the ledger keeps no settings: '$(cl_sql "SELECT value FROM meta WHERE key = 'model_config'")'"
db=$CL_DIR/state/$CL_NAME-ledger.db
sum=$(md5sum "$db" | cut -d' ' -f1)
cl_start coord2 coordinator-d -c "$CL_INI" -o model.path="$CL_DIR/tweak"
cl_wait_exit coord2 30
[[ $CL_RC == 78 ]] || fail "a coordinator on other config.json settings exited '$CL_RC', not 78"
grep -qF "$db was written for a target whose config.json has other settings: $CL_DIR/tweak/config.json: rope_theta is 500000 here, 1000000 in the run: put the run's config.json back, or move the ledger away" \
  "$CL_DIR/coord2.log" || fail "the coordinator did not say why: $(grep -v ' = \|^#' "$CL_DIR/coord2.log" | tail -2)"
[[ $(md5sum "$db" | cut -d' ' -f1) == "$sum" ]] || fail "the refused start changed the ledger"
cl_sql "DELETE FROM meta WHERE key = 'model_config'" >/dev/null
cl_start coord3 coordinator-d -c "$CL_INI" -o model.path="$CL_DIR/tweak"
cl_wait 's["state"] == "running"' 30 coord3 || fail "a ledger from before the settings were kept: not started"
cl_kill coord3 TERM
cl_wait_exit coord3 30 || fail "coord3 exited with '$CL_RC'"
[[ $(cl_sql "SELECT value FROM meta WHERE key = 'model_config'") == *" rope_theta=500000 "* ]] ||
  fail "a ledger from before the settings were kept was not given its start's"
cl_log "a coordinator on the other settings: exit 78, the ledger unchanged; a ledger without settings takes its start's"

# 3. a new run: a coordinator that knows no config.json lets the target in; a restart reads it
mv "$db" "$db.first"
rm -rf "$CL_DIR/state/checkpoints"
cl_start coord4 coordinator-d -c "$CL_INI" -o model.path= -o coordinator.ring_hidden=64
cl_wait 's["state"] == "running"' 30 coord4 || fail "coordinator without model.path did not come up"
cl_start target1 target-d -c "$CL_INI" -i 0 -o model.path="$CL_DIR/tweak"
cl_wait_log "$CL_DIR/target1.log" "ready: ring" 30 || fail "the target did not start"
cl_kill coord4 KILL
cl_wait_exit coord4 10
cl_start coord5 coordinator-d -c "$CL_INI"
cl_wait_exit target1 60
[[ $CL_RC == 1 ]] || fail "the target on other settings: '$CL_RC' after the coordinator read the run's, not exit 1"
grep -qF "exits: the run's target config.json has other settings now: rope_theta is 500000 here, 1000000 in the run" \
  "$CL_DIR/target1.log" || fail "the target did not say why: $(tail -n 3 "$CL_DIR/target1.log")"
cl_kill coord5 TERM
cl_wait_exit coord5 30 || true
echo "ok: other config.json settings are refused at a target's, a drafter's and a coordinator's start and at a reconnect"
