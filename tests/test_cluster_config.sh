#!/usr/bin/env bash
# test_cluster_config.sh: the daemons' configuration handling.
#  - the effective configuration each daemon prints (with -t, and at a real start) is exactly
#    the shipped defaults (etc/dflash.ini) overridden by the file and then by -o;
#  - a bad configuration (unknown key, wrong type, device index out of range, model dir
#    missing, bad enum value) exits 78 (EX_CONFIG, which the units do not restart) with
#    "file:line: section.key: reason".
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
T=${DFLASH_TEST_TMP:-$(mktemp -d)}
trap 'cl_cleanup' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cl_init "$T/c" 50 || exit 1
cl_ini_add ring.slots=6 target.threads=1 drafter.gamma=3.5 drafter.pick=random cluster.log_level=notice

# Expected = shipped defaults, then the file, then -o overrides; compared as typed values.
check_print() {
  local out=$1; shift
  "$CL_PY" - "$DFLASH_SRC/etc/dflash.ini" "$CL_INI" "$out" "$@" <<'EOF'
import sys
def parse(path):
    d, sec = {}, None
    for line in open(path):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            sec = s.strip("[]").strip(); continue
        k, _, v = s.partition("=")
        d[sec + "." + k.strip()] = v.strip()
    return d
want = parse(sys.argv[1])
want.update(parse(sys.argv[2]))
for o in sys.argv[4:]:
    k, _, v = o.partition("=")
    want[k] = v
got = {}
for line in open(sys.argv[3]):
    if " = " in line and not line.startswith(("#", "<")):
        k, _, v = line.rstrip("\n").partition(" = ")
        got[k] = v
def same(a, b):
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False
bad = [(k, want[k], got.get(k)) for k in want if not same(want[k], got.get(k, "<missing>"))]
extra = [k for k in got if k not in want]
if bad or extra or len(got) < 50:
    print("printed config differs:", bad[:10], "extra:", extra[:10], "keys:", len(got))
    sys.exit(1)
EOF
}

for d in "coordinator-d" "target-d -i 1" "drafter-d -i 2"; do
  set -- $d
  bin=$1; shift
  "$CL_BIN/$bin" -c "$CL_INI" "$@" -o target.prefetch=3 -t >"$T/print.txt" 2>&1 || fail "$bin -t: $(cat "$T/print.txt")"
  check_print "$T/print.txt" target.prefetch=3 || fail "$bin printed config"
  # the paths the empty keys stand for, under the printed keys
  grep -qx "# coordinator.ledger is $CL_DIR/state/$CL_NAME-ledger.db" "$T/print.txt" &&
    grep -qx "# cluster.socket is $CL_DIR/run/$CL_NAME.sock" "$T/print.txt" &&
    grep -qx "# drafter.checkpoint_dir is $CL_DIR/state/checkpoints" "$T/print.txt" ||
    fail "$bin does not say where the empty path keys lead: $(grep '^#' "$T/print.txt")"
done
# what the automatic keys came to, under the printed keys (the test model: 4 layers, hidden 64,
# 4/2 heads of 16, intermediate 128, vocabulary 256)
"$CL_BIN/coordinator-d" -c "$CL_INI" -t -o model.capture_layers= >"$T/print.txt" 2>&1 || fail "coordinator-d -t: $(tail -2 "$T/print.txt")"
grep -qx "# coordinator.ring_hidden is 64 (the hidden_size of $CL_DIR/model/config.json)" "$T/print.txt" &&
  grep -qx "# model.capture_layers is 2 (the DFlash default for 1 drafter layer over 4 target layers)" "$T/print.txt" ||
  fail "coordinator-d does not say what its automatic keys came to: $(grep '^#' "$T/print.txt")"
