# sysns.sh: run a real systemd as PID 1 of private pid/mount/uts/ipc/cgroup namespaces, so
# tests can drive units with systemctl on machines whose own PID 1 is not systemd (CI).
# Source it, then:
#   sysns_init DIR          check we can (exit 77 otherwise); DIR holds logs and the boot script
#   sysns_unit FILE...      units (and drop-in dirs: NAME.d/) to install into /run/systemd/system
#   sysns_boot              boot systemd into sysns.target; waits until it is up
#   sysns_ctl ARGS...       systemctl inside
#   sysns_prop UNIT PROP    one property's value
#   sysns_wait_prop UNIT PROP VALUE SECS   poll until PROP=VALUE (returns 1 on timeout)
#   sysns_shutdown          poweroff, wait, remove the cgroups (also run from the EXIT trap)
# Units started this way want DefaultDependencies=no (no udev, getty, ... in there): drop-ins
# written by the test add it. There is no journald: units log to files.

SYSNS_DIR= SYSNS_OUTER= SYSNS_PID= SYSNS_CG= SYSNS_MODE= SYSNS_UNITS=()

sysns_init() {
  SYSNS_DIR=$1
  mkdir -p "$SYSNS_DIR"
  [[ $(id -u) -eq 0 ]] || { echo "SKIP: systemd namespace needs root"; exit 77; }
  local b
  for b in unshare nsenter systemctl; do
    command -v $b >/dev/null || { echo "SKIP: $b missing"; exit 77; }
  done
  [[ -x /lib/systemd/systemd ]] || { echo "SKIP: /lib/systemd/systemd missing"; exit 77; }
  SYSNS_CG=dflash-sysns-$$-$RANDOM
  if [[ -d /sys/fs/cgroup/unified && -d /sys/fs/cgroup/systemd ]]; then
    SYSNS_MODE=hybrid
  elif [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    SYSNS_MODE=unified
  else
    echo "SKIP: no usable cgroup hierarchy under /sys/fs/cgroup"; exit 77
  fi
}

sysns_unit() { SYSNS_UNITS+=("$@"); }

sysns_boot() {
  local inner=$SYSNS_DIR/inner.sh u
  mkdir -p "$SYSNS_DIR/units"
  for u in "${SYSNS_UNITS[@]}"; do cp -r "$u" "$SYSNS_DIR/units/"; done
  cat >"$SYSNS_DIR/units/sysns.target" <<'EOT'
[Unit]
Description=test boot target
DefaultDependencies=no
EOT
  # PID 1 of the new namespaces: private /run and cgroup mounts, then exec systemd.
  cat >"$inner" <<EOT
#!/bin/bash
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/systemd/system /run/lock
cp -r "$SYSNS_DIR"/units/. /run/systemd/system/
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
if [[ $SYSNS_MODE == hybrid ]]; then
  mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
  mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
  mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
else
  umount /sys/fs/cgroup
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi
# systemd logs only to a terminal: /dev/console becomes the pty that script(1) records.
mount --bind "\$(tty)" /dev/console
export container=dflash-test
exec /lib/systemd/systemd --system --unit=sysns.target --log-target=console --log-level=info
EOT
  chmod +x "$inner"
  if [[ $SYSNS_MODE == hybrid ]]; then
    mkdir -p /sys/fs/cgroup/systemd/$SYSNS_CG /sys/fs/cgroup/unified/$SYSNS_CG
    setsid bash -c "echo \$\$ >/sys/fs/cgroup/systemd/$SYSNS_CG/cgroup.procs;
                    echo \$\$ >/sys/fs/cgroup/unified/$SYSNS_CG/cgroup.procs;
                    exec script -qfec 'unshare --pid --fork --mount-proc --uts --ipc --cgroup $inner' $SYSNS_DIR/console.log" \
      >"$SYSNS_DIR/boot.log" 2>&1 </dev/null &
  else
    mkdir -p /sys/fs/cgroup/$SYSNS_CG
    setsid bash -c "echo \$\$ >/sys/fs/cgroup/$SYSNS_CG/cgroup.procs;
                    exec script -qfec 'unshare --pid --fork --mount-proc --uts --ipc --cgroup $inner' $SYSNS_DIR/console.log" \
      >"$SYSNS_DIR/boot.log" 2>&1 </dev/null &
  fi
  SYSNS_OUTER=$!
  trap sysns_shutdown EXIT
  trap 'exit 1' INT TERM
  local i
  for ((i = 0; i < 300; i++)); do
    SYSNS_PID=$(sysns_find_systemd $SYSNS_OUTER)
    if [[ -n $SYSNS_PID ]]; then
      case $(sysns_ctl is-system-running 2>/dev/null) in
        running|degraded) return 0;;
      esac
    fi
    kill -0 $SYSNS_OUTER 2>/dev/null || break
    sleep 0.1
  done
  echo "systemd did not come up in the namespace; boot.log and console.log:"
  tail -n 20 "$SYSNS_DIR/boot.log" "$SYSNS_DIR/console.log"
  return 1
}

