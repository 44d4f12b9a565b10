#!/usr/bin/env bash
# test_cluster_drafter_kill.sh: a drafter of a 2-rank group SIGKILLed mid-training (plain
# processes), with steps trained past the last checkpoint. The survivor's collective fails, the
# coordinator ends the generation and re-queues what was trained after the last checkpoint
# (the kill once came right on a checkpoint step: nothing to roll back, and the test failed on
# that); when the drafter is started again both
# ranks load that checkpoint as generation 2 and the epoch completes: every batch trained
# exactly once in the surviving lineage, the ring ends FREE.
# The kill comes while rank 1 waits in a step's collective, its batch taken from the ring
# (rank 0 SIGSTOPped a moment before, so that rank 1 gets there, and until the coordinator has
# acted, so that rank 0 reports nothing meanwhile): that batch, consumed by the dead rank and
# never reported by anyone, goes back to the queue with the rollback at once. The run then
# completes well within the orphan sweep's grace (collective_timeout_ms + 2 x dead_after_ms),
# which would otherwise be what queues it again (the run took two minutes instead of seconds).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill drafter0 CONT'

cl_init "$T/c" 6000 || exit 1
# dead_after_ms well beyond rank 0's SIGSTOP below; the orphan sweep's grace, 120 s + 2 x 3 s
# (scaled): a batch left behind would be queued again by the sweep, which says so in the log
grace_s=$(($(cl_scaled 120) + 2 * $(cl_scaled 3)))
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=50 drafter.collective_timeout_ms=$(($(cl_scaled 120) * 1000)) \
  coordinator.dead_after_ms=$(($(cl_scaled 3) * 1000))
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
total=$(cl_json 's["batches"]["total"]')
for i in 0 1; do
  cl_start target$i target-d -c "$CL_INI" -i $i
  cl_start drafter$i drafter-d -c "$CL_INI" -i $i
done
# The kill comes with steps trained past the lineage head (they are what is rolled back): mid-way
# between two checkpoint steps (every 50; the status lags the steps by up to a heartbeat), not
# right on one.
cl_wait 's["group"]["checkpoint"]["step"] >= 100 and step() >= 130 and 5 <= step() % 50 <= 20' 120 coord ||
  fail "no training"
cl_kill drafter0 STOP
sleep "$(cl_scaled 0.5)"      # rank 1 finishes its batch and waits for rank 0 in the next collective
cl_kill drafter1 KILL
t_kill=$(date +%s.%N)
cl_wait_exit drafter1 10
cl_log "drafter 1 killed at step $(cl_json 'step()'), checkpoint $(cl_json 's["group"]["checkpoint"]["step"]')"
cl_wait 'not s["group"]["active"]' 30 coord || fail "the generation did not end"
rollback='rollback: [0-9]+ trained and [0-9]+ consumed batches back to the queue'
cl_wait_log "$CL_DIR/coord.log" "$rollback" 10 || fail "the coordinator logged no rollback of the failed group"
cl_kill drafter0 CONT
line=$(grep -m1 -Eo "$rollback" "$CL_DIR/coord.log")
cl_log "$line"
consumed=$(awk '{ print $5 }' <<<"$line")
requeued=$(grep -c "back to the queue: its slot was consumed by the failed drafter group" "$CL_DIR/coord.log")
((consumed >= 1 && requeued == consumed)) ||
  fail "rank 1's consumed batch: $consumed consumed batches in the rollback, $requeued of them back to the queue"
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] == 2' 60 coord || fail "the group did not re-form"
ck=$(cl_json 's["group"]["checkpoint"]["step"]')
for i in 0 1; do
  cl_wait_log "$CL_DIR/drafter$i.log" "loaded checkpoint .*step-$(printf %010d "$ck")" 30 || fail "drafter $i did not load step $ck"
done
cl_log "generation 2 from the step-$ck checkpoint"
# The rest of the epoch takes seconds; a batch taken from the ring and left published would hold
# the run until the orphan sweep queued it again, $grace_s s after the kill: the run completes
# either way, the sweep's line tells (a test of the outcome, not of this machine's speed).
cl_wait_exit coord $((grace_s + $(cl_scaled 60)))
took=$(awk -v a="$(date +%s.%N)" -v b="$t_kill" 'BEGIN { printf "%.1f", a - b }')
[[ $CL_RC == 0 ]] || fail "the run did not complete (coordinator '$CL_RC' after ${took} s): $(cl_json 's["batches"]')"
cl_never "$CL_DIR/coord.log" "not reported by any drafter for" "not reported by any drafter for" \
  "a batch taken before the kill was left published until the orphan sweep"
cl_log "run complete ${took} s after the kill"
for n in target0 target1 drafter0 drafter1; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC'"; done
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
[[ $(cl_sql 'SELECT count(*) FROM trains WHERE rolled_back = 1') -gt 0 ]] || fail "nothing was rolled back"
# the kill is the one death in the errors (rank 0, frozen meanwhile, and every exit of the end say BYE)
deaths=$(cl_sql "SELECT role, device FROM errors WHERE message LIKE '%without a word%'")
[[ $deaths == "drafter|1" ]] || fail "deaths recorded: '$deaths' (want drafter 1's alone): $(cl_sql 'SELECT message FROM errors')"
states=$(cl_ring_states 4)
[[ $states == "FREE FREE FREE FREE" ]] || fail "ring at the end: $states"
echo "ok: $total batches each trained once after a drafter crash ($(cl_sql 'SELECT count(*) FROM trains WHERE rolled_back = 1') trainings rolled back)"
