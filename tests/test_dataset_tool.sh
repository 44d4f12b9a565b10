#!/usr/bin/env bash
# test_dataset_tool.sh: dflash-data builds a dataset from JSONL, dump gives the same samples
# back, and bad input (a NUL byte in a line too) names file:line and the reason; a build that
# fails, is stopped, or reads an input cut short (--end-line) leaves the old output and no temp
# file.
set -u
B=${DFLASH_BUILD:-build}
T=${TMPDIR:-/tmp}
D=$B/bin/dflash-data
SCALE=${DFLASH_TEST_TIME_SCALE:-1}
fail() { echo "FAIL: $*" >&2; exit 1; }
printf '%s\n' '{"input_ids":[1,2,3],"loss_mask":[0,1,1]}' '' '{"input_ids":[7,8]}' > "$T/in.jsonl"
"$D" build -o "$T/a.bin" -v 10 "$T/in.jsonl" || fail "build"
"$D" verify "$T/a.bin" | grep -q ok || fail "verify"
"$D" info --json "$T/a.bin" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["samples"]==2 and d["tokens"]==5 and d["masked_tokens"]==4 and d["vocab_size"]==10, d' || fail "info"
"$D" dump "$T/a.bin" > "$T/out.jsonl"
[[ "$(sed -n 1p "$T/out.jsonl")" == '{"input_ids":[1,2,3],"loss_mask":[0,1,1]}' ]] || fail "dump line 1"
[[ "$(sed -n 2p "$T/out.jsonl")" == '{"input_ids":[7,8],"loss_mask":[1,1]}' ]] || fail "dump line 2"
"$D" build -o "$T/b.bin" < "$T/out.jsonl" >/dev/null || fail "build from stdin"
"$D" info "$T/b.bin" | grep -q "vocab 9" || fail "vocab = max id + 1"

# Hugging Face style labels: -100 = no loss there, the token itself = learned (the same mask)
printf '%s\n' '{"input_ids":[1,2,3],"labels":[-100,2,3],"id":"x7"}' > "$T/hf.jsonl"
"$D" build -o "$T/hf.bin" -v 10 "$T/hf.jsonl" || fail "build with labels"
[[ "$("$D" dump "$T/hf.bin")" == '{"input_ids":[1,2,3],"loss_mask":[0,1,1]}' ]] || fail "labels -> loss_mask: $("$D" dump "$T/hf.bin")"

# A read error part way (here: an input that is a directory) is not the end of the input: no
# dataset from what was read before it, and the old output stays.
cp "$T/a.bin" "$T/keep.bin"
mkdir -p "$T/adir"
if "$D" build -o "$T/keep.bin" -v 10 "$T/in.jsonl" "$T/adir" 2>"$T/err.txt"; then fail "a read error was taken as the end of the input"; fi
grep -q "$T/adir:1: read error" "$T/err.txt" || fail "read error message: $(cat "$T/err.txt")"
cmp -s "$T/a.bin" "$T/keep.bin" || fail "the output was replaced after a read error"

