#!/usr/bin/env bash
# test_ckpt_fallback.sh: a checkpoint that does not load makes the lineage fall back, not loop.
#  fallback: the 2-rank group writes checkpoints, both drafters are SIGKILLed, then the lineage's
#    head checkpoint is damaged (optimizer.bin cut short) and the one before it removed. The
#    drafters started again report each (CKPT_BAD); the coordinator drops them in the ledger,
#    queues again every batch trained after the third newest, and the group restarts from it.
#    The run completes with every batch trained exactly once (tests/soak/check_run.py), the two
#    checkpoints are marked dropped in the ledger, `dflashctl checkpoints` shows them dropped with
#    the reason, and the errors name the first.
#  storage not there: the checkpoint root moved away: no fall back (the drafters exit 1, as for a
#    read error); moved back, the run resumes from the head it had and completes.
#  set aside: the head left as .old-step-N-<pid> by a replacement cut between its two renames is
#    put back when the drafters load it; the run resumes from it.
#  none left: every checkpoint cut short: the walk back ends FAILED (exit 78) with a message that
#    says so, no drafter restart loop.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

# Run until the lineage head is at least step $1 with the group active, then SIGKILL both
# drafters and wait until the coordinator has ended the group. Sets head to the head's step.
# (Not in $(...): only the shell that started the drafters can wait for them.)
train_then_kill() {
  cl_wait "s[\"group\"][\"active\"] and s[\"group\"][\"checkpoint\"][\"step\"] >= $1" 240 coord ||
    fail "no checkpoint of step >= $1 (head $(cl_json 's["group"]["checkpoint"]["step"]'))"
  cl_kill drafter0 KILL
  cl_kill drafter1 KILL
  cl_wait_exit drafter0 10
  cl_wait_exit drafter1 10
  cl_wait 'not s["group"]["active"]' 60 coord || fail "the group did not end"
  head=$(cl_json 's["group"]["checkpoint"]["step"]')
}

# Start both drafters again and wait for the run to complete from the head, step $head.
resume_to_end() {
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_start drafter1 drafter-d -c "$CL_INI" -i 1
  cl_wait_exit coord 300 || fail "coordinator exited '$CL_RC'"
  local n
  for n in target0 target1 drafter0 drafter1; do
    cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
  done
  grep -q "loaded checkpoint .*step-$(printf %010d "$head")" "$CL_DIR"/drafter*.log || fail "no drafter loaded step $head"
}

ckdir() { printf '%s/state/checkpoints/step-%010d' "$CL_DIR" "$1"; }

