#!/usr/bin/env bash
# test_ckpt_kill.sh: checkpoints are written beside training. With every background write held
# back 3 s (drafter.debug_ckpt_delay_ms):
#  - while rank 0's write of step S2 is pending the group trains on past S2 (rank 0's metrics
#    file), and the coordinator keeps the previous checkpoint S1 as the lineage head until S2 is
#    durable;
#  - rank 0 SIGKILLed with that write in flight: S2 never becomes the head, the group restarts
#    from S1, and the run completes with every batch trained exactly once (tests/soak/check_run.py).
#  - the same with drafter.keep_checkpoints = 1 and rank 1 killed instead: rank 0's write of S2
#    completes after the group ended, and its prune must keep S1, the head the group restarts
#    from (it removed S1: every drafter then failed to load it, over and over).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

# phase NAME VICTIM_RANK [ini settings...]
phase() {
local pname=$1 vrank=$2
shift 2
cl_cleanup
cl_init "$T/$pname" 1200 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=25 drafter.debug_ckpt_delay_ms=3000 ring.slots=8 "$@"
cl_start_cluster 2 || fail "cluster start"
cl_wait 's["group"]["active"] and step() >= 1' 60 coord || fail "no training"

local out victim s1 s2 at head
out=$("$CL_PY" - "$CL_BIN/dflashctl" "$CL_SOCK" "$CL_DIR" "$(cl_scaled 240)" "$(cl_pid drafter0)" "$(cl_pid drafter1)" "$vrank" 2>&1 <<'EOF'
import json, os, re, signal, subprocess, sys, time
ctl, sock, d, secs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
names = {int(sys.argv[5]): "drafter0", int(sys.argv[6]): "drafter1"}
vrank = int(sys.argv[7])
end = time.time() + secs
def status():
    p = subprocess.run([ctl, "-s", sock, "--json", "status"], capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else {"daemons": [], "group": {"checkpoint": {"step": -1}}}
def rank0():
    for x in status()["daemons"]:
        if x["role"] == "drafter" and x.get("alive", True) and x.get("rank") == 0:
            return x
    return None
def text(n):
    return open(os.path.join(d, n + ".log"), errors="replace").read()
started = re.compile(r"checkpoint of step (\d+) \(periodic\): training paused")
written = re.compile(r"step-(\d+) \(periodic, written in")
r0 = None
while time.time() < end and not r0:
    r0 = rank0()
    time.sleep(0.05)
name = names.get(r0["pid"]) if r0 else None
if not name:
    sys.exit("no rank 0 among the drafters")
# S1: the first periodic checkpoint, written and the lineage head
s1 = None
while time.time() < end and s1 is None:
    w = written.findall(text(name))
    s1 = int(w[0]) if w else None
    time.sleep(0.05)
while s1 is not None and time.time() < end and status()["group"]["checkpoint"]["step"] != s1:
    time.sleep(0.05)
if s1 is None:
    sys.exit("no checkpoint written")
# S2: the next one started; the group must train past it before it is written
s2 = None
while time.time() < end and s2 is None:
    st = [int(x) for x in started.findall(text(name)) if int(x) > s1]
    s2 = st[0] if st else None
    time.sleep(0.02)
if s2 is None:
    sys.exit("no second checkpoint started")
while time.time() < end:
    s = status()
    if s2 in [int(x) for x in written.findall(text(name))]:
        sys.exit("step %d was written before the group trained past it: training waited for the write" % s2)
    steps = [0]
    for ln in open(os.path.join(d, "state", "metrics-rank0.jsonl"), errors="replace"):
        try:
            steps.append(json.loads(ln)["step"])
        except ValueError:
            pass    # a line being written
    if max(steps) > s2:
        head = s["group"]["checkpoint"]["step"]
        if head != s1:
            sys.exit("the head is step %d while step %d is being written (want %d)" % (head, s2, s1))
        vpid = r0["pid"] if vrank == 0 else [p for p in names if p != r0["pid"]][0]
        os.kill(vpid, signal.SIGKILL)
        print("%s %d %d %d" % (names[vpid], s1, s2, max(steps)))
        sys.exit(0)
    time.sleep(0.02)
sys.exit("timed out")
EOF
) || fail "the pending-write window: $out"
read -r victim s1 s2 at <<<"$out"
cl_log "$victim (rank $vrank) killed at step $at with the write of step $s2 pending; head step $s1"
cl_wait_exit "$victim" 10
if ((vrank == 0)); then
  cl_never "$CL_DIR/$victim.log" ", written in " "step-$(printf %010d "$s2") (periodic, written" "step $s2 was written after all"
fi
cl_wait 'not s["group"]["active"]' 60 coord || fail "the group did not end"
head=$(cl_json 's["group"]["checkpoint"]["step"]')
[[ $head == "$s1" ]] || fail "lineage head is step $head after the kill, want $s1"
cl_start "$victim" drafter-d -c "$CL_INI" -i "${victim#drafter}"
cl_wait 's["group"]["generation"] >= 2 and s["group"]["active"]' 60 coord || fail "the group did not restart"
cl_wait_exit coord 300 || fail "coordinator exited '$CL_RC'"
for n in target0 target1 drafter0 drafter1; do
  cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
done
grep -q 'run complete: every batch checkpointed' "$CL_DIR/coord.log" || fail "the run did not complete"
grep -q "loaded checkpoint .*step-$(printf %010d "$s1")" "$CL_DIR"/drafter*.log || fail "no drafter loaded step $s1"
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" || fail "exactly-once check"
echo "ok ($pname): step $s2 pending while the group trained to step $at; rank $vrank killed; resumed from step $s1; every batch once"
}

phase rank0 0
phase keep1 1 drafter.keep_checkpoints=1
