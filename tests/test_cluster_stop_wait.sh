#!/usr/bin/env bash
# test_cluster_stop_wait.sh: `dflashctl stop --wait` over TCP with a stop checkpoint that takes
# longer than coordinator.dead_after_ms (drafter.debug_ckpt_delay_ms), the drafter heartbeating
# meanwhile. 1 target + 1 drafter.
# 1. The coordinator waits for the drafter (it heartbeats) and records the stop checkpoint:
#    --wait says the cluster stopped with that checkpoint as the lineage head, exit 0. (It had
#    left dead_after_ms after the stop, the stop checkpoint not in the ledger.)
# 2. The run resumed and stopped again, a stop signal to the coordinator while it waits: it
#    leaves without the drafter; dflashctl (which has no stop note to read over TCP) says the
#    coordinator left before every daemon had, what they write at the stop may be missing, and
#    exits 1; the stop note says the same.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 6000 || exit 1
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$CL_DIR/tcp.token"
chmod 600 "$CL_DIR/tcp.token"
delay=$(($(cl_scaled 3) * 3000))
cl_ini_add cluster.tcp_listen=127.0.0.1:0 cluster.tcp_token_file="$CL_DIR/tcp.token" data.epochs=50 \
  drafter.checkpoint_every=100000 drafter.debug_ckpt_delay_ms=$delay
dead_after=$(sed -n 's/^dead_after_ms *= *//p' "$CL_INI" | tail -n 1)
((delay > dead_after)) || fail "the checkpoint delay ($delay ms) is not longer than dead_after_ms ($dead_after)"

# stop_over_tcp REASON: dflashctl --wait stop over the TCP listener of coordinator log LOG, into stop.txt
stop_over_tcp() {
  local port
  port=$(sed -n 's/.*TCP listener on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$CL_DIR/$1" | tail -n 1)
  [[ -n $port ]] || fail "no TCP listener port in $1"
  "$CL_BIN/dflashctl" --connect "127.0.0.1:$port" --token-file "$CL_DIR/tcp.token" --wait stop "$2" >"$CL_DIR/stop.txt" 2>&1
}

cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 'step() >= 5' 120 coord || fail "no training"
t0=$SECONDS
# (the longest reason a control keeps, 160 bytes, after the longest "who" (a TCP peer): the stop
# note is cut to its line, the part --wait reads kept)
stop_over_tcp coord.log "slow storage $(printf 'x%.0s' {1..147})"
rc=$?
cl_log "stop --wait: exit $rc after $((SECONDS - t0)) s: $(cat "$CL_DIR/stop.txt")"
cl_wait_exit coord 30 || fail "the coordinator exited with '$CL_RC'"
cl_wait_exit drafter0 30 || fail "the drafter exited with '$CL_RC'"
cl_wait_exit target0 30 || fail "the target exited with '$CL_RC'"
step=$(cl_sql "SELECT step FROM checkpoints ORDER BY step DESC LIMIT 1")
[[ -n $step ]] || fail "no checkpoint in the ledger after the stop (the stop checkpoint was not waited for)"
grep -q "stop checkpoint.*step $step\|checkpoint of step $step" "$CL_DIR/drafter0.log" ||
  fail "step $step is not the drafter's stop checkpoint: $(grep -i checkpoint "$CL_DIR/drafter0.log" | tail -n 3)"
[[ $rc == 0 ]] || fail "stop --wait with a slow stop checkpoint: exit $rc, not 0: $(cat "$CL_DIR/stop.txt")"
tail -n 1 "$CL_DIR/stop.txt" |
  grep -q "^stop: the cluster is stopped: stop by dflashctl@127.0.0.1:[0-9]* .*: slow storage x*; lineage head: step $step .*/step-0*$step\$" ||
  fail "stop --wait said: $(cat "$CL_DIR/stop.txt")"
grep -q "waiting for 1 drafter still heartbeating to leave" "$CL_DIR/coord.log" || fail "the coordinator did not say it waits"
grep -q "had not left" "$CL_SOCK.stopped" && fail "stop note: '$(cat "$CL_SOCK.stopped")'"
cl_log "phase 1: the stop checkpoint of step $step is in the ledger; --wait exit 0"

# 2. again, and a stop signal to the coordinator while it waits for the drafter
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord2 || fail "the coordinator did not come up again"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait "step() >= $((step + 5))" 120 coord2 || fail "no training after the restart"
t0=$SECONDS
stop_over_tcp coord2.log "again" &
ctl=$!
cl_wait_log "$CL_DIR/coord2.log" "waiting for 1 drafter still heartbeating to leave" 30 || fail "the coordinator did not wait"
cl_kill coord2 TERM
cl_wait_exit coord2 10 || fail "the coordinator exited with '$CL_RC' at a stop signal while it waited"
wait $ctl
rc=$?
cl_log "stop --wait: exit $rc after $((SECONDS - t0)) s: $(cat "$CL_DIR/stop.txt")"
[[ $rc == 1 ]] || fail "stop --wait, the coordinator gone before the drafter: exit $rc, not 1"
tail -n 1 "$CL_DIR/stop.txt" |
  grep -q "^stop: the cluster is stopped: stop by dflashctl@127.0.0.1:[0-9]* .*: again; the coordinator left before every daemon had: what they write at the stop may be missing$" ||
  fail "stop --wait said: $(cat "$CL_DIR/stop.txt")"
grep -q "^stopped: stop by dflashctl.*: again; 1 daemon had not left when the coordinator did$" "$CL_SOCK.stopped" ||
  fail "stop note: '$(cat "$CL_SOCK.stopped" 2>&1)'"
for n in target0 drafter0; do cl_wait_exit $n 60 || true; done
echo "ok: the coordinator waits for a heartbeating drafter's stop checkpoint (--wait exit 0, it is the lineage head);" \
  "at a stop signal while it waits it leaves, and --wait and the stop note say so"
