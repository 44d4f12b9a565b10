#!/usr/bin/env bash
# test_final_drain_kill.sh: a drafter SIGKILLed while the group writes the run's final
# checkpoint (every batch trained, the coordinator DRAINING for that checkpoint only). The
# targets were not told to drain, the batches trained since the last checkpoint are queued
# again, the cluster goes back to RUNNING, and the run still completes with every batch
# trained once in the surviving lineage (tests/soak/check_run.py).
# The window is the drafters' last wait slice plus the checkpoint itself (a few hundred ms):
# the kill comes from a poller that watches the state; a run whose kill landed after the final
# checkpoint is tried again (at most 4 runs), and a SKIP says so if none was hit.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

one_run() {
  cl_init "$T/c$1" 600 || exit 1
  # No periodic checkpoint: everything the group trained waits for the final one.
  cl_ini_add drafter.world_size=2 drafter.checkpoint_every=100000 ring.slots=8
  cl_start_cluster 2 || fail "cluster start"
  cl_wait 's["group"]["active"] and step() >= 1' 60 coord || fail "no training"
  # Kill rank 1 the moment the final drain starts.
  "$CL_PY" - "$CL_BIN/dflashctl" "$CL_SOCK" "$(cl_pid drafter1)" "$(cl_scaled 120)" <<'EOF'
import json, os, signal, subprocess, sys, time
ctl, sock, pid, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
end = time.time() + secs
while time.time() < end:
    p = subprocess.run([ctl, "-s", sock, "--json", "status"], capture_output=True, text=True)
    if p.returncode == 0:
        s = json.loads(p.stdout)
        if s["state"] in ("draining", "stopped"):
            os.kill(pid, signal.SIGKILL)
            print("killed drafter rank 1 in state %s (%s)" % (s["state"], s.get("reason", "")))
            sys.exit(0)
    elif os.path.exists(sock) is False:
        break
    time.sleep(0.005)
print("the run never reached its final drain")
sys.exit(1)
EOF
  (($? == 0)) || fail "no final drain"
  cl_wait_exit drafter1 10
  # The coordinator sees the death a moment later: it undoes the drain, or the run has ended.
  local i
  for ((i = 0; i < $(cl_scaled 100); i++)); do
    grep -q 'a drafter was lost before the final checkpoint' "$CL_DIR/coord.log" && HIT=1 && break
    cl_alive coord || break
    sleep 0.1
  done
  if ((HIT)); then
    cl_log "the final drain was undone: $(grep -o 'cluster draining -> running: .*' "$CL_DIR/coord.log" | tail -1)"
    cl_start drafter1 drafter-d -c "$CL_INI" -i 1
  fi
  cl_wait_exit coord 300 || fail "coordinator exited '$CL_RC'"
  for n in target0 target1 drafter0 drafter1; do
    [[ -n ${CL_PIDS[$n]:-} ]] || continue
    cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
  done
  grep -q 'run complete: every batch checkpointed' "$CL_DIR/coord.log" ||
    fail "the run did not complete: $(grep -o 'cluster [a-z]* -> stopped.*' "$CL_DIR/coord.log" | tail -1)"
  "$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" || fail "exactly-once check"
  ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left at the end"
  return 0
}

HIT=0
for run in 1 2 3 4; do
  one_run $run
  ((HIT)) && { echo "ok: a drafter lost during the final checkpoint: the run went back to training and completed"; exit 0; }
  cl_log "run $run: the kill landed after the final checkpoint; again"
  cl_cleanup
done
echo "SKIP: in 4 runs the kill never landed inside the final drain (a very slow machine?)"
exit 77