"$CL_BIN/target-d" -c "$CL_INI" -i 0 -t >"$T/print.txt" 2>&1 || fail "target-d -t: $(tail -2 "$T/print.txt")"
grep -q "^# model.capture_layers is" "$T/print.txt" && fail "target-d resolves a capture_layers the file sets"
grep -qx "# in effect here as the coordinator sends them: data.path, data.max_seq_len, coordinator.heartbeat_ms" "$T/print.txt" ||
  fail "target-d does not say which keys are the coordinator's: $(grep '^#' "$T/print.txt")"
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -t -o drafter.num_kv_heads=1 >"$T/print.txt" 2>&1 || fail "drafter-d -t: $(tail -2 "$T/print.txt")"
for l in "drafter.num_heads is 4 (the target's)" "drafter.head_dim is 16 (the target's)" \
         "drafter.intermediate_size is 128 (the target's)" "drafter.mask_token_id is 255 (the last vocabulary id)"; do
  grep -qxF "# $l" "$T/print.txt" || fail "drafter-d does not say '$l': $(grep '^#' "$T/print.txt")"
done
grep -q "^# drafter.num_kv_heads is" "$T/print.txt" && fail "drafter-d resolves a num_kv_heads that is set"
# the file named absolute, whatever -c was given as
(cd "$(dirname "$CL_INI")" && "$CL_BIN/coordinator-d" -c "./$(basename "$CL_INI")" -t) >"$T/print.txt" 2>&1 ||
  fail "coordinator-d -t with a relative -c: $(tail -2 "$T/print.txt")"
grep -qF "# coordinator-d effective configuration (file $(realpath "$CL_INI"), 0 overrides)" "$T/print.txt" ||
  fail "the printed configuration does not name its file absolute: $(head -1 "$T/print.txt")"
# At a real start the daemon prints the same (target-d waits for a coordinator meanwhile): stopped
# once the whole print is there (its "waiting" line is below this run's log level).
cl_start tgt target-d -c "$CL_INI" -i 0 -o target.prefetch=3
for ((i = 0; i < $(cl_scaled 100); i++)); do check_print "$CL_DIR/tgt.log" target.prefetch=3 >/dev/null && break; sleep 0.1; done
cl_kill tgt TERM
cl_wait_exit tgt 10 || fail "target-d stopped while waiting for the coordinator exited '$CL_RC', not 0"
check_print "$CL_DIR/tgt.log" target.prefetch=3 || fail "target-d start printed config"
echo "printed configuration matches the file"

# bad CONFIG_TEXT_SED EXPECTED_MESSAGE DAEMON ARGS...: the daemon exits 78 with that message.
bad() {
  local edit=$1 msg=$2; shift 2
  local ini=$T/bad.ini
  sed "$edit" "$CL_INI" >"$ini"
  local bin=$1; shift
  "$CL_BIN/$bin" -c "$ini" "$@" -t >"$T/bad.out" 2>&1
  local rc=$?
  [[ $rc == 78 ]] || fail "$bin ($edit): exit $rc, expected 78: $(tail -3 "$T/bad.out")"
  grep -qF -- "$msg" "$T/bad.out" || fail "$bin ($edit): no '$msg' in: $(grep -v ' = ' "$T/bad.out" | tail -3)"
  echo "$bin: $(grep -F -- "$msg" "$T/bad.out" | head -1)"
}
line() { grep -n "^$1 =" "$CL_INI" | head -1 | cut -d: -f1; }

for d in "target-d -i 0" "drafter-d -i 0" "coordinator-d"; do
  set -- $d
  l=$(line heartbeat_ms)
  bad "/^heartbeat_ms =/a bogus_key = 1" "$T/bad.ini:$((l + 1)): coordinator.bogus_key: unknown key" "$@"
  bad "s/^heartbeat_ms = .*/heartbeat_ms = fast/" "$T/bad.ini:$l: coordinator.heartbeat_ms: not an integer" "$@"
  bad "s/^slots = .*/slots = 1/" "$T/bad.ini:$(line slots): ring.slots: 1 out of range" "$@"
