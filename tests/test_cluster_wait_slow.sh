#!/usr/bin/env bash
# test_cluster_wait_slow.sh: `dflashctl stop --wait` waits through a coordinator that is slow to
# answer on a connection that stands (here paused with SIGSTOP for longer than dflashctl's 10 s
# reply timeout, as a ledger fsync stuck behind a checkpoint's data would keep it): it says once
# that it is still waiting and reports the end as it comes. (It had said the coordinator went
# away before the cluster ended, exit 1, with the stop still under way.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 2000 || exit 1
# the pause is not taken for a dead daemon's silence on either side
# the stop checkpoint takes 6 s to write: the stop is under way when the coordinator is paused
cl_ini_add data.epochs=50 drafter.checkpoint_every=100000 coordinator.dead_after_ms=60000 drafter.debug_ckpt_delay_ms=6000
cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 'step() >= 3' 120 coord || fail "no training"
"$CL_BIN/dflashctl" -c "$CL_INI" --wait stop "slow coordinator" >"$CL_DIR/stop.out" 2>"$CL_DIR/stop.err" &
ctl=$!
cl_wait_log "$CL_DIR/coord.log" "stop by dflashctl" 30 || fail "the stop did not reach the coordinator"
sleep 1     # (its answer to the control read: dflashctl polls the status)
cl_kill coord STOP
sleep 12
cl_kill coord CONT
wait $ctl
rc=$?
cl_log "stop --wait: exit $rc; stdout: $(cat "$CL_DIR/stop.out"); stderr: $(cat "$CL_DIR/stop.err")"
grep -q "went away" "$CL_DIR/stop.err" && fail "dflashctl took a slow coordinator for gone: $(cat "$CL_DIR/stop.err")"
grep -q "^dflashctl: stop: no answer from the coordinator within 10000 ms: still waiting$" "$CL_DIR/stop.err" ||
  fail "dflashctl did not say it waits on: $(cat "$CL_DIR/stop.err")"
[[ $(grep -c "still waiting" "$CL_DIR/stop.err") == 1 ]] || fail "said more than once: $(cat "$CL_DIR/stop.err")"
[[ $rc == 0 ]] || fail "stop --wait: exit $rc"
tail -n 1 "$CL_DIR/stop.out" | grep -q "^stop: the cluster is stopped: stop by dflashctl.*: slow coordinator; lineage head: step [1-9]" ||
  fail "stop --wait said: $(cat "$CL_DIR/stop.out")"
cl_wait_exit coord 30 || fail "the coordinator exited with '$CL_RC'"
for n in target0 drafter0; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
echo "ok: stop --wait waited through a 12 s pause of the coordinator and reported the stop"
