#!/usr/bin/env bash
# pipeline_gpu.sh: the whole pipeline on two GPUs in one run, from the repo root: build (nvcc), then
# coordinator + target-d@0 (GPU 0, CUDA) + drafter-d@1 (GPU 1, CUDA; on one GPU drafter-d@0 beside the
# target, see PIPE_SHARE_GPU) train for SECONDS (default 300)
# on a random Qwen3 target of small-realistic shape; halfway the target is SIGKILLed and restarted by
# this script while the drafter keeps training; then drain. Reports the drafter's idle fraction
# (waiting for slots with nothing left on its GPU), samples/s, tokens/s, ring occupancy, target
# throughput, the restart; then runs tests/test_gpu_cluster.sh with the time left. A table last.
# Usage: bench/pipeline_gpu.sh [SECONDS]. Env: PIPE_TARGETS / PIPE_DRAFTERS (default 1 / 1: targets on
# GPUs 0.., drafters, one NCCL group, on the GPUs after them; target-d@0 is the one killed),
# PIPE_SHARE_GPU (auto: drafters on the targets' GPUs, numbered from 0, when there are too few), PIPE_STEPS
# (default "build run test"), PIPE_BUDGET
# (s, default 520: the run is shortened rather than cut off), PIPE_SHAPE (realistic | small | tiny;
# tiny with PIPE_BACKEND=cpu checks this script on a machine without a GPU).
# Logs: $OUT when set, else build-gpu/pipeline-logs.
set -u
cd "$(dirname "$0")/.."
T_START=$(date +%s)
. tools/device-env.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 DFLASH_SRC=$PWD
B=${PIPE_BUILD:-build-gpu}
export DFLASH_BUILD=$PWD/$B
DUR=${1:-300}
BUDGET=${PIPE_BUDGET:-520}
STEPS=${PIPE_STEPS:-build run test}
DEST=${OUT:-$B/pipeline-logs}
mkdir -p "$DEST"
SUMMARY=$DEST/pipeline_summary.txt
LOG=$DEST/pipeline.log
: >"$SUMMARY"
: >"$LOG"
exec 3>&1 >>"$LOG" 2>&1     # everything to the log; say / note also to the terminal (fd 3)
say() { echo "$*"; echo "$*" >&3; }
note() { echo "$*" >>"$SUMMARY"; say "$*"; }      # and into the summary printed last
left() { echo $((BUDGET - ($(date +%s) - T_START))); }

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY" >&3

# ---- build ----------------------------------------------------------------------------------------
if [[ " $STEPS " == *" build "* ]]; then
  t0=$(date +%s)
  make -j"${JOBS:-16}" BUILD=$B $B/bin/coordinator-d $B/bin/target-d $B/bin/drafter-d $B/bin/dflashctl \
    $B/bin/dflash-data >"$DEST/build.log" 2>&1
  rc=$?
  ldd $B/bin/drafter-d 2>/dev/null | grep -q 'libnccl[^ ]* => /' && nccl="with NCCL" || nccl="without NCCL"
  note "$(printf '%-28s %-10s %4ss  (%s)' build "$([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)")" $(($(date +%s) - t0)) "$nccl")"
  [[ $rc == 0 ]] || { tail -n 30 "$DEST/build.log" >&3; exit 1; }
fi

