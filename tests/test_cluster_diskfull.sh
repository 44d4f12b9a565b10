#!/usr/bin/env bash
# test_cluster_diskfull.sh: the state folder (ledger and checkpoints) runs out of space under a
# training cluster. It is a 48 MiB tmpfs of a private mount namespace; coordinator.min_free_mb = 8.
#  1. A file fills it to under 8 MiB free: within seconds the cluster is PAUSED, the reason names the
#     folder and the setting, `dflashctl status` shows the space and the errors list has it; while
#     paused no batch is trained; no daemon exits, the ledger commits on.
#  2. The coordinator is SIGKILLed and started again while space is still short: it comes back
#     paused for want of space (saved in the ledger); started with coordinator.min_free_mb = 0
#     the pause ends, started with the watch again it pauses anew.
#  3. The file is removed: the cluster resumes by itself and trains on.
#  4. A resume while space is short is refused with the reason. The operator pauses a cluster
#     paused for space: room alone no longer resumes it; the operator's resume does.
#  5. A stop signal while paused for space stops at once, without a drain (the final checkpoint
#     may not fit): every daemon exits 0, each checkpointed batch trained once
#     (tests/soak/check_run.py --partial). (Skipped without the right to make a mount namespace.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_private_mounts "$0" "$@"
cl_test_init

cl_init "$T/c" 6000 || exit 1
mount -t tmpfs -o size=48m dflash-diskfull "$CL_DIR/state" || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
cl_ini_add coordinator.min_free_mb=8 data.epochs=50 drafter.checkpoint_every=50 drafter.keep_checkpoints=2
ctl() { "$CL_BIN/dflashctl" -s "$CL_SOCK" "$@"; }
free_mb() { df -m --output=avail "$CL_DIR/state" | tail -1 | tr -d ' '; }
trained() { cl_sql 'SELECT count(*) FROM trains WHERE rolled_back = 0'; }

cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 60' 60 coord || fail "no training"
cl_log "training, $(free_mb) MiB free in the state folder"

# 1. fill it to 4 MiB free
fill=$(( $(free_mb) - 4 ))
dd if=/dev/zero of="$CL_DIR/state/filler" bs=1M count="$fill" status=none 2>/dev/null
cl_log "filled: $(free_mb) MiB free"
cl_wait 's["state"] == "paused"' 15 coord || fail "not paused with $(free_mb) MiB free: $(cl_json 's["state"], s.get("reason"), s.get("space")')"
reason=$(cl_json 's["reason"]')
[[ $reason == *"$CL_DIR/state"*"below coordinator.min_free_mb = 8"* ]] || fail "the pause's reason: $reason"
ctl status | grep -q "^space: [0-9]* MiB free in $CL_DIR/state.* (pauses below 8 MiB), paused until twice that" ||
  fail "dflashctl status does not show the space: $(ctl status)"
ctl errors | grep -q "below coordinator.min_free_mb" || fail "the pause is not in dflashctl errors: $(ctl errors)"
ctl status | grep -q "^drafter group: generation [0-9]*, formed, paused, 1/1 ranks" ||
  fail "the group line does not show the pause: $(ctl status | grep 'drafter group')"
sleep 1       # a step in flight when the pause came is trained still
n1=$(trained)
sleep 3
n2=$(trained)
((n1 == n2)) || fail "trained on while paused for space: $n1 then $n2 rows"
for n in coord target0 drafter0; do cl_alive $n || fail "$n exited while space was short"; done
cl_log "paused for space: $reason"

# 2. the coordinator restarted while space is still short stays paused for it
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "paused" and s["space"]["paused"]' 30 coord ||
  fail "the restarted coordinator is not paused for space: $(cl_json 's["state"], s.get("reason"), s.get("space")')"