# Host pid of the namespace's systemd: the descendant of `pid` running /lib/systemd/systemd.
sysns_find_systemd() {
  local p c
  for p in $(cat /proc/$1/task/*/children 2>/dev/null); do
    if [[ $(readlink /proc/$p/exe 2>/dev/null) == */systemd ]]; then echo $p; return; fi
    c=$(sysns_find_systemd $p)
    if [[ -n $c ]]; then echo $c; return 0; fi
  done
  return 0
}

sysns_nsenter() { nsenter -t "$SYSNS_PID" -m -p -u -i -C "$@"; }
sysns_ctl() { sysns_nsenter systemctl --no-pager "$@"; }
sysns_prop() { sysns_ctl show -P "$2" "$1"; }

sysns_wait_prop() {
  local unit=$1 prop=$2 want=$3 secs=$4 i v
  secs=$(awk -v s="$secs" -v k="${DFLASH_TEST_TIME_SCALE:-1}" 'BEGIN { printf "%d", s * k + 0.5 }')
  for ((i = 0; i < secs * 10; i++)); do
    v=$(sysns_prop "$unit" "$prop" 2>/dev/null)
    [[ $v == "$want" ]] && return 0
    sleep 0.1
  done
  echo "timeout: $unit $prop=$v, wanted $want"
  return 1
}

sysns_shutdown() {
  [[ -n $SYSNS_OUTER ]] || return 0
  if kill -0 "$SYSNS_OUTER" 2>/dev/null; then
    [[ -n $SYSNS_PID ]] || SYSNS_PID=$(sysns_find_systemd "$SYSNS_OUTER")
    [[ -n $SYSNS_PID ]] && sysns_ctl poweroff >/dev/null 2>&1
    local i
    for ((i = 0; i < 300; i++)); do
      kill -0 "$SYSNS_OUTER" 2>/dev/null || break
      sleep 0.1
    done
    # Still there: SIGKILL of PID 1 takes the whole pid namespace down.
    if kill -0 "$SYSNS_OUTER" 2>/dev/null; then
      [[ -n $SYSNS_PID ]] && kill -KILL "$SYSNS_PID" 2>/dev/null
      kill -KILL "$SYSNS_OUTER" 2>/dev/null
    fi
  fi
  wait "$SYSNS_OUTER" 2>/dev/null || true
  local d
  for d in /sys/fs/cgroup/systemd/$SYSNS_CG /sys/fs/cgroup/unified/$SYSNS_CG /sys/fs/cgroup/$SYSNS_CG; do
    [[ -d $d ]] && find "$d" -depth -mindepth 1 -type d -exec rmdir {} + 2>/dev/null
    [[ -d $d ]] && rmdir "$d" 2>/dev/null
  done
  SYSNS_OUTER=
}
