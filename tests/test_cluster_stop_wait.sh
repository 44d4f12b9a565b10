#!/usr/bin/env bash
# test_cluster_stop_wait.sh: `dflashctl stop --wait` over TCP, and a drafter that does not leave
# in time. 1 target + 1 drafter train; each stop checkpoint write takes longer than
# coordinator.dead_after_ms (drafter.debug_ckpt_delay_ms), the drafter heartbeating meanwhile.
# The coordinator leaves dead_after_ms after the stop with the drafter still connected:
# dflashctl (which has no stop note to read over TCP) says the coordinator left before every
# daemon had, what they write at the stop may be missing, and exits 1; the stop note says the
# same. (--wait had said the cluster ended, exit 0, the stop checkpoint not in the lineage.)
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
cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 'step() >= 5' 120 coord || fail "no training"
port=$(sed -n 's/.*TCP listener on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$CL_DIR/coord.log" | head -n 1)
[[ -n $port ]] || fail "no TCP listener port in the coordinator's log"
t0=$SECONDS
# (the longest reason a control keeps, 160 bytes, after the longest "who" (a TCP peer): the stop
# note is cut to its line, the part --wait reads kept)
"$CL_BIN/dflashctl" --connect "127.0.0.1:$port" --token-file "$CL_DIR/tcp.token" --wait stop "slow storage $(printf 'x%.0s' {1..147})" \
  >"$CL_DIR/stop.txt" 2>&1
rc=$?
cl_log "stop --wait: exit $rc after $((SECONDS - t0)) s: $(cat "$CL_DIR/stop.txt")"
[[ $rc == 1 ]] || fail "stop --wait with the stop checkpoint still being written: exit $rc, not 1"
tail -n 1 "$CL_DIR/stop.txt" | grep -q "^stop: the cluster is stopped: stop by dflashctl@127.0.0.1:[0-9]* .*: slow storage x*; the coordinator left before every daemon had: what they write at the stop may be missing$" ||
  fail "stop --wait said: $(cat "$CL_DIR/stop.txt")"
cl_wait_exit coord 30 || fail "the coordinator exited with '$CL_RC'"
grep -q "^stopped: stop by dflashctl.*: slow storage x*; 1 daemon had not left when the coordinator did$" "$CL_SOCK.stopped" ||
  fail "stop note: '$(cat "$CL_SOCK.stopped" 2>&1)'"
for n in target0 drafter0; do cl_wait_exit $n 60 || true; done
echo "ok: stop --wait says the coordinator left before the drafter (exit 1); the stop note says so"
