#!/usr/bin/env bash
# test_convert_conversations.sh: tools/convert_conversations.py without a tokenizer (none is here
# to load): what it checks before loading one, each bad record as one line FILE:LINE: reason
# (counted with --skip-bad), and its dflash-data pipe: a stop part way (an error, SIGTERM, a kill)
# leaves the old output and no temp file.
set -u
B=${DFLASH_BUILD:-build}
T=${TMPDIR:-/tmp}
D=$B/bin/dflash-data
export S=${DFLASH_SRC:-.}/tools/convert_conversations.py D T
SCALE=${DFLASH_TEST_TIME_SCALE:-1}
fail() { echo "FAIL: $*" >&2; exit 1; }
one_line() {  # file, needle: the file is that one line, no traceback
  if [[ $(wc -l < "$1") != 1 ]] || ! grep -qF -- "$2" "$1"; then fail "expected one line '$2', got: $(cat "$1")"; fi
}
# The script as a module m (its transformers import is in run()), then the Python code of $1.
LOAD="import importlib.util, json, os, signal, sys, time
spec = importlib.util.spec_from_file_location('cc', os.environ['S'])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)"
py() { python3 -c "$LOAD
$1"; }

python3 -m py_compile "$S" || fail "py_compile"

# Checked before any tokenizer is loaded.
python3 "$S" --model none "$T/nope.jsonl" 2>"$T/err.txt" && fail "accepted a missing input"
one_line "$T/err.txt" "convert_conversations.py: $T/nope.jsonl: cannot open: No such file or directory"
printf '{}\n' > "$T/in.jsonl"
python3 "$S" --model none --dflash-data "$T/nope" -o "$T/x.bin" "$T/in.jsonl" 2>"$T/err.txt" && fail "accepted --dflash-data nope"
one_line "$T/err.txt" "convert_conversations.py: $T/nope: no dflash-data program there"
python3 "$S" --model none --dflash-data "$D" -o "$T/nodir/x.bin" "$T/in.jsonl" 2>"$T/err.txt" && fail "accepted -o nodir/x.bin"
one_line "$T/err.txt" "convert_conversations.py: $T/nodir/x.bin: no directory $T/nodir"
if ! python3 -c 'import transformers' 2>/dev/null; then
  python3 "$S" --model none "$T/in.jsonl" 2>"$T/err.txt" && fail "ran without transformers"
  one_line "$T/err.txt" "convert_conversations.py: needs the transformers package"
fi

# Records: each bad one is "FILE:LINE: reason", counted under --skip-bad; the tokenizer is never
# reached for them. ShareGPT turns and "messages" are read as conversations.
{
  echo '[1,2]'
  echo '{"conversations":["hi"]}'
  printf '{"conversations":[{"role":"user","content":"caf\xe9"}]}\n'
  echo '{"text":"no turns"}'
  echo '{"conversations":[{"role":"narrator","content":"x"}]}'
  echo '{"messages":[{"role":"user","content":null}]}'
  echo
  echo '{"input_ids":[1'
  echo '{"conversations":[{"from":"gpt","value":"Hi!"},{"from":"human","value":"q"},{"from":"gpt","value":"a"}]}'
} > "$T/bad.jsonl"
py "args = type('A', (), {'input': [os.environ['T'] + '/bad.jsonl'], 'skip_bad': True, 'max_len': 0})
stats = {'skipped': 0}
assert list(m.encoded(args, None, stats)) == []
print(stats['skipped'])" >"$T/out.txt" 2>"$T/err.txt" || fail "encoded: $(cat "$T/err.txt")"
[[ $(cat "$T/out.txt") == 8 ]] || fail "skipped count: $(cat "$T/out.txt")"
[[ $(wc -l < "$T/err.txt") == 8 ]] || fail "one line a bad record: $(cat "$T/err.txt")"
n=0
for want in "1: skipped: an array, not a JSON object: expected {\"conversations\"" \
            "2: skipped: turn 0: a string, not an object: expected" \
            "3: skipped: not UTF-8 (byte 0xe9 at column 48)" \
            "4: skipped: no 'conversations' list of turns: expected" \
            "5: skipped: turn 0: unknown role 'narrator'" \
            "6: skipped: turn 0: content is null, not a string" \
            "8: skipped: not valid JSON: " \
            "9: skipped: turn 0 is the assistant's: no prompt before it to answer"; do
  n=$((n + 1))
  sed -n "${n}p" "$T/err.txt" | grep -qF -- "convert_conversations.py: $T/bad.jsonl:$want" || fail "line $n: $(sed -n "${n}p" "$T/err.txt")"
done
# The mask, with a tokenizer of one id per character: a template that renders the conversation
# prefix by prefix the same gives one sample, the assistant turns in the loss (their header, the
# generation prompt, not); one that gives only the last assistant turn its reasoning block (as
# Qwen3's) gives one sample per assistant turn, that turn's tokens alone in the loss.
py 'class Tok:
    def __init__(self, think):
        self.think = think
    def apply_chat_template(self, msgs, tokenize=True, add_generation_prompt=False):
        last_user = max([i for i, t in enumerate(msgs) if t["role"] == "user"], default=-1)
        text = ""
        for i, t in enumerate(msgs):
            text += "<" + t["role"] + ">"
            if t["role"] == "assistant" and self.think and i > last_user:
                text += "<think></think>"
            text += t["content"] + "<end>"
        return [ord(c) for c in text + ("<assistant>" if add_generation_prompt else "")]
def show(samples):
    return [("".join(map(chr, ids)), "".join(chr(c) for c, k in zip(ids, mask) if k)) for ids, mask in samples]
conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
got = show(m.encode(Tok(False), conv, 0))
assert got == [("<system>s<end><user>q1<end><assistant>a1<end><user>q2<end><assistant>a2<end>", "a1<end>a2<end>")], got
got = show(m.encode(Tok(True), conv, 0))
assert got == [("<system>s<end><user>q1<end><assistant><think></think>a1<end>", "<think></think>a1<end>"),
               ("<system>s<end><user>q1<end><assistant>a1<end><user>q2<end><assistant><think></think>a2<end>",
                "<think></think>a2<end>")], got
got = show(m.encode(Tok(True), conv, 64))     # cut: the second sample keeps no loss token, dropped
assert got == [("<system>s<end><user>q1<end><assistant><think></think>a1<end>", "<think></think>a1<end>")], got
try:
    m.encode(Tok(True), conv[:2], 0)
    sys.exit("a conversation with no assistant turn was taken")
except ValueError as e:
    assert str(e) == "no assistant tokens: nothing to learn", e
# every assistant token past --max-len: no sample, dropped (not an error)
assert m.encode(Tok(False), conv, 20) == []
import io
src = json.dumps({"messages": conv}).encode() + b"\n"
args = type("A", (), {"input": ["-"], "skip_bad": False, "max_len": 20})
sys.stdin = io.TextIOWrapper(io.BytesIO(src + src))
stats = {"skipped": 0}
assert list(m.encoded(args, Tok(False), stats)) == [] and stats.get("cut") == 2, stats
# an id past the vocabulary of the model (a tokenizer with tokens past the embedding: "~" is 126 here)
# is an error of its record, "FILE:LINE: reason", skipped with --skip-bad; below it, taken
bad = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "~"}]}).encode()
args.max_len, args.skip_bad = 0, True
sys.stdin = io.TextIOWrapper(io.BytesIO(src + bad + b"\n"))
stats = {"skipped": 0}
err, sys.stderr = sys.stderr, io.StringIO()
got = list(m.encoded(args, Tok(False), stats, 126))
said, sys.stderr = sys.stderr.getvalue(), err
assert len(got) == 1 and stats["skipped"] == 1, (got, stats)
assert said == "convert_conversations.py: <stdin>:2: skipped: token id 126 is past the model\x27s vocabulary (126, " \
    "config.json vocab_size): the tokenizer has tokens the model has no embedding for\n", said
