#!/usr/bin/env bash
# test_cluster_drain_cut.sh: a drain cut short does not stay with the drafters. A stop signal
# makes the coordinator drain (DRAIN goes to the drafters); it is killed before the drain ends (a
# frozen target holds its leases), started again, and runs (a signal drain is not resumed). The
# drafters (a two-rank group), reconnected to a running cluster, train on, and when the ring runs
# dry for a while they wait: no "draining" checkpoint (the flag stayed set: only a RESUME cleared
# it, and none comes, so every dry spell cost a blocking checkpoint).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill target0 CONT; cl_kill target1 CONT'

cl_init "$T/c" 6000 || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=100000 data.epochs=20
D=$CL_DIR
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 'step() >= 20' 60 coord || fail "no training"
cl_kill target0 STOP                            # its leases keep the drain from ending
cl_kill coord TERM
cl_wait_log "$D/drafter0.log" "drain: " 10 || fail "the drafter was not told to drain"
sleep 0.5
cl_kill coord KILL
cl_wait_exit coord 10
cl_kill target0 KILL
cl_wait_exit target0 10
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coord2 || fail "second coordinator did not come up running"
cl_start target1 target-d -c "$CL_INI" -i 0
cl_wait 's["group"]["active"]' 30 coord2 || fail "the group is not back"
at=$(cl_json 'step()')
cl_wait "step() >= $at + 20" 60 coord2 || fail "no training after the restart"
before=$(grep -c "(draining)" "$D/drafter0.log")
cl_kill target1 STOP                            # the ring runs dry
sleep "$(cl_scaled 1.5)"
cl_kill target1 CONT
cl_status || fail "no status from the coordinator"
at=$(cl_json 'step()')
cl_wait "step() >= $at + 20" 60 coord2 || fail "no training after the dry spell"
after=$(grep -c "(draining)" "$D/drafter0.log")
((after == before)) || fail "$((after - before)) draining checkpoints while the cluster runs: $(grep "(draining)" "$D/drafter0.log" | tail -n 2)"
echo "ok: a drain cut short by a coordinator kill does not stay with the drafters"
