#!/usr/bin/env bash
# test_cluster_stop_race.sh: `dflashctl stop` in a 2-rank group keeps the stop checkpoint when the
# ranks see the STOP at different points of a step. Rank 1 is held between a step's last
# collective and its next look at the coordinator (its metrics line blocks on a FIFO whose
# reader is stopped), the STOP comes, rank 1 is let go. Each rank used to leave the moment it
# read the STOP: rank 0, waiting in the step's collective, met a dead peer and left without the
# stop checkpoint (every batch since the last one trained again). Now the STOP goes through the
# step's stop vote: the group's checkpoint, a barrier, then every rank leaves (exit 0) and the
# coordinator records that checkpoint (checkpoint_every is far away: it is the only one).
# Meanwhile the targets wait for a FREE slot of the full ring: they keep their heartbeat (the
# coordinator takes none for dead), read the STOP and exit 0.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
READER=
cl_test_init '[[ -n $READER ]] && kill -CONT $READER 2>/dev/null; [[ -n $READER ]] && kill $READER 2>/dev/null'

cl_init "$T/c" 20000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=100000 coordinator.dead_after_ms=60000
mkfifo "$CL_DIR/state/metrics-rank1.jsonl" || fail "mkfifo"
cat "$CL_DIR/state/metrics-rank1.jsonl" >/dev/null &
READER=$!
cl_start_cluster 2 || fail "cluster start"
cl_wait 's["group"]["active"] and step() >= 20' 120 coord || fail "no training"
kill -STOP $READER
# rank 1 blocks once the pipe is full: training stops moving (the same step for 3 s running)
prev=-1 now=0 same=0 age_max=0
for ((i = 0; i < 120 && same < 3; i++)); do
  sleep 1
  cl_status >/dev/null || fail "no status"
  now=$(cl_json "step()")
  if [[ $now == "$prev" ]]; then same=$((same + 1)); else same=0; fi
  prev=$now
  # the ring fills, the targets wait for a FREE slot: with their heartbeat all along
  age=$(cl_json 'max(int(d["heartbeat_age_ms"]) for d in targets())')
  ((same == 0 || age <= age_max)) || age_max=$age
done
(( same >= 3 )) || fail "training did not stall with rank 1's metrics reader stopped"
cl_log "training stalled at step $now (rank 1 held in its metrics write)"
((age_max < $(cl_scaled 2) * 1000)) || fail "the targets wait for a FREE slot: a last heartbeat ${age_max} ms old"
cl_log "the targets' heartbeat while they waited for a FREE slot: at most ${age_max} ms old"
# --wait: returns once the stop checkpoint is in (not when the state turns STOPPED, at once)
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop --wait "test" >"$CL_DIR/stop.txt" 2>&1 &
ctl=$!
sleep 1
kill -CONT $READER
for n in drafter0 drafter1 coord; do
  cl_wait_exit $n 120
  [[ $CL_RC == 0 ]] || fail "$n exited with '$CL_RC' after the stop"
done
for n in target0 target1; do
  cl_wait_exit $n 30
  [[ $CL_RC == 0 ]] || fail "$n exited with '$CL_RC' after the stop"
done
cl_never "$CL_DIR/drafter0.log" "collective failed" "collective failed" "rank 0 met a dead peer"
n=$(cl_sql "SELECT count(*) FROM checkpoints")
[[ $n == 1 ]] || fail "$n checkpoints in the ledger after the stop (wanted the stop checkpoint)"
step=$(cl_sql "SELECT step FROM checkpoints")
(( step >= now )) || fail "the stop checkpoint is of step $step, before the stall at $now"
wait $ctl || fail "dflashctl stop --wait: exit $?: $(cat "$CL_DIR/stop.txt")"
tail -n 1 "$CL_DIR/stop.txt" | grep -q "^stop: the cluster is stopped: .*; lineage head: step $step .*/step-0*$step\$" ||
  fail "dflashctl stop --wait did not wait for the stop checkpoint of step $step: $(cat "$CL_DIR/stop.txt")"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "batches left in flight"
echo "ok: the stop checkpoint of step $step was written and recorded; both ranks and the coordinator exited 0"
