#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) and runs them.
#   tools/fuzz.sh [--seconds N] [TARGET...]   each target N s (default $FUZZ_SECONDS or 60)
#   tools/fuzz.sh --ci                        each target $FUZZ_CI_SECONDS (25) s, one line each;
#                                             exits 77 with SKIP when clang's libFuzzer is missing
#   tools/fuzz.sh --build                     only build
#   tools/fuzz.sh --seeds                     rewrite tests/fuzz/corpus/*/seed-* from the writers
# Findings land in build-fuzz/fuzz/artifacts/<target>/; copy one to tests/fuzz/regress/<target>/
# and tests/test_fuzz_regress replays it in every build. Runs append to build-fuzz/fuzz/time.log.
# FUZZ_ARGS: more libFuzzer flags, e.g. "-fork=1 -ignore_crashes=1" to go on after a finding.
# FUZZ_NO_SANITIZE=check[,check] (e.g. nonnull-attribute) turns UBSan checks off, in a build dir
# of its own, to fuzz on past a reported finding that is not fixed yet.
set -u
cd "$(dirname "$0")/.."
TARGETS_ALL=(ckpt config ctl dataset hfconfig proto ring safetensors st_index)
NOSAN=${FUZZ_NO_SANITIZE:-}
B=${FUZZ_BUILD:-build-fuzz${NOSAN:+-no-${NOSAN//,/-}}}
F=$B/fuzz
secs=${FUZZ_SECONDS:-60}
mode=run
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --ci) mode=ci; secs=${FUZZ_CI_SECONDS:-25} ;;
    --build) mode=build ;;
    --seeds) mode=seeds ;;
    --seconds) [[ $# -ge 2 ]] || { echo "fuzz.sh: --seconds needs a value" >&2; exit 64; }; secs=$2; shift ;;
    --seconds=*) secs=${1#*=} ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 64 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
[[ ${#targets[@]} -eq 0 ]] && targets=("${TARGETS_ALL[@]}")
for t in "${targets[@]}"; do
  [[ -f tests/fuzz/fuzz_$t.c ]] || { echo "fuzz.sh: no target '$t' (tests/fuzz/fuzz_$t.c)" >&2; exit 64; }
done

CLANG=${FUZZ_CC:-clang}
mkdir -p "$F"
probe=$F/probe
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return (int)(n & 0); }\n' >"$probe.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >"$probe.log" 2>&1; then
  echo "SKIP fuzz: $CLANG with libFuzzer is not available ($(head -c 200 "$probe.log" | tr '\n' ' '))"
  exit 77
fi

PKGS="libuv libsystemd inih libcjson sqlite3 openblas"
PKG_CFLAGS=$(pkg-config --cflags $PKGS 2>/dev/null)
PKG_LIBS=$(pkg-config --libs $PKGS 2>/dev/null)
[[ -z $PKG_LIBS ]] && PKG_LIBS="-luv -lsystemd -linih -lcjson -lsqlite3 -lopenblas"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all${NOSAN:+ -fno-sanitize=$NOSAN}"
CFLAGS="-std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter -I. $PKG_CFLAGS"
LIBS="$PKG_LIBS -lm -lpthread -lrt"

# The library, instrumented for coverage (fuzzer-no-link) and built by the Makefile.
if ! make -s BUILD="$B" CC="$CLANG -fsanitize=fuzzer-no-link" \
     SAN="address,undefined${NOSAN:+ -fno-sanitize=$NOSAN}" NOCUDA=1 \
     "$B/libdflash.a" >"$F/build.log" 2>&1; then
  tail -n 30 "$F/build.log"
  echo "FAIL fuzz: library build failed (log: $F/build.log)"
  exit 1
fi

newer() { # out, inputs...: true when out is missing or older than any input
  local out=$1; shift
  [[ -f $out ]] || return 0
  for i in "$@"; do [[ $i -nt $out ]] && return 0; done
  return 1
}

deps=(tests/fuzz/fuzz.h tests/fuzz/fuzz_st.h daemons/dflashctl/show.c daemons/dflashctl/show.h "$B/libdflash.a")
if [[ $mode == seeds ]]; then
  if newer "$F/make_seeds" tests/fuzz/make_seeds.c tests/fuzz/fuzz_ring.c tests/fuzz/fuzz_ckpt.c "${deps[@]}"; then
    "$CLANG" $CFLAGS $SAN -fsanitize=fuzzer-no-link tests/fuzz/make_seeds.c "$B/libdflash.a" $LIBS \
      -o "$F/make_seeds" || exit 1
  fi
  "$F/make_seeds" "$PWD" tests/fuzz/corpus || exit 1
  # And one dataset made by the dflash-data tool, when it is built.
  dd=$(ls -t build*/bin/dflash-data 2>/dev/null | head -n 1)
  if [[ -n $dd ]]; then
    "$dd" synth -o tests/fuzz/corpus/dataset/seed-synth.dfd -n 4 -v 32 --min-len 3 --max-len 6 --seed 7 >/dev/null || exit 1
  fi
  for t in "${TARGETS_ALL[@]}"; do echo "$t: $(ls tests/fuzz/corpus/$t | wc -l) seeds"; done
  exit 0
fi

for t in "${targets[@]}"; do
  bin=$F/fuzz_$t
  if newer "$bin" "tests/fuzz/fuzz_$t.c" "${deps[@]}"; then
    if ! "$CLANG" $CFLAGS $SAN -fsanitize=fuzzer -DFUZZ_ENTRY=fuzz_$t "tests/fuzz/fuzz_$t.c" \
         "$B/libdflash.a" $LIBS -o "$bin" >"$F/build-$t.log" 2>&1; then
      cat "$F/build-$t.log"
      echo "FAIL fuzz $t: build failed"
      exit 1
    fi
  fi
done
[[ $mode == build ]] && { echo "built: ${targets[*]/#/$F/fuzz_}"; exit 0; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  work=$F/corpus/$t art=$F/artifacts/$t/ tmp=$F/tmp/$t log=$F/logs/$t.log
  mkdir -p "$work" "$art" "$tmp" "$F/logs"
  seeds=(tests/fuzz/corpus/$t)
  [[ -d tests/fuzz/regress/$t ]] && seeds+=(tests/fuzz/regress/$t)
  before=$(ls "$art" | wc -l)
  start=$(date +%s)
  # The first corpus dir collects what the run finds; the repo's seeds are only read.
  TMPDIR=$PWD/$tmp "$F/fuzz_$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art" ${FUZZ_ARGS:-} "$work" "${seeds[@]}" >"$log" 2>&1 &
  pid=$!
  wait $pid
  rc=$?
  took=$(( $(date +%s) - start ))
  rm -f "/dev/shm/dflash-fuzz-ring-$pid"
  rm -rf "${tmp:?}"/*
  runs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
  cov=$(grep -ao 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*')
  found=$(( $(ls "$art" | wc -l) - before ))
  if [[ $rc -eq 0 && $found -eq 0 ]]; then
    result=ok
    echo "PASS  fuzz_$t: ${took}s, ${runs:-?} runs, cov ${cov:-?}, corpus $(ls "$work" | wc -l), no finding"
  else
    result=FINDING
    failed+=("$t")
    echo "FAIL  fuzz_$t: rc=$rc after ${took}s, ${runs:-?} runs; new artifacts in $art:"
    ls -t "$art" | head -n 5 | sed 's/^/      /'
    grep -a -m 3 -E 'ERROR: |runtime error|fuzz invariant' "$log" | sed 's/^/      | /'
    echo "      keep it: cp $art<file> tests/fuzz/regress/$t/ (log: $log)"
  fi
  printf '%s %s %s %s %s\n' "$(date -u +%FT%TZ)" "$t" "$took" "${runs:-0}" "$result" >>"$F/time.log"
done
echo "fuzz: ${#targets[@]} targets x ${secs}s, ${#failed[@]} with findings${failed[*]:+: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