sys.stdin = io.TextIOWrapper(io.BytesIO(bad + b"\n"))
assert len(list(m.encoded(args, Tok(False), {"skipped": 0}, 127))) == 1' || fail "the mask of whole and per-turn samples"
py 'assert m.how_ended(1) == "exit 1" and m.how_ended(-9) == "killed by SIGKILL" and m.how_ended(-200) == "killed by signal 200"' ||
  fail "how a dflash-data child ended"
# a key twice in an object: refused (json.loads would take the last; dflash-data refuses it too)
py 'for line, key in ((b"{\"messages\":[{\"role\":\"assistant\",\"content\":\"4\",\"role\":\"user\"}]}", "role"),
                  (b"{\"conversations\":[],\"conversations\":[{\"role\":\"user\",\"content\":\"q\"}]}", "conversations")):
    try:
        m.conversation(line)
        sys.exit("accepted a key twice")
    except ValueError as e:
        assert str(e) == f"\x27{key}\x27 appears twice in an object", e' || fail "a key twice"

# nested past Python's recursion limit (an array 200000 deep, or a turn's extra key 5000 deep):
# one line's reason like any other bad record, not a traceback
py 'for line in (b"[" * 200000 + b"]" * 200000,
             b"{\"conversations\":[{\"role\":\"user\",\"content\":\"x\",\"meta\":" + b"[" * 5000 + b"]" * 5000 + b"}]}"):
    try:
        m.conversation(line)
        sys.exit("accepted a line nested too deeply")
    except ValueError as e:
        assert str(e) == "JSON nested too deeply to read", e' || fail "deeply nested JSON"
