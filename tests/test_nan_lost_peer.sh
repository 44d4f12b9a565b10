#!/usr/bin/env bash
# test_nan_lost_peer.sh: a NaN report lost with the rank that sent it is sent by its peer. Two
# drafters train as one group; one meets a poisoned batch (target.debug_nan_batch) while the
# coordinator is stopped (SIGSTOP: the report waits unread in its socket). The coordinator is
# killed (the report dies with it) and so is the drafter that sent it; the coordinator is started
# again, knowing nothing of the NaN. The other drafter, which saw the same skipped step and holds
# back its checkpoints, finds at its reconnect a cluster running and not resumed since: it
# reports the step itself and the cluster pauses (without: it runs on, and no checkpoint is ever
# written again).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill coord CONT'

BAD=12
CL_VOCAB=4096 CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512" \
  cl_init "$T/c" 2000 || exit 1
# slow drafters (big LM head) and a fast target: the ring is full when the coordinator stops
cl_ini_add ring.slots=24 target.prefetch=8 drafter.block_size=16 drafter.num_anchors=16 \
  drafter.world_size=2 drafter.checkpoint_every=100000 \
  drafter.collective_timeout_ms=$(($(cl_scaled 120) * 1000))
D=$CL_DIR
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0 -o target.debug_nan_batch=$BAD
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 'step() >= 1 and s["ring"]["ready"] >= 16' 60 coord || fail "no training with a full ring: $(cl_json 's["ring"]')"
cl_kill coord STOP
if grep -q "loss is not finite" "$D"/drafter[01].log; then
  echo "SKIP: batch $BAD was trained before the coordinator stopped"
  exit 77
fi
for ((i = 0; i < $(cl_scaled 30) * 10; i++)); do
  grep -q "loss is not finite" "$D"/drafter[01].log && break
  sleep 0.1
done
reporter=$(grep -l "loss is not finite: step skipped" "$D"/drafter[01].log | head -1)
[[ -n $reporter ]] || fail "no drafter met the NaN step while the coordinator was stopped"
reporter=$(basename "$reporter" .log)
peer=drafter$((1 - ${reporter#drafter}))
cl_wait_log "$D/$peer.log" "training held until the coordinator answers the report" 10 ||
  fail "$peer did not hold its training after the group's non-finite step"
sleep 0.3
cl_kill coord KILL
cl_kill coord CONT
cl_wait_exit coord 10
cl_kill "$reporter" KILL
cl_wait_exit "$reporter" 10
# the target again without the key (a second NaN would pause the cluster by itself)
cl_kill target0 KILL
cl_wait_exit target0 10
cl_start target1 target-d -c "$CL_INI" -i 0
cl_never "$D/coord.log" "reports a non-finite value" "reports a non-finite value" \
  "the stopped coordinator read the report (nothing to test)"
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "paused"' 30 coord2 || fail "the cluster runs on after the lost NaN report: $(cl_json 's["state"]')"
reason=$(cl_json 's["reason"]')
[[ $reason == "drafter-d@${peer#drafter}: "*"not finite at step "*"on a peer"* ]] || fail "pause reason: $reason"
grep -q "reported again" "$D/$peer.log" || fail "$peer did not say it reported again"
cl_log "paused: $reason"
echo "ok: a NaN report lost with the rank that sent it is sent by its peer at the reconnect"