# --end-line: the input is whole only with its last line {"end": N}, N the records before it. A
# writer killed part way leaves a clean end of input all the same: nothing written then.
cp "$T/a.bin" "$T/keep.bin"
{ cat "$T/in.jsonl"; echo '{"end": 2}'; echo; } > "$T/end.jsonl"
"$D" build --end-line -o "$T/end.bin" -v 10 "$T/end.jsonl" >/dev/null || fail "build with an end line"
cmp -s "$T/a.bin" "$T/end.bin" || fail "the end line changed the dataset"
end_err() {  # input file, needle
  if "$D" build --end-line -o "$T/keep.bin" -v 10 < "$1" 2>"$T/err.txt"; then fail "--end-line accepted $(cat "$1")"; fi
  if [[ $(wc -l < "$T/err.txt") != 1 ]] || ! grep -q "$2" "$T/err.txt"; then fail "--end-line message: $(cat "$T/err.txt")"; fi
  cmp -s "$T/a.bin" "$T/keep.bin" || fail "--end-line: an incomplete input replaced the output"
  ! compgen -G "$T/keep.bin.*" >/dev/null || fail "--end-line: left $(compgen -G "$T/keep.bin.*")"
}
end_err "$T/in.jsonl" '<stdin>: the input ended without its end line {"end": N} (--end-line): incomplete, nothing written'
{ cat "$T/in.jsonl"; echo '{"end": 3}'; } > "$T/end3.jsonl"
end_err "$T/end3.jsonl" "<stdin>:4: the end line counts 3 records, 2 came before it: nothing written"
{ cat "$T/in.jsonl"; echo '{"end": 1}'; } > "$T/end1.jsonl"
end_err "$T/end1.jsonl" "<stdin>:4: the end line counts 1 records, 2 came before it"
{ cat "$T/end.jsonl"; echo '{"input_ids":[5]}'; } > "$T/endmore.jsonl"
end_err "$T/endmore.jsonl" "<stdin>:6: a line after the end line"

# No token in the loss: nothing to learn, refused at the end, the old output stays.
for rec in '{"input_ids":[1,2],"loss_mask":[0,0]}' '{"input_ids":[1,2],"labels":[-100,-100]}'; do
  printf '%s\n' '{"input_ids":[3],"loss_mask":[0]}' "$rec" > "$T/noloss.jsonl"
  if "$D" build -o "$T/keep.bin" -v 10 "$T/noloss.jsonl" 2>"$T/err.txt"; then fail "accepted a dataset with no token in the loss"; fi
  grep -q "$T/keep.bin: no token is in the loss .*: nothing to learn" "$T/err.txt" || fail "no-loss message: $(cat "$T/err.txt")"
  cmp -s "$T/a.bin" "$T/keep.bin" || fail "a dataset with no token in the loss replaced the output"
done

# Loss tokens, but never two in a row in one sample (a block's anchor and its first label; a
# pair across two samples does not count): nothing to learn either.
printf '%s\n' '{"input_ids":[1,2,3],"loss_mask":[1,0,1]}' '{"input_ids":[4,5],"loss_mask":[0,1]}' \
  '{"input_ids":[6,7],"loss_mask":[1,0]}' '{"input_ids":[8],"loss_mask":[1]}' > "$T/nopair.jsonl"
if "$D" build -o "$T/keep.bin" -v 10 "$T/nopair.jsonl" 2>"$T/err.txt"; then fail "accepted a dataset with no anchor"; fi
grep -q "$T/keep.bin: no sample has two tokens in the loss in a row .*: nothing to learn" "$T/err.txt" ||
  fail "no-anchor message: $(cat "$T/err.txt")"
cmp -s "$T/a.bin" "$T/keep.bin" || fail "a dataset with no anchor replaced the output"
printf '%s\n' '{"input_ids":[9,9,9],"loss_mask":[0,1,1]}' >> "$T/nopair.jsonl"
"$D" build -o "$T/pair.bin" -v 10 "$T/nopair.jsonl" >/dev/null || fail "one pair of loss tokens was refused"