head -n 1 "$T/bad.jsonl" > "$T/bad1.jsonl"
py "args = type('A', (), {'input': [os.environ['T'] + '/bad1.jsonl'], 'skip_bad': False, 'max_len': 0})
list(m.encoded(args, None, {'skipped': 0}))" 2>"$T/err.txt" && fail "a bad record without --skip-bad went on"
one_line "$T/err.txt" "convert_conversations.py: $T/bad1.jsonl:1: an array, not a JSON object"
py 'share = m.conversation(b"{\"id\":1,\"conversations\":[{\"from\":\"system\",\"value\":\"s\"},{\"from\":\"human\",\"value\":\"q\"},{\"from\":\"gpt\",\"value\":\"a\"}]}")
assert share == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], share
msgs = m.conversation(b"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"r\"}]}")
assert msgs == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}], msgs
try:
    m.conversation(b"{\"messages\":[],\"conversations\":[]}")
    sys.exit("accepted both keys")
except ValueError as e:
    assert "both" in str(e), e' || fail "ShareGPT and messages rows"

# The dataset's vocabulary is the model's (config.json), not the tokenizer's length (one with a
# pad token added past the embedding is longer: the coordinator refused the dataset)
mkdir -p "$T/vmodel" "$T/vmm"
echo '{"vocab_size": 100}' > "$T/vmodel/config.json"
echo '{"text_config": {"vocab_size": 120}}' > "$T/vmm/config.json"
py "class L:
    def __len__(self): return 1000
t = os.environ['T']
assert m.dataset_vocab(t + '/vmodel', L()) == 100
assert m.dataset_vocab(t + '/vmm', L()) == 120
assert m.dataset_vocab(t + '/nowhere', L()) == 1000" || fail "the dataset's vocabulary"

# A UTF-8 BOM before the first record (some editors write one): read as dflash-data reads it
printf '\xef\xbb\xbf{"messages":[{"role":"user","content":"q"}]}\n' > "$T/bom.jsonl"
py "recs = list(m.records(os.environ['T'] + '/bom.jsonl'))
assert len(recs) == 1 and m.conversation(recs[0][1]) == [{'role': 'user', 'content': 'q'}], recs" ||
  fail "a BOM before the first record"

# The dflash-data pipe (-o). A whole input: a dataset with the samples.
SAMPLES='[([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1])]'
py "assert m.build_dataset(os.environ['D'], os.environ['T'] + '/good.bin', 10, iter($SAMPLES)) == 2" >/dev/null ||
  fail "build_dataset"
