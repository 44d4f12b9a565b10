#!/usr/bin/env bash
# test_cluster.sh: the cluster end to end on the CPU backend, plain processes: coordinator +
# 2 targets + 2 data-parallel drafters train a tiny model for one epoch, in two runs:
#  1. train part of the epoch, `dflashctl drain`: every daemon exits 0 after a final
#     checkpoint, the ledger is consistent, nothing is left in /dev/shm;
#  2. start everything again: the drafters load that checkpoint back and continue from its
#     step, the epoch completes.
# Rank 0's checkpoint timings show in `dflashctl daemons`.
# Then: the loss fell, every batch of the epoch was trained exactly once and is checkpointed,
# the ring ends with every slot FREE, no shm object or socket remains, and both ranks held the
# same parameters at every checkpoint-due step (tests/soak/check_run.py).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 6000 || exit 1
# each pick waits for two READY slots (a mix of both targets' batches), or 300 ms across the
# drafter's wait slices
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=40 drafter.min_ready=2 drafter.ready_timeout_ms=300
D=$CL_DIR

start_all() {
  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] in ("running", "starting")' 30 coord || fail "coordinator did not come up"
  for i in 0 1; do
    cl_start target$i target-d -c "$CL_INI" -i $i
    cl_start drafter$i drafter-d -c "$CL_INI" -i $i
  done
}

expect_all_exit_0() {
  local n
  for n in target0 target1 drafter0 drafter1 ${CL_PIDS[coord]:+coord}; do
    cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
  done
}

# ---- run 1: part of the epoch, then drain -------------------------------------------------
start_all
total=$(cl_json 's["batches"]["total"]')
cl_log "run 1: $total batches in the epoch"
cl_wait 's["group"]["active"] and s["batches"]["checkpointed"] + s["batches"]["trained"] >= '$((total / 4)) 120 ||
  fail "no training progress"
# rank 0's checkpoint timings reach the coordinator and dflashctl
cl_wait 'any(d.get("ckpt_write_ms", 0) > 0 and d.get("ckpt_pause_ms", -1) >= 0 for d in s["daemons"])' 60 ||
  fail "no checkpoint timings in the status"
"$CL_BIN/dflashctl" -s "$CL_SOCK" daemons | grep -q "ckpt pause [0-9]* ms + write [0-9]* ms" ||
  fail "dflashctl daemons does not show the checkpoint timings: $("$CL_BIN/dflashctl" -s "$CL_SOCK" daemons)"
# total_steps = 0: both ranks schedule the learning rate over the epoch's batches over the group
for i in 0 1; do
  grep -q "lr horizon $(((total + 1) / 2)) steps" "$CL_DIR/drafter$i.log" ||
    fail "drafter$i: not the lr horizon of $total batches over 2 ranks: $(grep "lr horizon" "$CL_DIR/drafter$i.log")"
done
cl_log "draining at $(cl_json 's["batches"]')"
# dflashctl batches: a trained batch shows its generation and step, one not trained yet "-"; what a
# batch does not have (a slot, a holder) is "-", never a -1 or a 0 standing for none.
"$CL_BIN/dflashctl" -s "$CL_SOCK" batches >"$CL_DIR/batches.txt" || fail "dflashctl batches"
awk '$2 ~ /^(leased|published|trained)$/ {
       n++
       if ($6 == "-1" || $7 == "0" || $8 == "0") bad = bad $0 "\n"
       if ($2 == "trained" && ($8 == "-" || $9 == "-")) bad = bad $0 " (no step)\n"
       if ($2 != "trained" && $8 != "-") bad = bad $0 " (a step before training)\n"
     }
     END { if (!n || bad != "") { printf "%d rows\n%s", n, bad; exit 1 } }' "$CL_DIR/batches.txt" ||
  fail "dflashctl batches table: $(cat "$CL_DIR/batches.txt")"
# --wait returns once the cluster has ended, with the final checkpoint
"$CL_BIN/dflashctl" -s "$CL_SOCK" drain --wait "run 1 ends here" >"$CL_DIR/drain.txt" || fail "dflashctl drain --wait: $(cat "$CL_DIR/drain.txt")"
tail -n 1 "$CL_DIR/drain.txt" | grep -Eq "^drain: (the cluster is stopped: drained \(drain by dflashctl .*: run 1 ends here\); lineage head: step [0-9]+ .*/step-[0-9]+|the cluster is stopped: drained \(drain by dflashctl .*: run 1 ends here\))\$" ||
  fail "dflashctl drain --wait said: $(cat "$CL_DIR/drain.txt")"