expect_err() {  # input, needle, extra args
  printf '%s\n' "$1" > "$T/bad.jsonl"
  if "$D" build -o "$T/bad.bin" $3 "$T/bad.jsonl" 2>"$T/err.txt"; then fail "accepted: $1"; fi
  grep -q "$T/bad.jsonl:1: $2" "$T/err.txt" || fail "message for '$1': $(cat "$T/err.txt")"
  [[ ! -e $T/bad.bin ]] || fail "left a half-written file"
}
expect_err '{"input_ids":[1,2,99]}' "sample 0: token 2: id 99 >= vocab size 10" "-v 10"
expect_err '{"input_ids":[1,2],"loss_mask":[1]}' "loss_mask: not an array of the same length" ""
expect_err '{"input_ids":[1,2],"loss_mask":[1,5]}' "loss_mask\[1\]: not 0 or 1" ""
expect_err '{"input_ids":[]}' "input_ids: empty" ""
expect_err '{"input_ids":[1,-3]}' "input_ids\[1\]: not a token id" ""
expect_err 'not json' "not a JSON object: one object per line is read (JSON Lines)" ""
expect_err '{"input_ids":[1,2' "not valid JSON" ""
expect_err '{"input_ids":[1,2],"labels":[-100,3]}' "labels\[1\]: 3 is neither -100 nor input_ids\[1\] (2): shifted labels" ""
expect_err '{"input_ids":[1,2],"labels":[-100,2],"loss_mask":[0,1]}' "both loss_mask and labels" ""
expect_err '{"input_ids":[1,2],"labels":[-100]}' "labels: not an array of the same length" ""
expect_err '{"input_ids":[1,2],"labels":["a",2]}' "labels\[0\]: not a number" ""
# A line too large to read in the memory there is (one object holding a whole dataset, as pandas'
# to_json writes it): out of memory said, not "not valid JSON" (not under ASan: no address space
# limit for it)
if ! grep -qa __asan_init "$D"; then
  python3 -c 'print("{\"input_ids\":[" + ",".join(["1"] * 3000000) + "]}")' > "$T/huge.jsonl"
  if (ulimit -v 200000 && exec "$D" build -o "$T/huge.bin" "$T/huge.jsonl") 2>"$T/err.txt"; then
    fail "a line larger than memory was read"
  fi
  grep -q "$T/huge.jsonl:1: out of memory reading a line of 6000016 bytes" "$T/err.txt" || fail "huge line: $(cat "$T/err.txt")"
  rm -f "$T/huge.jsonl"
fi
# a per-token mask under another name (a list of 0/1 as long as input_ids) is not read: without
# loss_mask or labels, refused, named (the sample would be learned whole, prompts included);
# padding that attention_mask marks before a token, or with nothing to keep it out of the loss,
# and packed sequences, refused too
expect_err '{"input_ids":[1,2,3,4],"assistant_masks":[0,0,1,1]}' "assistant_masks: not read (the loss is taken where loss_mask is 1" ""
expect_err '{"input_ids":[1,2],"loss_masks":[0,1]}' "loss_masks: not read" ""
expect_err '{"input_ids":[1,2],"Label_Mask":[true,false]}' "Label_Mask: not read" ""
expect_err '{"input_ids":[0,1,2],"attention_mask":[0,1,1],"loss_mask":[0,1,1]}' "attention_mask\[0\]: 0 before a 1: padding" ""
expect_err '{"input_ids":[1,2,0],"attention_mask":[1,1,0]}' "attention_mask\[2\]: 0: the padding from there would be learned" ""
expect_err '{"input_ids":[1,2,3,4],"attention_mask":[1,1,2,2],"loss_mask":[0,1,0,1]}' "attention_mask\[2\]: past 1: one sequence per line" ""
# fine: an attention_mask of ones; right padding kept out of the loss; a mask-like list beside
# loss_mask or labels (special_tokens_mask); lists that are no per-token flags (tags, spans); a label
printf '%s\n' '{"input_ids":[1,2,3],"attention_mask":[1,1,1],"loss_mask":[0,1,1],"label":"chat","masks_used":3}' \
  '{"input_ids":[1,2,3,0],"attention_mask":[1,1,1,0],"labels":[-100,2,3,-100],"special_tokens_mask":[1,0,0,1]}' \
  '{"input_ids":[4,5,6],"label":["helpful","harmless"],"mask_spans":[[0,1]],"label_ids":[7,8,9]}' > "$T/am.jsonl"
