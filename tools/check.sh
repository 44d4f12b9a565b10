#!/usr/bin/env bash
# check.sh: what `make check` and CI run. Installs missing packages, then builds and
# runs the whole suite plainly, under ASan+UBSan, and the concurrent parts under TSan.
# Ends with one line: "N passed, N failed, N skipped" summed over every phase.
set -u
cd "$(dirname "$0")/.."
tools/install-deps.sh || { echo "dependency install failed"; echo "0 passed, 1 failed"; exit 1; }
jobs=$(nproc)
total_p=0 total_f=0 total_s=0
phases=${CHECK_PHASES:-"plain asan tsan fuzz"}
logs=$(mktemp -d /tmp/dflash-check.XXXXXX)     # this run's own: two checks on one host do not mix

run_phase() { # name, make args..., -- run.sh filter
  local name=$1; shift
  local margs=() filter=""
  while [[ $# -gt 0 && $1 != -- ]]; do margs+=("$1"); shift; done
  [[ $# -gt 0 ]] && { shift; filter=${1:-}; }
  echo "=== $name: make ${margs[*]}"
  local build
  build=$(make -s "${margs[@]}" print-build 2>/dev/null | tail -n 1)
  if ! make -s -j"$jobs" "${margs[@]}" all >"$logs/build-$name.log" 2>&1; then
    tail -n 40 "$logs/build-$name.log"
    echo "=== $name: build failed"
    total_f=$((total_f + 1))
    return
  fi
  local out log=$logs/check-$name.log scale=1
  [[ $name != plain ]] && scale=${DFLASH_SAN_TIME_SCALE:-5}
  BUILD=$build DFLASH_TEST_TIME_SCALE=$scale tests/run.sh "$filter" | tee "$log"
  out=$(tail -n 1 "$log")
  if [[ $out =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
    total_p=$((total_p + BASH_REMATCH[1])); total_f=$((total_f + BASH_REMATCH[2])); total_s=$((total_s + BASH_REMATCH[3]))
  else
    total_f=$((total_f + 1))
  fi
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

for ph in $phases; do
  case $ph in
    plain) run_phase plain ;;
    asan)  run_phase asan SAN=address,undefined ;;
    # TSan does not follow memory shared between processes: the ring, collective and
    # coordinator have thread variants of their concurrent tests; those run here.
    tsan)  run_phase tsan SAN=thread -- "${TSAN_TESTS:-_thread|_race|coordinator|ledger}" ;;
    # Every libFuzzer target for a bounded time (tools/fuzz.sh --ci); one result.
    fuzz)  echo "=== fuzz: tools/fuzz.sh --ci"
           tools/fuzz.sh --ci; rc=$?
           case $rc in 0) total_p=$((total_p + 1));; 77) total_s=$((total_s + 1));; *) total_f=$((total_f + 1));; esac ;;
  esac
done
echo "(logs: $logs)"
echo "$total_p passed, $total_f failed, $total_s skipped"
[[ $total_f -eq 0 ]]
