#!/usr/bin/env bash
# test_cluster_coord_down_deaths.sh: daemons that die while the coordinator is down. The
# coordinator never sees them leave (no connection ends under it), so only what it finds when it
# comes back tells of them: the ledger's owners (both ranks of the drafter group, the target's
# leases) whose processes are gone. Each death is recorded once in `dflashctl errors`, named as
# the daemon it was, with the rank or the leases it held; the group's generation ends once.
# Both drafters are frozen first, so that the ring fills and the target holds leases it cannot
# publish: its death always has batches to queue again.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill drafter0 CONT; cl_kill drafter1 CONT'

cl_init "$T/c" 3000 || exit 1
# (dead_after_ms: the frozen drafters are not declared dead before the coordinator goes)
cl_ini_add drafter.world_size=2 data.epochs=20 coordinator.dead_after_ms=60000
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and step() >= 10' 120 coord || fail "no training"
gen=$(cl_json 's["group"]["generation"]')
cl_kill drafter0 STOP
cl_kill drafter1 STOP
cl_wait 's["ring"]["ready"] + s["ring"]["reading"] == s["ring"]["slots"] and [t for t in targets() if t["leases"] >= 1]' 60 coord ||
  fail "the ring did not fill with the target holding leases: $(cl_json 's["ring"], targets()')"

cl_kill coord KILL
cl_wait_exit coord 10
pt=$(cl_pid target0) p0=$(cl_pid drafter0) p1=$(cl_pid drafter1)
held=$(cl_sql "SELECT count(*) FROM batches WHERE state = 1 AND (owner & 4194303) = $pt")
for n in target0 drafter0 drafter1; do cl_kill $n KILL; cl_wait_exit $n 10; done
cl_log "coordinator, target (pid $pt, $held leases) and both drafters (pids $p0, $p1) killed"

cl_start coord2 coordinator-d -c "$CL_INI"
for r in 0 1; do
  p=$p0; ((r == 1)) && p=$p1
  cl_wait '[e for e in s["errors"] if e["role"] == "drafter" and e["pid"] == '$p' and e["message"].startswith("drafter-d (pid '$p') died while away from this coordinator") and e["message"].endswith(": rank '$r' of generation '$gen', which ends")]' 30 coord2 ||
    fail "rank $r's death is not among the errors: $(cl_json 's["errors"]')"
done
# The target's leases (none published: the ring was full) are queued again, as the coordinator's
# start says; its death is told with them
# (the start's reconciliation is logged before the coordinator answers: read after the waits above)
requeued=$(sed -n 's/.* \([0-9]*\) leases of dead targets re-queued.*/\1/p' "$CL_DIR/coord2.log" | tail -n 1)
((held > 0 && ${requeued:-0} == held)) || fail "the target held $held leases; ${requeued:-none} queued again"
cl_wait '[e for e in s["errors"] if e["role"] == "target" and e["pid"] == '$pt' and e["message"].startswith("target-d (pid '$pt') died while away") and e["message"].endswith(": its '$requeued' leased batch'"$( ((requeued > 1)) && echo es)"' queued again")]' 30 coord2 ||
  fail "the target's death is not among the errors: $(cl_json 's["errors"]')"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors | grep -qE "^  [0-9-]+ [0-9:]+ drafter-d \(pid $p1\) died while away" ||
  fail "dflashctl errors does not show the row as the daemon's own words: $("$CL_BIN/dflashctl" -s "$CL_SOCK" errors)"
# once each, and one end of the generation for both
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop >/dev/null || fail "dflashctl stop"
cl_wait_exit coord2 30
for p in "$p0" "$p1" "$pt"; do
  n=$(grep -c "(pid $p) died while away from this coordinator" "$CL_DIR/coord2.log")
  [[ $n == 1 ]] || fail "the death of pid $p told $n times"
done
n=$(grep -c "drafter group generation $gen ends" "$CL_DIR/coord2.log")
[[ $n == 1 ]] || fail "generation $gen ended $n times: $(grep "generation $gen ends" "$CL_DIR/coord2.log")"
echo "ok: both ranks' deaths and the target's ($held leases, $requeued queued again) while the coordinator was down recorded once each"
