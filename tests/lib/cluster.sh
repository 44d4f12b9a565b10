# cluster.sh: helpers for tests (and the demo) that run a dflash cluster of real processes on
# the CPU backend: a tiny random target model, a structured dataset, a private config, runtime
# and state dir, start/stop of daemons by pid, and polling of `dflashctl status --json`.
# Source it, then:
#   cl_init DIR [SAMPLES]     model + dataset + DIR/dflash.ini (cluster name unique per process);
#                             CL_VOCAB, CL_MKMODEL_ARGS, CL_MKDATA_ARGS change the model and data
#   cl_ini_add 'section.key=value'...  set keys in DIR/dflash.ini (before starting)
#   cl_start NAME ARGS...     start BIN/ARGS[0] with the rest, log to DIR/NAME.log, remember its pid
#   cl_pid NAME / cl_alive NAME / cl_kill NAME SIG / cl_wait_exit NAME SECS (exit code in CL_RC)
#   cl_status                 DIR/status.json from dflashctl (returns non-zero when unreachable)
#   cl_json 'PYEXPR'          evaluate a Python expression over s = status.json and print it
#   cl_wait 'PYEXPR' SECS     poll the status until the expression is true
#   cl_ring_hold / cl_ring_states NSLOTS   keep the ring open (fd 9), print every slot's state
#   cl_sql 'SQL'              query the ledger with sqlite3
#   cl_hb_lost PROG           the coordinator's "left: no heartbeat" lines for daemons of PROG (e.g. target-d)
#   cl_never FILE SRC PAT MSG fail when FILE has a line matching PAT (SRC: its text in the source)
#   cl_cleanup                kill what is left, remove the ring / collective shm objects
# Needs: python3 (sqlite3 shell optional); DFLASH_BUILD (the build dir) and DFLASH_SRC (the source tree).

