#!/usr/bin/env bash
# test_cluster_ring_remade.sh: the ring's shm object removed (as a cleanup of /dev/shm or
# systemd's RemoveIPC= would) or cut short, in three ways; a target and a drafter train in each:
#  - away: the coordinator is SIGKILLed, the object removed, a coordinator started again: it
#    creates a new ring of the same name;
#  - running: the object is removed under a running coordinator. Every target or drafter started
#    later would fail to find it; the coordinator sees it within a second, records why and
#    exits 1; started again (as systemd would), it creates a new ring. A target started just
#    after the removal finds no ring: that is its own error (exit 1), not the cluster's;
#  - cut: the object is cut to half its size in place (truncate) under the running cluster. A
#    daemon that touches a page it lost dies of SIGBUS after one line naming the ring; the
#    coordinator, unless that comes first, sees the size within a second and exits 1 as above.
#    Started again, the coordinator replaces the cut ring with a new one.
# Either way the target and the drafter reconnect still mapping the old object; working beside
# the cluster there (publishing slots nobody reads) would stall the run. Each sees that the
# object is not the one it maps, says so and exits 1; started again (as systemd would), they
# attach the new ring and the run completes: every batch trained exactly once.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

run_case() {    # run_case away|running
  local how=$1 n who
  cl_init "$T/$how" 1200 || exit 1
  cl_ini_add drafter.checkpoint_every=20 data.epochs=6   # seconds of training left after the removal
  cl_start_coord || fail "$how: coordinator did not come up"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_wait 'step() >= 25' 120 coord || fail "$how: no training"
  cl_log "$how: training at step $(cl_json 'step()')"

  if [[ $how == away ]]; then
    cl_kill coord KILL
    cl_wait_exit coord 10
    [[ $CL_RC == 137 ]] || fail "coordinator exit after SIGKILL: $CL_RC"
    rm -f /dev/shm/dflash-"$CL_NAME" || fail "cannot remove the ring"
  elif [[ $how == cut ]]; then
    local size
    size=$(stat -c %s /dev/shm/dflash-"$CL_NAME") || fail "no ring"
    truncate -s $((size / 2)) /dev/shm/dflash-"$CL_NAME" || fail "cannot cut the ring"
    cl_wait_exit coord "$(cl_scaled 10)"
    if [[ $CL_RC == 1 ]]; then
      grep -q "ring /dflash-$CL_NAME was removed from /dev/shm, replaced or cut short" "$CL_DIR/coord.log" ||
        fail "the coordinator did not say why it left"
    else
      [[ $CL_RC == 135 ]] || fail "coordinator exit with its ring cut short: '$CL_RC' (wanted 1 or 135)"
      grep -q "SIGBUS: ring /dflash-$CL_NAME shrank under this process" "$CL_DIR/coord.log" ||
        fail "the coordinator's SIGBUS does not name the ring: $(tail -n 3 "$CL_DIR/coord.log")"
    fi
    cl_log "cut: coordinator exit $CL_RC: $(grep -h "cut short\|SIGBUS" "$CL_DIR/coord.log" | sed 's/^<[0-9]>//' | head -n 1)"
  else
    rm -f /dev/shm/dflash-"$CL_NAME" || fail "cannot remove the ring"
    # a target (re)started meanwhile finds no ring: its error must not end the cluster (78)
    cl_start target1 target-d -c "$CL_INI" -i 1
    cl_wait_exit coord "$(cl_scaled 10)"
    [[ $CL_RC == 1 ]] || fail "coordinator exit with its ring removed: '$CL_RC' (wanted 1)"
    grep -q "ring /dflash-$CL_NAME was removed from /dev/shm" "$CL_DIR/coord.log" ||
      fail "the coordinator did not say why it left"
    [[ ! -e /dev/shm/dflash-$CL_NAME ]] || fail "the exiting coordinator made a ring"
  fi
  cl_start coord2 coordinator-d -c "$CL_INI"
  if [[ $how == running ]]; then   # the restarted coordinator shows why its predecessor left
    cl_wait '[e for e in s["errors"] if "removed from /dev/shm" in e["message"] and e["role"] == "coordinator"]' 30 coord2 ||
      fail "dflashctl does not show the error recorded before the restart: $(cl_json 's["errors"]')"
  fi
  local bused=()     # cut: the daemons that died of SIGBUS (the others left at their reconnect)
  for n in target0 drafter0; do
    cl_wait_exit $n 60
    if [[ $how == cut && $CL_RC == 135 ]]; then
      grep -q "SIGBUS: ring /dflash-$CL_NAME shrank under this process" "$CL_DIR/$n.log" ||
        fail "$how: $n's SIGBUS does not name the ring: $(tail -n 3 "$CL_DIR/$n.log")"
      bused+=("$n")
      continue
    fi
    [[ $CL_RC == 1 ]] || fail "$how: $n exited with '$CL_RC' after the ring was made anew (wanted 1)"
    grep -q "was made anew while the coordinator was away" "$CL_DIR/$n.log" || fail "$how: $n did not say why it left"
  done
  cl_wait 's["state"] != ""' 30 coord2 >/dev/null || fail "$how: the second coordinator did not come up"
  grep -q "created ring /dflash-$CL_NAME" "$CL_DIR/coord2.log" || fail "$how: the second coordinator did not make a new ring"
  cl_log "$how: both left the old ring${bused[*]:+ (SIGBUS: ${bused[*]})}: $(grep -h "made anew\|SIGBUS" "$CL_DIR/target0.log" | sed 's/^<[0-9]>//' | head -n 1)"

  cl_start target0b target-d -c "$CL_INI" -i 0
  cl_start drafter0b drafter-d -c "$CL_INI" -i 0
  cl_wait_exit coord2 300 || fail "$how: the run did not complete: coordinator '$CL_RC'"
  for n in target0b drafter0b; do cl_wait_exit $n 30 || fail "$how: $n exited with '$CL_RC'"; done
  if [[ $how == running ]]; then   # it left (1), or it came late enough to work on the new ring (0)
    cl_wait_exit target1 30
    [[ $CL_RC == 0 || $CL_RC == 1 ]] || fail "target1, started with the ring removed, exited with '$CL_RC'"
  fi
  for who in target-d@0 drafter-d@0; do
    [[ " ${bused[*]} " == *" ${who%-d@0}0 "* ]] && continue     # died of SIGBUS: nothing sent
    [[ $(cl_sql "SELECT count(*) FROM errors WHERE message LIKE '$who exits: %made anew%'") == 1 ]] ||
      fail "$how: the error log does not say why $who left: $(cl_sql 'SELECT message FROM errors')"
    # ... and it said BYE after it: no death recorded for it
    [[ $(cl_sql "SELECT count(*) FROM errors WHERE message LIKE '$who (pid %) %without a word%'") == 0 ]] ||
      fail "$how: $who, which said why it left, is recorded as dead: $(cl_sql 'SELECT message FROM errors')"
  done
  if [[ $how == running ]]; then
    [[ $(cl_sql "SELECT count(*) FROM errors WHERE role = 'coordinator' AND message LIKE '%removed from /dev/shm%'") == 1 ]] ||
      fail "the error log does not say why the coordinator left: $(cl_sql 'SELECT message FROM errors')"
  fi
  local total once
  total=$(cl_sql 'SELECT count(*) FROM batches')
  [[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "$how: not every batch is checkpointed"
  once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
  [[ $once == "$total" ]] || fail "$how: $once of $total batches trained exactly once"
  echo "ok ($how): target and drafter left the old ring, came back to the new one; $total batches trained once each"
  CL_PIDS=()
}

run_case away
run_case running
run_case cut
