#!/usr/bin/env bash
# test_ledger_damaged.sh: a coordinator restarted on a ledger that was changed behind its back
# (a batch row with a state no coordinator writes) refuses to start with a one-line error
# naming the ledger file and what is wrong, exit 78 (the unit is not restarted into a loop),
# and leaves the ledger as it found it.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 100 || exit 1
cl_start_coord || fail "coordinator did not come up"
cl_kill coord KILL
cl_wait_exit coord 10
db=$CL_DIR/state/$CL_NAME-ledger.db
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
