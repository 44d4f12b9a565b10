#!/usr/bin/env bash
# test_cluster_wide.sh: the production shape on the CPU backend, 5 targets feeding a 3-rank
# drafter group through an 8-slot ring, for one epoch. While it trains, one target is SIGKILLed
# and started again, then one drafter (the group forms anew with three ranks, from the last
# checkpoint). Then: the run completes by itself, every daemon exits 0; every batch of the epoch is
# trained exactly once in the surviving lineage and the three replicas hold the same parameters
# at every checkpoint-due step (tests/soak/check_run.py); each generation's ranks schedule the
# learning rate over a third of the epoch; all five targets published while it ran; the ring ends FREE and
# nothing of the cluster is left in /dev/shm or the runtime dir (its
# stop note and lock file aside).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

TARGETS=5 WORLD=3
cl_init "$T/c" 15000 || exit 1
cl_ini_add target.devices=8 ring.slots=8 drafter.world_size=$WORLD drafter.checkpoint_every=20 drafter.keep_checkpoints=0 \
  drafter.min_ready=$WORLD drafter.ready_timeout_ms=300
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')
for ((i = 0; i < TARGETS; i++)); do cl_start target$i target-d -c "$CL_INI" -i $i; done
for ((i = 0; i < WORLD; i++)); do cl_start drafter$i drafter-d -c "$CL_INI" -i $i; done
cl_log "$TARGETS targets, $WORLD drafters, $total batches"

cl_wait 's["group"]["active"] and s["group"]["ranks_connected"] == '$WORLD' and step() >= 30' 120 ||
  fail "the 3-rank group did not train: $(cl_json 's["group"]')"
cl_wait 'len([d for d in s["daemons"] if d["role"] == "target" and d.get("alive") and d.get("published", 0) > 0]) == '$TARGETS 60 ||
  fail "not every target publishes: $(cl_json '[(d["gpu"], d.get("published")) for d in s["daemons"] if d["role"] == "target"]')"

# a target dies mid-batch and comes back
cl_kill target3 KILL
cl_wait_exit target3 10
cl_start target3 target-d -c "$CL_INI" -i 3
gen=$(cl_json 's["group"]["generation"]')
# a drafter dies: the group forms again with three ranks once it is back
cl_wait 's["batches"]["checkpointed"] > 0' 60 || fail "no checkpoint before the drafter kill"
cl_kill drafter1 KILL
cl_wait_exit drafter1 10
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] > '$gen' and s["group"]["ranks_connected"] == '$WORLD 120 ||
  fail "the group did not form again with $WORLD ranks: $(cl_json 's["group"]')"
cl_log "group generation $(cl_json 's["group"]["generation"]') formed after the drafter kill"

cl_wait_exit coord 300 || fail "the run did not complete: coordinator '$CL_RC'"
for ((i = 0; i < TARGETS; i++)); do cl_wait_exit target$i 30 || fail "target$i exited with '$CL_RC'"; done
for ((i = 0; i < WORLD; i++)); do cl_wait_exit drafter$i 30 || fail "drafter$i exited with '$CL_RC'"; done
grep -q "run complete" "$CL_DIR/coord.log" || fail "the coordinator did not end with the run complete"

"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" --min-hashed=3 ||
  fail "exactly-once / replica check"
gens=$(cl_sql 'SELECT count(DISTINCT gen) FROM checkpoints')
((gens >= 2)) || fail "checkpoints of $gens generation(s), wanted 2 or more"
# every rank of every generation: the lr over ceil(total / 3) steps
horizon=$(((total + WORLD - 1) / WORLD))
for ((i = 0; i < WORLD; i++)); do
  bad=$(grep "lr horizon" "$CL_DIR/drafter$i.log" | grep -v "lr horizon $horizon steps")
  [[ -z $bad ]] && grep -q "lr horizon" "$CL_DIR/drafter$i.log" ||
    fail "drafter$i: not the lr horizon of $total batches over $WORLD ranks: $(grep "lr horizon" "$CL_DIR/drafter$i.log")"
done
[[ $(cl_ring_states 8) == "FREE FREE FREE FREE FREE FREE FREE FREE" ]] || fail "ring at the end: $(cl_ring_states 8)"
exec 9<&-
left=$(ls /dev/shm | grep -F "dflash-$CL_NAME"; ls "$CL_DIR/run" | grep -vE '\.(stopped|lock)$')
[[ -z $left ]] || fail "left behind: $left"
echo "ok: $TARGETS targets and $WORLD drafters trained $total batches once each, through a target and a drafter kill"