expect_all_exit_0
cl_log "run 1 drained; ledger: $(cl_sql 'SELECT state, count(*) FROM batches GROUP BY state' | tr '\n' ' ')"
# dflashctl with the coordinator gone says how the cluster ended (its stop note), exit 1
"$CL_BIN/dflashctl" -s "$CL_SOCK" status >"$CL_DIR/ended.txt" 2>&1 && fail "dflashctl status with no coordinator: exit 0"
grep -qF "the coordinator ended the cluster ($CL_SOCK.stopped): stopped" "$CL_DIR/ended.txt" ||
  fail "dflashctl does not show the stop note: $(cat "$CL_DIR/ended.txt"; ls "$CL_DIR/run")"
# ... and, given the config, the command that reads the run's ledger, which works
"$CL_BIN/dflashctl" -c "$CL_INI" status >"$CL_DIR/ended.txt" 2>&1 && fail "dflashctl -c status with no coordinator: exit 0"
hint=$(sed -n 's/^dflashctl: the run.s record: //p' "$CL_DIR/ended.txt")
[[ $hint == "dflashctl --ledger $CL_DIR/state/$CL_NAME-ledger.db status" ]] ||
  fail "no ledger hint after the stop note: $(cat "$CL_DIR/ended.txt")"
# shellcheck disable=SC2086  # the hint is a command line
"$CL_BIN"/$hint | grep -q "checkpointed" || fail "'$hint' does not read the ledger"
# ... also from a config with a mistake outside [cluster] and [coordinator] (an edit for the next run)
sed 's/^\[drafter\]$/[drafter]\ngamma = x/' "$CL_INI" >"$CL_DIR/edited.ini"
"$CL_BIN/dflashctl" -c "$CL_DIR/edited.ini" status >"$CL_DIR/ended.txt" 2>&1 && fail "dflashctl -c edited status: exit 0"
grep -qx "dflashctl: the run.s record: dflashctl --ledger $CL_DIR/state/$CL_NAME-ledger.db status" "$CL_DIR/ended.txt" ||
  fail "no ledger hint with a mistake in [drafter]: $(cat "$CL_DIR/ended.txt")"
# Only pending (0) and checkpointed (4) remain after a clean drain.
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "ledger not consistent after drain"
done1=$(cl_sql 'SELECT count(*) FROM batches WHERE state = 4')
((done1 > 0 && done1 < total)) || fail "run 1 checkpointed $done1 of $total batches"
ck1=$(cl_sql 'SELECT step FROM checkpoints ORDER BY gen DESC, step DESC LIMIT 1')
[[ -n $ck1 ]] || fail "no checkpoint recorded"
# The checkpointed batches each trained once, none of the pending ones; the two replicas held the
# same parameters at every checkpoint-due step (every 40: from step 40 on, the first one)
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" --partial --min-hashed=3 ||
  fail "run 1: exactly-once / replica check"
# the checkpoint records the seed its anchors were drawn from (drafter.seed, 42 here), also on a
# fresh run's first generation
seed=$("$CL_PY" -c 'import struct, sys; print(struct.unpack_from("<Q", open(sys.argv[1], "rb").read(64 + 8), 64)[0])' \
  "$(cl_sql 'SELECT dir FROM checkpoints ORDER BY gen DESC, step DESC LIMIT 1')/optimizer.bin")
[[ $seed == 42 ]] || fail "checkpoint step $ck1 records seed '$seed', drafter.seed is 42"
ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left after drain: $(ls /dev/shm | grep "dflash-$CL_NAME")"
[[ -e $CL_SOCK ]] && fail "socket left after drain"
grep -q "^stopped: drained (drain by dflashctl .*: run 1 ends here)" "$CL_SOCK.stopped" 2>/dev/null || fail "stop note after the drain: '$(cat "$CL_SOCK.stopped" 2>&1)'"

