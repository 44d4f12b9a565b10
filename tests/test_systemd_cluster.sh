#!/usr/bin/env bash
# test_systemd_cluster.sh: the shipped units under a real systemd (PID 1 of private
# namespaces, tests/lib/sysns.sh): dflash.target with 2 targets + 1 drafter on the CPU backend.
#  - a bad config (device index out of range) fails with 78 and is not restarted;
#  - target 0 SIGKILLed 5 times: systemd restarts it each time, the drafter's step counter
#    keeps increasing while it is down;
#  - target 1 SIGSTOPped: the watchdog kills and restarts it;
#  - `systemctl stop dflash.target`: every unit exits 0 after a final checkpoint;
#  - `systemctl start dflash.target` again: the drafter resumes from that checkpoint; stop again;
#  - a target started alone after that finds the coordinator's stop note and ends as a success.
# After each stop: no batch lost or trained twice (only pending and checkpointed batches, each
# checkpointed one trained exactly once in the lineage), no slot left WRITING or READING, no
# shm object left. The data is large enough (many epochs) that the run never ends on its own,
# so the test takes the same time on a fast or a slow machine.
set -u
cd "$(dirname "$0")/.."
. tests/lib/sysns.sh
. tests/lib/cluster.sh
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
sysns_init "$T/ns"
cleanup() { sysns_shutdown; cl_cleanup; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  sysns_ctl status --no-pager dflash-coordinator dflash-target@0 dflash-target@1 dflash-drafter@0 2>&1 | tail -40
  cl_logs 15
  grep -i "dflash" "$T/ns/console.log" | tail -20
  exit 1
}
KILLS=${KILLS:-5}

cl_init "$T/c" 6000 || exit 1
cl_ini_add drafter.checkpoint_every=50 data.epochs=50
# cluster.group: the coordinator (root with only CAP_CHOWN in its unit) gives the socket and the ring
# to that group
grp=$(getent group nogroup >/dev/null && echo nogroup || true)
[[ -n $grp ]] && cl_ini_add cluster.group=$grp

# The shipped units, with the build dir as @BINDIR@, plus test drop-ins: no default
# dependencies (nothing else boots in the namespace), this test's config and directory,
# a short watchdog for the targets, logs to files (no journald in there).
U=$T/units
mkdir -p "$U/dflash.target.wants"
for f in systemd/*.service systemd/*.target; do
  sed "s|@BINDIR@|$CL_BIN|g; s|@DOCDIR@|$CL_SRC/docs|g" "$f" >"$U/$(basename "$f")"
done
dropin() {  # dropin UNIT LOGNAME [extra Service lines]
  mkdir -p "$U/$1.d"
  cat >"$U/$1.d/test.conf" <<EOF
[Unit]
DefaultDependencies=no
[Service]
Environment=DFLASH_CONFIG=$CL_INI
ReadWritePaths=$T
PrivateTmp=no
StandardOutput=append:$CL_DIR/$2.log
StandardError=inherit
$3
EOF
}
dropin dflash-coordinator.service coord ""
# RestartSec scaled: a kill below must see target 0 gone while the drafter steps, before it is back
RESTART_S=$(cl_scaled 1.5)
dropin dflash-target@.service target%i "WatchdogSec=3s
RestartSec=${RESTART_S}s"
dropin dflash-drafter@.service drafter%i ""
mkdir -p "$U/dflash.target.d"
printf '[Unit]\nDefaultDependencies=no\n' >"$U/dflash.target.d/test.conf"
# masked: the coordinator wants it, and /etc is the host's (its wait-online services must not run here)
ln -s /dev/null "$U/network-online.target"
for u in dflash-target@0 dflash-target@1 dflash-drafter@0; do
  ln -s "../$(echo $u | sed 's/@[0-9]*/@/').service" "$U/dflash.target.wants/$u.service"
