#!/usr/bin/env bash
# nan.sh target|drafter: NaN injection into a running cluster (coordinator + 2 targets + a
# 2-rank drafter group, plain processes, CPU backend).
#   target:  both targets run with -o target.debug_nan_batch=B: the captured states of batch B
#            are poisoned; the drafter that trains it sees a non-finite loss;
#   drafter: drafter 1 runs with -o drafter.debug_nan_step=N: its loss at step N is NaN.
# Checks: the step that meets the NaN is skipped on both ranks and reported (the error names
# the batch / step), the cluster pauses with that reason in `dflashctl status` and in the
# coordinator's sd_notify STATUS (NOTIFY_SOCKET points at tests/soak/notify_listen.py), stays
# paused, no checkpoint is written from that state (none at or after the NaN step; a stop in
# that state writes none); then the cause is removed (the daemon restarted with the key at -1),
# `dflashctl resume` and the run completes: every batch trained exactly once in the lineage
# (tests/soak/check_run.py), the ring ends FREE, nothing left in /dev/shm, no socket left.
# The batches of the skipped step (the poisoned one and every other rank's) are handed back
# (SKIPPED from the drafter) and published again after the resume. In target mode the resume
# happens while the drafters are away (stopped, the coordinator killed and started again: it
# comes back paused): they learn of it from the WELCOME of their reconnect (its count of the
# operator's resumes) and checkpoint again, else the final drain would wait for them forever.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
mode=${1:?usage: nan.sh target|drafter}
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
LP=
trap '[[ -n $LP ]] && kill $LP 2>/dev/null; cl_cleanup' EXIT
fail() { echo "FAIL ($mode): $*"; cl_logs 20; exit 1; }
ctl() { "$CL_BIN/dflashctl" -s "$CL_SOCK" "$@"; }
san_check() {
  ! grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:\|WARNING: ThreadSanitizer" "$CL_DIR"/*.log ||
    fail "sanitizer reports in the daemon logs"
}

cl_init "$T/c" 2000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=10
D=$CL_DIR

# The coordinator's sd_notify messages, as systemd would receive them.
"$CL_PY" tests/soak/notify_listen.py "$D/notify.sock" "$D/notify.log" & LP=$!
cl_wait_log "$D/notify.log" LISTENING 5 || true
export NOTIFY_SOCKET=$D/notify.sock
cl_start coord coordinator-d -c "$CL_INI"
unset NOTIFY_SOCKET
cl_wait 's["state"] == "running"' 30 coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')

BAD_BATCH=120 BAD_STEP=45
t_opt=() d1_opt=()
[[ $mode == target ]] && t_opt=(-o target.debug_nan_batch=$BAD_BATCH)
[[ $mode == drafter ]] && d1_opt=(-o drafter.debug_nan_step=$BAD_STEP)
for i in 0 1; do cl_start target$i target-d -c "$CL_INI" -i $i "${t_opt[@]}"; done
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1 "${d1_opt[@]}"

# ---- detection: the step is skipped and reported, the cluster pauses -----------------------
cl_wait 's["state"] == "paused"' 120 coord || fail "the cluster did not pause"
reason=$(cl_json 's["reason"]')
cl_log "paused: $reason"
if [[ $mode == target ]]; then
  [[ $reason =~ drafter-d@[01]:\ batch\ 0:$BAD_BATCH\ at\ step\ ([0-9]+):\ loss\ is\ not\ finite ]] ||
    fail "pause reason does not name batch $BAD_BATCH: $reason"
  nan_step=${BASH_REMATCH[1]}
  grep -q "poisoning batch 0:$BAD_BATCH with NaN" "$D"/target[01].log || fail "no target poisoned batch $BAD_BATCH"
else
  [[ $reason =~ drafter-d@1:\ batch\ ([0-9]+:[0-9]+)\ at\ step\ $BAD_STEP:\ loss\ is\ not\ finite ]] ||
    fail "pause reason does not name drafter 1 at step $BAD_STEP: $reason"
  nan_step=$BAD_STEP
