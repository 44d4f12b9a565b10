#!/usr/bin/env bash
# test_blas_kernels.sh: target-d and drafter-d run OpenBLAS's kernels for this CPU's features when
# OpenBLAS does not know its model (it falls back to generic SSE3 "Prescott" kernels, a third of
# the speed: an Emerald Rapids under Debian 12's OpenBLAS 0.3.21): they set OPENBLAS_CORETYPE and
# exec themselves once, and log it. What OpenBLAS picks on its own is read from its verbose line;
# an OPENBLAS_CORETYPE the operator set is left alone.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
cl_init "$T/c" 20 || exit 1
# OpenBLAS's own pick on this CPU (OPENBLAS_VERBOSE=2 prints "Core: NAME" as it loads)
own=$(env -u OPENBLAS_CORETYPE -u DFLASH_OPENBLAS_DETECTED OPENBLAS_VERBOSE=2 "$CL_BIN/target-d" -h 2>&1 |
      sed -n 's/^Core: //p' | head -n 1)
[[ -n $own ]] || { echo "SKIP: no 'Core:' line from OpenBLAS (not a DYNAMIC_ARCH build): nothing to pick"; exit 77; }
for d in "target-d -i 0" "drafter-d -i 0"; do
  set -- $d
  bin=$1; shift
  env -u OPENBLAS_CORETYPE "$CL_BIN/$bin" -c "$CL_INI" "$@" -t >"$T/out.txt" 2>&1 || fail "$bin -t: $(tail -2 "$T/out.txt")"
  note=$(grep "OpenBLAS took this CPU for" "$T/out.txt")
  case $own in
    Prescott|Core2|Nehalem)
      if grep -qw "avx2\|avx512f" /proc/cpuinfo; then
        [[ $note == *"OpenBLAS took this CPU for $own (a model it does not know): OPENBLAS_CORETYPE="*"set from its features (OpenBLAS now: "* ]] ||
          fail "$bin: OpenBLAS runs its $own kernels on a CPU with AVX2: $(grep -v ' = ' "$T/out.txt" | tail -3)"
        [[ $note == *"(OpenBLAS now: $own)"* ]] && fail "$bin: OpenBLAS still $own after the exec: $note"
      fi ;;
    *) [[ -z $note ]] || fail "$bin changed OpenBLAS's own pick ($own): $note" ;;
  esac
  if [[ $note ]]; then     # the exec'd daemon keeps its name (ps, pgrep, the journal's _COMM)
    env -u OPENBLAS_CORETYPE "$CL_BIN/$bin" -c "$CL_INI" "$@" >"$T/run.txt" 2>&1 &
    pid=$!
    sleep 1
    comm=$(cat /proc/$pid/comm 2>/dev/null)
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    [[ $comm == "$bin" ]] || fail "$bin runs as '$comm' after its exec"
  fi
  OPENBLAS_CORETYPE=Prescott "$CL_BIN/$bin" -c "$CL_INI" "$@" -t >"$T/out.txt" 2>&1 || fail "$bin -t: $(tail -2 "$T/out.txt")"
  grep -q "OpenBLAS took" "$T/out.txt" && fail "$bin overrode the operator's OPENBLAS_CORETYPE"
  echo "$bin: OpenBLAS's own pick $own${note:+; $note}"
done
echo "ok"
