#!/usr/bin/env bash
# test_systemd_ns.sh: the systemd-in-a-namespace harness itself, with a trivial Type=notify
# unit: it becomes active, SIGKILL -> restarted (NRestarts), SIGSTOP -> watchdog restart.
set -eu
cd "$(dirname "$0")/.."
. tests/lib/sysns.sh
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
sysns_init "$T/ns"
cat >"$T/notify-test.service" <<EOT
[Unit]
DefaultDependencies=no
[Service]
Type=notify
NotifyAccess=all
ExecStart=/bin/bash -c 'systemd-notify --ready; while :; do systemd-notify WATCHDOG=1; sleep 0.2; done'
Restart=on-failure
RestartSec=100ms
WatchdogSec=2s
EOT
sysns_unit "$T/notify-test.service"
sysns_boot
sysns_ctl start notify-test.service
[[ $(sysns_prop notify-test.service ActiveState) == active ]]
pid=$(sysns_prop notify-test.service MainPID)
echo "active, main pid $pid (namespace)"
sysns_nsenter kill -KILL "$pid"
sysns_wait_prop notify-test.service NRestarts 1 10
sysns_wait_prop notify-test.service ActiveState active 10
pid2=$(sysns_prop notify-test.service MainPID)
[[ $pid2 != "$pid" ]]
echo "SIGKILL -> restarted as $pid2"
sysns_nsenter kill -STOP "$pid2"
sysns_wait_prop notify-test.service NRestarts 2 15
sysns_wait_prop notify-test.service ActiveState active 10
grep -q "notify-test.service: Watchdog timeout" "$T/ns/console.log"
echo "SIGSTOP -> watchdog restart"
sysns_shutdown
echo ok
