#!/usr/bin/env bash
# test_units.sh: the systemd units. `make install DESTDIR= PREFIX=` puts binaries, units (with
# @BINDIR@ replaced) and /etc/dflash/dflash.ini in place; every unit (and a template instance)
# passes `systemd-analyze verify` without a single warning; the properties the cluster relies
# on are there (Type=notify, watchdog, restart on failure but not on a config error, ordering,
# /dev/shm and devices left shared).
set -u
cd "$(dirname "$0")/.."
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
BIN=${DFLASH_BUILD:-build}/bin
fail() { echo "FAIL: $*"; exit 1; }
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze missing"; exit 77; }
BINS=$(make -s --no-print-directory print-bins)     # every program make install ships
[[ -n $BINS ]] || fail "make print-bins printed nothing"
for b in $BINS; do [[ -x $BIN/$b ]] || fail "$BIN/$b not built"; done

# make install into a DESTDIR (the binaries copied first so make has nothing to rebuild).
mkdir -p "$T/bins"
for b in $BINS; do cp "$BIN/$b" "$T/bins/"; done
(umask 077; make -s install DESTDIR="$T/root" PREFIX=/opt/dflash BIN_PATHS="$(for b in $BINS; do printf '%s ' "$T/bins/$b"; done)" \
  >"$T/install.out") || fail "make install"
# (a strict umask does not make the units unreadable to systemd; a PREFIX it does not search is said)
grep -q "systemd does not look in /opt/dflash/lib/systemd/system" "$T/install.out" || fail "no note of the units' folder"
for b in $BINS; do [[ -x $T/root/opt/dflash/bin/$b ]] || fail "install: bin/$b missing"; done
[[ -f $T/root/etc/dflash/dflash.ini ]] || fail "install: /etc/dflash/dflash.ini missing"
cmp -s etc/dflash.ini "$T/root/etc/dflash/dflash.ini" ||
  fail "install: dflash.ini differs"
# An upgrade keeps the operator's config and puts the shipped one beside it.
echo "# edited" >>"$T/root/etc/dflash/dflash.ini"
make -s install DESTDIR="$T/root" PREFIX=/opt/dflash BIN_PATHS="$(for b in $BINS; do printf '%s ' "$T/bins/$b"; done)" \
  >/dev/null || fail "make install again"
[[ $(tail -n 1 "$T/root/etc/dflash/dflash.ini") == "# edited" ]] || fail "install again: the edited dflash.ini was replaced"
cmp -s etc/dflash.ini "$T/root/etc/dflash/dflash.ini.dist" || fail "install again: no dflash.ini.dist"
UNITS="dflash-coordinator.service dflash-target@.service dflash-drafter@.service dflash.target"
for u in $UNITS; do
  f=$T/root/opt/dflash/lib/systemd/system/$u
  [[ -f $f ]] || fail "install: unit $u missing"
  [[ $(stat -c %a "$f") == 644 ]] || fail "install: unit $u mode $(stat -c %a "$f") under umask 077"
  grep -q '@BINDIR@\|@DOCDIR@' "$f" && fail "install: $u still has @BINDIR@ or @DOCDIR@"
  cmp -s <(sed 's|@BINDIR@|/opt/dflash/bin|g; s|@DOCDIR@|/opt/dflash/share/doc/dflash|g' "systemd/$u") "$f" ||
    fail "install: $u is not the substituted source"
  doc=$(sed -n 's|^Documentation=file://||p' "$f")
  [[ -f $T/root$doc ]] || fail "install: $u names $doc, which is not installed"
done
echo "make install: binaries, units, config, docs in place"

# systemd-analyze verify needs the ExecStart binaries: point @BINDIR@ at the build.
mkdir -p "$T/u"
abs=$(cd "$BIN" && pwd)
for u in $UNITS; do sed "s|@BINDIR@|$abs|g; s|@DOCDIR@|$PWD/docs|g" "systemd/$u" >"$T/u/$u"; done
(cd "$T/u" && systemd-analyze verify --man=no ./dflash.target ./dflash-coordinator.service \
  ./dflash-target@0.service ./dflash-drafter@3.service) >"$T/verify.log" 2>&1
rc=$?
[[ $rc == 0 && ! -s $T/verify.log ]] || fail "systemd-analyze verify (rc $rc): $(cat "$T/verify.log")"
echo "systemd-analyze verify: clean"