"$D" build -o "$T/am.bin" -v 10 "$T/am.jsonl" 2>"$T/err.txt" || fail "attention_mask of ones, right padding, tags: $(cat "$T/err.txt")"
[[ "$("$D" dump "$T/am.bin")" == '{"input_ids":[1,2,3],"loss_mask":[0,1,1]}'$'\n''{"input_ids":[1,2,3,0],"loss_mask":[0,1,1,0]}'$'\n''{"input_ids":[4,5,6],"loss_mask":[1,1,1]}' ]] ||
  fail "attention_mask of ones, right padding, tags: $("$D" dump "$T/am.bin")"
expect_err '{"input_ids":[5,6,7]}{"input_ids":[8,9]}' "more after the JSON object" ""
expect_err '{"input_ids":[1,2]} trailing' "more after the JSON object" ""
# a BOM and blanks before the object, as cJSON takes them: still a record
printf '\xef\xbb\xbf{"input_ids":[1,2,3]}\n\f {"input_ids":[4,5]}\n' > "$T/bom.jsonl"
"$D" build -o "$T/bom.bin" "$T/bom.jsonl" 2>"$T/err.txt" || fail "a BOM or a form feed before the object: $(cat "$T/err.txt")"
"$D" info "$T/bom.bin" | grep -q ": 2 samples, 5 tokens" || fail "BOM file: $("$D" info "$T/bom.bin")"
expect_err '[1,2]' "a JSON array, not an object: one object per line is read (JSON Lines); a file of one array: jq -c '.\[\]' makes it one" ""
expect_err '{"input_ids":[1,2],"input_ids":[3]}' "input_ids: appears twice" ""
# A NUL ends the parser's string: the record after it on that line would be lost unsaid.
printf '{"input_ids":[1,2]}\0{"input_ids":[3,4]}\n' > "$T/nul.jsonl"
if "$D" build -o "$T/bad.bin" "$T/nul.jsonl" 2>"$T/err.txt"; then fail "accepted a line with a NUL byte"; fi
grep -q "$T/nul.jsonl:1: a NUL byte at column 20: not a JSON line" "$T/err.txt" || fail "NUL message: $(cat "$T/err.txt")"
[[ ! -e $T/bad.bin ]] || fail "left a half-written file"
expect_err '{"input_ids":[1,2,3,4294967295]}' "sample 0: token 3: id 4294967295 >= 1073741824, no vocabulary is that large" ""
# An empty output path is refused before the input is read (it failed at the final rename).
for cmd in build synth; do
  "$D" $cmd -o "" "$T/bad.jsonl" 2>"$T/err.txt"
  rc=$?
  [[ $rc == 64 ]] && grep -q "dflash-data: $cmd: -o OUT is required (an empty path was given)" "$T/err.txt" ||
    fail "$cmd -o '': exit $rc: $(cat "$T/err.txt")"
done
# A failed build leaves the file it would have replaced as it was.
printf '%s\n' '{"input_ids":[1,2,3,4294967295]}' > "$T/bad.jsonl"
if "$D" build -o "$T/a.bin" "$T/bad.jsonl" 2>/dev/null; then fail "accepted an id beyond any vocabulary"; fi
"$D" verify "$T/a.bin" | grep -q ok || fail "a failed build damaged the file it would have replaced"
# An output that exists and is not a regular file is refused at once, before any input is read
# (a rename would replace a FIFO or, as root, a device with a file; a directory would fail only
# at the end), and left as it was.
mkfifo "$T/out.fifo"
mkdir -p "$T/out.dir"
ln -sf out.dir "$T/dirlink"
for o in out.fifo out.dir dirlink; do
  if "$D" build -o "$T/$o" "$T/in.jsonl" 2>"$T/err.txt"; then fail "wrote over $o"; fi
  grep -q "$T/$o: exists and is not a regular file" "$T/err.txt" || fail "$o message: $(cat "$T/err.txt")"