CL_SRC=${DFLASH_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
CL_BIN=${DFLASH_BUILD:-$CL_SRC/build}/bin
CL_DIR= CL_NAME= CL_INI= CL_SOCK=
# The system interpreter: a version-manager shim in PATH can take seconds to start.
CL_PY=$(command -v /usr/bin/python3 || command -v python3)
# Sanitizer phases run slower: every timeout here is multiplied by this (tools/check.sh sets it).
CL_SCALE=${DFLASH_TEST_TIME_SCALE:-1}
cl_scaled() { awk -v s="$1" -v k="$CL_SCALE" 'BEGIN { printf "%d", s * k + 0.5 }'; }
declare -A CL_PIDS=()

cl_log() { printf '[%6.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="${CL_T0:-0}" 'BEGIN { print a - b }')" "$*"; }

cl_init() {
  CL_DIR=$1
  local samples=${2:-400}
  CL_T0=$(date +%s.%N)
  CL_NAME=t$$x$RANDOM
  CL_INI=$CL_DIR/dflash.ini
  CL_SOCK=$CL_DIR/run/$CL_NAME.sock
  mkdir -p "$CL_DIR/run" "$CL_DIR/state"
  local b
  for b in coordinator-d target-d drafter-d dflashctl dflash-data; do
    [[ -x $CL_BIN/$b ]] || { echo "missing $CL_BIN/$b (build first)"; return 1; }
  done
  local vocab=${CL_VOCAB:-256}
  # shellcheck disable=SC2086  # the *_ARGS are word lists
  "$CL_PY" "$CL_SRC/tools/mkmodel.py" "$CL_DIR/model" --vocab "$vocab" ${CL_MKMODEL_ARGS:-} >/dev/null || return 1
  # shellcheck disable=SC2086
  "$CL_PY" "$CL_SRC/tools/mkdata.py" -n "$samples" --vocab "$vocab" ${CL_MKDATA_ARGS:-} -o "$CL_DIR/data.jsonl" || return 1
  "$CL_BIN/dflash-data" build -o "$CL_DIR/data.bin" -v "$vocab" "$CL_DIR/data.jsonl" >/dev/null || return 1
  cat >"$CL_INI" <<EOF
# test cluster $CL_NAME
[cluster]
name = $CL_NAME
runtime_dir = $CL_DIR/run
state_dir = $CL_DIR/state
log_level = info

[ring]
slots = 4
max_tokens = 512
max_seqs = 32

[model]
path = $CL_DIR/model
capture_layers = 1,2
draft_layers = 1

[data]
path = $CL_DIR/data.bin
token_budget = 256
max_seq_len = 128
bucket_width = 32
epochs = 1

[coordinator]
heartbeat_ms = 200
dead_after_ms = 3000
recovery_ms = 1000
# pause below 16 MiB free (the default 1 GiB would pause tests on a nearly full disk)
min_free_mb = 16

[target]
prefetch = 2
devices = 4

[drafter]
world_size = 1
block_size = 4
num_anchors = 16
lr = 3e-3
warmup_steps = 10
checkpoint_every = 25
ready_timeout_ms = 100
devices = 4
keep_checkpoints = 0
EOF
}

# Set section.key=value in the ini (the key must already be there, in its section).
cl_ini_add() {
  local kv sec key val
  for kv in "$@"; do
    sec=${kv%%.*}; key=${kv#*.}; key=${key%%=*}; val=${kv#*=}
    "$CL_PY" - "$CL_INI" "$sec" "$key" "$val" <<'EOF'
import sys
path, sec, key, val = sys.argv[1:]
lines = open(path).read().split("\n")
cur, done = None, False
for i, l in enumerate(lines):
    s = l.strip()
    if s.startswith("["):
        if cur == sec and not done:
            lines.insert(i, "%s = %s" % (key, val)); done = True; break
        cur = s.strip("[]")
    elif cur == sec and s.split("=")[0].strip() == key:
        lines[i] = "%s = %s" % (key, val); done = True; break
if not done:
    if cur != sec:
        lines.append("[%s]" % sec)
    lines.append("%s = %s" % (key, val))
open(path, "w").write("\n".join(lines))
EOF
  done
}

cl_start() {
  local name=$1; shift
  local bin=$1; shift
  "$CL_BIN/$bin" "$@" >>"$CL_DIR/$name.log" 2>&1 &
  CL_PIDS[$name]=$!
}

# cl_wait_log FILE REGEX SECS: wait (scaled) until FILE has a line matching REGEX (grep -E).
cl_wait_log() {
  local i n
  n=$(( $(cl_scaled "$3") * 10 ))
  for ((i = 0; i < n; i++)); do
    grep -Eq -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  grep -Eq -- "$2" "$1" 2>/dev/null
}
cl_pid() { echo "${CL_PIDS[$1]:-}"; }
cl_alive() { local p=${CL_PIDS[$1]:-}; [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }
cl_kill() { local p=${CL_PIDS[$1]:-}; [[ -n $p ]] && kill -"$2" "$p" 2>/dev/null; }

# Wait for NAME to exit (at most SECS); sets CL_RC to its exit code, or "timeout".
# (Not in $(...): only the shell that started a process can wait for it.)
cl_wait_exit() {
  local name=$1 secs p=${CL_PIDS[$1]:-} i
  secs=$(cl_scaled "$2")
  CL_RC=none
  [[ -n $p ]] || return 1
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$p" 2>/dev/null; then CL_RC=timeout; return 1; fi
  wait "$p"
  CL_RC=$?
  unset "CL_PIDS[$name]"
  [[ $CL_RC == 0 ]]
}

cl_status() {
  "$CL_BIN/dflashctl" -s "$CL_SOCK" --json status >"$CL_DIR/status.json.tmp" 2>/dev/null &&
    mv "$CL_DIR/status.json.tmp" "$CL_DIR/status.json"
}

cl_json() {
  "$CL_PY" - "$CL_DIR/status.json" "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
def drafters(): return [d for d in s["daemons"] if d["role"] == "drafter" and d.get("alive", True)]
def targets(): return [d for d in s["daemons"] if d["role"] == "target" and d.get("alive", True)]
def step(): return max([d.get("step", 0) for d in drafters()] or [0])
print(eval(sys.argv[2]))
EOF
}

# cl_wait EXPR SECS [NAME]: gives up early when process NAME (e.g. coord) has exited.
# One Python process polls (every 50 ms) so waiting costs little CPU on a busy machine.
cl_wait() {
  local watch=${3:-} wpid=0
  [[ -n $watch ]] && wpid=${CL_PIDS[$watch]:-0}
  "$CL_PY" - "$CL_BIN/dflashctl" "$CL_SOCK" "$CL_DIR/status.json" "$1" "$(cl_scaled "$2")" "$wpid" <<'EOF2'
import json, os, re, subprocess, sys, time
ctl, sock, out, expr, secs, wpid = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
def drafters(): return [d for d in s["daemons"] if d["role"] == "drafter" and d.get("alive", True)]
def targets(): return [d for d in s["daemons"] if d["role"] == "target" and d.get("alive", True)]
def step(): return max([d.get("step", 0) for d in drafters()] or [0])
end, s = time.time() + secs, None
while time.time() < end:
    if wpid:
        try:
            os.kill(wpid, 0)
            st = open("/proc/%d/stat" % wpid).read().split(")")[-1].split()[0]
            if st == "Z":
                raise ProcessLookupError
        except ProcessLookupError:
            print("pid %d exited while waiting for: %s" % (wpid, expr)); sys.exit(1)
    p = subprocess.run([ctl, "-s", sock, "--json", "status"], capture_output=True, text=True)
    if p.returncode == 0:
        try:
            s = json.loads(p.stdout)
        except ValueError:
            s = None
        if s is not None:
            open(out, "w").write(p.stdout)
            try:
                if eval(expr):
                    sys.exit(0)
            except (KeyError, IndexError, TypeError):
                pass
    time.sleep(0.05)
print("timeout after %gs waiting for: %s" % (secs, expr))
if s is not None:
    print(json.dumps({k: s[k] for k in ("state", "batches", "ring", "daemons") if k in s}, indent=1)[:3000])
sys.exit(1)
EOF2
}

# Keep the ring's shm object open (fd 9) so its slots can be read after the coordinator
# unlinked it; cl_ring_states prints each slot's state. Layout (ipc/ring.h): 64-byte slot
# control blocks from offset 4096, the 64-bit control word first, state in its low 2 bits.
cl_ring_hold() {
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -e /dev/shm/dflash-$CL_NAME ]] && { exec 9</dev/shm/dflash-"$CL_NAME"; return 0; }
    sleep 0.1
  done
  return 1
}

# cl_start_cluster [N]: coordinator (up and running, its ring held), then N targets and N drafters
# (instances 0..N-1). Says what failed and returns 1.
# A test script's set-up (after sourcing this file): T, the test's scratch dir (DFLASH_TEST_TMP or a
# new temp dir); cl_cleanup on exit, after the command in $1 if given (e.g. a SIGCONT to a daemon
# the test stopped); fail MSG: says FAIL, shows the daemons' log tails and exits 1.
# cl_private_mounts "$0" "$@": first thing in a test that mounts (a tmpfs): the script runs again
# in a private mount namespace, its mounts its own and gone with it; exit 77 where none can be made.
cl_private_mounts() {
  [[ -n ${DFLASH_IN_MOUNT_NS:-} ]] && return 0
  if ! unshare -m --propagation private true 2>/dev/null; then
    echo "SKIP: cannot make a private mount namespace (unshare -m needs root or CAP_SYS_ADMIN)"
    exit 77
  fi
  DFLASH_IN_MOUNT_NS=1 exec unshare -m --propagation private "$@"
}

cl_test_init() {
  T=${DFLASH_TEST_TMP:-$(mktemp -d)}
  CL_SCAN_DIR=$T      # cl_cleanup looks for sanitizer reports in every log under it
  # shellcheck disable=SC2064  # $1 is expanded now, on purpose
  trap "${1:+$1; }cl_cleanup" EXIT
  fail() { echo "FAIL: $*"; cl_logs 20; exit 1; }
}

# cl_never FILE SRC PATTERN MSG: fail with MSG (and the line) when FILE has a line matching the
# grep PATTERN. SRC is a fixed piece of that line as the source prints it, checked to be there
# first: a reworded message fails the test instead of letting it pass unseen.
cl_never() {
  grep -rqF -- "$2" "$CL_SRC"/daemons "$CL_SRC"/ipc "$CL_SRC"/model "$CL_SRC"/common ||
    fail "no daemon prints '$2' any more: the check for '$3' would pass unseen"
  [[ -r $1 ]] || fail "$1 is not there to look for '$3' in: the check would pass unseen"
  if grep -q -- "$3" "$1"; then fail "$4: $(grep -m1 -- "$3" "$1")"; fi
  return 0
}

# Start the coordinator and wait (30 s, scaled) until it runs.
cl_start_coord() {
  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] == "running"' 30 coord
}

# Start target0 and wait (30 s) until the ring's 4 slots are all READY; 1 if they are not.
cl_fill_ring() {
  local i
  cl_start target0 target-d -c "$CL_INI" -i 0
  for ((i = 0; i < 300; i++)); do
    [[ $(cl_ring_states 4) == "READY READY READY READY" ]] && return 0
    sleep 0.1
  done
  return 1
}

cl_start_cluster() {
  local n=${1:-2} i
  cl_start_coord || { echo "coordinator did not come up"; return 1; }
  cl_ring_hold || { echo "no ring"; return 1; }
  for ((i = 0; i < n; i++)); do
    cl_start target$i target-d -c "$CL_INI" -i $i
    cl_start drafter$i drafter-d -c "$CL_INI" -i $i
  done
}

cl_ring_states() {
  "$CL_PY" - "$1" <<'EOF2'
import os, struct, sys
names = ["FREE", "WRITING", "READY", "READING"]
words = [struct.unpack("<Q", os.pread(9, 8, 4096 + 64 * i))[0] for i in range(int(sys.argv[1]))]
print(" ".join(names[w & 3] for w in words))
EOF2
}

# Rows as the sqlite3 shell prints them ('|' between columns); Python's sqlite3 where the shell
# is missing (some GPU hosts have none).
cl_sql() {
  if command -v sqlite3 >/dev/null; then
    sqlite3 -batch -noheader "$CL_DIR/state/$CL_NAME-ledger.db" "$1"
  else
    "$CL_PY" - "$CL_DIR/state/$CL_NAME-ledger.db" "$1" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for row in db.execute(sys.argv[2]):
    print("|".join("" if v is None else str(v) for v in row))
db.commit()     # (a write kept, as the sqlite3 tool keeps it)
EOF
  fi
}

# cl_hb_lost PROG: print the lines where the coordinator took a daemon of PROG (target-d,
# drafter-d) for dead for want of heartbeats; returns 0 if there is one.
cl_hb_lost() {
  grep -E "^(<[0-9]>)?coordinator-d: $1@[0-9]+ \(pid [0-9]+, member [0-9]+\) left: no heartbeat" "$CL_DIR"/coord*.log
}

cl_cleanup() {
  local n p
  for n in "${!CL_PIDS[@]}"; do
    p=${CL_PIDS[$n]}
    kill -CONT "$p" 2>/dev/null
    kill -TERM "$p" 2>/dev/null
  done
  sleep 0.5
  for n in "${!CL_PIDS[@]}"; do
    p=${CL_PIDS[$n]}
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
  done
  CL_PIDS=()
  [[ -n $CL_NAME ]] && rm -f /dev/shm/dflash-"$CL_NAME" /dev/shm/dflash-"$CL_NAME"-* 2>/dev/null
  # A sanitizer build's report from any daemon the test ran, also one at an exit it did not look
  # at (a leak, undefined behaviour on the way out), fails the test (the logs of every cluster of
  # a cl_test_init test, else of the last cluster made).
  local san='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer'
  local dir=${CL_SCAN_DIR:-${CL_DIR:-}}
  if [[ -n $dir && -d $dir ]] && grep -rqE --include='*.log' "$san" "$dir" 2>/dev/null; then
    echo "FAIL: sanitizer reports in the daemon logs:"
    grep -rE -m 3 --include='*.log' "$san" "$dir" | cut -c1-300
    exit 1
  fi
  return 0
}

# Print the tail of every daemon log (on failure).
cl_logs() {
  local f
  for f in "$CL_DIR"/*.log; do
    echo "---- $f"
    grep -v '^[a-z_]*\.[a-z_]* = \|^#' "$f" | tail -n "${1:-15}"
  done
}
