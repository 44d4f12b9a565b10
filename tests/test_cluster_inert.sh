#!/usr/bin/env bash
# test_cluster_inert.sh: samples that train nothing (their loss tokens never two in a row: no
# block can be anchored in them) are left out of the schedule, so no step is ever empty. Such a
# step took no optimizer step and its batch counted as trained at the step before: after a
# checkpoint of that step, the batch was marked done by a checkpoint that had not seen it, and
# every checkpoint from one before it in the run fell short of the ledger. Here a batch holds one
# sample (data.token_budget = max_seq_len) and a checkpoint is written at every step: the
# coordinator names how many it leaves out, the ledger schedules exactly the others, and
# dflash-replay finds every checkpoint of the run as the ledger says (totals and weights).
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

cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit coord 120 || fail "coordinator exited with '$CL_RC'"
for n in target0 drafter0; do
  cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
done
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
echo "ok: $inert of 60 samples left out, $steps steps, $nck checkpoints replayed"
