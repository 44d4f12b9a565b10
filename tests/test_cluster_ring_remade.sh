#!/usr/bin/env bash
# test_cluster_ring_remade.sh: a coordinator that comes back with its ring made anew. A target
# and a drafter train; the coordinator is SIGKILLed, the ring's shm object removed (as a cleanup
# of /dev/shm would), and a coordinator started again: it creates a new ring of the same name.
# The target and the drafter reconnect still mapping the old object; working beside the cluster
# there (publishing slots nobody reads) would stall the run. Each sees that the object is not
# the one it maps, says so and exits 1; started again (as systemd would), they attach the new
# ring and the run completes: every batch trained exactly once.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 1200 || exit 1
cl_ini_add drafter.checkpoint_every=20 data.epochs=2
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 25' 120 coord || fail "no training"
cl_log "training at step $(cl_json 'step()')"

cl_kill coord KILL
cl_wait_exit coord 10
[[ $CL_RC == 137 ]] || fail "coordinator exit after SIGKILL: $CL_RC"
rm -f /dev/shm/dflash-"$CL_NAME" || fail "cannot remove the ring"
cl_start coord2 coordinator-d -c "$CL_INI"
for n in target0 drafter0; do
  cl_wait_exit $n 60
  [[ $CL_RC == 1 ]] || fail "$n exited with '$CL_RC' after the ring was made anew (wanted 1)"
  grep -q "was made anew while the coordinator was away" "$CL_DIR/$n.log" || fail "$n did not say why it left"
done
grep -q "created ring /dflash-$CL_NAME" "$CL_DIR/coord2.log" || fail "the second coordinator did not make a new ring"
cl_log "both left the old ring: $(grep -h "made anew" "$CL_DIR/target0.log" | sed 's/^<[0-9]>//' | head -n 1)"

cl_start target0b target-d -c "$CL_INI" -i 0
cl_start drafter0b drafter-d -c "$CL_INI" -i 0
cl_wait_exit coord2 300 || fail "the run did not complete: coordinator '$CL_RC'"
for n in target0b drafter0b; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC'"; done
for who in target-d@0 drafter-d@0; do
  [[ $(cl_sql "SELECT count(*) FROM errors WHERE message LIKE '$who exits: %made anew%'") == 1 ]] ||
    fail "the error log does not say why $who left: $(cl_sql 'SELECT message FROM errors')"
done
total=$(cl_sql 'SELECT count(*) FROM batches')
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once"
echo "ok: target and drafter left the old ring, came back to the new one; $total batches trained once each"