done
[[ -p $T/out.fifo && -d $T/out.dir && -L $T/dirlink ]] || fail "a refused output was changed"
[[ -z $(ls -A "$T/out.dir") ]] || fail "a temp file was left in a refused output directory"
# Through a symlink (relative, into another directory; or dangling) the file it leads to is
# replaced and the link stays a link.
mkdir -p "$T/real" "$T/links"
cp "$T/a.bin" "$T/real/r.bin"
ln -sf ../real/r.bin "$T/links/r.bin"
ln -sf ../real/new.bin "$T/links/new.bin"
"$D" build -o "$T/links/r.bin" -v 77 "$T/in.jsonl" >/dev/null || fail "build through a symlink"
"$D" build -o "$T/links/new.bin" -v 77 "$T/in.jsonl" >/dev/null || fail "build through a dangling symlink"
for f in r new; do
  [[ -L $T/links/$f.bin && $(readlink "$T/links/$f.bin") == ../real/$f.bin ]] || fail "$f.bin: the symlink was replaced"
  "$D" info "$T/real/$f.bin" | grep -q "vocab 77" || fail "$f.bin: the file the symlink leads to was not written"
done
if compgen -G "$T/links/*.tmp.*" >/dev/null || compgen -G "$T/real/*.tmp.*" >/dev/null; then fail "a temp file was left beside a symlink"; fi

