#!/usr/bin/env bash
# coord_idle.sh: the coordinator's own CPU use with a large schedule and nothing else running
# (the periodic checks are all it does), then its CPU time per `dflashctl status` and per
# `dflashctl batches` (-q of each, one after the other), for one or more builds in the same run.
# usage: bench/coord_idle.sh [-n SAMPLES] [-s SECONDS] [-q QUERIES] BUILD_DIR...
# Each sample is one batch (token budget 32, samples of 20-30 tokens): -n 1000000 = 1M batches.
set -u
cd "$(dirname "$0")/.."
n=1000000 secs=20 queries=20
while getopts "n:s:q:" o; do case $o in n) n=$OPTARG;; s) secs=$OPTARG;; q) queries=$OPTARG;; *) exit 2;; esac; done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || { echo "usage: $0 [-n SAMPLES] [-s SECONDS] [-q QUERIES] BUILD_DIR..."; exit 2; }
hz=$(getconf CLK_TCK)
printf '%-28s %10s %12s %14s %14s %14s\n' build batches cpu_s cpu_per_tick_ms status_cpu_ms batches_cpu_ms
for b in "$@"; do
  export DFLASH_BUILD=$(realpath "$b") DFLASH_SRC=$PWD
  . tests/lib/cluster.sh
  D=$(mktemp -d /tmp/coord-idle.XXXXXX)
  cl_init "$D/c" 50 >/dev/null || exit 1
  "$CL_BIN/dflash-data" synth -o "$D/big.bin" -n "$n" -v 256 --min-len 20 --max-len 30 --seed 3 >/dev/null || exit 1
  cl_ini_add data.path="$D/big.bin" data.token_budget=32 data.max_seq_len=32
  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] in ("running", "starting")' 300 coord >/dev/null || { tail -3 "$CL_DIR/coord.log"; exit 1; }
  pid=${CL_PIDS[coord]}
  c0=$(awk '{print $14+$15}' "/proc/$pid/stat")
  sleep "$secs"
  c1=$(awk '{print $14+$15}' "/proc/$pid/stat")
  total=$(cl_json 's["batches"]["total"]')
  period=$(awk -F' *= *' '/^heartbeat_ms/{print $2}' "$CL_INI")
  period=$(( ${period:-500} / 2 > 250 ? 250 : ${period:-500} / 2 ))
  # per query: the coordinator's CPU over the queries, less the idle rate over their wall time
  per_query() {
    local c0 c1 w0 w1 i
    c0=$(awk '{print $14+$15}' "/proc/$pid/stat") w0=$(date +%s.%N)
    for ((i = 0; i < queries; i++)); do "$CL_BIN/dflashctl" -s "$CL_SOCK" --json "$1" >/dev/null || exit 1; done
    c1=$(awk '{print $14+$15}' "/proc/$pid/stat") w1=$(date +%s.%N)
    awk -v c=$((c1 - c0)) -v hz="$hz" -v q="$queries" -v w="$(awk -v a="$w1" -v b="$w0" 'BEGIN{print a-b}')" \
      -v idle=$((c1_idle - c0_idle)) -v s="$secs" 'BEGIN { x = (c / hz - idle / hz * w / s) * 1000 / q; printf "%.2f", x < 0 ? 0 : x }'
  }
  c0_idle=$c0 c1_idle=$c1
  qs=$(per_query status) qb=$(per_query batches)
  awk -v b="$b" -v t="$total" -v c=$((c1 - c0)) -v hz="$hz" -v s="$secs" -v p="$period" -v qs="$qs" -v qb="$qb" \
    'BEGIN { printf "%-28s %10d %12.2f %14.2f %14s %14s\n", b, t, c / hz, (c / hz) * 1000 / (s * 1000 / p), qs, qb }'
  cl_cleanup >/dev/null 2>&1
  rm -rf "$D"
done
