#!/usr/bin/env bash
# coord_down_kill.sh: two failures at once, the order the soak can produce: the coordinator is
# SIGKILLed; while it is down the drafter group keeps training on what the targets had leased
# and rank 0 writes checkpoints (their CHECKPOINTED and every TRAINED wait in the clients'
# outboxes); then drafter rank 1 is SIGKILLed (its unsent TRAINED die with it) and the
# coordinator is started again. Rank 0 replays its CHECKPOINTED; the run must still train every
# batch exactly once in the surviving lineage: checked against the ledger, the final
# checkpoint's trained sequences/tokens and the drafters' metrics (tests/soak/check_run.py).
# Rank 0 reports every rank's batches ahead of its checkpoints, so rank 1's lost reports do not
# leave batches of a checkpoint unknown to the coordinator (they would be trained twice).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
trap 'cl_cleanup' EXIT
fail() { echo "FAIL: $*"; cl_logs 20; exit 1; }

cl_init "$T/c" 3000 || exit 1
# Checkpoints every 2 steps and deep prefetch: the group trains and checkpoints a while on its own.
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=2 target.prefetch=6 ring.slots=8
cl_start_cluster 2 || fail "cluster start"
cl_wait 's["group"]["active"] and step() >= 40' 60 coord || fail "no training"

cl_kill coord KILL
cl_wait_exit coord 10
head=$(cl_sql 'SELECT value FROM meta WHERE key = "ckpt_step"')
newest=$head
for ((i = 0; i < $(cl_scaled 200); i++)); do
  n=$(ls "$CL_DIR/state/checkpoints" | sort | tail -1)
  newest=$((10#${n#step-}))
  ((newest >= head + 4)) && break
  sleep 0.05
done
cl_log "coordinator down: the ledger's head is step $head, rank 0 has written step $newest since"
((newest > head)) || fail "no checkpoint was written while the coordinator was down (the case this test is for)"
p1=$(cl_pid drafter1)
cl_kill drafter1 KILL
cl_wait_exit drafter1 10
cl_start coord coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running" and not s["recovering"]' 30 coord || fail "the coordinator did not come back"
# The death it did not see is told all the same (dflashctl errors), once
died='[e for e in s["errors"] if e["role"] == "drafter" and e["pid"] == '$p1' and "died while away from this coordinator" in e["message"] and "rank 1 of generation" in e["message"]]'
cl_wait "$died" 30 coord || fail "rank 1's death while the coordinator was down is not among the errors: $(cl_json 's["errors"]')"
cl_log "coordinator back: head step $(cl_json 's["group"]["checkpoint"]["step"]'), generation $(cl_json 's["group"]["generation"]')"
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait_exit coord 300 || fail "coordinator exited '$CL_RC'"
for n in target0 target1 drafter0 drafter1; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
out=$("$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state")
rc=$?
echo "$out"
states=$(cl_ring_states 8)
[[ $states != *WRITING* && $states != *READING* && $states != *READY* ]] || fail "ring at the end: $states"
ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left at the end"
((rc == 0)) || fail "exactly-once check"
n=$(grep -c "drafter-d (pid $p1) died while away from this coordinator" "$CL_DIR/coord.log")
[[ $n == 1 ]] || fail "rank 1's death told $n times: $(grep "died while away" "$CL_DIR/coord.log")"
echo "ok: coordinator and a drafter down together; every batch trained once in the lineage"
