#!/usr/bin/env bash
# demo.sh: `make demo`: a small local dflash cluster on the CPU backend. Makes a tiny random
# Qwen3 target and a structured dataset, starts coordinator + 2 targets + 2 data-parallel
# drafters as plain processes (private runtime/state dir), shows live progress for about a
# minute, then drains: final checkpoint, every daemon exits 0. Everything stays in the run
# dir for a look afterwards (logs, ledger, metrics, checkpoints).
#   DEMO_SECONDS=60   how long to train before draining
#   DEMO_DIR=...      run dir (default: a new /tmp/dflash-demo.XXXXXX)
set -u
cd "$(dirname "$0")/.."
export DFLASH_SRC=$PWD DFLASH_BUILD=${DFLASH_BUILD:-$PWD/build}
. tests/lib/cluster.sh
SECS=${DEMO_SECONDS:-60}
RUN=${DEMO_DIR:-$(mktemp -d /tmp/dflash-demo.XXXXXX)}
# Each demo is a new run (a cluster name of its own): the checkpoints of an earlier one in the
# same folder belong to another run and would be refused.
if [[ -n $(ls -A "$RUN" 2>/dev/null) ]]; then
  echo "demo: DEMO_DIR $RUN is not empty (an earlier run's files): give a new or empty folder" >&2
  exit 1
fi
mkdir -p "$RUN" || exit 1
say() { printf '\033[1m== %s\033[0m\n' "$*"; }
die() { echo "demo: $*" >&2; cl_logs 10 >&2; cl_cleanup; exit 1; }

say "run dir $RUN"
say "making a tiny random Qwen3 target (4 layers, hidden 64, vocab 256) and 6000 structured samples"
cl_init "$RUN" 6000 || die "setup failed (is the build complete? make all)"
cl_ini_add data.epochs=50 drafter.world_size=2 drafter.checkpoint_every=200 drafter.keep_checkpoints=3 drafter.warmup_steps=50
trap 'echo; say "interrupted: draining"; "$CL_BIN/dflashctl" -s "$CL_SOCK" drain >/dev/null 2>&1; sleep 3; cl_cleanup; exit 130' INT TERM

say "starting coordinator-d, 2 x target-d, 2 x drafter-d (config $CL_INI)"
cl_start coordinator coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "running"' 30 coordinator >/dev/null || die "the coordinator did not come up"
for i in 0 1; do
  cl_start target$i target-d -c "$CL_INI" -i $i
  cl_start drafter$i drafter-d -c "$CL_INI" -i $i
done
cl_wait 's["group"]["active"]' 60 coordinator >/dev/null || die "the drafter group did not form"

say "training for ${SECS}s (progress from dflashctl status --json every second)"
"$CL_PY" - "$CL_BIN/dflashctl" "$CL_SOCK" "$SECS" <<'EOF'
import json, subprocess, sys, time
ctl, sock, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
print("%6s %7s %8s %8s %6s %6s %9s %9s  %s" % ("time", "step", "epoch:%", "loss", "acc", "accept",
      "draft t/s", "target t/s", "ring free/writing/ready/reading"))
t0 = time.time()
while time.time() - t0 < secs:
    p = subprocess.run([ctl, "-s", sock, "--json", "status"], capture_output=True, text=True)
    if p.returncode:
        print("dflashctl:", p.stderr.strip()); break
    s = json.loads(p.stdout)
    d = [x for x in s["daemons"] if x["role"] == "drafter" and x.get("alive")]
    t = [x for x in s["daemons"] if x["role"] == "target" and x.get("alive")]
    e, r = s["epoch"], s["ring"]
    ep = s["batches"]["checkpointed"] + s["batches"]["trained"]
    per = e["per_epoch"][e["current"]] if e["per_epoch"] else {"batches": 1}
    # trained counts batches of the next epoch too (it starts before this one is checkpointed)
    done_in_epoch = min(ep - sum(x["batches"] for x in e["per_epoch"][:e["current"]]), per["batches"])
    d0 = max(d, key=lambda x: x.get("step", 0)) if d else {}
    print("%5.0fs %7d %3d:%3.0f%% %8.4f %6.3f %6.2f %9.0f %10.0f  %d/%d/%d/%d" % (
        time.time() - t0, d0.get("step", 0), e["current"] + 1, 100.0 * done_in_epoch / max(per["batches"], 1),
        d0.get("loss") or 0, d0.get("accuracy") or 0, d0.get("accept_len") or 0,
        d0.get("tokens_per_s") or 0, s["drafter"].get("target_tokens_per_s", 0),   # (silent targets left out)
        r["free"], r["writing"], r["ready"], r["reading"]), flush=True)
    time.sleep(1)
EOF

say "dflashctl status"
"$CL_BIN/dflashctl" -s "$CL_SOCK" status
echo
say "dflashctl drain: targets finish their batch, the drafters write a final checkpoint"
"$CL_BIN/dflashctl" -s "$CL_SOCK" drain || die "drain failed"
ok=1
for n in target0 target1 drafter0 drafter1 coordinator; do
  if cl_wait_exit $n 120; then echo "  $n exited 0"; else echo "  $n: exit $CL_RC"; ok=0; fi
done
ckpt=$(cl_sql 'SELECT dir FROM checkpoints ORDER BY gen DESC, step DESC LIMIT 1')
say "final checkpoint: $ckpt"
ls -l "$ckpt" 2>/dev/null | sed 's/^/  /'
say "the run as its ledger records it, read with no coordinator: dflashctl --ledger $CL_DIR/state/$CL_NAME-ledger.db status"
"$CL_BIN/dflashctl" --ledger "$CL_DIR/state/$CL_NAME-ledger.db" status | grep -v '^epoch [0-9]* (batch ids' | sed 's/^/  /'
((PIPESTATUS[0] == 0)) || ok=0
"$CL_PY" - "$RUN/state/metrics-rank0.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if rows:
    k = max(1, min(20, len(rows) // 10))
    avg = lambda key, part: sum(r[key] for r in part) / len(part)
    print("== metrics: %d steps; loss %.3f -> %.3f, accuracy %.3f -> %.3f, accepted length %.2f -> %.2f" % (
        len(rows), avg("loss", rows[:k]), avg("loss", rows[-k:]), avg("accuracy", rows[:k]),
        avg("accuracy", rows[-k:]), avg("accept_len", rows[:k]), avg("accept_len", rows[-k:])))
EOF
trap - INT TERM
cl_cleanup
if ((ok)); then say "done; logs, ledger, metrics and checkpoints are in $RUN"; else die "a daemon did not stop cleanly"; fi