cl_wait 'len(targets()) == 1 and len(drafters()) == 1' 30 coord || fail "the daemons did not reconnect"
cl_log "restarted coordinator: paused for space"
# ... and one restarted with the watch off ends that pause (nothing else would), then with it on
# again pauses anew
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord coordinator-d -c "$CL_INI" -o coordinator.min_free_mb=0
cl_wait 's["state"] == "running"' 30 coord || fail "the watch off did not end the pause for space: $(cl_json 's["state"], s.get("reason")')"
grep -q "coordinator.min_free_mb = 0: the pause for want of space ends" "$CL_DIR/coord.log" || fail "no notice of the pause's end"
# the daemons, back in the restarted coordinator's recovery window, are shown as the cluster is
cl_wait 'len(targets()) == 1 and len(drafters()) == 1 and all(d["state"] == "running" for d in targets() + drafters())' 20 coord ||
  fail "the daemons are not shown running: $(cl_json '[(d["name"], d["state"]) for d in s["daemons"]]')"
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "paused" and s["space"]["paused"]' 30 coord || fail "not paused for space after the watch came back"
cl_wait 'len(targets()) == 1 and len(drafters()) == 1' 30 coord || fail "the daemons did not reconnect"

# 3. room again: it resumes by itself and trains on
rm -f "$CL_DIR/state/filler"
cl_wait 's["state"] == "running"' 15 coord || fail "did not resume with $(free_mb) MiB free: $(cl_json 's["state"], s.get("reason")')"
grep -q "MiB free again (coordinator.min_free_mb = 8): resuming" "$CL_DIR/coord.log" || fail "no notice of the resume"
n3=$(trained)
cl_wait "step() >= $(cl_json 'step()') + 20" 60 coord || fail "no training after the resume"
cl_log "resumed by itself"

# 4. a resume while space is short is refused, saying why; the operator's pause over a pause for
#    space outlasts the room
dd if=/dev/zero of="$CL_DIR/state/filler" bs=1M count="$(( $(free_mb) - 4 ))" status=none 2>/dev/null
cl_wait 's["state"] == "paused" and s["space"]["paused"]' 15 coord || fail "not paused for space the second time"
ctl resume >"$T/resume.out" 2>&1 && fail "a resume with space short was taken: $(cat "$T/resume.out")"
grep -q "resume: $CL_DIR/state has [0-9]* MiB free, below coordinator.min_free_mb = 8: free space first" "$T/resume.out" ||
  fail "the refused resume does not say why: $(cat "$T/resume.out")"
ctl pause "a look at the disk" >/dev/null || fail "dflashctl pause of a cluster paused for space"
cl_wait 's["state"] == "paused" and not s["space"]["paused"]' 5 coord || fail "the operator's pause did not take over"
rm -f "$CL_DIR/state/filler"
sleep 5
cl_status || fail "dflashctl status"
[[ $(cl_json 's["state"]') == paused ]] || fail "room resumed the operator's pause"
ctl resume >/dev/null || fail "dflashctl resume"
cl_wait 's["state"] == "running"' 10 coord || fail "the operator's resume did not run it"
cl_wait "step() >= $(cl_json 'step()') + 10" 60 coord || fail "no training after the operator's resume"

# 5. a stop signal while paused for space stops without a drain (its final checkpoint may not fit)
dd if=/dev/zero of="$CL_DIR/state/filler" bs=1M count="$(( $(free_mb) - 4 ))" status=none 2>/dev/null
cl_wait 's["state"] == "paused" and s["space"]["paused"]' 15 coord || fail "not paused for space the third time"
cl_kill coord TERM
for n in coord target0 drafter0; do cl_wait_exit $n 30 || fail "$n exited with '$CL_RC' after the stop signal"; done
grep -q "stop signal (no drain: paused for want of space, a final checkpoint may not fit)" "$CL_DIR/coord.log" ||
  fail "the stop does not say why there was no drain: $(grep -v ' = ' "$CL_DIR/coord.log" | tail -3)"
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" --partial ||
  fail "exactly-once check"
((n3 >= n2)) || fail "rows lost: $n2 before the restart, $n3 after"
echo "ok: paused below min_free_mb (restart included), resumed with room, a resume refused, the operator's pause kept, stopped clean"