fi
[[ $(cl_json '[e for e in s["errors"] if "loss is not finite" in e["message"] and not e["fatal"]] != []') == True ]] ||
  fail "the error is not in dflashctl status: $(cl_json 's["errors"]')"
# systemd's view: the coordinator's STATUS= carries the state and the reason.
grep -q "^STATUS=paused: .*loss is not finite" "$D/notify.log" || fail "no STATUS=paused line: $(grep STATUS= "$D/notify.log" | tail -3)"
ctl status | grep -q "paused.*loss is not finite" || fail "dflashctl status (table) does not show the reason"
# The NaN step itself was skipped: its number is trained later by another batch, never with a
# non-finite loss, and the poisoned batch has no training row (it was never applied).
"$CL_PY" - "$D/state" "$nan_step" "$mode" "$BAD_BATCH" <<'EOF' || fail "metrics at the pause"
import glob, json, math, sys
state, step, mode, bad = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rows = [json.loads(l) for p in glob.glob(state + "/metrics-rank*.jsonl") for l in open(p)]
assert all(math.isfinite(r["loss"]) for r in rows), "a non-finite loss in the metrics"
assert mode != "target" or not [r for r in rows if r["batch"] == bad], "the poisoned batch was trained"
before = [r for r in rows if r["step"] == step - 1]
assert before, "no step %d before the NaN step" % (step - 1)
print("metrics: %d steps, %d of them after the skipped step %d before the pause reached the drafters" %
      (len({r["step"] for r in rows}), len({r["step"] for r in rows if r["step"] >= step}), step))
EOF
grep -q "the loss is not finite: step skipped" "$D"/drafter[01].log || fail "no drafter logged the skipped step"
cl_log "NaN at step $nan_step detected and reported"

# ---- paused: nothing moves, no checkpoint from the poisoned state ---------------------------
# The steps the drafters took before the pause reached them reach the status with their next
# heartbeat: let it catch up with the metrics files before watching that nothing moves.
last=$("$CL_PY" -c 'import glob, json, sys; print(max([json.loads(l)["step"] for p in glob.glob(sys.argv[1] + "/metrics-rank*.jsonl") for l in open(p)] or [0]))' "$D/state")
cl_wait "step() >= $last" 10 coord || fail "the status never showed step $last (shows $(cl_json 'step()'))"
cl_status || fail "dflashctl status"
s0=$(cl_json 'step()') p0=$(cl_json 's["ring"]["published"]')
sleep 2    # a pause must hold: look again after a while
cl_status || fail "dflashctl status"
[[ $(cl_json 's["state"]') == paused ]] || fail "the pause did not hold"
[[ $(cl_json 'step()') == "$s0" && $(cl_json 's["ring"]["published"]') == "$p0" ]] ||
  fail "training went on while paused (step $s0 -> $(cl_json 'step()'), published $p0 -> $(cl_json 's["ring"]["published"]'))"
