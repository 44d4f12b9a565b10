#!/usr/bin/env bash
# run.sh: runs every test program (build*/tests/test_*) and script (tests/test_*.sh),
# each with its own timeout and private temp dir; prints "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
[[ $BUILD == /* ]] || BUILD=$PWD/$BUILD     # relative to the tree, or absolute
export DFLASH_SRC=$PWD DFLASH_BUILD=$BUILD
export NCCL_NVLS_ENABLE=0
TIMEOUT=${TEST_TIMEOUT:-600}
filter=${1:-}

pass=0 fail=0 skip=0 failed=()
logdir=$BUILD/test-logs
mkdir -p "$logdir"

tests=()
for t in "$BUILD"/tests/test_*; do
  [[ -x $t && $t != *.d && $t != *.o ]] && tests+=("$t")
done
for t in tests/test_*.sh; do [[ -f $t ]] && tests+=("$t"); done

for t in "${tests[@]}"; do
  name=$(basename "$t"); name=${name%.sh}
  [[ -n $filter && ! $name =~ $filter ]] && continue
  tmp=$(mktemp -d /tmp/dflash-test.XXXXXX)
  start=$(date +%s%N)
  [[ $t == /* ]] || t=$PWD/$t
  TMPDIR=$tmp DFLASH_TEST_TMP=$tmp timeout -k 10 "$TIMEOUT" "$t" >"$logdir/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 )); secs=$((ms / 1000)).$(( (ms % 1000) / 100 ))
  rm -rf "$tmp"
  case $rc in
    0)  pass=$((pass+1)); echo "PASS  $name (${secs}s)";;
    77) skip=$((skip+1)); echo "SKIP  $name ($(grep -m1 SKIP "$logdir/$name.log" | cut -c1-100))";;
    *)  fail=$((fail+1)); failed+=("$name"); echo "FAIL  $name (rc=$rc, ${secs}s)"
        # the test's own verdict lines first (a long log's tail may not hold them), then the tail
        grep -m 8 -E '(^|: |  )FAIL' "$logdir/$name.log" | cut -c1-300 | sed 's/^/      ! /'
        tail -n 25 "$logdir/$name.log" | sed 's/^/      | /';;
  esac
done

[[ ${#failed[@]} -gt 0 ]] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[[ $fail -eq 0 ]]
