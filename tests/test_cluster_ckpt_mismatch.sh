#!/usr/bin/env bash
# test_cluster_ckpt_mismatch.sh: checkpoints a drafter must not use, or must not remove.
#  - The drafter's shape changed under a state_dir. A one-rank group trains and checkpoints; the
#    drafter is killed and started again with model.draft_layers changed: the group's checkpoint
#    is made for another drafter, which no restart can load. The drafter says so (the file and
#    what differs), reports it as fatal and exits 78 (systemd does not restart it); the cluster
#    ends FAILED with that reason (it exited 1 and was restarted into the same refusal for ever).
#  - A new run (the ledger moved away, as to start again) in the same state_dir: the old run's
#    checkpoint folder is claimed by it (its run-id file), and the new run's checkpoints could
#    replace or prune the old run's. The drafter refuses the folder (exit 78, both runs named),
#    and the old checkpoints are all still there; an unclaimed folder with step folders in it
#    (written before folders were claimed) is refused the same way. With the old folder moved
#    away the new run makes it again, trains and checkpoints there.
#  - The folder moved (drafter.checkpoint_dir set to its new place) under a ledger that names the
#    old paths: refused in one line (78); a link at the old place, and the run goes on.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 600 || exit 1
cl_ini_add drafter.checkpoint_every=5 data.epochs=50
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["checkpoint"]["step"] >= 5' 120 coord || fail "no checkpoint"
cl_kill drafter0 KILL
cl_wait_exit drafter0 10
cl_ini_add model.draft_layers=2
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "drafter with another shape than its checkpoint exited '$CL_RC', want 78: $(tail -n 3 "$CL_DIR/drafter0.log")"
grep -q "joining generation 2: .*step-.*config.json.*" "$CL_DIR/drafter0.log" || fail "drafter0: $(tail -n 3 "$CL_DIR/drafter0.log")"
cl_wait_exit coord 60
[[ $CL_RC == 78 ]] || fail "coordinator exited '$CL_RC', want 78 (FAILED)"
grep -q -- "-> failed: .*joining generation 2: .*does not match" "$CL_DIR/coord.log" || fail "the cluster did not fail on it"
cl_log "$(grep -m1 'joining generation 2' "$CL_DIR/drafter0.log" | sed 's/^<[0-9]>//')"

# a new run in the same state_dir
ck="$CL_DIR/state/checkpoints"
old_run=$(cat "$ck/run-id") || fail "no run-id in $ck"
before=$(cd "$ck" && ls -d step-* | tr '\n' ' ')
[[ -n $before ]] || fail "no checkpoints in $ck"
mkdir "$T/old-ledger"
mv "$CL_DIR"/state/*-ledger.db* "$T/old-ledger/"
cl_ini_add model.draft_layers=1
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord2 || fail "second coordinator did not come up"
new_run=$(cl_json 's["run"]')
[[ $new_run != "$old_run" && $new_run =~ ^[0-9a-f]{16}$ ]] || fail "run ids: old '$old_run', new '$new_run'"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "a drafter on another run's checkpoint folder exited '$CL_RC', want 78: $(tail -n 3 "$CL_DIR/drafter0.log")"
grep -q "$ck belongs to run $old_run, not to this run ($new_run): move the folder away" \
  "$CL_DIR/drafter0.log" || fail "drafter0: $(tail -n 3 "$CL_DIR/drafter0.log")"
[[ $(cd "$ck" && ls -d step-* | tr '\n' ' ') == "$before" ]] || fail "checkpoints of the old run changed: $(ls "$ck")"
cl_log "$(grep -m1 'belongs to run' "$CL_DIR/drafter0.log" | sed 's/^<[0-9]>//')"
cl_wait_exit coord2 60

# the same folder unclaimed (as written before folders were claimed)
rm "$ck/run-id"
rm -f "$CL_DIR"/state/*-ledger.db*
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord3 || fail "third coordinator did not come up"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "a drafter on an unclaimed folder of step folders exited '$CL_RC', want 78"
grep -q "$ck holds checkpoints of no known run (step-[0-9]* ...), which this run could prune or replace" \
  "$CL_DIR/drafter0.log" || fail "drafter0: $(tail -n 3 "$CL_DIR/drafter0.log")"
[[ $(cd "$ck" && ls -d step-* | tr '\n' ' ') == "$before" && ! -e $ck/run-id ]] || fail "the unclaimed folder changed: $(ls -A "$ck")"
cl_wait_exit coord3 60

# the old checkpoints moved away (the folder went with them): the new run makes it again, trains
# and checkpoints there
mv "$ck" "$T/archive"
rm -f "$CL_DIR"/state/*-ledger.db*
cl_start coord4 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord4 || fail "fourth coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["checkpoint"]["step"] >= 5' 120 coord4 || fail "no checkpoint in the emptied folder"
[[ $(cat "$ck/run-id") == $(cl_json 's["run"]') ]] || fail "$ck/run-id: $(cat "$ck/run-id")"
[[ $(cd "$T/archive" && ls -d step-* | tr '\n' ' ') == "$before" ]] || fail "the archived checkpoints changed"

# the folder moved to a bigger disk, drafter.checkpoint_dir set to its new place: the ledger's
# lineage names the old paths. Refused in one line saying so (exit 78; it exited 1 saying
# "config.json: No such file or directory: missing", restarted into the same for ever); a link at
# the old place and the run goes on from its head.
head=$(cl_json 's["group"]["checkpoint"]["step"]')
cl_kill drafter0 KILL
cl_wait_exit drafter0 10
cl_kill target0 TERM
cl_kill coord4 TERM
cl_wait_exit coord4 30
cl_wait_exit target0 30 || true
mkdir "$T/big"
mv "$ck" "$T/big/checkpoints"
cl_ini_add drafter.checkpoint_dir="$T/big/checkpoints"
cl_start coord5 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord5 || fail "fifth coordinator did not come up"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "a drafter whose checkpoint folder moved exited '$CL_RC', want 78: $(tail -n 2 "$CL_DIR/drafter0.log")"
grep -q "the lineage head $ck/step-[0-9]* (the ledger's) is not in drafter.checkpoint_dir $T/big/checkpoints: the ledger keeps the checkpoints' paths: put the folder back where it was (or a link to it there)" \
  "$CL_DIR/drafter0.log" || fail "drafter0: $(tail -n 2 "$CL_DIR/drafter0.log")"
cl_log "$(grep -m1 'the lineage head' "$CL_DIR/drafter0.log" | sed 's/^<[0-9]>//')"
cl_wait_exit coord5 60
ln -s "$T/big/checkpoints" "$ck"
cl_start coord6 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord6 || fail "sixth coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["checkpoint"]["step"] >= '"$((head + 5))" 120 coord6 ||
  fail "no checkpoint past $head with the folder linked back: $(grep -v ' = ' "$CL_DIR/drafter0.log" | tail -2)"
echo "ok: a checkpoint of another drafter shape: exit 78, cluster failed; another run's checkpoint folder, and an unclaimed one, refused and left as they were; moved away, made again by the new run; moved under the ledger's lineage: exit 78, linked back: goes on"