no_ckpt_after() {
  local c
  c=$(cl_sql "SELECT count(*) FROM checkpoints WHERE step >= $nan_step")
  [[ $c == 0 ]] || fail "$c checkpoints of step >= $nan_step in the ledger ($1)"
  for c in "$D"/state/checkpoints/step-*; do
    [[ -e $c ]] || continue
    ((10#${c##*step-} < nan_step)) || fail "checkpoint $c written from the poisoned state ($1)"
  done
}
no_ckpt_after "while paused"

# ---- remove the cause, resume -----------------------------------------------------------------
if [[ $mode == target ]]; then
  for i in 0 1; do
    cl_kill target$i TERM
    cl_wait_exit target$i 30 || fail "target $i exited '$CL_RC' on SIGTERM while paused"
    cl_start target$i target-d -c "$CL_INI" -i $i -o target.debug_nan_batch=-1
  done
  cl_kill drafter0 STOP
  cl_kill drafter1 STOP
  cl_kill coord KILL
  cl_wait_exit coord 10
  export NOTIFY_SOCKET=$D/notify.sock
  cl_start coord coordinator-d -c "$CL_INI"
  unset NOTIFY_SOCKET
  cl_wait 's["state"] == "paused"' 30 coord || fail "the coordinator did not come back paused"
else
  # A stop in the poisoned state asks for a final checkpoint: none may be written.
  cl_kill drafter1 TERM
  cl_wait_exit drafter1 30 || fail "drafter 1 exited '$CL_RC' on SIGTERM while paused"
  grep -q "no checkpoint (a rank is stopping): a non-finite loss was seen" "$D/drafter0.log" ||
    fail "rank 0 did not refuse the stop checkpoint"
  no_ckpt_after "after a stop"
  cl_start drafter1 drafter-d -c "$CL_INI" -i 1 -o drafter.debug_nan_step=-1
  cl_wait 's["group"]["active"] and s["group"]["generation"] == 2' 60 coord || fail "the group did not re-form"
  ck=$(cl_json 's["group"]["checkpoint"]["step"]')
  ((ck < nan_step)) || fail "the group restarts from step $ck, after the NaN step $nan_step"
fi
cl_wait '[t for t in targets() if t["gpu"] == 0] and [t for t in targets() if t["gpu"] == 1]' 30 coord ||
  fail "targets not back"
[[ $(cl_json 's["state"]') == paused ]] || fail "restarting a daemon ended the pause"
ctl resume || fail "dflashctl resume"
cl_wait 's["state"] == "running"' 10 coord || fail "not running after resume"
grep -q "^STATUS=running" <(sed -n '/^STATUS=paused/,$p' "$D/notify.log") || fail "no STATUS=running after the pause"
cl_log "resumed"
if [[ $mode == target ]]; then
  cl_kill drafter0 CONT
  cl_kill drafter1 CONT
  for n in drafter0 drafter1; do
    cl_wait_log "$D/$n.log" "resumed after the non-finite loss" 10 || fail "$n did not learn of the resume on its reconnect"
  done
  cl_log "the drafters, away during the resume, learned of it on their reconnect"
fi

# ---- the run completes ------------------------------------------------------------------------
# Done (the coordinator leaves), or stuck: nothing left to lease, nothing in the ring, yet
# batches PUBLISHED (the batches of the skipped step were not handed back: fail at once).
stuck='s["batches"]["pending"] == 0 and s["batches"]["leased"] == 0 and s["batches"]["published"] > 0 and s["ring"]["ready"] + s["ring"]["reading"] + s["ring"]["writing"] == 0'
if cl_wait "$stuck" 300 coord; then
  sleep 3
  if cl_status && [[ $(cl_json "$stuck") == True ]]; then
    san_check
    fail "stuck after resume: batches $(cl_sql 'SELECT epoch || ":" || idx FROM batches WHERE state = 2' | tr '\n' ' ')are PUBLISHED but in no ring slot (the skipped step's batches were not re-queued): $(cl_json 's["batches"]')"
  fi
fi
cl_wait_exit coord 300 || fail "the coordinator exited '$CL_RC' ($(cl_json 's["batches"]' 2>/dev/null))"
for n in target0 target1 drafter0 drafter1; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
"$CL_PY" tests/soak/check_run.py "$D/state/$CL_NAME-ledger.db" "$D/state" || fail "exactly-once check"
[[ $(cl_sql 'SELECT value FROM meta WHERE key = "reason"') == *"run complete"* ]] || fail "the run did not complete"
if [[ $mode == target ]]; then
  row=$(cl_sql "SELECT gen || ' ' || step FROM trains WHERE batch = $BAD_BATCH AND rolled_back = 0")
  [[ -n $row ]] || fail "batch $BAD_BATCH never trained after the resume"
  cl_log "batch $BAD_BATCH trained after the resume (generation/step $row)"
fi
states=$(cl_ring_states 4)
[[ $states == "FREE FREE FREE FREE" ]] || fail "ring at the end: $states"
ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left at the end"
[[ -n $(find "$D/run" -type s) ]] && fail "sockets left: $(find "$D/run" -type s)"
san_check
echo "ok ($mode): NaN at step $nan_step skipped, reported, paused, no checkpoint from it; resumed; $total batches each trained once"
