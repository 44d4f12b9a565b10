#!/usr/bin/env bash
# test_ledger_damaged.sh: a coordinator restarted on a ledger that was changed behind its back
# (a batch row with a state no coordinator writes) refuses to start with a one-line error
# naming the ledger file and what is wrong, exit 78 (the unit is not restarted into a loop),
# and leaves the ledger as it found it. A meta number that is no number is refused so too, and a
# page of the file overwritten. A ledger another process holds locked is said so (exit 1).
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
grep -q "$db: reading the batches: batch 0:0 has state 9, not one of 0..4" "$CL_DIR/coord2.log" || fail "no clear message: $(tail -n 2 "$CL_DIR/coord2.log")"
[[ $(md5sum "$db" | cut -d' ' -f1) == "$sum_before" ]] || fail "the damaged ledger was changed"
echo "ok: $(grep -h "reading the batches" "$CL_DIR/coord2.log" | sed 's/^<[0-9]>//')"

# The undamaged ledger back in place, with meta KEY set to VALUE when given.
good_ledger() {
  rm -f "$db" "$db-wal" "$db-shm"
  cp "$T/good.db" "$db"
  [[ $# == 0 ]] && return
  "$CL_PY" - "$db" "$1" "$2" <<'PY' || fail "cannot set meta $1 in the ledger"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
          (sys.argv[2], sys.argv[3]))
c.commit()
PY
}

# A coordinator (named NAME) on the ledger with meta KEY = VALUE exits 78 saying MESSAGE.
refused_meta() {
  local name=$1 key=$2 value=$3 message=$4
  good_ledger "$key" "$value"
  cl_start "$name" coordinator-d -c "$CL_INI"
  cl_wait_exit "$name" 30
  [[ $CL_RC == 78 ]] || fail "coordinator on a ledger with meta $key '$value' exited with '$CL_RC', wanted 78"
  grep -q "$message" "$CL_DIR/$name.log" || fail "no clear message for meta $key: $(tail -n 2 "$CL_DIR/$name.log")"
  echo "ok: $(grep -h "$message" "$CL_DIR/$name.log" | sed 's/^<[0-9]>//')"
}

# A meta number edited by hand (the drafter group's checkpoint step): refused the same way, not
# read as the number its leading digits make.
refused_meta coord3 ckpt_step 12abc "$db: reading the drafter group's lineage: meta ckpt_step = '12abc' is not a decimal number"
# The drafter ranks' owner tokens, a list of numbers.
refused_meta coord4 group_tokens 123,4x5 "meta group_tokens = '123,4x5' is not a list of decimal numbers"
# The run's state numbers (here "fatal"): one read as 0 would resume a failed run as healthy.
refused_meta coord6 fatal 1x "reading the run's state: meta fatal = '1x' is not a decimal number"
# A page of the file overwritten (a disk's bad sector): here the root of the trains index, which no
# start reads, only the first write of a training row. Refused at the start by SQLite's quick check,
# 78, not restarted into a commit that fails every time.
good_ledger
"$CL_PY" - "$db" <<'PY' || fail "cannot damage a page of the ledger"
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
size = c.execute("PRAGMA page_size").fetchone()[0]
root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'trains_gen'").fetchone()[0]
c.close()
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, bytes([0xA5]) * size, (root - 1) * size)
os.close(fd)
PY
cl_start coord7 coordinator-d -c "$CL_INI"
cl_wait_exit coord7 30
[[ $CL_RC == 78 ]] || fail "coordinator on a ledger with a damaged page exited with '$CL_RC', wanted 78"
grep -q "$db: a damaged database (SQLite's quick check: .*): restore it from a copy" "$CL_DIR/coord7.log" ||
  fail "no clear message for a damaged page: $(tail -n 2 "$CL_DIR/coord7.log")"
(($(grep -c . "$CL_DIR/coord7.log" | head -1) > 0)) && ! grep -q "^Page\|^\*\*\*" "$CL_DIR/coord7.log" ||
  fail "the damaged page's message is not one line: $(tail -n 4 "$CL_DIR/coord7.log")"
echo "ok: $(grep -h "a damaged database" "$CL_DIR/coord7.log" | sed 's/^<[0-9]>//')"
# A batch's epoch damaged past any run's (a wrapped -1): refused as such, not skipped
good_ledger
"$CL_PY" -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("UPDATE batches SET epoch = 4294967295 WHERE id = (SELECT max(id) FROM batches)"); c.commit()' "$db" ||
  fail "cannot damage an epoch"
cl_start coord9 coordinator-d -c "$CL_INI"
cl_wait_exit coord9 30
[[ $CL_RC == 78 ]] && grep -q "$db: .*epoch 4294967295" "$CL_DIR/coord9.log" ||
  fail "a damaged epoch: exit '$CL_RC': $(grep -v ' = ' "$CL_DIR/coord9.log" | tail -2)"
echo "ok: $(grep -h "epoch 4294967295" "$CL_DIR/coord9.log" | sed 's/^<[0-9]>//')"
# ... and the undamaged copy still starts (the checks refuse only damage)
good_ledger
cl_start coord5 coordinator-d -c "$CL_INI"
cl_wait 'True' 20 coord5 || fail "the coordinator did not start on the undamaged ledger: $(tail -n 2 "$CL_DIR/coord5.log")"
cl_kill coord5 TERM
cl_wait_exit coord5 20
# A ledger another process holds write-locked (a sqlite3 shell left in a transaction): exit 1 (a
# restart may find it free), the lock and its likely holder said; freed, the next start goes on
good_ledger
"$CL_PY" - "$db" "$T/unlock" <<'PY' &
import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("UPDATE meta SET value = value WHERE key = 'run_id'")
open(sys.argv[2] + ".held", "w").close()
end = time.time() + 120
while not os.path.exists(sys.argv[2]) and time.time() < end:
    time.sleep(0.1)
c.execute("ROLLBACK")
PY
holder=$!
for ((i = 0; i < 100; i++)); do [[ -e $T/unlock.held ]] && break; sleep 0.1; done
cl_start coord10 coordinator-d -c "$CL_INI"
cl_wait_exit coord10 60
touch "$T/unlock"
wait $holder
[[ $CL_RC == 1 ]] && grep -q "$db: .*database is locked (another process has held it locked for 5000 ms: a sqlite3 shell with a transaction open?)" "$CL_DIR/coord10.log" ||
  fail "a write-locked ledger: exit '$CL_RC': $(grep -v ' = ' "$CL_DIR/coord10.log" | tail -2)"
echo "ok: $(grep -h "database is locked" "$CL_DIR/coord10.log" | sed 's/^<[0-9]>//')"
cl_start coord11 coordinator-d -c "$CL_INI"
cl_wait 'True' 20 coord11 || fail "the coordinator did not start once the lock was gone: $(tail -n 2 "$CL_DIR/coord11.log")"
cl_kill coord11 TERM
cl_wait_exit coord11 20
# A ledger cut to nothing (0 bytes): a new run starts in it, said with a warning
rm -f "$db" "$db-wal" "$db-shm"
: >"$db"
cl_start coord8 coordinator-d -c "$CL_INI"
cl_wait 'True' 20 coord8 || fail "the coordinator did not start on an empty ledger: $(tail -n 2 "$CL_DIR/coord8.log")"
grep -q "$db is there but empty (0 bytes): a new run starts in it" "$CL_DIR/coord8.log" ||
  fail "no warning of an empty ledger: $(grep -v ' = ' "$CL_DIR/coord8.log" | head -3)"
cl_kill coord8 TERM
cl_wait_exit coord8 20
