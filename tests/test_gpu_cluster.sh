#!/usr/bin/env bash
# test_gpu_cluster.sh: the cluster on the CUDA backends, plain processes (skips with exit 77
# without a GPU or without a CUDA build). Small random Qwen3 target (hidden 256, 4 layers, vocab
# 2048). The drafter runs on GPU 1, or on GPU 0 beside the target where there is one GPU. Phases
# (GPU_PHASES, default "kill dp nan hang nanbatch"), each a fresh cluster:
#  kill: coordinator + target-d@0 + one drafter-d; the target is SIGKILLed twice mid-run and
#        restarted by this test; the drafter process keeps training throughout (it steps on what
#        the ring holds while the target is down); drain: every daemon exits 0, no batch lost or
#        trained twice, no slot left WRITING/READING, every loss finite, loss falls.
#  dp:   two drafters (GPUs 0 and 1, NCCL group of 2) + one target: both ranks see the same summed
#        metrics at every step (the NCCL all-reduce), drain cleanly. Needs two GPUs (left out
#        with one: NCCL takes one rank per GPU).
#  nan:  drafter.debug_nan_step poisons one step's loss: the step is skipped, the error reaches
#        the coordinator, the cluster pauses, no checkpoint is written from then on.
#  hang: target.debug_stall_batch hangs the GPU (a kernel that never ends) before one batch: the
#        target notices after target.gpu_timeout_ms (nothing else would: its loop, heartbeats and
#        watchdog go on), reports it and exits 1; the coordinator takes its leases back; the target
#        started again without the key, the batch is trained once and the drain is clean.
#  nanbatch: target.debug_nan_batch poisons one batch's captured states: the CUDA drafter (its
#        result read a step late) skips that step and hands the batch back, the cluster pauses;
#        the target restarted without the key, `dflashctl resume`: the same drafter process, in
#        the same generation, trains the batch once it is published again (its group forgot the
#        skipped step; else it would leave it out as a repeat for ever), checkpoints again, and
#        the drain finds every batch trained once.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
export NCCL_NVLS_ENABLE=0

n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
((n_gpu >= 1)) || { echo "SKIP: no GPU"; exit 77; }
[[ -x $CL_BIN/target-d ]] || { echo "missing $CL_BIN/target-d (build first)"; exit 1; }
PHASES=${GPU_PHASES:-kill dp nan hang nanbatch}
# The drafter's instance index is its GPU: 1, or 0 (sharing the target's) on a one-GPU machine.
DI=$((n_gpu >= 2 ? 1 : 0))
DR=drafter$DI

# A fresh cluster dir for one phase, CUDA on both sides.
gpu_init() {
  cl_cleanup
  CL_VOCAB=2048 CL_MKMODEL_ARGS="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512 --layers 4" \
    CL_MKDATA_ARGS="--min-len 64 --max-len 512" cl_init "$T/$1" 4000 || exit 1
  cl_ini_add target.backend=cuda drafter.backend=cuda ring.slots=8 ring.max_tokens=4096 ring.max_seqs=64 \
    data.token_budget=4096 data.max_seq_len=512 data.bucket_width=64 data.epochs=100 target.prefetch=3 \
    drafter.block_size=8 drafter.num_anchors=64 drafter.warmup_steps=20 drafter.lr=2e-3 drafter.checkpoint_every=100 \
    drafter.keep_checkpoints=0 drafter.devices=2 target.devices=2
  if ! "$CL_BIN/target-d" -c "$CL_INI" -i 0 -t >/dev/null 2>&1 || ! "$CL_BIN/drafter-d" -c "$CL_INI" -i $DI -t >/dev/null 2>&1; then
    echo "SKIP: this build has no CUDA target/drafter backend"
    exit 77
  fi
}

# Drain, every process exits 0, the ledger and the ring are consistent.
drain_and_check() {
  local n
  "$CL_BIN/dflashctl" -s "$CL_SOCK" drain || fail "dflashctl drain"
  for n in "$@" coord; do cl_wait_exit "$n" 60 || fail "$n exited with '$CL_RC'"; done
  [[ $(cl_sql 'SELECT count(*) FROM batches WHERE state NOT IN (0, 4)') == 0 ]] || fail "ledger not consistent after the drain"
  [[ $(cl_sql 'SELECT count(*) FROM batches b WHERE (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) != (b.state = 4)') == 0 ]] ||
    fail "a batch lost or trained twice"
  local states
  states=$(cl_ring_states 8)
  [[ $states != *WRITING* && $states != *READING* ]] || fail "slot leaked: $states"
  ! ls /dev/shm | grep -q "dflash-$CL_NAME" || fail "shm objects left at the end"
}

