#!/usr/bin/env bash
# test_cluster_ckpt_hang.sh: a checkpoint write that does not end (drafter.debug_ckpt_delay_ms:
# as an fsync on a dead network mount) does not hold the drafter for ever, feeding its watchdog
# and heartbeat for a writer that does not move and deaf to a stop:
#  - the next checkpoint waits for it at most drafter.checkpoint_timeout_ms, then the drafter
#    reports "the storage hangs" and exits 1 (systemd restarts it);
#  - waiting for the write at a stop, a second stop signal makes it leave at once (exit 0).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 3000 || exit 1
cl_ini_add drafter.checkpoint_every=1 drafter.debug_ckpt_delay_ms=600000
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0 -o drafter.checkpoint_timeout_ms=2000
cl_wait_exit drafter0 60
[[ $CL_RC == 1 ]] || fail "the drafter waiting on a hung write exited '$CL_RC', wanted 1: $(tail -3 "$CL_DIR/drafter0.log")"
grep -q "a checkpoint write still running after [0-9]* s (drafter.checkpoint_timeout_ms): the storage hangs: abandoned" \
  "$CL_DIR/drafter0.log" || fail "no reason logged: $(tail -3 "$CL_DIR/drafter0.log")"
cl_wait '[e for e in s["errors"] if "the storage hangs" in e["message"]]' 10 coord ||
  fail "the coordinator has no error of the hung write"
cl_log "timeout: $(grep -m1 "abandoned" "$CL_DIR/drafter0.log")"

# A stop while the write hangs: the first signal waits for it (the stop checkpoint), the second
# leaves at once.
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
for ((i = 0; i < $(cl_scaled 60) * 10; i++)); do   # (the first run's is in the log too)
  (($(grep -c "checkpoint of step [0-9]* (periodic)" "$CL_DIR/drafter0.log") >= 2)) && break
  sleep 0.1
done
(($(grep -c "checkpoint of step [0-9]* (periodic)" "$CL_DIR/drafter0.log") >= 2)) || fail "no checkpoint started"
sleep 0.5
cl_kill drafter0 TERM
sleep 1
cl_alive drafter0 || fail "the drafter left at the first signal, its write unfinished"
cl_kill drafter0 TERM
cl_wait_exit drafter0 10 || fail "the drafter did not leave at the second signal: '$CL_RC'"
grep -q "a checkpoint write still running after [0-9]* s and a second stop signal: abandoned" "$CL_DIR/drafter0.log" ||
  fail "no reason logged: $(tail -3 "$CL_DIR/drafter0.log")"
# Either way it left on purpose and said so (BYE "exits N at once: ..."): no death recorded.
sleep 1.5     # (the coordinator's look for processes gone: once a second)
cl_status || fail "no status"
[[ $(cl_json '[e["message"] for e in s["errors"] if "without a word" in e["message"]]') == "[]" ]] ||
  fail "a drafter that left on purpose is recorded as dead: $(cl_json 's["errors"]')"
[[ $(grep -c "drafter-d@0 (pid [0-9]*) leaves, exit status [01]: drafter-d@0 exits [01] at once: a checkpoint write hangs" \
  "$CL_DIR/coord.log") == 2 ]] || fail "not the two BYEs of the abandoned writes: $(grep 'leaves' "$CL_DIR/coord.log")"

# A stop while a periodic write runs: that write and the stop checkpoint after it share one
# drafter.checkpoint_timeout_ms (each alone is shorter than it, the two together longer), so the
# stop ends within the unit's TimeoutStopSec (that and a minute) instead of systemd's SIGKILL.
n0=$(grep -c "checkpoint of step [0-9]* (periodic): training paused" "$CL_DIR/drafter0.log")
cl_start drafter0 drafter-d -c "$CL_INI" -i 0 -o drafter.debug_ckpt_delay_ms=4000 -o drafter.checkpoint_timeout_ms=6000
for ((i = 0; i < $(cl_scaled 60) * 20; i++)); do   # its first write
  (($(grep -c "checkpoint of step [0-9]* (periodic): training paused" "$CL_DIR/drafter0.log") > n0)) && break
  sleep 0.05
done
n0=$(grep -c "checkpoint of step [0-9]* (periodic): training paused" "$CL_DIR/drafter0.log")
# The stop comes a second after a write began: the next step is trained by then (a few ms), and
# its checkpoint waits for that write; the write of that step is then still to come.
for ((i = 0; i < $(cl_scaled 60) * 20; i++)); do
  (($(grep -c "checkpoint of step [0-9]* (periodic): training paused" "$CL_DIR/drafter0.log") > n0)) && break
  sleep 0.05
done
sleep 1
cl_kill drafter0 TERM
cl_wait_exit drafter0 30
[[ $CL_RC == 1 ]] && grep -q "a checkpoint write still running after [0-9]* s (drafter.checkpoint_timeout_ms): the storage hangs: abandoned" \
  "$CL_DIR/drafter0.log" || fail "a stop with a write in flight and its own checkpoint past the timeout together: exit '$CL_RC': $(tail -3 "$CL_DIR/drafter0.log")"
echo "ok: a hung checkpoint write: exit 1 after drafter.checkpoint_timeout_ms, at once on a second stop signal; a stop's writes share one timeout"