# ---- run 2: load the checkpoint back, finish the epoch --------------------------------------
start_all
[[ -e $CL_SOCK.stopped ]] && fail "the new coordinator left the last run's stop note"
cl_ring_hold || fail "no ring"
cl_wait_exit coord 600 || fail "coordinator exited with '$CL_RC'"
expect_all_exit_0
grep -q "loaded checkpoint .*step-$(printf %010d "$ck1")" "$D"/drafter0.log || fail "drafter 0 did not load the step $ck1 checkpoint"
grep -q "loaded checkpoint .*step-$(printf %010d "$ck1")" "$D"/drafter1.log || fail "drafter 1 did not load the step $ck1 checkpoint"
states=$(cl_ring_states 4)
[[ $states == "FREE FREE FREE FREE" ]] || fail "ring at the end: $states"
cl_log "run 2 done"
# Every batch trained once, from the ledger, the final checkpoint and the metrics; and the two
# replicas stayed identical: the parameters' hash at every checkpoint-due step (every 40) is the
# same on both ranks (a drift shows from the first such step on; a double training only once a
# rank's step count falls behind).
"$CL_PY" tests/soak/check_run.py "$CL_DIR/state/$CL_NAME-ledger.db" "$CL_DIR/state" --min-hashed=5 ||
  fail "exactly-once / replica check"

# ---- the ledger: every batch trained exactly once, in the checkpoint lineage ----------------
n=$(cl_sql 'SELECT count(*) FROM batches')
[[ $n == "$total" ]] || fail "ledger has $n batches, epoch has $total"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state != 4') == 0 ]] || fail "not every batch is checkpointed"
once=$(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) = 1')
[[ $once == "$total" ]] || fail "$once of $total batches trained exactly once: $(cl_sql 'SELECT batch, count(*) FROM trains WHERE rolled_back = 0 GROUP BY batch HAVING count(*) != 1 LIMIT 5')"
# The run-1 batches were not trained again in run 2 (their training rows are all of generation 1).
[[ $(cl_sql 'SELECT count(*) FROM trains WHERE rolled_back = 0 AND gen = 1') == "$done1" ]] || fail "run-1 batches were trained again"
ls /dev/shm | grep -q "dflash-$CL_NAME" && fail "shm objects left at the end"
[[ -e $CL_SOCK ]] && fail "socket left at the end"

# ---- daemons started after the end: the coordinator's stop note says why; they exit 0 at once ---
grep -q "run complete" "$CL_SOCK.stopped" 2>/dev/null || fail "stop note beside the socket: '$(cat "$CL_SOCK.stopped" 2>&1)'"
cl_start late_target target-d -c "$CL_INI" -i 0
cl_start late_drafter drafter-d -c "$CL_INI" -i 0
for n in late_target late_drafter; do
  cl_wait_exit $n 30 || fail "$n (started after the end) exited with '$CL_RC'"
  [[ $CL_RC == 0 ]] || fail "$n (started after the end) exited with $CL_RC"
  grep -q "coordinator has ended the cluster (stopped: run complete.*nothing to do" "$D/$n.log" || fail "$n: $(tail -n 2 "$D/$n.log")"
done
cl_log "daemons started after the end: $(grep -h "nothing to do" "$D"/late_*.log | sed 's/^<[0-9]>//' | tr '\n' ' ')"

# ---- metrics: steps continue from the checkpoint; the loss falls ---------------------------
"$CL_PY" - "$D/state/metrics-rank0.jsonl" "$ck1" <<'EOF' || fail "metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ck = int(sys.argv[2])
gens = sorted({r["generation"] for r in rows})
run2 = [r for r in rows if r["generation"] == gens[-1]]
assert len(gens) == 2, gens
assert run2[0]["step"] == ck + 1, ("run 2 starts at step", run2[0]["step"], "checkpoint", ck)
steps = [r["step"] for r in run2]
assert steps == sorted(steps) and len(set(steps)) == len(steps), "steps not increasing"
loss = [r["loss"] for r in rows]
k = max(5, len(loss) // 10)
first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
acc = [r["accept_len"] for r in rows]
print("steps %d, loss %.3f -> %.3f, accept_len %.2f -> %.2f" % (len(rows), first, last, sum(acc[:k]) / k, sum(acc[-k:]) / k))
# ln(256) = 5.55 at the start; the structure in the data is worth well over half a nat here.
assert last < first - 0.5, "loss did not fall"
assert sum(acc[-k:]) > sum(acc[:k]), "accepted length did not grow"
EOF
echo "ok: $total batches, run 1 checkpointed $done1 at step $ck1"
