#!/usr/bin/env bash
# hotpath_syscalls.sh: the system calls target-d and drafter-d make per batch on the CPU backend.
# The same cluster (1 target, 1 drafter, checkpoints only at the end) runs an epoch of about 100
# batches and one of about 400, each daemon under `strace -f -c`; the difference of the counts over
# the difference of the batches is the per-batch cost, with the startup's calls taken out. Prints a
# table per daemon: calls per batch by system call, and the total.
# Usage: bench/hotpath_syscalls.sh (needs strace; the build in DFLASH_BUILD, default build/).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)"; exit 1; }
T=$(mktemp -d)
trap 'cl_cleanup; rm -rf "$T"' EXIT

run() {   # NAME SAMPLES: prints the batches checkpointed
  local name=$1 samples=$2
  cl_init "$T/$name" "$samples" >/dev/null || exit 1
  cl_ini_add drafter.checkpoint_every=100000
  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] == "running"' 30 || { echo "$name: no coordinator" >&2; exit 1; }
  strace -f -c -o "$T/$name/target.strace" "$CL_BIN/target-d" -c "$CL_INI" -i 0 >"$CL_DIR/target0.log" 2>&1 &
  local tp=$!
  strace -f -c -o "$T/$name/drafter.strace" "$CL_BIN/drafter-d" -c "$CL_INI" -i 0 >"$CL_DIR/drafter0.log" 2>&1 &
  local dp=$!
  wait $tp $dp
  cl_wait_exit coord 60 || { echo "$name: coordinator exited with '$CL_RC'" >&2; exit 1; }
  cl_sql 'SELECT count(*) FROM batches WHERE state = 4'
  CL_PIDS=()
}
small=$(run small 400)
large=$(run large 1600)
echo "epochs of $small and $large batches ($(date -u +%F), $(nproc) cores, $(uname -r))"
for d in target drafter; do
  "$CL_PY" - "$T/small/$d.strace" "$T/large/$d.strace" "$((large - small))" "$d" <<'PY'
import sys
def load(path):
    calls = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[-1] != "total" and f[0].replace(".", "").isdigit():
            calls[f[-1]] = int(f[3])      # % time, seconds, usecs/call, calls, [errors], syscall
    return calls
a, b = load(sys.argv[1]), load(sys.argv[2])
n, name = int(sys.argv[3]), sys.argv[4]
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / n, k) for k in set(a) | set(b))
rows = [(v, k) for v, k in reversed(rows) if abs(v) >= 0.05]
print("%-8s %-16s %8s" % (name, "syscall", "/batch"))
for v, k in rows:
    print("%-8s %-16s %8.2f" % ("", k, v))
print("%-8s %-16s %8.2f" % ("", "total", sum(v for v, _ in rows)))
PY
done