# ---- the 5-minute run -------------------------------------------------------------------------------
run_pipeline() {
  . tests/lib/cluster.sh
  R=/dev/shm/dflash-pipe-$$     # model, data, ring, ledger, checkpoints: all on tmpfs
  local shape=${PIPE_SHAPE:-realistic}
  rm -rf "$R"
  mkdir -p "$R"
  trap 'cl_cleanup; rm -rf "$R"' EXIT
  # cl_init's tiny model and data are replaced below; it writes the ini and the dirs.
  cl_init "$R/c" 200 || return 1
  local V H L NH NKV D FF TB MINL MAXL ANCH BS backend=${PIPE_BACKEND:-cuda}
  case $shape in
    tiny)  V=256 H=64 L=8 NH=4 NKV=2 D=16 FF=128 TB=1024 MINL=24 MAXL=256 ANCH=16 BS=4 ;;
    small) V=2048 H=256 L=4 NH=4 NKV=2 D=64 FF=512 TB=8192 MINL=128 MAXL=1024 ANCH=128 BS=8 ;;
    *)     V=65536 H=2048 L=16 NH=16 NKV=8 D=128 FF=6144 TB=16384 MINL=512 MAXL=3072 ANCH=512 BS=16 ;;
  esac
  local t0 py TORCH_PY=
  t0=$(date +%s)
  # The interpreter with torch (PATH's python3 on a GPU host, not always /usr/bin/python3).
  for py in python3 /usr/bin/python3 /usr/local/bin/python3; do
    if [[ -z $TORCH_PY ]] && command -v "$py" >/dev/null && "$py" -c 'import torch, safetensors' 2>/dev/null; then
      TORCH_PY=$(command -v "$py")
    fi
  done
  if [[ $shape != tiny && -z $TORCH_PY ]]; then
    say "no python3 with torch and safetensors: the model cannot be made"
    return 1
  fi
  # The data (CPU) while the model is made (GPU 0).
  ( "$CL_PY" tools/mkdata.py -n 2500 --vocab $V --min-len $MINL --max-len $MAXL --rules 4 -o "$R/data.jsonl" &&
    "$CL_BIN/dflash-data" build -o "$CL_DIR/data.bin" -v $V "$R/data.jsonl" >/dev/null ) &
  local dpid=$!
  rm -rf "$CL_DIR/model"
  if [[ $shape == tiny ]]; then
    "$CL_PY" tools/mkmodel.py "$CL_DIR/model" --vocab $V --layers $L >/dev/null
  elif ! "$TORCH_PY" - "$CL_DIR/model" $V $H $L $NH $NKV $D $FF <<'EOF'; then
import json, os, sys
import torch
from safetensors.torch import save_file
out = sys.argv[1]
V, H, L, NH, NKV, D, FF = map(int, sys.argv[2:])
os.makedirs(out, exist_ok=True)
torch.manual_seed(1)
def normal(*shape):
    return (torch.randn(*shape, device="cuda:0") * 0.02).to(torch.bfloat16).cpu()
def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)
t = {"model.embed_tokens.weight": normal(V, H), "model.norm.weight": ones(H), "lm_head.weight": normal(V, H)}
for i in range(L):
    p = "model.layers.%d." % i
    t.update({p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
              p + "self_attn.q_proj.weight": normal(NH * D, H), p + "self_attn.k_proj.weight": normal(NKV * D, H),
              p + "self_attn.v_proj.weight": normal(NKV * D, H), p + "self_attn.o_proj.weight": normal(H, NH * D),
              p + "self_attn.q_norm.weight": ones(D), p + "self_attn.k_norm.weight": ones(D),
              p + "mlp.gate_proj.weight": normal(FF, H), p + "mlp.up_proj.weight": normal(FF, H),
              p + "mlp.down_proj.weight": normal(H, FF)})
save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": H, "num_hidden_layers": L,
       "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": D, "intermediate_size": FF,
       "vocab_size": V, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
       "rope_scaling": None, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