# Every loss finite; with `falls`, the last tenth below the first tenth.
check_metrics() {
  "$CL_PY" - "$1" "${2:-}" <<'EOF' || fail "metrics of $1"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows, "no metrics"
bad = [r["step"] for r in rows if r["loss"] is None or not math.isfinite(r["loss"])]
assert not bad, ("non-finite loss at steps", bad[:5])
loss = [r["loss"] for r in rows]
k = max(5, len(loss) // 10)
first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
print("%s: %d steps, loss %.3f -> %.3f, accept_len %.2f -> %.2f" % (sys.argv[1].split("/")[-1], len(rows), first, last,
      sum(r["accept_len"] for r in rows[:k]) / k, sum(r["accept_len"] for r in rows[-k:]) / k))
if sys.argv[2] == "falls":
    assert last < first - 0.1, "loss did not fall"
    # step time is the GPU's (input there to results back), not the time between results: with
    # the target down twice, the steps' sum is well under the run's span
    assert all(r["step_ms"] > 0 for r in rows[1:]), "a step without its GPU time"
    span = rows[-1]["time"] - rows[0]["time"]
    busy = sum(r["step_ms"] for r in rows[1:]) / 1e3
    print("GPU step time: median %.2f ms, %.1f s of the %.1f s between the first and last result (%.0f%%)" % (
          sorted(r["step_ms"] for r in rows)[len(rows) // 2], busy, span, 100 * busy / span))
    assert busy < 0.9 * span, "step_ms sums to the run's span: the time between results, not the GPU's"
EOF
}

phase_kill() {
  gpu_init kill
  cl_start_coord || fail "coordinator did not come up"
  cl_ring_hold || fail "no ring"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start $DR drafter-d -c "$CL_INI" -i $DI
  cl_wait 'step() >= 100 and len(targets()) == 1' 90 coord || fail "no training"
  cl_log "training: $(cl_json 's["drafter"]')"
  # the slot's copy to the GPU is timed and shown
  cl_wait 'drafters() and drafters()[0].get("h2d_ms", 0) > 0' 10 coord || fail "no H2D time in the drafter's heartbeat"
  "$CL_BIN/dflashctl" -s "$CL_SOCK" daemons | grep -q "^drafter .*, h2d [0-9.]* ms" ||
    fail "dflashctl daemons shows no h2d: $("$CL_BIN/dflashctl" -s "$CL_SOCK" daemons)"
  local k s0 s1
  for k in 1 2; do
    cl_wait '[t for t in targets() if t.get("published", 0) >= 10]' 30 coord || fail "target 0 is not publishing"
    cl_kill target0 KILL
    cl_wait_exit target0 10
    [[ $CL_RC == 137 ]] || fail "target 0 exit after SIGKILL: $CL_RC"
    cl_status && s0=$(cl_json 'step()')
    # Down: the coordinator notices, the drafter trains on what the ring still holds.
    cl_wait 'not targets()' 15 coord || fail "the coordinator did not notice the target's death"
    sleep 1
    cl_status && s1=$(cl_json 'step()')
    cl_log "kill $k: step $s0 -> $s1 while the target was down; ring $(cl_json '{k: s["ring"][k] for k in ("ready", "writing", "reading", "free")}')"
    cl_start target0 target-d -c "$CL_INI" -i 0
    cl_wait 'step() >= '$((s1 + 100))' and [t for t in targets() if t.get("published", 0) >= 3]' 60 coord ||
      fail "training did not resume after restart $k"
  done
  cl_alive $DR || fail "the drafter died"
  cl_wait 'step() >= 1500' 90 coord || fail "not enough steps"
  cl_log "before drain: $(cl_json 's["drafter"]') $(cl_json 's["batches"]')"
  drain_and_check target0 $DR
  [[ $(grep -c "ready: drafter" "$CL_DIR/$DR.log") == 1 ]] || fail "the drafter was not one process throughout"
  grep -q "backend cuda" "$CL_DIR/$DR.log" || fail "the drafter did not run on CUDA"
  local n_deaths
  n_deaths=$(grep -c "target-d@0 (pid [0-9]*, member [0-9]*) left" "$CL_DIR/coord.log")
  ((n_deaths >= 2)) || fail "the coordinator saw $n_deaths departures of target 0"
  check_metrics "$CL_DIR/state/metrics-rank0.jsonl" falls
  cl_log "kill phase ok: $(cl_sql 'SELECT count(*) FROM batches WHERE state = 4') batches trained once, $(cl_sql 'SELECT count(*) FROM batches WHERE leases > 1') re-leased"
}

phase_dp() {
  if ((n_gpu < 2)); then
    cl_log "dp phase left out: one GPU here, NCCL takes one rank per GPU"
    return 0
  fi
  gpu_init dp
  cl_ini_add drafter.world_size=2
  cl_start_coord || fail "coordinator did not come up"
  cl_ring_hold || fail "no ring"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_start drafter1 drafter-d -c "$CL_INI" -i 1
  cl_wait 's["group"]["active"] and step() >= 200' 90 coord || fail "no data-parallel training"
  cl_log "data parallel: $(cl_json 's["drafter"]')"
  drain_and_check target0 drafter0 drafter1
  local i
  for i in 0 1; do grep -q "rank $i of 2" "$CL_DIR/drafter$i.log" || fail "drafter $i was not rank $i of 2"; done
  check_metrics "$CL_DIR/state/metrics-rank0.jsonl"
  "$CL_PY" - "$CL_DIR/state/metrics-rank0.jsonl" "$CL_DIR/state/metrics-rank1.jsonl" <<'EOF' || fail "ranks disagree"
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p))} for p in sys.argv[1:3])
common = sorted(set(a) & set(b))
assert len(common) >= 100, ("steps seen by both ranks", len(common))
for s in common:
    for k in ("loss", "accept_len", "tokens", "grad_norm"):
        assert a[s][k] == b[s][k], (s, k, a[s][k], b[s][k])
print("ranks agree on %d steps (NCCL-summed loss, tokens, norm)" % len(common))
EOF
}

