#!/usr/bin/env bash
# test_ledger_damaged.sh: a coordinator restarted on a ledger that was changed behind its back
# (a batch row with a state no coordinator writes) refuses to start with a one-line error
# naming the ledger file and what is wrong, exit 78 (the unit is not restarted into a loop),
# and leaves the ledger as it found it. A meta number that is no number is refused so too.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 100 || exit 1
cl_start_coord || fail "coordinator did not come up"
cl_kill coord KILL
cl_wait_exit coord 10
db=$CL_DIR/state/$CL_NAME-ledger.db
"$CL_PY" -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' "$db" "$T/good.db" ||
  fail "cannot copy the ledger"
"$CL_PY" - "$db" <<'PY' || fail "cannot spoil the ledger"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("UPDATE batches SET state = 9 WHERE id = (SELECT min(id) FROM batches)")
c.commit()
PY
sum_before=$(md5sum "$db" | cut -d' ' -f1)
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_exit coord2 30
[[ $CL_RC == 78 ]] || fail "coordinator on a damaged ledger exited with '$CL_RC', wanted 78"
grep -q "$db: reading the batches: batch 0 has state 9, not one of 0..4" "$CL_DIR/coord2.log" || fail "no clear message: $(tail -n 2 "$CL_DIR/coord2.log")"
[[ $(md5sum "$db" | cut -d' ' -f1) == "$sum_before" ]] || fail "the damaged ledger was changed"
echo "ok: $(grep -h "reading the batches" "$CL_DIR/coord2.log" | sed 's/^<[0-9]>//')"

# A meta number edited by hand (the drafter group's checkpoint step): refused the same way, not
# read as the number its leading digits make.
rm -f "$db" "$db-wal" "$db-shm"
cp "$T/good.db" "$db"
"$CL_PY" - "$db" <<'PY' || fail "cannot spoil the ledger's meta"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("INSERT INTO meta(key, value) VALUES ('ckpt_step', '12abc') "
          "ON CONFLICT(key) DO UPDATE SET value = excluded.value")
c.commit()
PY
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait_exit coord3 30
[[ $CL_RC == 78 ]] || fail "coordinator on a ledger with meta ckpt_step '12abc' exited with '$CL_RC', wanted 78"
grep -q "$db: reading the drafter group's lineage: meta ckpt_step = '12abc' is not a decimal number" "$CL_DIR/coord3.log" ||
  fail "no clear message for the meta number: $(tail -n 2 "$CL_DIR/coord3.log")"
echo "ok: $(grep -h "is not a decimal number" "$CL_DIR/coord3.log" | sed 's/^<[0-9]>//')"

# The drafter ranks' owner tokens, a list of numbers: a damaged one is refused the same way.
rm -f "$db" "$db-wal" "$db-shm"
cp "$T/good.db" "$db"
"$CL_PY" - "$db" <<'PY' || fail "cannot spoil the ledger's group tokens"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("INSERT INTO meta(key, value) VALUES ('group_tokens', '123,4x5') "
          "ON CONFLICT(key) DO UPDATE SET value = excluded.value")
c.commit()
PY
cl_start coord4 coordinator-d -c "$CL_INI"
cl_wait_exit coord4 30
[[ $CL_RC == 78 ]] || fail "coordinator on a ledger with group_tokens '123,4x5' exited with '$CL_RC', wanted 78"
grep -q "meta group_tokens = '123,4x5' is not a list of decimal numbers" "$CL_DIR/coord4.log" ||
  fail "no clear message for the group tokens: $(tail -n 2 "$CL_DIR/coord4.log")"
# ... and the good copy still starts (the checks refuse only damage)
rm -f "$db" "$db-wal" "$db-shm"
cp "$T/good.db" "$db"
cl_start coord5 coordinator-d -c "$CL_INI"
cl_wait 'True' 20 coord5 || fail "the coordinator did not start on the undamaged ledger: $(tail -n 2 "$CL_DIR/coord5.log")"
cl_kill coord5 TERM
cl_wait_exit coord5 20

# The run's state numbers (here "fatal") too: one read as 0 would resume a failed run as healthy.
rm -f "$db" "$db-wal" "$db-shm"
cp "$T/good.db" "$db"
"$CL_PY" - "$db" <<'PY' || fail "cannot spoil the ledger's state"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("INSERT INTO meta(key, value) VALUES ('fatal', '1x') ON CONFLICT(key) DO UPDATE SET value = excluded.value")
c.commit()
PY
cl_start coord6 coordinator-d -c "$CL_INI"
cl_wait_exit coord6 30
[[ $CL_RC == 78 ]] || fail "coordinator on a ledger with meta fatal '1x' exited with '$CL_RC', wanted 78"
grep -q "reading the run's state: meta fatal = '1x' is not a decimal number" "$CL_DIR/coord6.log" ||
  fail "no clear message for the state number: $(tail -n 2 "$CL_DIR/coord6.log")"
