#!/usr/bin/env bash
# stress-tests.sh: runs the tests matching REGEX several rounds on a machine kept busy by CPU
# hogs, to bring out the failures that show only when processes are descheduled at bad moments
# (a CI machine running other jobs). Prints each round's result and, at the end, every test that
# failed in any round with its count; exits 1 if any did. Logs of failed rounds are kept.
#
#   tools/stress-tests.sh [-n ROUNDS] [-j HOGS] [-b BUILD] [-s SCALE] REGEX
#
# ROUNDS (5): how often; HOGS (the CPU count): busy loops beside the tests; BUILD (build): the
# build dir whose tests run (build-asan for the sanitizer build: make SAN=address,undefined
# BUILD=build-asan); SCALE (1; 5 for a sanitizer build, as tools/check.sh): DFLASH_TEST_TIME_SCALE.
set -u
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 [-n ROUNDS] [-j HOGS] [-b BUILD] [-s SCALE] REGEX" >&2; exit 2; }
rounds=5 hogs=$(nproc) build=build scale=1
while getopts "n:j:b:s:" o; do
  case $o in
    n) rounds=$OPTARG ;; j) hogs=$OPTARG ;; b) build=$OPTARG ;; s) scale=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -eq 1 ]] || usage
filter=$1
[[ -d $build/tests ]] || { echo "stress-tests: $build/tests: no such build (make BUILD=$build)" >&2; exit 2; }

pids=()
stop_hogs() { [[ ${#pids[@]} -gt 0 ]] && kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; }
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
  ( while :; do :; done ) &
  pids+=($!)
done

keep=$build/stress-logs
mkdir -p "$keep"
declare -A failures=()
for ((r = 1; r <= rounds; r++)); do
  out=$(BUILD=$build DFLASH_TEST_TIME_SCALE=$scale tests/run.sh "$filter")
  echo "round $r: $(tail -n 1 <<<"$out")"
  while read -r name; do
    failures[$name]=$(( ${failures[$name]:-0} + 1 ))
    cp "$build/test-logs/$name.log" "$keep/$name.round$r.log"
    echo "  FAIL $name (log: $keep/$name.round$r.log)"
  done < <(awk '$1 == "FAIL" { print $2 }' <<<"$out")
done
stop_hogs
trap - EXIT
if [[ ${#failures[@]} -eq 0 ]]; then
  echo "stress: $rounds rounds with $hogs hogs: no failure"
  exit 0
fi
for n in "${!failures[@]}"; do echo "stress: $n failed ${failures[$n]} of $rounds rounds"; done
exit 1