# What the cluster relies on.
prop() { grep -E "^$2=" "systemd/$1" | tail -1 | cut -d= -f2-; }
ex_config=$(sed -n 's/^#define DAEMON_EX_CONFIG *\([0-9]*\).*/\1/p' common/daemon.h)
[[ -n $ex_config ]] || fail "DAEMON_EX_CONFIG not found"
for u in dflash-coordinator.service dflash-target@.service dflash-drafter@.service; do
  [[ $(prop $u Type) == notify ]] || fail "$u: Type"
  ws=$(prop $u WatchdogSec)
  [[ $ws =~ ^[1-9][0-9]*s$ ]] || fail "$u: WatchdogSec '$ws' (0 or none turns the watchdog off)"
  [[ $(prop $u Restart) == on-failure ]] || fail "$u: Restart"
  rp=" $(prop $u RestartPreventExitStatus) "
  [[ $rp == *" $ex_config "* && $rp == *" 64 "* ]] ||
    fail "$u: RestartPreventExitStatus has not $ex_config (config) and 64 (usage)"
  [[ $(prop $u PartOf) == dflash.target ]] || fail "$u: PartOf"
  [[ $(prop $u NoNewPrivileges) == yes ]] || fail "$u: NoNewPrivileges"
  [[ $(prop $u ProtectSystem) == strict ]] || fail "$u: ProtectSystem"
  [[ $(prop $u RuntimeDirectory) == dflash && $(prop $u StateDirectory) == dflash ]] || fail "$u: directories"
  [[ $(prop $u RuntimeDirectoryPreserve) == yes ]] || fail "$u: RuntimeDirectoryPreserve"
  # every start re-applies the shared directories' modes: the same in every unit; the socket's
  # own mode and group (cluster.group) decide who connects
  [[ $(prop $u RuntimeDirectoryMode) == 0755 && $(prop $u StateDirectoryMode) == 0750 ]] || fail "$u: directory modes"
  [[ $(prop $u RestrictAddressFamilies) == "AF_UNIX AF_INET AF_INET6 AF_NETLINK" ]] || fail "$u: RestrictAddressFamilies"
  # files made by the daemons (ledger, checkpoints, metrics) not readable by every user
  [[ $(prop $u UMask) == 0007 ]] || fail "$u: UMask"
  [[ $(prop $u PrivateTmp) == yes ]] || fail "$u: PrivateTmp"
  [[ -n $(prop $u StartLimitBurst) && -n $(prop $u StartLimitIntervalSec) ]] || fail "$u: start limit"
  # no capabilities, but the coordinator's CAP_CHOWN (the socket and the ring go to cluster.group)
  want_caps=; [[ $u == dflash-coordinator.service ]] && want_caps=CAP_CHOWN
  [[ $(prop $u CapabilityBoundingSet) == "$want_caps" ]] || fail "$u: CapabilityBoundingSet '$(prop $u CapabilityBoundingSet)'"
  # The ring in /dev/shm and /dev/nvidia* must stay visible and shared between the units.
  grep -Eq '^(PrivateIPC|PrivateDevices|DevicePolicy|DeviceAllow|MemoryDenyWriteExecute|InaccessiblePaths|RemoveIPC)=' "systemd/$u" &&
    fail "$u: an option that hides /dev/shm or breaks CUDA"
  grep -q '^WantedBy=dflash.target' "systemd/$u" || fail "$u: WantedBy"
done
# a stop's checkpoint waits end within drafter.checkpoint_timeout_ms (its default here): the
# drafter's and the coordinator's (which drains them) TimeoutStopSec are above it
ckto=$(sed -n 's/^checkpoint_timeout_ms = \([0-9]*\)$/\1/p' etc/dflash.ini)
for u in dflash-drafter@.service dflash-coordinator.service; do
  ts=$(prop $u TimeoutStopSec)
  [[ -n $ckto && $ts =~ ^([0-9]+)s$ ]] && ((BASH_REMATCH[1] * 1000 > ckto)) ||
    fail "$u: TimeoutStopSec '$ts' not above drafter.checkpoint_timeout_ms ($ckto ms)"
done
for u in dflash-target@.service dflash-drafter@.service; do
  # -i N in PCI bus order (nvidia-smi's numbering)
  grep -q '^Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID$' "systemd/$u" || fail "$u: CUDA_DEVICE_ORDER"
  # after the coordinator, without pulling it in (a restart after the run stopped must not start it)
  [[ " $(prop $u After) " == *" dflash-coordinator.service "* ]] || fail "$u: After"
  grep -q '^Wants=.*dflash-coordinator' "systemd/$u" && fail "$u: Wants the coordinator"
  # ProtectClock= before systemd 252 turns on a device allow-list that hides /dev/nvidia*
  grep -q '^ProtectClock=' "systemd/$u" && fail "$u: ProtectClock"
  grep -q '^ExecStart=@BINDIR@/[a-z-]* -c ${DFLASH_CONFIG} -i %i$' "systemd/$u" || fail "$u: ExecStart"
done
grep -q '^Wants=dflash-coordinator.service' systemd/dflash.target || fail "dflash.target: Wants"
echo ok
