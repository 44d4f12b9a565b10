#!/usr/bin/env bash
# test_cluster_drafter_term_busy.sh: a rank of a 2-rank group stopped with SIGTERM while rank 0's
# last periodic checkpoint is still being written (drafter.debug_ckpt_delay_ms) and nothing was
# trained since (the cluster is paused). The stop vote finds nothing new to write, yet no rank
# leaves before the coordinator has recorded the write in flight: the generation ends with
# nothing to roll back. (Rank 0 once waited only for a write of its own stop checkpoint: the
# leaving rank ended the generation first, the coordinator rolled back to the checkpoint before
# and refused the one in flight as not in the lineage.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 3000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=1 drafter.debug_ckpt_delay_ms=$(($(cl_scaled 3) * 1000))
cl_start_cluster 2 || fail "cluster did not come up"
cl_wait 's["group"]["active"] and step() >= 2' 120 coord || fail "no training"
"$CL_BIN/dflashctl" -s "$CL_SOCK" pause >/dev/null || fail "dflashctl pause"
cl_wait 's["state"] == "paused"' 30 coord || fail "not paused"
sleep 0.5   # (the step in flight at the pause lands; its checkpoint write takes 3 s)
cl_status || fail "no status from the coordinator"
step=$(cl_json 'step()')
# the scenario: rank 0's newest checkpoint line (one read of its log) is a snapshot whose write
# has not ended yet, not a write's end
busy=$(grep -E 'checkpoint of step [0-9]+ |checkpoint .*/step-[0-9]+ \(' "$CL_DIR/drafter0.log" | tail -n 1)
[[ $busy == *"checkpoint of step "* ]] ||
  fail "no checkpoint write in flight at the SIGTERM (the test's timing): rank 0's last line: ${busy:-none}"
cl_log "SIGTERM to drafter 1 at step $step, the cluster paused"
cl_kill drafter1 TERM
cl_wait_exit drafter1 30 || fail "drafter 1 exited with '$CL_RC'"
cl_wait 'not s["group"]["active"]' 30 coord || fail "the generation did not end"
grep -q "rollback: 0 trained and 0 consumed" "$CL_DIR/coord.log" ||
  fail "rolled back: $(grep "rollback:" "$CL_DIR/coord.log")"
cl_never "$CL_DIR/coord.log" "ignored: not in the lineage" "ignored: not in the lineage" "the checkpoint in flight was ignored"
ck=$(cl_json 's["group"]["checkpoint"]["step"]')
last=$(grep -o 'checkpoint of step [0-9]*' "$CL_DIR/drafter0.log" | tail -n 1 | grep -o '[0-9]*$')
((ck >= step && ck == last)) || fail "the group's checkpoint is at step $ck; rank 0 last wrote step $last"
echo "ok: SIGTERM to a rank while a checkpoint write is in flight: generation 1 ended at step $ck, nothing retrained"