phase_nan() {
  gpu_init nan
  cl_ini_add drafter.debug_nan_step=60 drafter.checkpoint_every=25
  cl_start_coord || fail "coordinator did not come up"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start $DR drafter-d -c "$CL_INI" -i $DI
  cl_wait 's["state"] == "paused" and [e for e in s["errors"] if "not finite" in e["message"]]' 90 coord ||
    fail "the non-finite loss did not pause the cluster"
  cl_log "paused: $(cl_json 's["errors"][0]["message"]')"
  sleep 1
  "$CL_BIN/dflashctl" -s "$CL_SOCK" stop || fail "dflashctl stop"
  local n
  for n in target0 $DR coord; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
  local last
  last=$(ls "$CL_DIR/state/checkpoints" | grep '^step-' | sort | tail -n 1)
  [[ $last == step-0000000050 ]] || fail "checkpoints after the NaN step: newest is '$last' (expected step-0000000050)"
  grep -q "no checkpoint (.*non-finite" "$CL_DIR/$DR.log" || fail "the drafter did not refuse a checkpoint"
  check_metrics "$CL_DIR/state/metrics-rank0.jsonl"
  cl_log "nan phase ok: newest checkpoint $last"
}

phase_hang() {
  local bad=30 i
  gpu_init hang
  cl_start_coord || fail "coordinator did not come up"
  cl_start target0 target-d -c "$CL_INI" -i 0 -o target.debug_stall_batch=$bad -o target.gpu_timeout_ms=3000
  cl_start $DR drafter-d -c "$CL_INI" -i $DI
  cl_wait_exit target0 90 || true
  [[ $CL_RC == 1 ]] || fail "the target on a hung GPU exited '$CL_RC', wanted 1: $(tail -3 "$CL_DIR/target0.log")"
  grep -q "batch [0-9]*:[0-9]* on the GPU for [0-9]* s (target.gpu_timeout_ms 3000): the GPU hangs" "$CL_DIR/target0.log" ||
    fail "no hang reported: $(tail -3 "$CL_DIR/target0.log")"
  cl_wait '[e for e in s["errors"] if "the GPU hangs" in e["message"]]' 10 coord || fail "the coordinator has no error of the hang"
  cl_log "hang: $(grep -m1 "the GPU hangs" "$CL_DIR/target0.log")"
  # A stop while the GPU hangs: finishing the pipeline polls as the loop does, so the hang is
  # still caught and the target leaves (it waited in an event for ever). The hang comes a few
  # batches in (the batches the dead target held come first): a process's first forward loads
  # its kernels, which waits for a GPU that hangs, as no forward of a running target does.
  local bad2=$((bad + 5))
  cl_start target0s target-d -c "$CL_INI" -i 0 -o target.debug_stall_batch=$bad2 -o target.gpu_timeout_ms=5000
  cl_wait_log "$CL_DIR/target0s.log" "the GPU hangs from batch 0:$bad2 on" 60 || fail "batch $bad2 did not come to hang the GPU"
  cl_kill target0s TERM
  cl_wait_exit target0s 60 || true
  [[ $CL_RC == 1 ]] && grep -q "batch 0:$bad2 on the GPU for [0-9]* s (target.gpu_timeout_ms 5000): the GPU hangs" "$CL_DIR/target0s.log" ||
    fail "a stop while the GPU hangs: exit '$CL_RC': $(tail -3 "$CL_DIR/target0s.log")"
  # (the stop came first: the hang was caught while the pipeline was being finished)
  local at_stop at_hang
  at_stop=$(grep -n "finishing the batch in flight" "$CL_DIR/target0s.log" | head -1 | cut -d: -f1)
  at_hang=$(grep -n "the GPU hangs; exiting" "$CL_DIR/target0s.log" | head -1 | cut -d: -f1)
  [[ -n $at_stop && -n $at_hang ]] && ((at_stop < at_hang)) ||
    fail "a stop while the GPU hangs: the hang was not caught after the stop: $(tail -4 "$CL_DIR/target0s.log")"
  cl_log "stop while hung: exit 1 after the hang check"
  cl_start target0 target-d -c "$CL_INI" -i 0
  for ((i = 0; i < $(cl_scaled 60) * 10; i++)); do
    [[ $(cl_sql "SELECT count(*) FROM trains WHERE batch = $bad AND rolled_back = 0") == 1 ]] && break
    sleep 0.1
  done
  [[ $(cl_sql "SELECT count(*) FROM trains WHERE batch = $bad AND rolled_back = 0") == 1 ]] ||
    fail "batch $bad not trained after the target's restart"
  cl_wait 'step() >= 200' 60 coord || fail "no training after the restart"
  drain_and_check target0 $DR
  check_metrics "$CL_DIR/state/metrics-rank0.jsonl"
  cl_log "hang phase ok"
}