# ---- fallback -------------------------------------------------------------------------------
cl_init "$T/fb" 2400 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=15 drafter.keep_checkpoints=3
cl_start_cluster 2 || fail "cluster start"
train_then_kill 45
mapfile -t steps < <(cl_sql "SELECT step FROM checkpoints WHERE dropped IS NULL ORDER BY step DESC LIMIT 3")
((${#steps[@]} == 3)) && [[ ${steps[0]} == "$head" ]] || fail "checkpoints in the ledger: ${steps[*]} (head $head)"
s_bad=${steps[0]} s_gone=${steps[1]} s_ok=${steps[2]}
[[ -d $(ckdir "$s_ok") ]] || fail "step $s_ok is not on disk: $(ls "$CL_DIR/state/checkpoints")"
opt=$(ckdir "$s_bad")/optimizer.bin
truncate -s $(($(stat -c %s "$opt") / 2)) "$opt"
rm -rf "$(ckdir "$s_gone")"
cl_log "head step $s_bad damaged, step $s_gone removed; expecting step $s_ok"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait_log "$CL_DIR/coord.log" "falls back to checkpoint .*step-$(printf %010d "$s_ok")" 60 ||
  fail "no fall back to step $s_ok"
# dflashctl checkpoints: both dropped, with the reason; the JSON document says the same
out=$("$CL_BIN/dflashctl" -s "$CL_SOCK" checkpoints) || fail "dflashctl checkpoints: $out"
# (the damaged one still on disk, the removed one not)
grep -Eq "^ +$s_bad +[0-9]+ .* dropped +yes +$(ckdir "$s_bad")\$" <<<"$out" || fail "step $s_bad not shown dropped: $out"
grep -Eq "^ +$s_gone +[0-9]+ .* dropped +no +$(ckdir "$s_gone")\$" <<<"$out" || fail "step $s_gone not shown dropped and gone: $out"
grep -q "does not load on drafter-d@" <<<"$out" || fail "no reason shown: $out"
printf '%s\n' "$out" | head -8
"$CL_BIN/dflashctl" -s "$CL_SOCK" --json checkpoints | "$CL_PY" -c '
import json, sys
c = json.load(sys.stdin)
bad, gone, ok = (int(a) for a in sys.argv[1:4])
rows = {r["step"]: r for r in c["checkpoints"]}
assert "optimizer.bin" in rows[bad]["dropped"] and rows[gone]["dropped"], rows
assert rows[ok]["dropped"] is None and c["head"]["step"] >= ok, (rows[ok], c["head"])
assert rows[bad]["on_disk"] is True and rows[gone]["on_disk"] is False and rows[ok]["on_disk"] is True, rows' "$s_bad" "$s_gone" "$s_ok" ||
  fail "dflashctl --json checkpoints"
cl_wait_exit coord 300 || fail "coordinator exited '$CL_RC'"
for n in target0 target1 drafter0 drafter1; do
  cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
done
grep -q 'run complete: every batch checkpointed' "$CL_DIR/coord.log" || fail "the run did not complete"
grep -q "loaded checkpoint .*step-$(printf %010d "$s_ok")" "$CL_DIR"/drafter*.log || fail "no drafter loaded step $s_ok"
grep -q "falls back to checkpoint .*step-$(printf %010d "$s_gone")" "$CL_DIR/coord.log" ||
  fail "the first fall back (to step $s_gone) is not logged"
[[ $(cl_sql "SELECT step FROM checkpoints WHERE dropped LIKE '%does not load%' ORDER BY step") == "$s_gone"$'\n'"$s_bad" ]] ||
  fail "dropped checkpoints: $(cl_sql 'SELECT step, dropped FROM checkpoints WHERE dropped IS NOT NULL')"
[[ $(cl_sql "SELECT count(*) FROM errors WHERE message LIKE '%step-$(printf %010d "$s_bad") (step $s_bad) does not load%optimizer.bin%'") -ge 1 ]] ||
  fail "the damaged checkpoint is not in the errors: $(cl_sql 'SELECT message FROM errors')"
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" || fail "exactly-once check"
cl_log "ok: fell back from step $s_bad past $s_gone to $s_ok; every batch once"

# ---- storage not there ---------------------------------------------------------------------
# The checkpoint root moved away (a mount missing): the drafters' claim makes an empty one, the
# head is not in it, and that is no reason to drop checkpoints: each drafter exits 1 (systemd
# would restart it); once the root is back the run goes on from the head it had.
cl_cleanup
cl_init "$T/storage" 1600 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=15
cl_start_cluster 2 || fail "cluster start"
train_then_kill 30
root=$CL_DIR/state/checkpoints
mv "$root" "$root.away"
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait_exit drafter0 60
[[ $CL_RC == 1 ]] || fail "drafter0 exited '$CL_RC' without its checkpoint storage, want 1"
cl_wait_exit drafter1 60
cl_never "$CL_DIR/coord.log" "falls back" "falls back" "fell back without the storage"
[[ $(cl_sql "SELECT count(*) FROM checkpoints WHERE dropped IS NOT NULL") == 0 ]] || fail "checkpoints dropped"
cl_status || fail "no status from the coordinator"
[[ $(cl_json 's["group"]["checkpoint"]["step"]') == "$head" ]] || fail "the head moved"
rm -rf "$root" && mv "$root.away" "$root"
resume_to_end
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" || fail "exactly-once check"
cl_log "ok: storage away: no fall back; back: resumed from step $head"

# ---- set aside ------------------------------------------------------------------------------
# The head set aside by a replacement cut between its two renames (a file system that cannot
# exchange: step-N renamed .old-step-N-<pid>, the new one never renamed in): put back when the
# drafters load it, not reported as gone (which dropped it, or with no other step-N folder made
# the drafters exit 1 at every start).
cl_cleanup
cl_init "$T/aside" 1600 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=15
cl_start_cluster 2 || fail "cluster start"
train_then_kill 30
mv "$(ckdir "$head")" "$CL_DIR/state/checkpoints/.old-step-$(printf %010d "$head")-99999"
resume_to_end
grep -q "checkpoint .*step-$(printf %010d "$head") put back from where an interrupted replacement had set it aside" \
  "$CL_DIR"/drafter*.log || fail "no drafter put step $head back"
cl_never "$CL_DIR/coord.log" "falls back" "falls back" "fell back from a checkpoint set aside"
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" || fail "exactly-once check"
cl_log "ok: the head set aside was put back and the run resumed from step $head"

# ---- none left ------------------------------------------------------------------------------
cl_cleanup
cl_init "$T/none" 1600 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=15 drafter.keep_checkpoints=0
cl_start_cluster 2 || fail "cluster start"
train_then_kill 30
for d in "$CL_DIR"/state/checkpoints/step-*; do truncate -s 100 "$d/optimizer.bin"; done
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait_exit coord 120
[[ $CL_RC == 78 ]] || fail "coordinator exited '$CL_RC', want 78 (FAILED)"
grep -q "no earlier checkpoint of the run is left to fall back to" "$CL_DIR/coord.log" || fail "no 'none left' message"
for n in target0 target1 drafter0 drafter1; do
  cl_wait_exit $n 60 || fail "$n did not exit after the cluster failed"
done
n_load=$(cat "$CL_DIR"/drafter*.log | grep -c "asked the coordinator to fall back")
n_ckpt=$(cl_sql "SELECT count(*) FROM checkpoints")
((n_load >= n_ckpt && n_load <= 2 * n_ckpt)) || fail "$n_load reports for $n_ckpt checkpoints"
echo "ok: fell back from step $s_bad past $s_gone to $s_ok, every batch once; storage away: no fall back; set aside: put back; with none left FAILED"
