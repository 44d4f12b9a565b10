# replay.sh: for the tests of dflash-replay, after tests/lib/cluster.sh and cl_init.
# replay_expect RC PATTERN ARGS...: dflash-replay -c $CL_INI ARGS exits RC, and its output is one
# line, matching PATTERN (an extended regex).
REPLAY=$CL_BIN/dflash-replay
[[ -x $REPLAY ]] || fail "missing $REPLAY (build first)"
replay_expect() {
  local want=$1 pat=$2 out rc
  shift 2
  out=$(${REPLAY_AS:+$REPLAY_AS} "$REPLAY" -c "$CL_INI" "$@" 2>&1)    # REPLAY_AS: e.g. setpriv ... (words)
  rc=$?
  cl_log "dflash-replay${*:+ $*}: exit $rc: $out"
  [[ $rc == "$want" ]] || fail "dflash-replay${*:+ $*}: exit $rc, expected $want: $out"
  grep -qE -- "$pat" <<<"$out" || fail "dflash-replay${*:+ $*}: no line matching '$pat': $out"
  [[ $(wc -l <<<"$out") == 1 ]] || fail "dflash-replay${*:+ $*}: more than one line: $out"
}