done
bad2() { local e=$1 m=$2; shift 2; bad "$e" "$T/bad.ini:$m" "$@"; }
l=$(grep -n "^\[target\]" "$CL_INI" | cut -d: -f1)
bad2 "s/^prefetch = .*/prefetch = two/" "$(line prefetch): target.prefetch: not an integer" target-d -i 0
bad2 "/^\[target\]/a nonsense = 1" "$((l + 1)): target.nonsense: unknown key" target-d -i 0
bad2 "s|^devices = 4|devices = 4|" "$(grep -n '^devices' "$CL_INI" | head -1 | cut -d: -f1): target.devices: instance index -i 4 out of range [0, 4)" target-d -i 4
bad2 "s|^devices = 4|devices = 4|" "$(grep -n '^devices' "$CL_INI" | tail -1 | cut -d: -f1): drafter.devices: instance index -i 7 out of range [0, 4)" drafter-d -i 7
bad2 "s|^path = .*/model$|path = $T/no-such-model|" "$(grep -n "^path = .*/model$" "$CL_INI" | cut -d: -f1): model.path: $T/no-such-model: No such file or directory" target-d -i 0
bad2 "s|^path = .*/model$|path = $T/no-such-model|" "$(grep -n "^path = .*/model$" "$CL_INI" | cut -d: -f1): model.path: $T/no-such-model: No such file or directory" drafter-d -i 0
bad2 "s|^path = .*/model$|path = $T|" "$(grep -n "^path = .*/model$" "$CL_INI" | cut -d: -f1): model.path:" target-d -i 0
# the coordinator's -t reads the model's config.json and the dataset's header as its start does
bad2 "s|^path = .*/model$|path = $T|" "$(grep -n "^path = .*/model$" "$CL_INI" | cut -d: -f1): model.path: $T/config.json:" coordinator-d
bad2 "s|^path = .*/data.bin$|path = $T/no-data.bin|" "$(grep -n "^path = .*/data.bin$" "$CL_INI" | cut -d: -f1): data.path: $T/no-data.bin: cannot open" coordinator-d
# rules between keys, checked by -t as at a start (each key's range alone allows these)
bad2 "s/^max_seq_len = .*/max_seq_len = 300/" "$(line max_seq_len): data.max_seq_len: 300 is larger than data.token_budget (256)" coordinator-d
bad2 "s/^token_budget = .*/token_budget = 1024/;s/^max_seq_len = .*/max_seq_len = 1024/" "$(line token_budget): data.token_budget: 1024 is larger than ring.max_tokens (512)" coordinator-d
bad2 "s/^max_seqs = .*/max_seqs = 513/" "$(line max_seqs): ring.max_seqs: 513 is more than ring.max_tokens 512" coordinator-d
l=$(grep -n "^\[coordinator\]" "$CL_INI" | cut -d: -f1)
bad2 "/^\[coordinator\]/a ring_hidden = 7" "$((l + 1)): coordinator.ring_hidden: 7 is not the hidden_size of $CL_DIR/model/config.json" coordinator-d
l=$(grep -n "^\[target\]" "$CL_INI" | cut -d: -f1)
# enumerated values: refused by every program that loads the file, not only the one using the key
for d in "target-d -i 0" "drafter-d -i 0" "coordinator-d"; do
  bad2 "/^\[target\]/a backend = tpu" "$((l + 1)): target.backend: 'tpu': expected cpu or cuda" $d
  bad2 "s/^pick = .*/pick = newest/" "$(line pick): drafter.pick: 'newest': expected oldest or random" $d
  bad2 "s/^log_level = .*/log_level = loud/" "$(line log_level): cluster.log_level: 'loud': expected error, warn, notice, info or debug" $d
  # keys that bound each other: fewer than three heartbeats before a daemon counts as dead
  bad2 "s/^heartbeat_ms = .*/heartbeat_ms = 1500/" "$(line dead_after_ms): coordinator.dead_after_ms: $(sed -n 's/^dead_after_ms = //p' "$CL_INI") is less than three heartbeats (coordinator.heartbeat_ms = 1500)" $d
