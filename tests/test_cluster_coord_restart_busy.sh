#!/usr/bin/env bash
# test_cluster_coord_restart_busy.sh: the coordinator restarted while a drafter is in a long step
# (a CPU drafter reconnects only when its step ends; here it is frozen with SIGSTOP). Past the
# restart's recovery_ms the rank is alive but not back: the group waits coordinator.dead_after_ms
# for it, as for any rank whose connection ended, instead of ending its generation (every step
# since the last checkpoint was lost at each coordinator restart); back in that time, it trains on
# in the same generation. One that stays away longer ends the generation then ("a drafter stayed
# disconnected"), and a new one forms when it comes back.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill drafter0 CONT'

cl_init "$T/c" 3000 || exit 1
# (dead_after_ms: the frozen drafter's time to come back, well past the restart's recovery_ms)
cl_ini_add data.epochs=20 coordinator.dead_after_ms=30000
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 's["group"]["active"] and step() >= 10' 120 coord || fail "no training"
gen=$(cl_json 's["group"]["generation"]')

cl_kill drafter0 STOP
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_log "$CL_DIR/coord2.log" "rank 0 of generation $gen \(pid $(cl_pid drafter0)\) is alive but not back yet" 60 ||
  fail "the coordinator did not wait for the rank: $(tail -n 5 "$CL_DIR/coord2.log")"
cl_wait 's["state"] == "running"' 30 coord2 || fail "the coordinator's recovery did not end"
sleep 1
cl_status || fail "no status"
[[ $(cl_json 's["group"]["active"] and s["group"]["generation"]') == "$gen" ]] ||
  fail "generation $gen ended while its rank was alive: $(cl_json 's["group"]')"
cl_kill drafter0 CONT
s0=$(cl_json 'step()')
cl_wait 'step() >= '$((s0 + 5))' and s["group"]["generation"] == '$gen' and s["group"]["active"]' 60 coord2 ||
  fail "the drafter did not train on in generation $gen"
cl_never "$CL_DIR/coord2.log" "did not come back after the coordinator restart" "did not come back" "the group failed"
cl_log "generation $gen kept across the restart: step $(cl_json 'step()')"

# Away past dead_after_ms: the generation ends then, and the drafter joins the next one.
cl_kill drafter0 STOP
cl_kill coord2 KILL
cl_wait_exit coord2 10
cl_ini_add coordinator.dead_after_ms=1500
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait_log "$CL_DIR/coord3.log" "a drafter stayed disconnected" 60 || fail "the generation did not end: $(tail -n 5 "$CL_DIR/coord3.log")"
cl_kill drafter0 CONT
cl_wait 's["group"]["active"] and s["group"]["generation"] > '$gen' and step() > 0' 60 coord3 ||
  fail "no new generation with the drafter back"
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop >/dev/null || fail "dflashctl stop"
cl_wait_exit coord3 30
echo "ok: a rank alive but busy kept its generation across a coordinator restart; one away too long ended it"
