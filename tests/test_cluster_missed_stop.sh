#!/usr/bin/env bash
# test_cluster_missed_stop.sh: a target and a drafter that were away when the cluster ended.
# Coordinator + 1 target + 1 drafter train; both daemons are frozen (SIGSTOP), the coordinator
# is SIGKILLed and a second one started, and `dflashctl stop` ends the cluster while neither
# daemon is connected: they never get its STOP. Thawed, each finds no coordinator but its stop
# note, takes that as the STOP it missed and exits 0 within seconds (without it they would keep
# reconnecting to a cluster that is over). The drafter writes no checkpoint nobody can record.
# Then a drafter started in a cluster's last moments: welcomed by a coordinator that has stopped
# (it waits for a frozen target to leave), it finds the ring removed, as a coordinator that
# leaves removes it: it has nothing to do and exits 0 (it exited 1, a failure systemd restarts).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill target0 CONT; cl_kill drafter0 CONT'

cl_init "$T/c" 6000 || exit 1
cl_ini_add drafter.checkpoint_every=1000 data.epochs=50
D=$CL_DIR
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 5 and len(targets()) == 1' 120 coord || fail "no training"
cl_log "training at step $(cl_json 'step()')"

cl_kill target0 STOP
cl_kill drafter0 STOP
cl_kill coord KILL
cl_wait_exit coord 10
[[ $CL_RC == 137 ]] || fail "coordinator exit after SIGKILL: $CL_RC"
[[ -e $CL_SOCK.stopped ]] && fail "a killed coordinator left a stop note"

cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] in ("running", "starting")' 30 coord2 || fail "second coordinator did not come up"
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop "operator test" || fail "dflashctl stop"
cl_wait_exit coord2 30 || fail "second coordinator exited with '$CL_RC'"
grep -q "^stopped: stop by dflashctl .*: operator test$" "$CL_SOCK.stopped" 2>/dev/null || fail "stop note: '$(cat "$CL_SOCK.stopped" 2>&1)'"
cl_log "cluster stopped while both daemons were frozen"

ckpts_before=$(find "$D/state" -name 'step-*' | wc -l)
cl_kill target0 CONT
cl_kill drafter0 CONT
for n in target0 drafter0; do
  cl_wait_exit $n 20 || fail "$n (away at the STOP) exited with '$CL_RC': $(tail -n 3 "$D/$n.log")"
  grep -q "stop: missed while disconnected (stop note: stopped: stop by dflashctl .*: operator test)" "$D/$n.log" ||
    fail "$n: $(tail -n 3 "$D/$n.log")"
done
ckpts_after=$(find "$D/state" -name 'step-*' | wc -l)
[[ $ckpts_after == "$ckpts_before" ]] || fail "the drafter wrote a checkpoint no coordinator records ($ckpts_before -> $ckpts_after)"
cl_log "both exited 0: $(grep -h "missed while disconnected" "$D"/target0.log "$D"/drafter0.log | sed 's/^<[0-9]>//' | head -n 1)"
echo "ok: target and drafter away at the STOP exit 0 from the stop note"

cl_ini_add coordinator.dead_after_ms=20000      # the frozen target keeps the stopped coordinator
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait 's["state"] in ("running", "starting")' 30 coord3 || fail "third coordinator did not come up"
cl_start target1 target-d -c "$CL_INI" -i 0
cl_wait 'len(targets()) == 1' 60 coord3 || fail "target did not register"
cl_kill target1 STOP
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop "last moments" || fail "dflashctl stop"
cl_wait 's["state"] == "stopped"' 10 coord3 || fail "not stopped"
rm -f "/dev/shm/dflash-$CL_NAME"                # what the coordinator does as it leaves
cl_start drafter1 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter1 30 || fail "drafter started as the cluster ended exited with '$CL_RC': $(tail -n 3 "$D/drafter1.log")"
grep -q "the coordinator has ended the cluster (stopped; its ring .* is gone): nothing to do" "$D/drafter1.log" ||
  fail "drafter1: $(tail -n 3 "$D/drafter1.log")"
cl_kill target1 CONT
cl_wait_exit target1 20 || fail "target1 exited with '$CL_RC'"
cl_wait_exit coord3 30 || fail "third coordinator exited with '$CL_RC'"
echo "ok: a drafter welcomed by a stopped coordinator whose ring is gone exits 0: nothing to do"
