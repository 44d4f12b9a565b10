#!/usr/bin/env bash
# test_cluster_ledger_restored.sh: the ledger put back from an older copy under a checkpoint folder
# that went on without it. Day 1 trains (drafter group generation 1) and the ledger is copied; day 2
# loses a drafter twice (generations 2 and 3 form, raising the folder's fence) and drains. The operator puts the
# day-1 copy back and starts again: the coordinator forms generation 2 from it, below the fence.
# That group trained on with every checkpoint write fenced out ("generation 3 of the drafter group
# writes here now"), at notice level, no error; its drain never ended. Now the drafter refuses to
# join, in one line naming the fence, both generations and what to do: a configuration error
# (exit 78) that fails the cluster; the folder and its checkpoints are left as they were.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 1500 || exit 1
cl_ini_add drafter.checkpoint_every=10 data.epochs=50
DB=$CL_DIR/state/$CL_NAME-ledger.db
CK=$CL_DIR/state/checkpoints
cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 's["group"]["checkpoint"]["step"] >= 10' 120 coord || fail "no checkpoint on day 1"
"$CL_PY" -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' "$DB" "$T/day1.db" ||
  fail "cannot copy the ledger"
day1=$("$CL_PY" -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("select value from meta where key=\"group_gen\"").fetchone()[0])' "$T/day1.db")
[[ $day1 == 1 ]] || fail "the day-1 copy is at generation '$day1', not 1"
# day 2: the drafter lost and started again twice, a checkpoint in each new generation (the copy,
# at generation 1, forms generation 2 when it is put back: below the fence at 3)
for gen in 2 3; do
  head=$(cl_json 's["group"]["checkpoint"]["step"]')
  cl_kill drafter0 KILL
  cl_wait_exit drafter0 10 || true
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_wait 's["group"]["generation"] >= '$gen' and s["group"]["active"] and s["group"]["checkpoint"]["step"] >= '"$((head + 10))" 120 coord ||
    fail "no checkpoint of generation $gen: $(cl_json 's["group"]')"
done
"$CL_BIN/dflashctl" -s "$CL_SOCK" drain --wait "day 2 ends" >"$T/drain.txt" 2>&1 || fail "drain: $(cat "$T/drain.txt")"
for n in coord target0 drafter0; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC' after the drain"; done
fence=$(cat "$CK/generation")
[[ $((16#$fence)) -ge 3 ]] || fail "the fence after day 2 is '$fence'"
ls "$CK" >"$T/before.txt"
# the day-1 copy put back
rm -f "$DB" "$DB-wal" "$DB-shm"
cp "$T/day1.db" "$DB"
: >"$CL_DIR/drafter0.log"
cl_start_coord || fail "the coordinator did not start on the day-1 copy"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "the drafter under a fence past the ledger's generation exited with '$CL_RC', not 78: $(grep -v ' = \|^#' "$CL_DIR/drafter0.log" | tail -3)"
line="$CK/generation says drafter group generation $((16#$fence)), the ledger's is 2: the ledger is older than the folder (restored from a copy?): put back the newest; or, to go on from its head, move that file and the step folders past the head away (its lineage may prune or replace them)"
grep -qF "drafter-d@0: joining generation 2: $line" "$CL_DIR/drafter0.log" ||
  fail "the drafter did not say why: $(grep -v ' = \|^#' "$CL_DIR/drafter0.log" | tail -3)"
cl_wait_exit coord 30
[[ $CL_RC == 78 ]] || fail "the coordinator exited with '$CL_RC', not 78 (failed on a configuration error)"
grep -qF "failed: drafter-d@0: joining generation 2: $CK/generation says drafter group generation" "$CL_SOCK.stopped" ||
  fail "the stop note does not say why the cluster failed: $(cat "$CL_SOCK.stopped" 2>&1)"
"$CL_BIN/dflashctl" --ledger "$DB" errors 2>&1 | grep -qF "$CK/generation says drafter group generation $((16#$fence)), the ledger's is 2: the ledger is older" ||
  fail "the ledger's errors do not have it: $("$CL_BIN/dflashctl" --ledger "$DB" errors 2>&1 | tail -2)"
cl_never "$CL_DIR/drafter0.log" ' not written: %s' "checkpoint of step .* not written" "a checkpoint was fenced out"
[[ $(cat "$CK/generation") == "$fence" ]] || fail "the fence moved: $(cat "$CK/generation")"
ls "$CK" | diff - "$T/before.txt" >/dev/null || fail "the checkpoint folder changed: $(ls "$CK" | diff - "$T/before.txt")"
echo "ok: a ledger older than its checkpoint folder is refused in one line, exit 78; nothing in the folder changed"
