#!/usr/bin/env bash
# test_cluster_ckpt_mismatch.sh: the drafter's shape changed under a state_dir. A one-rank group
# trains and checkpoints; the drafter is killed and started again with model.draft_layers changed:
# the group's checkpoint is made for another drafter, which no restart can load. The drafter says
# so (the file and what differs), reports it as fatal and exits 78 (systemd does not restart it);
# the cluster ends FAILED with that reason (it exited 1 and was restarted into the same refusal
# for ever).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 600 || exit 1
cl_ini_add drafter.checkpoint_every=5 data.epochs=50
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["checkpoint"]["step"] >= 5' 120 coord || fail "no checkpoint"
cl_kill drafter0 KILL
cl_wait_exit drafter0 10
cl_ini_add model.draft_layers=2
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait_exit drafter0 60
[[ $CL_RC == 78 ]] || fail "drafter with another shape than its checkpoint exited '$CL_RC', want 78: $(tail -n 3 "$CL_DIR/drafter0.log")"
grep -q "joining generation 2: .*step-.*config.json.*" "$CL_DIR/drafter0.log" || fail "drafter0: $(tail -n 3 "$CL_DIR/drafter0.log")"
cl_wait_exit coord 60
[[ $CL_RC == 78 ]] || fail "coordinator exited '$CL_RC', want 78 (FAILED)"
grep -q -- "-> failed: .*joining generation 2: .*does not match" "$CL_DIR/coord.log" || fail "the cluster did not fail on it"
cl_log "$(grep -m1 'joining generation 2' "$CL_DIR/drafter0.log" | sed 's/^<[0-9]>//')"
echo "ok: a checkpoint of another drafter shape: exit 78, cluster failed"
