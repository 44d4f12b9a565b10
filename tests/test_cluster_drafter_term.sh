#!/usr/bin/env bash
# test_cluster_drafter_term.sh: a drafter of a 2-rank group stopped with SIGTERM (what systemd
# does to one unit) while the checkpoint write is slow (drafter.debug_ckpt_delay_ms). The stop
# vote has rank 0 write the group's checkpoint, and no rank leaves before the coordinator has
# recorded it: the generation then ends with nothing to roll back, and the group restarts from
# that checkpoint. (The leaving rank once exited at once: the coordinator rolled the group back to
# the checkpoint before and ignored the new one as not in the lineage.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 3000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=1000 drafter.debug_ckpt_delay_ms=1500
cl_start_cluster 2 || fail "cluster did not come up"
cl_wait 's["group"]["active"] and step() >= 40' 120 coord || fail "no training"
cl_log "SIGTERM to drafter 1 at step $(cl_json 'step()')"
cl_kill drafter1 TERM
cl_wait_exit drafter1 30 || fail "drafter 1 exited with '$CL_RC'"
cl_wait 'not s["group"]["active"]' 30 coord || fail "the generation did not end"
cl_never "$CL_DIR/coord.log" "ignored: not in the lineage" "ignored: not in the lineage" "the stop checkpoint was ignored"
grep -q "rollback: 0 trained and 0 consumed" "$CL_DIR/coord.log" ||
  fail "rolled back: $(grep "rollback:" "$CL_DIR/coord.log")"
ck=$(cl_json 's["group"]["checkpoint"]["step"]')
((ck >= 40)) || fail "the group's checkpoint is at step $ck"
cl_log "generation 1 ended at its stop checkpoint, step $ck; $(grep -o "rollback:.*" "$CL_DIR/coord.log")"

cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] == 2' 60 coord || fail "the group did not re-form"
for i in 0 1; do
  cl_wait_log "$CL_DIR/drafter$i.log" "loaded checkpoint .*step-$(printf %010d "$ck")" 30 || fail "drafter $i did not load step $ck"
done
"$CL_BIN/dflashctl" -s "$CL_SOCK" drain >/dev/null || fail "dflashctl drain"
for n in coord target0 target1 drafter0 drafter1; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "ledger not consistent after the drain"
[[ $(cl_sql 'SELECT count(*) FROM trains WHERE rolled_back = 1') == 0 ]] || fail "trainings were rolled back"
echo "ok: SIGTERM to a rank: generation 1 ended at its step-$ck checkpoint, nothing retrained"