done
# The default capture ids of a target too shallow for model.draft_layers (the 4-layer test model,
# 5 drafter layers: 1 1 1 1 1) are refused by each program that derives them, as a list naming a
# layer twice is.
for d in "target-d -i 0" "drafter-d -i 0" "coordinator-d"; do
  set -- $d
  bin=$1; shift
  "$CL_BIN/$bin" -c "$CL_INI" "$@" -o model.capture_layers= -o model.draft_layers=5 -t >"$T/o.out" 2>&1
  rc=$?
  [[ $rc == 78 ]] && grep -q "override model.draft_layers: the DFlash default capture ids for 5 drafter layers over the 4 layers of .* take layer 1 more than once: set model.capture_layers" "$T/o.out" ||
    fail "$bin: repeated default capture ids: exit $rc: $(tail -2 "$T/o.out")"
  echo "$bin: $(grep 'override model.draft_layers' "$T/o.out")"
done
# An -o that is not section.key=value is a usage error (64), like a bad -i.
"$CL_BIN/target-d" -c "$CL_INI" -i 0 -o 'ring.slots 3' -t >"$T/o.out" 2>&1
[[ $? == 64 ]] && grep -q "\-o 'ring.slots 3': expected section.key=value" "$T/o.out" || fail "malformed -o: $(tail -2 "$T/o.out")"
# A key given with -o is blamed on the override.
"$CL_BIN/target-d" -c "$CL_INI" -i 0 -o target.backend=tpu -t >"$T/o.out" 2>&1
[[ $? == 78 ]] && grep -q "override target.backend: 'tpu'" "$T/o.out" || fail "override error: $(tail -2 "$T/o.out")"
# A checkpoint folder whose step folders' paths would not fit the protocol's 256 bytes.
long=/tmp/$(printf 'd%.0s' {1..235})     # 240 bytes, + /step-0000000010: 256
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o drafter.checkpoint_dir="$long" -t >"$T/o.out" 2>&1
[[ $? == 78 ]] && grep -q "override drafter.checkpoint_dir: its checkpoint folders ($long/step-N) would be longer than the 255 bytes" "$T/o.out" ||
  fail "long checkpoint_dir: $(tail -2 "$T/o.out")"
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o drafter.checkpoint_dir="${long:0:239}" -t >"$T/o.out" 2>&1 ||
  fail "a checkpoint_dir of 239 bytes: $(tail -2 "$T/o.out")"
# backend = cuda: checked without touching a GPU (-t); a build without the backend says so (78).
for d in target drafter; do
  "$CL_BIN/$d-d" -c "$CL_INI" -i 0 -o $d.backend=cuda -t >"$T/o.out" 2>&1
  rc=$?
  if grep -q "override $d.backend: cuda: this build has no CUDA" "$T/o.out"; then
    [[ $rc == 78 ]] || fail "$d-d backend=cuda without CUDA: exit $rc"
  else
    [[ $rc == 0 ]] || fail "$d-d backend=cuda: exit $rc: $(tail -2 "$T/o.out")"
  fi
done
# A CUDA drafter group of more than one rank needs NCCL.
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o drafter.backend=cuda -o drafter.world_size=2 -t >"$T/o.out" 2>&1
rc=$?
grep -q "this build has no NCCL\|this build has no CUDA" "$T/o.out" && { [[ $rc == 78 ]] || fail "no NCCL: exit $rc"; } ||
  { [[ $rc == 0 ]] || fail "drafter-d cuda world 2: exit $rc: $(tail -2 "$T/o.out")"; }
# A drafter shape refused names the key it came from: a [drafter] key, or the target's config.json.
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o drafter.num_heads=3 -t >"$T/o.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "override drafter.num_heads: drafter shape: drafter config: num_attention_heads 3" "$T/o.out" ||
  fail "drafter shape from [drafter]: exit $rc: $(tail -1 "$T/o.out")"
# ... the key behind the first field named that a key set, not the field config.json gave first
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o drafter.num_kv_heads=3 -t >"$T/o.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "override drafter.num_kv_heads: drafter shape: .* of num_key_value_heads 3" "$T/o.out" ||
  fail "drafter shape from [drafter], second field: exit $rc: $(tail -1 "$T/o.out")"
cp -r "$CL_DIR/model" "$T/model-theta"
"$CL_PY" - "$T/model-theta/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["rope_theta"] = 0.5; json.dump(c, open(sys.argv[1], "w"))
PY
"$CL_BIN/drafter-d" -c "$CL_INI" -i 0 -o model.path="$T/model-theta" -t >"$T/o.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "override model.path: $T/model-theta/config.json: rope_theta: 0.5 must be greater than 1" "$T/o.out" ||
  fail "rope_theta in config.json: exit $rc: $(tail -1 "$T/o.out")"
