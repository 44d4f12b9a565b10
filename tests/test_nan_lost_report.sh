#!/usr/bin/env bash
# test_nan_lost_report.sh: a NaN report the coordinator never read is sent again. The drafter
# meets a poisoned batch (target.debug_nan_batch) while the coordinator is stopped (SIGSTOP: the
# report waits unread in its socket) and trains on (the batches after it are sound), the
# coordinator is then killed and started again: it runs on, knowing nothing of the NaN. The drafter, still refusing to checkpoint, finds at its
# reconnect a cluster running and not resumed since its report: it reports again, and the
# cluster pauses with the reason (without: it runs on, and the final drain would never end). The
# target is restarted without the key, so no second NaN pauses the cluster instead.
# With NAN_LOST_DRAIN=1 (test_nan_lost_drain.sh) the operator drains first: the restarted
# coordinator comes back draining, which a report read would have ended; it is sent again all
# the same (it once was only to a running cluster, and the drain waited for ever on a final
# checkpoint the poisoned drafter would not write).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill coord CONT'

BAD=10
CL_VOCAB=4096 CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512" \
  cl_init "$T/c" 2000 || exit 1
# a slow drafter (big LM head) and a fast target: the ring is full when the coordinator stops
cl_ini_add ring.slots=16 target.prefetch=8 drafter.block_size=16 drafter.num_anchors=16 \
  drafter.checkpoint_every=100000
D=$CL_DIR
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0 -o target.debug_nan_batch=$BAD
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 2 and s["ring"]["ready"] >= 12' 60 coord || fail "no training with a full ring: $(cl_json 's["ring"]')"
if [[ ${NAN_LOST_DRAIN:-} ]]; then
  "$CL_BIN/dflashctl" -s "$CL_SOCK" drain >/dev/null || fail "dflashctl drain"
  cl_wait 's["state"] == "draining"' 10 coord || fail "not draining: $(cl_json 's["state"]')"
fi
cl_kill coord STOP
grep -q "loss is not finite" "$D/drafter0.log" && { echo "SKIP: batch $BAD was trained before the coordinator stopped"; exit 77; }
cl_wait_log "$D/drafter0.log" "loss is not finite" 30 ||
  fail "the drafter did not meet its NaN step while the coordinator was stopped"
sleep 0.3
cl_kill coord KILL
cl_kill coord CONT
cl_wait_exit coord 10
# the target again without the key: batch $BAD, handed back, is published sound this time (a
# second NaN would pause the cluster by itself)
cl_kill target0 KILL
cl_wait_exit target0 10
cl_start target1 target-d -c "$CL_INI" -i 0
cl_never "$D/coord.log" "reports a non-finite value" "reports a non-finite value" "the stopped coordinator read the report (nothing to test)"
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "paused"' 30 coord2 || fail "the cluster runs on after the lost NaN report: $(cl_json 's["state"]')"
reason=$(cl_json 's["reason"]')
[[ $reason == *"batch 0:$BAD at step "*": loss is not finite"* ]] || fail "pause reason: $reason"
(($(grep -c "loss is not finite: step skipped" "$D/drafter0.log") == 1)) || fail "more than one non-finite step"
grep -q "reported again" "$D/drafter0.log" || fail "the drafter did not say it reported again"
if [[ ${NAN_LOST_DRAIN:-} ]]; then
  # the refused drain checkpoint is said once, not each try; the pause ends the drain in the
  # drafter too (it tried on, five times a second)
  sleep 1.5
  n=$(grep -c "no checkpoint (draining)" "$D/drafter0.log")
  ((n == 1)) || fail "the drain checkpoint refused for the NaN is logged $n times"
  grep -q "no checkpoint (draining)" <(sed -n '/pause: .*loss is not finite/,$p' "$D/drafter0.log") &&
    fail "paused, the drafter still tries its drain checkpoint"
fi
cl_log "paused again: $reason"
echo "ok: a NaN report lost with its coordinator is sent again at the reconnect"
