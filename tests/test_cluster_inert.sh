#!/usr/bin/env bash
# test_cluster_inert.sh: samples that train nothing (their loss tokens never two in a row: no
# block can be anchored in them) are left out of the schedule, so no step is ever empty. Such a
# step took no optimizer step and its batch counted as trained at the step before: after a
# checkpoint of that step, the batch was marked done by a checkpoint that had not seen it, and
# every checkpoint from one before it in the run fell short of the ledger. Here a batch holds one
# sample (data.token_budget = max_seq_len) and a checkpoint is written at every step: the
# coordinator names how many it leaves out, the ledger schedules exactly the others, and
# dflash-replay finds every checkpoint of the run as the ledger says (totals and weights). A run
# from before keeps its schedule.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
unset WATCHDOG_PID NOTIFY_SOCKET

CL_MKDATA_ARGS="--inert 0.3 --min-len 40 --max-len 120" cl_init "$T/c" 60 || exit 1
. tests/lib/replay.sh
cl_ini_add data.token_budget=128 drafter.checkpoint_every=1 drafter.keep_checkpoints=0
inert=$("$CL_PY" - "$CL_DIR/data.jsonl" <<'PY'
import json, sys
n = 0
for line in open(sys.argv[1]):
    m = json.loads(line)["loss_mask"][:128]
    n += not any(a and b for a, b in zip(m, m[1:]))
print(n)
PY
)
((inert > 5 && inert < 40)) || fail "the dataset has $inert samples that train nothing of 60: not a mix"

# one target and one drafter train the epoch; every daemon exits 0
run_to_end() {
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_wait_exit coord 120 || fail "coordinator exited with '$CL_RC'"
  local n
  for n in target0 drafter0; do
    cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
  done
}
cl_start_coord || fail "coordinator did not come up"
run_to_end
grep -q ": $inert of 60 samples have no two tokens in the loss in a row within data.max_seq_len (128): nothing in them is trained, they are left out of the schedule" \
  "$CL_DIR"/coord*.log || fail "the coordinator does not say it leaves $inert samples out: $(grep -h 'samples' "$CL_DIR"/coord*.log | head -3)"
scheduled=$(cl_sql 'SELECT sum(n_samples) FROM batches')
[[ $scheduled == $((60 - inert)) ]] || fail "the ledger schedules $scheduled samples, expected $((60 - inert)) of 60"
nb=$(cl_sql 'SELECT count(*) FROM batches')
steps=$(cl_sql 'SELECT count(DISTINCT step) FROM trains WHERE rolled_back = 0')
[[ $steps == "$nb" ]] || fail "$nb batches of one sample each, trained in $steps steps: a step was empty"
nck=$(cl_sql 'SELECT count(*) FROM checkpoints')
cl_log "$inert of 60 samples left out; $nb batches in $steps steps, $nck checkpoints"
for dir in $(cl_sql 'SELECT dir FROM checkpoints ORDER BY step'); do
  s=$((10#${dir##*step-}))
  replay_expect 0 "^dflash-replay: $s steps of generation 1 replayed to .*: PASS$" --checkpoint "$dir"
done

# A run from before samples that train nothing were left out: its ledger's fingerprint is of every
# sample's length, and it has no meta.sched_inert. It goes on with its schedule (said once), and
# dflash-replay finds that schedule too. Here: a new run's ledger made to look so, its batches not
# scheduled yet, run to its end.
cl_sql "SELECT dir FROM checkpoints" >/dev/null
rm -rf "$CL_DIR/state"/* "$CL_DIR/run"/*
cl_start coord coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord || fail "coordinator did not come up again"
cl_kill coord TERM
cl_wait_exit coord 30 || fail "coordinator exited with '$CL_RC'"
mv "$CL_DIR/coord.log" "$CL_DIR/coord-made.log"
every=$("$CL_PY" - "$CL_DIR/data.jsonl" "$CL_DIR/state/$CL_NAME-ledger.db" <<'PY'
import json, sqlite3, sys
meta = dict(sqlite3.connect(sys.argv[2]).execute("SELECT key, value FROM meta"))
lengths = [len(json.loads(line)["input_ids"]) for line in open(sys.argv[1])]
# sched_fingerprint: the schedule's settings, the number of samples, then each sample's length
words = [int(meta[k]) for k in ("data.seed", "data.token_budget", "data.max_seq_len", "data.bucket_width",
                                "ring.max_seqs")]
h = 0xcbf29ce484222325
for w in words + [len(lengths)] + lengths:
    h = ((h ^ w) * 0x100000001b3) & ((1 << 64) - 1)
print("%016x" % h)
PY
)
# (one statement a call: without the sqlite3 tool cl_sql runs them through Python's sqlite3)
for q in "DELETE FROM batches" "DELETE FROM meta WHERE key = 'sched_inert'" \
         "UPDATE meta SET value = '$every' WHERE key = 'fingerprint'"; do
  cl_sql "$q" >/dev/null || fail "cannot edit the ledger: $q"
done
[[ $(cl_sql "SELECT value FROM meta WHERE key = 'fingerprint'") == "$every" ]] || fail "the ledger's fingerprint is not $every"
cl_start_coord || fail "the coordinator refused a run from before samples were left out: $(tail -n 3 "$CL_DIR/coord.log")"
grep -q "a run from before samples that train nothing were left out: its schedule keeps its $inert " "$CL_DIR/coord.log" ||
  fail "the coordinator does not say the run keeps its schedule"
grep -q "left out of the schedule" "$CL_DIR/coord.log" && fail "the coordinator says it leaves samples out"
run_to_end
scheduled=$(cl_sql 'SELECT sum(n_samples) FROM batches')
[[ $scheduled == 60 ]] || fail "the old run's schedule has $scheduled samples, not all 60"
[[ $(cl_sql "SELECT value FROM meta WHERE key = 'sched_inert'") == 0 ]] || fail "meta.sched_inert is not 0"
# dflash-replay takes the schedule (with the key, and without it: a run no new coordinator started);
# the run itself may have an empty step it cannot replay, as runs then had
for pass in key nokey; do
  [[ $pass == nokey ]] && { cl_sql "DELETE FROM meta WHERE key = 'sched_inert'" >/dev/null || fail "cannot edit the ledger"; }
  out=$("$REPLAY" -c "$CL_INI" 2>&1)
  cl_log "dflash-replay ($pass): $out"
  grep -qE ": PASS$|: a step with nothing supervised, not replayable$" <<<"$out" ||
    fail "dflash-replay of the old run ($pass): $out"
done
echo "ok: $inert of 60 samples left out, $steps steps, $nck checkpoints replayed; a run from before keeps its schedule"
