#!/usr/bin/env bash
# test_target_stop_connecting.sh: a daemon stopped (SIGTERM, as systemctl stop sends) while its
# connect() to the coordinator's socket waits, the listener's queue full (a stalled coordinator):
# a clean stop, exit 0, "stopped while waiting for the coordinator". (The signal cut the connect
# short with EINTR, taken for a failure to connect: exit 1, and systemd restarted it.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'kill $LISTENER 2>/dev/null'

cl_init "$T/c" 50 || exit 1
"$CL_PY" - "$CL_SOCK" "$CL_DIR/listening" <<'PY' &
import os, socket, sys, time
path, ready = sys.argv[1], sys.argv[2]
lfd = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
lfd.bind(path)
lfd.listen(0)
held = []
while True:                 # fill its queue: a connect then waits
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.1)
    try:
        s.connect(path)
    except OSError:
        break
    held.append(s)
open(ready, "w").close()
time.sleep(600)
PY
LISTENER=$!
for _ in $(seq 100); do [[ -e $CL_DIR/listening ]] && break; sleep 0.1; done
[[ -e $CL_DIR/listening ]] || fail "the listener did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
pid=$(cl_pid target0)
in_connect=0
for _ in $(seq 200); do
  # (the kernel's wait for room in a unix listener's queue; syscall 42 is connect on x86-64)
  if grep -q "unix_wait_for_peer" "/proc/$pid/wchan" 2>/dev/null ||
     [[ $(uname -m) == x86_64 && $(cut -d' ' -f1 "/proc/$pid/syscall" 2>/dev/null) == 42 ]]; then
    in_connect=1
    break
  fi
  sleep 0.05
done
((in_connect)) || fail "target-d did not wait in connect(): $(tail -n 3 "$CL_DIR/target0.log")"
cl_kill target0 TERM
cl_wait_exit target0 20 || true
[[ $CL_RC == 0 ]] || fail "target-d stopped in connect() exited '$CL_RC': $(tail -n 2 "$CL_DIR/target0.log")"
grep -q "stopped while waiting for the coordinator at $CL_SOCK" "$CL_DIR/target0.log" ||
  fail "target-d did not say it stopped while waiting: $(tail -n 2 "$CL_DIR/target0.log")"
echo "ok: stopped in connect(): exit 0"