"$D" info "$T/good.bin" | grep -q "2 samples, 5 tokens (3 in the loss), vocab 10" || fail "built: $("$D" info "$T/good.bin")"
cp "$T/good.bin" "$T/keep.bin"
kept() {  # what: the old output as it was, no temp file beside it
  cmp -s "$T/good.bin" "$T/keep.bin" || fail "$1: the output was replaced"
  ! compgen -G "$T/keep.bin.*" >/dev/null || fail "$1: left $(compgen -G "$T/keep.bin.*")"
}
# An error part way (a bad record without --skip-bad): one line, nothing written.
py "def gen():
    yield from $SAMPLES
    m.die('in.jsonl:3: a bad record')
m.build_dataset(os.environ['D'], os.environ['T'] + '/keep.bin', 10, gen())" 2>"$T/err.txt" && fail "went on after an error"
one_line "$T/err.txt" "convert_conversations.py: in.jsonl:3: a bad record"
kept "an error part way"
# SIGTERM part way: raised where the script is, dflash-data stopped, one line, death by SIGTERM.
python3 -c "$LOAD
def gen():
    yield from $SAMPLES
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    yield from $SAMPLES
m.with_stop_signals(lambda: m.build_dataset(os.environ['D'], os.environ['T'] + '/keep.bin', 10, gen()))" 2>"$T/err.txt" &
wait $! 2>/dev/null     # (the shell's "Terminated" not in err.txt)
rc=$?
[[ $rc == 143 ]] || fail "SIGTERM: exit $rc: $(cat "$T/err.txt")"
one_line "$T/err.txt" "convert_conversations.py: stopped by SIGTERM"
kept "SIGTERM"
# SIGKILL part way (many samples through to dflash-data first): no cleanup at all; dflash-data
# sees its input end without the end line.
python3 -c "$LOAD
def gen():
    yield from $SAMPLES * 5000
    sys.stdout.write('fed\n'); sys.stdout.flush()
    time.sleep(60)
    yield from $SAMPLES
m.build_dataset(os.environ['D'], os.environ['T'] + '/keep.bin', 10, gen())" 2>"$T/err.txt" >"$T/fed.txt" & pid=$!
for ((i = 0; i < 200 * SCALE; i++)); do [[ -s $T/fed.txt ]] && break; sleep 0.05; done
[[ -s $T/fed.txt ]] || fail "SIGKILL: the samples were not fed: $(cat "$T/err.txt")"
kill -KILL $pid
wait $pid 2>/dev/null
# (dflash-data, left behind, removes its temp file and says why as it ends: both awaited)
for ((i = 0; i < 200 * SCALE; i++)); do
  compgen -G "$T/keep.bin.*" >/dev/null || { [[ -s $T/err.txt ]] && break; }
  sleep 0.05
done
kept "SIGKILL"
one_line "$T/err.txt" 'dflash-data: <stdin>: the input ended without its end line {"end": N} (--end-line): incomplete, nothing written'
# dflash-data stops first (here at once: the output is a directory): one line of its own, one of
# this script's, no BrokenPipeError.
mkdir -p "$T/outdir"
py "m.build_dataset(os.environ['D'], os.environ['T'] + '/outdir', 10, iter($SAMPLES * 50000))" 2>"$T/err.txt" &&
  fail "went on after dflash-data stopped"
if [[ $(wc -l < "$T/err.txt") != 2 ]] ||
   ! grep -q "^dflash-data: $T/outdir: exists and is not a regular file" "$T/err.txt" ||
   ! grep -q "^convert_conversations.py: dflash-data build stopped (exit 1) before its input was through" "$T/err.txt"; then
  fail "dflash-data stopped first: $(cat "$T/err.txt")"
fi
py "m.build_dataset('$T/nope', os.environ['T'] + '/keep.bin', 10, iter($SAMPLES))" 2>"$T/err.txt" && fail "ran a missing dflash-data"
one_line "$T/err.txt" "convert_conversations.py: $T/nope: cannot run: No such file or directory"
# JSONL to standard output, its reader gone (| head): one line.
py "m.write_jsonl(iter($SAMPLES * 50000), sys.stdout)" 2>"$T/err.txt" | head -c 10 >/dev/null
one_line "$T/err.txt" "convert_conversations.py: standard output: closed by its reader before the end"
echo "convert_conversations ok"