# A build in progress: its input a FIFO that stays open (fd 3 holds both ends, so no open waits).
mkfifo "$T/slow.fifo"
# Its temp file: without a name beside the output (O_TMPFILE: "DIR/#INODE (deleted)") where the
# file system allows, else OUT.tmp.*.
temp_beside() {  # out
  local f
  local dir
  dir=$(cd "$(dirname "$1")" && pwd -P)    # (as the kernel names it: a link in $T resolved)
  for f in "/proc/$pid/fd"/*; do [[ $(readlink "$f") == "$dir/#"*" (deleted)" ]] && { anon=1; return 0; }; done
  anon=0
  compgen -G "$1.tmp.*" >/dev/null
}
start_slow() {  # out: starts the build as $pid and waits for its temp file
  exec 3<>"$T/slow.fifo"
  "$D" build -o "$1" -v 10 "$T/slow.fifo" 2>"$T/slow.err" 3>&- & pid=$!
  for ((i = 0; i < 200 * SCALE; i++)); do temp_beside "$1" && return; sleep 0.05; done
  fail "no temp file beside $1: $(cat "$T/slow.err")"
}
# The loss-mask temp is beside the output (not in /tmp, often a small tmpfs), unlinked at once.
mask_beside() {
  local f
  for f in "/proc/$pid/fd"/*; do [[ $(readlink "$f") == "$T/slow.bin.mask."*" (deleted)" ]] && return 0; done
  return 1
}
start_slow "$T/slow.bin"
for ((i = 0; i < 100 * SCALE; i++)); do mask_beside && break; sleep 0.05; done
mask_beside || fail "the loss-mask temp is not beside the output: $(ls -l "/proc/$pid/fd")"
exec 3>&-
wait $pid
# Stopped by a signal part way: its temp file goes with it, the old output stays.
for sig in TERM HUP; do
  cp "$T/a.bin" "$T/sig.bin"
  start_slow "$T/sig.bin"
  echo '{"input_ids":[4,5,6]}' >&3
  kill -$sig $pid
  wait $pid 2>/dev/null
  rc=$?
  exec 3>&-
  [[ $rc == $((128 + $(kill -l $sig))) ]] || fail "SIG$sig: exit $rc: $(cat "$T/slow.err")"
  ! compgen -G "$T/sig.bin.*" >/dev/null || fail "SIG$sig left $(compgen -G "$T/sig.bin.*")"
  cmp -s "$T/a.bin" "$T/sig.bin" || fail "SIG$sig: the output was replaced"
done
# Killed outright (SIGKILL, the OOM killer): a temp without a name goes with the process.
cp "$T/a.bin" "$T/sig.bin"
start_slow "$T/sig.bin"
echo '{"input_ids":[4,5,6]}' >&3
kill -KILL $pid
wait $pid 2>/dev/null
exec 3>&-
tmpfile_ok=$(python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_TMPFILE | os.O_RDWR, 0o600)); print(1)' "$T" 2>/dev/null)
[[ $tmpfile_ok == 1 && $anon == 0 ]] && fail "$T takes O_TMPFILE files, yet the build's temp file has a name"
if ((anon)); then
  ! compgen -G "$T/sig.bin.*" >/dev/null || fail "SIGKILL left $(compgen -G "$T/sig.bin.*")"
else
  echo "note: $T's file system has no O_TMPFILE: a killed build leaves its named temp file"
  rm -f "$T"/sig.bin.tmp.*
fi
cmp -s "$T/a.bin" "$T/sig.bin" || fail "SIGKILL: the output was replaced"

long=$T/$(printf 'd%.0s' {1..200})/$(printf 'e%.0s' {1..200})/$(printf 'f%.0s' {1..100})/train.bin
if "$D" build -o "$long" "$T/in.jsonl" 2>"$T/err.txt"; then fail "accepted a path of ${#long} bytes"; fi
grep -q "output path longer than 511 bytes" "$T/err.txt" || fail "long path message: $(cat "$T/err.txt")"
# info --json names any path as a JSON string.
odd=$T/$'q"b\\c\td.bin'
cp "$T/a.bin" "$odd"
"$D" info --json "$odd" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["path"]==sys.argv[1], d' "$odd" || fail "info --json with a path holding a quote, a backslash and a tab"
# An option out of range is named with its value and limit (not cut to 32 bits).
opt_err() {  # needle, args...
  local needle=$1; shift
  if "$D" synth -o "$T/opt.bin" "$@" 2>"$T/err.txt" >/dev/null; then fail "accepted $*"; fi
  grep -qF -- "$needle" "$T/err.txt" || fail "message for $*: $(cat "$T/err.txt")"
}
opt_err "--min-len: 4294967298 is above the limit, 16777216" --min-len 4294967298 --max-len 8
opt_err "--max-len: 16777217 is above the limit, 16777216" --max-len 16777217
opt_err "-v: 1073741825 is above the largest vocabulary, 1073741824" -v 1073741825
# strtoull skips blanks and wraps a minus: " -1" is no count, not 2^64 - 1 (-n would run away)
opt_err "-v: not a number: ' -1'" -v " -1"
opt_err "-n: not a number: ' 5'" -n " 5"

# A usage mistake: one line naming it, exit 64 (not the whole usage)
usage_err() {  # needle, args...
  local needle=$1; shift
  "$D" "$@" >/dev/null 2>"$T/err.txt"
  local rc=$?
  [[ $rc == 64 ]] && grep -qF -- "$needle" "$T/err.txt" && [[ $(wc -l <"$T/err.txt") == 1 ]] ||
    fail "dflash-data $*: exit $rc: $(cat "$T/err.txt")"
}
usage_err "dflash-data: a command is needed: build, synth, info, verify or dump (try -h)"
usage_err "dflash-data: unknown command 'frob'" frob
usage_err "dflash-data: build: unknown option '--frob' (try -h)" build --frob
usage_err "dflash-data: build: -o needs a value" build -o
usage_err "dflash-data: synth: --seed needs a value" synth -o "$T/x.bin" --seed
usage_err "dflash-data: info: a dataset FILE is needed" info
usage_err "dflash-data: dump: one dataset FILE only" dump a b

# The output is never one of the inputs (by name, through a link, or on stdin): refused before a
# byte is read, the input as it was.
cp "$T/in.jsonl" "$T/self.jsonl"
ln -sf "$T/self.jsonl" "$T/self.link"
self_err() {  # shown name, build args...
  local name=$1; shift
  if "$D" build -v 10 "$@" 2>"$T/err.txt"; then fail "built over its own input: $*"; fi
  grep -qF "dflash-data: $name: is the output (-o " "$T/err.txt" || fail "self-output message: $(cat "$T/err.txt")"
  cmp -s "$T/in.jsonl" "$T/self.jsonl" || fail "the input was replaced: $*"
  ! compgen -G "$T/self.jsonl.*" >/dev/null || fail "left $(compgen -G "$T/self.jsonl.*")"
}
self_err "$T/self.jsonl" -o "$T/self.jsonl" "$T/self.jsonl"
self_err "$T/self.jsonl" -o "$T/self.link" "$T/in.jsonl" "$T/self.jsonl"
self_err "<stdin>" -o "$T/self.jsonl" < "$T/self.jsonl"

# The output's mode: a new file's follows the umask, a rebuilt one keeps its own.
rm -f "$T/priv.bin"
(umask 077; "$D" build -o "$T/priv.bin" -v 10 "$T/in.jsonl" >/dev/null) || fail "build under umask 077"
[[ $(stat -c %a "$T/priv.bin") == 600 ]] || fail "a new output under umask 077 is mode $(stat -c %a "$T/priv.bin")"
chmod 640 "$T/priv.bin"
(umask 022; "$D" build -o "$T/priv.bin" -v 10 "$T/in.jsonl" >/dev/null) || fail "rebuild"
[[ $(stat -c %a "$T/priv.bin") == 640 ]] || fail "a rebuilt output is mode $(stat -c %a "$T/priv.bin"), was 640"

"$D" synth -o "$T/s.bin" -n 50 -v 64 --min-len 4 --max-len 32 >/dev/null || fail "synth"
# synth's samples each have two tokens in the loss in a row (something to learn: build, which
# refuses a dataset without, takes them back); shorter than 3 tokens none can: refused
opt_err "synth: need vocab >= 4 and 3 <= min-len <= max-len" --min-len 2 --max-len 2
"$D" synth -o "$T/s3.bin" -n 50 -v 64 --min-len 3 --max-len 3 >/dev/null || fail "synth of 3 tokens"
"$D" dump "$T/s3.bin" | "$D" build -o "$T/s3b.bin" - >/dev/null 2>"$T/err.txt" ||
  fail "synth's short samples have nothing to learn: $(cat "$T/err.txt")"
"$D" verify "$T/s.bin" >/dev/null || fail "synth output does not verify"
head -c 1000 "$T/s.bin" > "$T/cut.bin"
if "$D" verify "$T/cut.bin" 2>"$T/err.txt"; then fail "truncated file verified"; fi
grep -q "$T/cut.bin: truncated" "$T/err.txt" || fail "truncated message: $(cat "$T/err.txt")"
# The test-data generators: bad arguments or an output they cannot write give one line, no traceback
S=${DFLASH_SRC:-.}
one_line() {  # needle, command...
  local needle=$1; shift
  if "$@" >/dev/null 2>"$T/err.txt"; then fail "$* succeeded"; fi
  [[ $(wc -l < "$T/err.txt") == 1 ]] && grep -q "$needle" "$T/err.txt" || fail "$*: $(cat "$T/err.txt")"
}
printf '\n \n' >"$T/blank.jsonl"
one_line "^dflash-data: $T/blank.jsonl: no record (empty, or blank lines only): nothing written$" "$D" build -o "$T/x.bin" "$T/blank.jsonl"
# an option of another command: refused, not ignored (build --seed shuffles nothing)
one_line "dflash-data: build: --seed is not an option of build (try -h)" "$D" build --seed 3 -o "$T/x.bin" "$T/in.jsonl"
one_line "dflash-data: info: -v is not an option of info (try -h)" "$D" info -v 3 "$T/a.bin"
one_line "dflash-data: dump: --json is not an option of dump (try -h)" "$D" dump --json "$T/a.bin"
one_line "mkdata: need --rules >= 1" python3 "$S/tools/mkdata.py" --rules 0
one_line "mkdata: $T/none/x.jsonl: No such file" python3 "$S/tools/mkdata.py" -o "$T/none/x.jsonl"
one_line "mkmodel: --kv-heads must be at least 1" python3 "$S/tools/mkmodel.py" "$T/mm" --kv-heads 0
one_line "mkmodel: --layers must be at least 1" python3 "$S/tools/mkmodel.py" "$T/mm" --layers 0
# An input not there: said before the inputs before it are read, nothing written
cp "$T/a.bin" "$T/keep2.bin"
"$D" build -o "$T/keep2.bin" -v 10 "$T/in.jsonl" "$T/gone.jsonl" 2>"$T/err.txt" && fail "a missing input went through"
grep -qx "dflash-data: $T/gone.jsonl: cannot open: No such file or directory: nothing written" "$T/err.txt" ||
  fail "a missing input: $(cat "$T/err.txt")"
cmp -s "$T/a.bin" "$T/keep2.bin" || fail "a missing input replaced the output"
# A JSONL file where a dataset goes (data.path set to the input): said so, with what to run
"$D" info "$T/in.jsonl" >/dev/null 2>"$T/err.txt" && fail "info took a JSONL file for a dataset"
grep -qx "dflash-data: $T/in.jsonl: not a dflash dataset (bad magic): a JSON file? build a dataset of it with \`dflash-data build -o OUT FILE\`" "$T/err.txt" ||
  fail "a JSONL file as a dataset: $(cat "$T/err.txt")"
# Compressed: a gzip dataset where the dataset goes, a gzip JSONL input (file or stdin): named so
gzip -c "$T/a.bin" >"$T/a.bin.gz"
"$D" info "$T/a.bin.gz" >/dev/null 2>"$T/err.txt" && fail "info took a gzip file for a dataset"
grep -qx "dflash-data: $T/a.bin.gz: not a dflash dataset: gzip-compressed data (a dataset is read uncompressed, mapped in place: decompress it first)" "$T/err.txt" ||
  fail "a gzip dataset: $(cat "$T/err.txt")"
gzip -c "$T/in.jsonl" >"$T/in.jsonl.gz"
cp "$T/a.bin" "$T/keep3.bin"
for src in "$T/in.jsonl.gz" -; do
  "$D" build -o "$T/keep3.bin" -v 10 "$src" <"$T/in.jsonl.gz" 2>"$T/err.txt" && fail "built of gzip input ($src)"
  name=$src; [[ $src == - ]] && name="<stdin>"
  grep -qxF "dflash-data: $name:1: gzip-compressed, not JSON Lines: decompress it on the way in (e.g. gzip -dc FILE | dflash-data build -o OUT -)" "$T/err.txt" ||
    fail "gzip input ($src): $(cat "$T/err.txt")"
done
cmp -s "$T/a.bin" "$T/keep3.bin" || fail "a gzip input replaced the output"
# A write of the output that fails (here: past the file size limit, as a full disk would): the
# output named, and where in the input it was; the old output kept, no temp file beside it
python3 -c 'import json
for i in range(3000): print(json.dumps({"input_ids": [i % 9 + 1] * 20, "loss_mask": [1] * 20}))' >"$T/many.jsonl"
cp "$T/a.bin" "$T/fsz.bin"
( trap '' XFSZ; ulimit -f 64; "$D" build -o "$T/fsz.bin" -v 10 "$T/many.jsonl" ) 2>"$T/err.txt" && fail "a build past the size limit succeeded"
grep -Eq "^dflash-data: $T/fsz.bin: (loss-mask temp file: )?write: File too large \(at $T/many.jsonl:[0-9]+\): nothing written$" "$T/err.txt" ||
  fail "a failed write: $(cat "$T/err.txt")"
[[ $(wc -l <"$T/err.txt") == 1 ]] || fail "a failed write: more than one line: $(cat "$T/err.txt")"
cmp -s "$T/a.bin" "$T/fsz.bin" || fail "a failed write replaced the output"
! compgen -G "$T/fsz.bin.*" >/dev/null || fail "a failed write left $(compgen -G "$T/fsz.bin.*")"
echo "dflash-data ok"