phase_nanbatch() {
  local bad=40 i
  gpu_init nanbatch
  cl_ini_add drafter.checkpoint_every=25
  cl_start_coord || fail "coordinator did not come up"
  cl_start target0 target-d -c "$CL_INI" -i 0 -o target.debug_nan_batch=$bad
  cl_start $DR drafter-d -c "$CL_INI" -i $DI
  cl_wait 's["state"] == "paused" and [e for e in s["errors"] if "not finite" in e["message"]]' 90 coord ||
    fail "the poisoned batch did not pause the cluster"
  cl_log "paused: $(cl_json 's["errors"][0]["message"]')"
  grep -q "poisoning batch 0:$bad with NaN" "$CL_DIR/target0.log" || fail "the target did not poison batch $bad"
  local gen
  gen=$(cl_json 's["group"]["generation"]')
  [[ -z $(cl_sql "SELECT 1 FROM trains WHERE batch = $bad") ]] || fail "batch $bad has a training row before the resume"
  cl_kill target0 TERM
  cl_wait_exit target0 30 || fail "target 0 exited '$CL_RC' on SIGTERM while paused"
  cl_start target0 target-d -c "$CL_INI" -i 0 -o target.debug_nan_batch=-1
  cl_wait '[t for t in targets() if t["pid"] == '"$(cl_pid target0)"']' 30 coord || fail "the target did not come back"
  [[ $(cl_json 's["state"]') == paused ]] || fail "the target's restart ended the pause"
  "$CL_BIN/dflashctl" -s "$CL_SOCK" resume || fail "dflashctl resume"
  # Trained (and checkpointed: the drafter checkpoints again after the resume), in the same
  # generation, by the drafter process that met the NaN.
  for ((i = 0; i < $(cl_scaled 60) * 10; i++)); do
    [[ $(cl_sql "SELECT state FROM batches WHERE id = $bad") == 4 ]] && break
    sleep 0.1
  done
  [[ $(cl_sql "SELECT state FROM batches WHERE id = $bad") == 4 ]] ||
    fail "batch $bad not trained and checkpointed 60 s after the resume (state $(cl_sql "SELECT state FROM batches WHERE id = $bad"); $(grep -c "is a repeat" "$CL_DIR/$DR.log") repeats left out)"
  local row
  row=$(cl_sql "SELECT gen || ' ' || step FROM trains WHERE batch = $bad AND rolled_back = 0")
  [[ ${row% *} == "$gen" ]] || fail "batch $bad trained as '$row' (generation step), not by generation $gen"
  cl_log "batch $bad trained after the resume: generation ${row% *} step ${row#* }"
  drain_and_check target0 $DR
  [[ $(grep -c "ready: drafter" "$CL_DIR/$DR.log") == 1 ]] || fail "the drafter was not one process throughout"
  check_metrics "$CL_DIR/state/metrics-rank0.jsonl"
  cl_log "nanbatch phase ok"
}

for p in $PHASES; do
  cl_log "---- phase $p"
  "phase_$p"
done
echo "ok: phases $PHASES$( ((n_gpu < 2)) && [[ " $PHASES " == *" dp "* ]] && echo " (dp left out: one GPU)")"