done
for f in "$U"/*; do sysns_unit "$f"; done
sysns_boot || fail "systemd did not boot"

# ---- a config error is not restarted --------------------------------------------------------
sysns_ctl start dflash-target@9.service 2>/dev/null
sleep 2.5
[[ $(sysns_prop dflash-target@9.service ExecMainStatus) == 78 ]] || fail "target@9 status $(sysns_prop dflash-target@9.service ExecMainStatus)"
[[ $(sysns_prop dflash-target@9.service ActiveState) == failed ]] || fail "target@9 not failed"
[[ $(sysns_prop dflash-target@9.service NRestarts) == 0 ]] || fail "target@9 was restarted"
grep -q "dflash.ini:[0-9]*: target.devices: instance index -i 9 out of range" "$CL_DIR/target9.log" || fail "target@9 message"
cl_log "config error: exit 78, not restarted"
sysns_ctl reset-failed dflash-target@9.service

# ---- start the cluster ------------------------------------------------------------------------
sysns_ctl start dflash.target || fail "start dflash.target"
for u in dflash-coordinator dflash-target@0 dflash-target@1 dflash-drafter@0; do
  [[ $(sysns_prop $u.service ActiveState) == active ]] || fail "$u not active"
done
cl_ring_hold || fail "no ring"
if [[ -n $grp ]]; then
  [[ $(stat -c %G "$CL_SOCK") == "$grp" ]] || fail "socket group $(stat -c %G "$CL_SOCK"), wanted $grp (cluster.group)"
  [[ $(stat -c %G "/dev/shm/dflash-$CL_NAME") == "$grp" ]] ||
    fail "ring group $(stat -c %G "/dev/shm/dflash-$CL_NAME"), wanted $grp"
  cl_log "cluster.group $grp: socket and ring given to it under the units"
fi
total=$(cl_json 's["epoch"]["total_batches"]' 2>/dev/null || true)
cl_wait 'step() >= 20 and len(targets()) == 2' 120 || fail "no training"
total=$(cl_json 's["epoch"]["total_batches"]')
cl_log "training under systemd: about $total batches"

# ---- SIGKILL target 0, KILLS times ----------------------------------------------------------------
for ((k = 1; k <= KILLS; k++)); do
  cl_wait '[t for t in targets() if t["gpu"] == 0 and t.get("published", 0) >= 3]' 60 || fail "target 0 not publishing"
  pid=$(sysns_prop dflash-target@0.service MainPID)
  n0=$(sysns_prop dflash-target@0.service NRestarts)
  s0=$(cl_json 'step()')
  sysns_nsenter kill -KILL "$pid"
  cl_wait 'step() >= '$((s0 + 5))' and not [t for t in targets() if t["gpu"] == 0]' 30 ||
    fail "drafter did not step while target 0 was down (kill $k)"
  s1=$(cl_json 'step()')
  sysns_wait_prop dflash-target@0.service NRestarts $((n0 + 1)) 20 || fail "target 0 not restarted (kill $k)"
  sysns_wait_prop dflash-target@0.service ActiveState active 20 || fail "target 0 not active again (kill $k)"
  cl_log "kill $k: pid $pid, drafter step $s0 -> $s1 while down, restarted as $(sysns_prop dflash-target@0.service MainPID)"
done

# ---- SIGSTOP target 1: the watchdog restarts it ------------------------------------------------
n1=$(sysns_prop dflash-target@1.service NRestarts)
pid=$(sysns_prop dflash-target@1.service MainPID)
sysns_nsenter kill -STOP "$pid"
sysns_wait_prop dflash-target@1.service NRestarts $((n1 + 1)) 30 || fail "no watchdog restart"
sysns_wait_prop dflash-target@1.service ActiveState active 20 || fail "target 1 not active after the watchdog"
grep -q "dflash-target@1.service: Watchdog timeout" "$T/ns/console.log" || fail "no watchdog timeout logged"
cl_log "SIGSTOP: watchdog restarted target 1"
cl_wait '[t for t in targets() if t["gpu"] == 1 and t.get("published", 0) >= 1]' 60 || fail "target 1 not publishing again"

# ---- graceful stop, start again, stop again ------------------------------------------------------
# stop_and_check LABEL: stop dflash.target; every unit exits 0; the ledger and ring are consistent.
stop_and_check() {
  sysns_ctl stop dflash.target || fail "stop dflash.target ($1)"
  local u states
  for u in dflash-coordinator dflash-target@0 dflash-target@1 dflash-drafter@0; do
    # The target itself stops first (the units are ordered before it): wait for each unit.
    sysns_wait_prop $u.service ActiveState inactive 120 || fail "$u: $(sysns_prop $u.service ActiveState) after stop ($1)"
    [[ $(sysns_prop $u.service ExecMainStatus) == 0 ]] || fail "$u exited $(sysns_prop $u.service ExecMainStatus) on stop ($1)"
  done
  [[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "ledger not consistent after stop ($1)"
  # Checkpointed batches were trained exactly once in the lineage, pending ones not at all.
  [[ $(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) != (b.state = 4)') == 0 ]] ||
    fail "a batch lost or trained twice ($1): $(cl_sql 'SELECT b.id, b.state, count(t.batch) FROM batches b LEFT JOIN trains t ON t.batch = b.id AND t.rolled_back = 0 GROUP BY b.id HAVING count(t.batch) != (b.state = 4) LIMIT 5')"
  # Batches the targets finished after the drafter left may sit READY in the (unlinked) ring:
  # the ledger has them pending again. Nothing may be left half-written or half-read.
  states=$(cl_ring_states 4)
  [[ $states != *WRITING* && $states != *READING* ]] || fail "slot leaked ($1): $states"
  exec 9<&-
  ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left after stop ($1)"
  cl_log "stopped cleanly ($1): $(cl_sql 'SELECT state, count(*) FROM batches GROUP BY state' | tr '\n' ' ')"
}

stop_and_check "after the kills"
ck=$(cl_sql 'SELECT step FROM checkpoints ORDER BY gen DESC, step DESC LIMIT 1')
# The newest checkpoint holds the drafter's last step: written on the stop, or by the periodic
# checkpoint when the stop landed right after one (nothing left unsaved then); stop_and_check saw
# no batch trained but not checkpointed.
grep -q "checkpoint .*step-$(printf %010d "$ck") (" "$CL_DIR/drafter0.log" || fail "no final checkpoint on stop"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state = 3') == 0 ]] || fail "batches trained after the last checkpoint"
done1=$(cl_sql 'SELECT count(*) FROM batches WHERE state = 4')

sysns_ctl start dflash.target || fail "restart dflash.target"
cl_ring_hold || fail "no ring after restart"
cl_wait 's["group"]["active"] and step() >= '$((ck + 50))' and s["group"]["checkpoint"]["step"] > '"$ck" 120 ||
  fail "no training after the restart"
grep -q "loaded checkpoint .*step-$(printf %010d "$ck")" "$CL_DIR/drafter0.log" || fail "the drafter did not resume from step $ck"
cl_log "resumed from the step-$ck checkpoint"
stop_and_check "after the restart"
done2=$(cl_sql 'SELECT count(*) FROM batches WHERE state = 4')
((done2 > done1)) || fail "no progress after the restart ($done1 -> $done2)"

# A target started after the stop (systemd restarting one that crashed at the very end, or an
# operator's `systemctl start`): its unit does not pull the coordinator in, so it finds the stop
# note, says READY then STOPPING and exits 0: systemd counts a success and does not restart it.
grep -q "^stopped" "$CL_SOCK.stopped" 2>/dev/null || fail "no stop note after the stop: '$(cat "$CL_SOCK.stopped" 2>&1)'"
n0=$(sysns_prop dflash-target@0.service NRestarts)
sysns_ctl start dflash-target@0 || fail "start dflash-target@0 alone after the stop"
sysns_wait_prop dflash-target@0.service ActiveState inactive 30 || fail "the late target did not end"
sleep $((RESTART_S + 1))     # a restart would have come by now
[[ $(sysns_prop dflash-target@0.service ActiveState) == inactive ]] || fail "the late target was started again"
[[ $(sysns_prop dflash-target@0.service Result) == success ]] ||
  fail "the late target's result: $(sysns_prop dflash-target@0.service Result)"
[[ $(sysns_prop dflash-target@0.service NRestarts) == "$n0" ]] || fail "the late target was restarted"
[[ $(sysns_prop dflash-coordinator.service ActiveState) == inactive ]] || fail "the coordinator was started"
grep -q "has ended the cluster (stopped: .*): nothing to do" "$CL_DIR/target0.log" || fail "late target: $(tail -n 2 "$CL_DIR/target0.log")"
cl_log "a target started after the stop: exit 0, result success, not restarted"
echo "ok: $KILLS kills + 1 watchdog restart, two clean stops, $done2 batches each trained exactly once"
