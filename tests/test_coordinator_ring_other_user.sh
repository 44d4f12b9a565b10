#!/usr/bin/env bash
# test_coordinator_ring_other_user.sh: an object under the ring's name that belongs to another
# user (here root's, the coordinator run as nobody) is the operator's to remove: the coordinator
# exits 78 saying so, not 1 (a restart loop, each start failing the same way).
#  - mode 0600: the coordinator cannot open it;
#  - a dflash ring of mode 0666 (every user's to write: not trusted, replaced if it holds
#    nothing): /dev/shm is sticky, so it cannot be removed by this user either.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

[[ $(id -u) == 0 ]] || { echo "SKIP: needs root to run the coordinator as another user"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: no setpriv"; exit 77; }
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
chmod 755 "$T"
# a copy of its own: the build may be where uid 65534 cannot reach (a clone under /root)
mkdir -p "$T/bin" && cp "$CL_BIN/coordinator-d" "$T/bin/" && chmod 755 "$T/bin" "$T/bin/coordinator-d"
as_nobody test -x "$T/bin/coordinator-d" || fail "uid 65534 cannot run $T/bin/coordinator-d"

cl_init "$T/c" 50 || exit 1
chmod -R a+rwX "$CL_DIR"
shm=/dev/shm/dflash-$CL_NAME

expect78() {  # what the log must say
  (as_nobody "$T/bin/coordinator-d" -c "$CL_INI") >"$CL_DIR/nobody.log" 2>&1
  local rc=$?
  [[ $rc == 78 ]] || fail "coordinator as nobody exited $rc, wanted 78: $(tail -3 "$CL_DIR/nobody.log")"
  grep -q -- "$1" "$CL_DIR/nobody.log" || fail "it does not say '$1': $(tail -3 "$CL_DIR/nobody.log")"
  [[ -e $shm ]] || fail "the object was removed"
  echo "ok: exit 78: $(grep -m1 -- "$1" "$CL_DIR/nobody.log")"
}

# root's ring, left by a coordinator killed: mode 0600
cl_start_coord || fail "root's coordinator did not come up"
cl_kill coord KILL
cl_wait_exit coord 10
[[ $(stat -c %U "$shm") == root ]] || fail "no ring of root's at $shm"
rm -rf "$CL_DIR/state"/* "$CL_DIR/run"/*   # (root's lock, socket and ledger: nobody's coordinator has its own)
expect78 "ring /dflash-$CL_NAME: Permission denied (another user's object under the ring's name? its owner or root must remove it"
chmod 666 "$shm"
expect78 "ring /dflash-$CL_NAME: cannot replace the object there: .* (another user's? its owner or root must remove $shm)"
rm -f "$shm"
echo "ok: another user's object under the ring's name: exit 78, left as it was"

# cluster.group a group this user is not in (and no CAP_CHOWN): the socket cannot be given to it
rm -rf "$CL_DIR/state"/* "$CL_DIR/run"/*
cl_ini_add cluster.group=root
expect_group() {
  (as_nobody "$T/bin/coordinator-d" -c "$CL_INI") >"$CL_DIR/nobody.log" 2>&1
  local rc=$?
  [[ $rc == 78 ]] || fail "coordinator as nobody, cluster.group = root: exit $rc, wanted 78: $(tail -3 "$CL_DIR/nobody.log")"
  grep -q "cannot give it to group 'root' (cluster.group): Operation not permitted (this user is not in that group" \
    "$CL_DIR/nobody.log" || fail "it does not say why: $(tail -3 "$CL_DIR/nobody.log")"
  echo "ok: exit 78: $(grep -m1 -o "control socket .*" "$CL_DIR/nobody.log" | cut -c1-160)"
}
expect_group
