#!/usr/bin/env bash
# test_cluster_group_form_kill.sh: a drafter dies while its group is being formed. Rank 1 joins
# and is frozen (SIGSTOP), rank 0 starts, the generation forms and rank 0 waits in the collective
# for rank 1 (its log says it went to meet rank 1, and not that it got through); rank 1 is
# SIGKILLed. The coordinator ends the generation, and rank 0 gives its wait up at once on the
# RESTART (it once sat out the whole collective timeout, then exited 1). With rank 1 started again
# the next generation forms and the run drains cleanly.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill drafter1 CONT'

cl_init "$T/c" 2000 || exit 1
# a long heartbeat limit: the frozen rank 1 must not be dropped before rank 0 is up (its death is
# seen without it: the coordinator checks a rank's process)
cl_ini_add drafter.world_size=2 drafter.collective_timeout_ms=120000 coordinator.dead_after_ms=$(cl_scaled 30000)
cl_start_coord || fail "coordinator did not come up"
cl_ring_hold || fail "no ring"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 'len(drafters()) == 1 and drafters()[0]["joined"]' 30 coord || fail "drafter 1 did not join"
cl_kill drafter1 STOP
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["active"]' 30 coord || fail "the group did not form"
cl_wait_log "$CL_DIR/drafter0.log" "rank 0 of 2, meeting the other ranks in collective" 30 ||
  fail "rank 0 did not go to meet rank 1"
sleep "$(cl_scaled 1)"                      # rank 0 waits in the collective for rank 1
cl_alive drafter0 || fail "rank 0 exited while rank 1 was frozen: $(tail -n 3 "$CL_DIR/drafter0.log")"
cl_never "$CL_DIR/drafter0.log" "in drafter group generation" "in drafter group generation" "rank 0 got through the collective without rank 1"
cl_log "generation 1 formed with a frozen rank 1: SIGKILL it"
cl_kill drafter1 KILL
cl_wait_exit drafter1 10
t0=$(date +%s)
cl_wait_log "$CL_DIR/drafter0.log" "restarts as generation" 20 || fail "rank 0 did not take the RESTART"
cl_alive drafter0 || fail "rank 0 exited: $(tail -n 3 "$CL_DIR/drafter0.log")"
cl_log "rank 0 took the RESTART after $(($(date +%s) - t0)) s and waits for the next generation"

cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] >= 2 and step() >= 5' 60 coord ||
  fail "the next generation did not train"
"$CL_BIN/dflashctl" -s "$CL_SOCK" drain >/dev/null || fail "dflashctl drain"
for n in coord target0 drafter0 drafter1; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "ledger not consistent after the drain"
echo "ok: a rank lost while its group formed: the survivor restarted at once, generation $(cl_sql 'SELECT max(gen) FROM trains') trained"