# Weights with a NaN: target-d refuses the model at its start (78), naming file, tensor, element.
cp -r "$CL_DIR/model" "$T/model-nan"
"$CL_PY" - "$T/model-nan/model.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
t = json.loads(f.read(n))["model.layers.1.mlp.down_proj.weight"]
f.seek(8 + n + t["data_offsets"][0] + 3 * {"BF16": 2, "F16": 2, "F32": 4}[t["dtype"]])
f.write({"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}[t["dtype"]])
PY
timeout 60 "$CL_BIN/target-d" -c "$CL_INI" -i 0 -o model.path="$T/model-nan" >"$T/o.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "model-nan/model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight': element 3 is NaN or infinite" "$T/o.out" ||
  fail "NaN weights: exit $rc: $(tail -1 "$T/o.out")"
# A cluster.group that names no group: refused by -t, and by a start before it makes a ledger.
ledger=$CL_DIR/state/$CL_NAME-ledger.db
rm -f "$ledger"
sed '/^\[cluster\]$/a group = dflash-no-such-group' "$CL_INI" >"$T/group.ini"
l=$(grep -n "^group = dflash-no-such-group" "$T/group.ini" | cut -d: -f1)
for t in -t ""; do
  timeout 60 "$CL_BIN/coordinator-d" -c "$T/group.ini" $t >"$T/g.out" 2>&1
  rc=$?
  [[ $rc == 78 ]] && grep -q "$T/group.ini:$l: cluster.group: no such group 'dflash-no-such-group'" "$T/g.out" ||
    fail "unknown cluster.group (${t:-a start}): exit $rc: $(tail -2 "$T/g.out")"
done
[[ ! -e $ledger ]] || fail "a start refused on cluster.group left a ledger"
# (a start reads the dataset before it makes the socket: samples cut to data.max_seq_len are
# counted in its log; a folder where the socket goes then ends it)
timeout 60 "$CL_BIN/coordinator-d" -c "$CL_INI" -o cluster.socket="$T" -o data.max_seq_len=16 >"$T/g.out" 2>&1
grep -Eq "data.bin: [1-9][0-9]* of 50 samples are longer than data.max_seq_len \(16\) and are cut to it: [0-9]+ of [0-9]+ tokens \([0-9.]+%\) are not trained, [0-9]+ of the [0-9]+ in the loss \([0-9.]+%\)$" "$T/g.out" ||
  fail "no word of the samples cut to data.max_seq_len: $(grep -v ' = ' "$T/g.out" | tail -3)"
rm -f "$ledger"
# ... and the ledger that start made is gone: the next start (its config mended, and a changed
# schedule) is not refused for "another dataset or schedule"
[[ ! -e $ledger ]] || fail "a start that failed its checks left its new ledger $ledger"
timeout 60 "$CL_BIN/coordinator-d" -c "$CL_INI" -o model.path="$T" >"$T/g.out" 2>&1
rc=$?
[[ $rc == 78 && ! -e $ledger ]] && grep -q "model.path: $T/config.json" "$T/g.out" ||
  fail "a model without config.json: exit $rc, ledger there: $([[ -e $ledger ]] && echo yes): $(tail -2 "$T/g.out")"
# cluster.socket naming a file that is not a socket: left alone, a config error; one in a folder
# that does not exist: named
echo "precious" >"$T/notsock"
timeout 60 "$CL_BIN/coordinator-d" -c "$CL_INI" -o cluster.socket="$T/notsock" >"$T/s.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "control socket $T/notsock: a file is there, not a socket" "$T/s.out" &&
  [[ $(cat "$T/notsock") == precious ]] || fail "cluster.socket on a file: exit $rc: $(tail -2 "$T/s.out")"
timeout 60 "$CL_BIN/coordinator-d" -c "$CL_INI" -o cluster.socket="$T/none/x.sock" >"$T/s.out" 2>&1
rc=$?
[[ $rc == 78 ]] && grep -q "control socket $T/none/x.sock: its folder $T/none: No such file or directory" "$T/s.out" ||
  fail "cluster.socket in a missing folder: exit $rc: $(tail -2 "$T/s.out")"
# Datasets with nothing to learn or of another tokenizer: refused by the coordinator, by -t too
# (a run would end "complete" having trained nothing, or every target refuse it after the ledger
# was made for it). patch_mask FILE BYTE MASKED: every token's loss mask byte (a Python expression
# of t) and the header's masked_tokens (of n, the token count); data_refused FILE NEEDLE WHAT.
patch_mask() {
  "$CL_PY" - "$@" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(128)
n, mask_off = struct.unpack_from("<Q", h, 24)[0], struct.unpack_from("<Q", h, 48)[0]
f.seek(mask_off); f.write(bytes(eval(sys.argv[2]) for t in range(n)))
f.seek(80); f.write(struct.pack("<Q", eval(sys.argv[3])))      # masked_tokens
PY
}
data_refused() {
  "$CL_BIN/coordinator-d" -c "$CL_INI" -o data.path="$1" -t >"$T/o.out" 2>&1
  local rc=$?
  [[ $rc == 78 ]] && grep -q "override data.path: $1: $2" "$T/o.out" || fail "$3: exit $rc: $(tail -1 "$T/o.out")"
}
cp "$CL_DIR/data.bin" "$T/nomask.bin"
patch_mask "$T/nomask.bin" 0 0
data_refused "$T/nomask.bin" "no token is in the loss (every loss mask is 0): nothing to learn" \
  "a dataset with nothing to learn"
patch_mask "$T/nomask.bin" "1 - t % 2" "(n + 1) // 2"      # loss tokens, never two in a row
data_refused "$T/nomask.bin" "no sample has two tokens in the loss in a row .*: nothing to learn" \
  "a dataset with no anchor"
# ... or only past data.max_seq_len (128 here), where every sample is cut: long prompts, short
# answers. late_data FILE MASK...: 20 samples of 200 tokens for each loss mask (a Python expression)
late_data() {
  "$CL_PY" - "$@" <<'PY' && "$CL_BIN/dflash-data" build -o "$1" -v 256 "$1.jsonl" >/dev/null || fail "cannot build $1"
import json, sys
with open(sys.argv[1] + ".jsonl", "w") as f:
    for i in range(20):
        ids = [(i * 7 + t) % 200 + 1 for t in range(200)]
        for mask in sys.argv[2:]:
            f.write(json.dumps({"input_ids": ids, "loss_mask": eval(mask)}) + "\n")
PY
}
late_data "$T/late.bin" "[0] * 150 + [1] * 50" "[t % 2 for t in range(130)] + [1] * 70"
data_refused "$T/late.bin" "no sample has two tokens in the loss in a row within data.max_seq_len (128), where the samples are cut: nothing to learn" \
  "a dataset whose anchors are all past the cut"
late_data "$T/late.bin" "[0] * 150 + [1] * 50"
data_refused "$T/late.bin" "every token in the loss is past data.max_seq_len (128), where the samples are cut: nothing to learn" \
  "a dataset whose loss tokens are all past the cut"
cp "$CL_DIR/data.bin" "$T/vocab.bin"
"$CL_PY" -c 'import struct, sys
f = open(sys.argv[1], "r+b"); f.seek(32); f.write(struct.pack("<I", 100000))' "$T/vocab.bin"    # vocab_size
data_refused "$T/vocab.bin" "vocabulary 100000 is larger than the target's ([0-9]*, .*/config.json)" \
  "a dataset of another vocabulary"
# Folders and files in the wrong place, at a real start: exit 78 (not restarted) naming the key.
touch "$T/afile"
mkdir -p "$T/adir"
started_bad() {
  local msg=$1 bin=$2; shift 2
  timeout 20 "$CL_BIN/$bin" -c "$CL_INI" "$@" >"$T/s.out" 2>&1
  local rc=$?
  [[ $rc == 78 ]] && grep -qF -- "$msg" "$T/s.out" || fail "$bin $*: exit $rc, wanted 78 and '$msg': $(grep -v ' = ' "$T/s.out" | tail -2)"
  echo "$bin: $(grep -F -- "$msg" "$T/s.out" | head -1)"
}
started_bad "cluster.state_dir: $T/afile is not a folder (a file is there)" coordinator-d -o cluster.state_dir="$T/afile"
started_bad "cluster.runtime_dir: $T/afile is not a folder (a file is there)" coordinator-d -o cluster.runtime_dir="$T/afile"
started_bad "cluster.runtime_dir: $T/afile is not a folder (a file is there)" target-d -i 0 -o cluster.runtime_dir="$T/afile"
started_bad "cluster.runtime_dir: $T/afile is not a folder (a file is there)" drafter-d -i 0 -o cluster.runtime_dir="$T/afile"
started_bad "drafter.checkpoint_dir: $T/afile is not a folder (a file is there)" drafter-d -i 0 -o drafter.checkpoint_dir="$T/afile"
bad "s|^world_size = .*|&\ncheckpoint_dir = $T/afile|" "drafter.checkpoint_dir: $T/afile is not a folder (a file is there)" drafter-d -i 0
# a link to a folder not there (storage not mounted yet): exit 1, restarted, not 78
ln -s "$T/not-mounted/state" "$T/dangling"
timeout 20 "$CL_BIN/coordinator-d" -c "$CL_INI" -o cluster.state_dir="$T/dangling" >"$T/s.out" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q "cluster.state_dir: $T/dangling is a link to nothing (its storage not mounted?)" "$T/s.out" ||
  fail "a dangling state_dir link: exit $rc: $(grep -v ' = ' "$T/s.out" | tail -2)"
started_bad "$T/adir: a folder, not a ledger file (coordinator.ledger names the file)" coordinator-d -o coordinator.ledger="$T/adir"
started_bad "cluster.socket is too long (a unix socket's path has at most 107 bytes)" coordinator-d \
  -o cluster.socket="$T/$(printf 's%.0s' {1..120}).sock"
# A socket that accepts and never answers (another program's, or a hung coordinator): said once,
# while the target asks again (its third connection comes after two HELLOs went unanswered, 10 s each)
"$CL_PY" - "$T/silent.sock" "$T/silent.count" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
held, end = [], time.time() + 120
s.settimeout(0.5)
while time.time() < end:
    try: held.append(s.accept()[0])
    except socket.timeout: continue
    with open(sys.argv[2], "w") as f: f.write(f"{len(held)}\n")
PY
silent=$!
for ((i = 0; i < 50; i++)); do [[ -S $T/silent.sock ]] && break; sleep 0.1; done
"$CL_BIN/target-d" -c "$CL_INI" -i 0 -o cluster.socket="$T/silent.sock" >"$T/silent.out" 2>&1 &
tpid=$!
for ((i = 0; i < 600 * CL_SCALE; i++)); do
  [[ $(cat "$T/silent.count" 2>/dev/null) -ge 3 ]] 2>/dev/null && break
  kill -0 $tpid 2>/dev/null || break
  sleep 0.1
done
kill -TERM $tpid 2>/dev/null; wait $tpid
kill $silent 2>/dev/null; wait $silent 2>/dev/null
asked=$(cat "$T/silent.count" 2>/dev/null || echo 0)
said=$(grep -c "$T/silent.sock accepted the connection but did not answer its HELLO in 10 s (a coordinator that hangs, or another program's socket?)" "$T/silent.out")
[[ $asked -ge 3 && $said == 1 ]] ||
  fail "a silent socket asked $asked times is said $said times, not once: $(grep -v ' = ' "$T/silent.out" | tail -3)"
echo "target-d: $(grep -h "did not answer its HELLO" "$T/silent.out")"
# A missing config file is a config error too.
"$CL_BIN/drafter-d" -c "$T/nope.ini" -i 0 >"$T/o.out" 2>&1
[[ $? == 78 ]] && grep -q "$T/nope.ini: cannot open" "$T/o.out" || fail "missing file: $(tail -2 "$T/o.out")"
echo ok