print("model: %.2f B parameters" % (sum(x.numel() for x in t.values()) / 1e9))
EOF
    say "model generation (torch) failed"
    wait $dpid
    return 1
  fi
  if ! wait $dpid; then say "data generation failed"; return 1; fi
  local tokens
  tokens=$("$CL_PY" -c "import os; print(os.path.getsize('$CL_DIR/data.bin') // 5)")
  note "shape: Qwen3 target hidden $H, $L layers, $NH/$NKV heads x $D, FFN $FF, vocab $V (random bf16); data ~${tokens} tokens (2500 sequences of $MINL-$MAXL); batches of <= $TB tokens; made in $(($(date +%s) - t0)) s"
  # 3 drafter layers -> captured target layers 1, 7, 13 (DFlash default ids for 16 layers).
  local NT=${PIPE_TARGETS:-1} ND=${PIPE_DRAFTERS:-1} i
  DRAFTERS=() TARGETS=()
  for ((i = 0; i < NT; i++)); do TARGETS+=(target$i); done
  # Instance i runs on GPU i. With fewer GPUs than daemons (PIPE_SHARE_GPU=auto), or PIPE_SHARE_GPU=1,
  # the drafters are numbered from 0 and share the targets' GPUs: a check of the pipeline, not of its speed.
  local ngpu share=${PIPE_SHARE_GPU:-auto} d0=$NT
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [[ $share == auto ]] && { [[ $backend == cuda ]] && ((ngpu < NT + ND)) && share=1 || share=0; }
  [[ $share == 1 ]] && d0=0
  if [[ $backend == cuda ]] && ((d0 + ND > ngpu || NT > ngpu)); then
    say "$NT target(s) and $ND drafter(s) need more than the $ngpu GPU(s) here (drafters of one group cannot share one)"
    return 1
  fi
  for ((i = d0; i < d0 + ND; i++)); do DRAFTERS+=(drafter$i); done
  note "layout: target-d on GPU 0-$((NT - 1)), drafter-d on GPU $d0-$((d0 + ND - 1)) (one group of $ND)$([[ $share == 1 ]] && echo ", SHARING the targets' GPUs ($ngpu GPU(s) here)")"
  cl_ini_add model.capture_layers= model.draft_layers=3 target.backend=$backend drafter.backend=$backend \
    ring.slots=$((8 * NT)) ring.max_tokens=$TB ring.max_seqs=16 data.token_budget=$TB data.max_seq_len=$MAXL \
    data.bucket_width=$((MAXL / 12)) data.epochs=100 target.prefetch=3 target.devices=$((NT + ND)) \
    drafter.devices=$((NT + ND)) drafter.world_size=$ND \
    drafter.block_size=$BS drafter.num_anchors=$ANCH drafter.lr=6e-4 drafter.warmup_steps=50 \
    drafter.checkpoint_every=400 drafter.keep_checkpoints=2 coordinator.dead_after_ms=30000 \
    coordinator.heartbeat_ms=500
  cp "$CL_INI" "$DEST/dflash.ini"

  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] == "running"' 60 coord || { say "coordinator did not come up"; cl_logs 20; return 1; }
  cl_ring_hold
  t0=$(date +%s)
  for i in "${TARGETS[@]}"; do cl_start $i target-d -c "$CL_INI" -i ${i#target}; done
  for i in "${DRAFTERS[@]}"; do cl_start $i drafter-d -c "$CL_INI" -i ${i#drafter}; done
  # status samples every second for the ring occupancy and the throughput figures
  ( while :; do
      "$CL_BIN/dflashctl" -s "$CL_SOCK" --json status 2>/dev/null | tr -d '\n' >>"$R/status.jsonl" && echo >>"$R/status.jsonl"
      sleep 1
    done ) &
  local spid=$!
  if ! cl_wait 'step() >= 5' 180 coord; then say "no training"; cl_logs 30; kill $spid; return 1; fi
  local t_train ready_s
  t_train=$(date +%s)
  ready_s=$((t_train - t0))
  note "first steps after ${ready_s} s (daemon start: model loads, CUDA set-up)"
  # Shorten rather than be cut off: setup so far plus drain must fit the budget.
  local dur=$DUR l
  l=$(left)
  ((dur > l - 60)) && dur=$((l - 60))
  ((dur < 60)) && dur=60
  sleep $((dur / 2))
  cl_status
  local s0 kill_t
  s0=$(cl_json 'step()')
  kill_t=$(date +%s.%N)
  cl_kill target0 KILL
  cl_wait_exit target0 10
  note "target SIGKILLed at $(($(date +%s) - t_train)) s, drafter step $s0 (exit $CL_RC)"
  cl_wait 'len(targets()) < '$NT 30 coord
  mv "$CL_DIR/target0.log" "$CL_DIR/target0-killed.log"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_wait '[t for t in targets() if t["pid"] == '"$(cl_pid target0)"' and t.get("published", 0) >= 1]' 120 coord ||
    say "restarted target does not publish"
  local back_t s1
  back_t=$(date +%s.%N)
  s1=$(cl_json 'step()')
  note "$(awk -v a="$kill_t" -v b="$back_t" -v s0="$s0" -v s1="$s1" 'BEGIN { printf "restarted target published again %.1f s after the kill; the drafter took %d steps meanwhile", b - a, s1 - s0 }')"
  local rest=$((t_train + dur - $(date +%s)))
  ((rest > 0)) && sleep $rest
  cl_status
  note "trained for $(($(date +%s) - t_train)) s; before drain: $(cl_json 's["batches"]')"
  kill $spid 2>/dev/null
  local td
  td=$(date +%s)
  "$CL_BIN/dflashctl" -s "$CL_SOCK" drain
  local n rc=0
  for n in "${TARGETS[@]}" "${DRAFTERS[@]}" coord; do
    cl_wait_exit $n 120 || { say "$n exited with '$CL_RC'"; rc=1; }
  done
  note "drain: every daemon exited ($([[ $rc == 0 ]] && echo "all 0" || echo "NOT all 0")) in $(($(date +%s) - td)) s"
  local ck
  ck=$(grep -o 'checkpoint [^ ]*step-[0-9]* ([a-z ]*, written in [0-9]* ms' "$CL_DIR/${DRAFTERS[0]}.log" |
    sed 's/.*step-0*\([0-9][0-9]*\) (\([a-z ]*\), written in \([0-9]*\) ms/step \1 \2 \3 ms/' | tr '\n' ';' | sed 's/;$//')
  local paused
  paused=$(grep -o 'training paused [0-9]* ms' "$CL_DIR/${DRAFTERS[0]}.log" | awk '{printf "%s%s", sep, $3; sep="/"}')
  note "drafter checkpoints (step, why, write time beside training): ${ck:-none}; training paused ${paused:-0} ms for the snapshots"
  cp "$CL_DIR/state/metrics-rank0.jsonl" "$DEST/" 2>/dev/null
  cp "$R/status.jsonl" "$DEST/" 2>/dev/null
  tar -C "$CL_DIR" -czf "$DEST/daemon-logs.tar.gz" $(cd "$CL_DIR" && ls ./*.log) 2>/dev/null
  "$CL_PY" - "$CL_DIR/state/metrics-rank0.jsonl" "$R/status.jsonl" "$t_train" "$kill_t" "$back_t" >>"$SUMMARY" <<'EOF'
import json, math, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
stat = []
for l in open(sys.argv[2]):
    try:
        stat.append(json.loads(l))
    except ValueError:
        pass
t_train, kill_t, back_t = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rows = [r for r in rows if r["time"] >= t_train]
a, b = rows[0], rows[-1]
dt = b["time"] - a["time"]
tok = sum(r["tokens"] for r in rows[1:])
fin = all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows)
k = max(5, len(rows) // 10)
print("RESULT window_s %.1f" % dt)
print("RESULT steps %d" % (b["step"] - a["step"]))
print("RESULT step_ms_median %.1f" % st.median(r["step_ms"] for r in rows))
print("RESULT drafter_tokens_per_s %.0f" % (tok / dt))
print("RESULT drafter_samples_per_s %.2f" % ((b["samples"] - a["samples"]) / dt))
print("RESULT drafter_idle_frac %.4f" % ((b["idle_s"] - a["idle_s"]) / dt))
down = [r for r in rows if kill_t <= r["time"] <= back_t]
print("RESULT steps_while_target_down %d" % len(down))
# the same figures without the target's outage (kill to 5 s after its first publication again)
def at(t):
    prev = [r for r in rows if r["time"] <= t]
    return prev[-1] if prev else rows[0]
k0, k1 = at(kill_t), at(back_t + 5)
sdt = dt - (k1["time"] - k0["time"])
stok = tok - sum(r["tokens"] for r in rows if k0["time"] < r["time"] <= k1["time"])
print("RESULT steady_tokens_per_s %.0f" % (stok / sdt))
print("RESULT steady_samples_per_s %.2f" % (((b["samples"] - a["samples"]) - (k1["samples"] - k0["samples"])) / sdt))
print("RESULT steady_idle_frac %.4f" % (((b["idle_s"] - a["idle_s"]) - (k1["idle_s"] - k0["idle_s"])) / sdt))
print("RESULT loss_first %.4f" % (sum(r["loss"] for r in rows[:k]) / k))
print("RESULT loss_last %.4f" % (sum(r["loss"] for r in rows[-k:]) / k))
print("RESULT accept_len_first %.3f" % (sum(r["accept_len"] for r in rows[:k]) / k))
print("RESULT accept_len_last %.3f" % (sum(r["accept_len"] for r in rows[-k:]) / k))
print("RESULT loss_all_finite %s" % ("yes" if fin else "NO"))
ring = [s["ring"] for s in stat if "ring" in s]
if ring:
    n = ring[0]["slots"]
    for key in ("ready", "writing", "reading", "free"):
        print("RESULT ring_%s_mean %.2f" % (key, sum(r[key] for r in ring) / len(ring)))
    print("RESULT ring_full_frac %.3f" % (sum(1 for r in ring if r["free"] == 0) / len(ring)))
    print("RESULT ring_empty_frac %.3f" % (sum(1 for r in ring if r["ready"] == 0) / len(ring)))
    print("RESULT ring_slots %d" % n)
tps = [d.get("tokens_per_s", 0) for s in stat for d in s.get("daemons", []) if d.get("role") == "target" and d.get("alive")]
if tps:
    print("RESULT target_tokens_per_s_median %.0f" % st.median(tps))
fwd = [d.get("forward_ms", 0) for s in stat for d in s.get("daemons", []) if d.get("role") == "target" and d.get("alive")]
if fwd:
    print("RESULT target_forward_ms_median %.1f" % st.median(fwd))
EOF
  return $rc
}

if [[ " $STEPS " == *" run "* ]]; then
  t0=$(date +%s)
  ( run_pipeline )
  rc=$?
  note "$(printf '%-28s %-10s %4ss' "pipeline ${DUR}s" "$([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)")" $(($(date +%s) - t0)))"
fi

# ---- the short GPU cluster test with what is left ----------------------------------------------------
if [[ " $STEPS " == *" test "* ]]; then
  l=$(left)
  if ((l < 40)); then
    note "$(printf '%-28s %-10s' test_gpu_cluster "NOT RUN (budget)")"
  else
    t0=$(date +%s)
    TMPDIR=$(mktemp -d) DFLASH_TEST_TMP=$(mktemp -d) timeout -k 5 $((l - 5)) tests/test_gpu_cluster.sh >"$DEST/test_gpu_cluster.log" 2>&1
    rc=$?
    st=PASS; [[ $rc == 77 ]] && st=SKIP; [[ $rc != 0 && $rc != 77 ]] && st="FAIL($rc)"
    note "$(printf '%-28s %-10s %4ss' test_gpu_cluster "$st" $(($(date +%s) - t0)))"
    grep -h 'phase ok\|^ok:\|FAIL\|kill [12]:\|ranks agree\|paused:\|jsonl:' "$DEST/test_gpu_cluster.log" | tail -n 14 |
      while IFS= read -r l; do note "    $l"; done
  fi
fi
note "total $(($(date +%s) - T_START)) s"
echo "==== summary ====" >&3
cat "$SUMMARY" >&3
