#!/usr/bin/env python3
"""convert_conversations.py: JSONL conversations -> dflash-data input (or a dataset file).

Reads lines {"id": ..., "conversations": [{"role": "user"|"assistant"|"system"|"tool", "content": "..."}]}
("messages" in place of "conversations" too, and ShareGPT turns {"from": "human"|"gpt"|"system",
"value": "..."}) and renders each with the target model's Hugging Face tokenizer and chat template.
The loss mask is 1 on the tokens of assistant turns (what the drafter learns to predict), 0 elsewhere.

    tools/convert_conversations.py --model /models/Qwen3-8B in.jsonl > tokens.jsonl
    tools/convert_conversations.py --model /models/Qwen3-8B in.jsonl -o data.bin   # runs dflash-data build

Needs `transformers` (pip install transformers). The mask is found by rendering growing
prefixes of the conversation: the tokens a turn adds are the ones that turn owns. A chat
template that renders earlier turns otherwise when later ones are added (Qwen3 gives only the last
assistant turn its reasoning block) is detected: such a conversation becomes one sample per
assistant turn, the conversation up to that turn with only its tokens in the loss.

With -o, dflash-data build gets --end-line and the end line {"end": N} only once every record
is through: a stop of this script for any reason (an error, a signal, a kill) leaves the old
output as it was.
"""
import argparse
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping

PROG = "convert_conversations.py"
# The chat roles, and ShareGPT's names for them.
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "human": "user", "gpt": "assistant"}
TemplateError = ()  # jinja2's, once run() imports it (until then nothing renders)
SCHEMA = ('expected {"conversations": [{"role": "user", "content": "..."}, ...]} ("messages" in place of '
          '"conversations", or ShareGPT turns {"from": "human", "value": "..."}, also do)')


class Stopped(BaseException):
    """SIGTERM or SIGHUP, raised where the script is so that its cleanup runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def on_stop_signal(signum, frame):
    raise Stopped(signum)


def die(msg):
    sys.exit(f"{PROG}: {msg}")


def json_type(v):
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


def turn_of(i, t):
    """Turn i of a record as a chat-template message, or ValueError naming what is wrong."""
    if not isinstance(t, dict):
        raise ValueError(f"turn {i}: {json_type(t)}, not an object: {SCHEMA}")
    if "role" in t:
        role, content = t.get("role"), t.get("content")
        msg = dict(t)   # other keys (tool_calls, reasoning_content, ...) are the template's
    elif "from" in t:
        role, content = t.get("from"), t.get("value")
        msg = {k: v for k, v in t.items() if k not in ("from", "value")}
    else:
        raise ValueError(f"turn {i}: no 'role' (nor ShareGPT's 'from'): {SCHEMA}")
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"turn {i}: unknown role {role!r} (system, user, assistant, tool; ShareGPT's human, gpt)")
    if not isinstance(content, str):
        raise ValueError(f"turn {i}: content is {json_type(content)}, not a string")
    msg["role"], msg["content"] = ROLES[role], content
    return msg


def unique_keys(pairs):
    """A JSON object as a dict; a key given twice (which json.loads would take the last of, as
    dflash-data does not) is refused."""
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise ValueError(f"'{k}' appears twice in an object")
        obj[k] = v
    return obj


def conversation(line):
    """One input line (bytes) -> its turns, or ValueError naming what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
    try:
        rec = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{json_type(rec)}, not a JSON object: {SCHEMA}")
    keys = [k for k in ("conversations", "messages") if k in rec]
    if len(keys) > 1:
        raise ValueError("both 'conversations' and 'messages': give one")
    conv = rec[keys[0]] if keys else None
    if not isinstance(conv, list) or not conv:
        raise ValueError(f"no 'conversations' list of turns: {SCHEMA}")
    turns = [turn_of(i, t) for i, t in enumerate(conv)]
    if turns[0]["role"] == "assistant":
        # (ShareGPT dumps have such records, their first prompt lost; a chat template has no
        # empty conversation to render the first answer's header from)
        raise ValueError("turn 0 is the assistant's: no prompt before it to answer")
    return turns


def render(tok, messages, add_generation_prompt=False):
    try:
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    except TemplateError as e:  # the template's own refusals ("roles must alternate", ...) are this record's
        raise ValueError(f"the chat template refused it: {e}") from None
    if isinstance(ids, Mapping):    # transformers 5 returns a BatchEncoding, 4 a list of ids
        ids = ids["input_ids"]
    ids = list(ids)
    if ids and isinstance(ids[0], (list, tuple)):   # a batch of one
        ids = list(ids[0])
    return [int(x) for x in ids]


class Rerendered(ValueError):
    """The chat template renders an earlier turn otherwise once later turns follow it."""


def whole(tok, conv):
    """(ids, mask) of the whole conversation, 1 on every assistant turn's tokens."""
    ids, mask = [], []
    for i, msg in enumerate(conv):
        if msg["role"] == "assistant":
            # The assistant header (e.g. "<|im_start|>assistant\n") is the generation prompt: not learned.
            head = render(tok, conv[:i], add_generation_prompt=True)
            if head[: len(ids)] != ids:
                raise Rerendered(f"turn {i}: the chat template re-renders earlier turns")
            mask += [0] * (len(head) - len(ids))
            ids = head
        full = render(tok, conv[: i + 1])
        if full[: len(ids)] != ids:
            raise Rerendered(f"turn {i}: the chat template re-renders earlier turns")
        added = len(full) - len(ids)
        mask += [1 if msg["role"] == "assistant" else 0] * added
        ids = full
    return ids, mask


def last_turn(tok, conv, i):
    """(ids, mask) of the conversation up to assistant turn i, 1 on that turn's tokens only."""
    head = render(tok, conv[:i], add_generation_prompt=True)
    full = render(tok, conv[: i + 1])
    if full[: len(head)] != head:
        raise ValueError(f"turn {i}: the chat template renders the turn otherwise than its generation prompt; "
                         "cannot align the mask")
    return full, [0] * len(head) + [1] * (len(full) - len(head))


def encode(tok, conv, max_len, vocab=0):
    """[(ids, mask)]: the conversation as one sample, the tokens of its assistant turns in the loss.
    A chat template that renders earlier turns otherwise once later ones follow (Qwen3 gives only
    the last assistant turn its reasoning block) has no such sample: then one sample per assistant
    turn, the conversation up to it as the template renders it there, that turn's tokens in the loss.
    Samples past max_len are cut; one with no loss token left is dropped. An id at or past vocab
    (the model's, when given) is this record's error: the tokenizer has tokens past the embedding."""
    try:
        samples = [whole(tok, conv)]
    except Rerendered:
        samples = [last_turn(tok, conv, i) for i, msg in enumerate(conv) if msg["role"] == "assistant"]
    if not any(any(mask) for _, mask in samples):
        raise ValueError("no assistant tokens: nothing to learn")
    if max_len:
        samples = [(ids[:max_len], mask[:max_len]) for ids, mask in samples]
    samples = [(ids, mask) for ids, mask in samples if any(mask)]
    top = max((max(ids) for ids, _ in samples), default=-1)
    if vocab and top >= vocab:
        raise ValueError(f"token id {top} is past the model's vocabulary ({vocab}, config.json vocab_size): the "
                         "tokenizer has tokens the model has no embedding for")
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model dir or id (tokenizer + chat template)")
    ap.add_argument("input", nargs="*", help="JSONL files (default: stdin)")
    ap.add_argument("-o", "--output", help="write a dataset file with dflash-data build (default: JSONL to stdout)")
    ap.add_argument("--max-len", type=int, default=0, help="truncate samples to this many tokens (0 = no)")
    ap.add_argument("--skip-bad", action="store_true", help="skip malformed conversations instead of stopping")
    ap.add_argument("--dflash-data", default=None, help="path of the dflash-data binary")
    args = ap.parse_args()
    if args.max_len < 0:
        ap.error(f"--max-len: {args.max_len} is negative")
    # What can be checked before the tokenizer loads (that can take a while) is checked first;
    # without opening the inputs (a FIFO's writer would see its reader come and go).
    for path in args.input:
        if path != "-":
            try:
                st = os.stat(path)
            except OSError as e:
                die(f"{path}: cannot open: {e.strerror}")
            if stat.S_ISDIR(st.st_mode) or not os.access(path, os.R_OK):
                die(f"{path}: cannot open: {os.strerror(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EACCES)}")
    tool = None
    if args.output:
        tool = args.dflash_data or shutil.which("dflash-data") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin", "dflash-data")
        if not os.path.isfile(tool) or not os.access(tool, os.X_OK):
            die(f"{tool}: no dflash-data program there (build it, or give --dflash-data PATH)")
        outdir = os.path.dirname(args.output) or "."
        if not os.path.isdir(outdir):
            die(f"{args.output}: no directory {outdir}")
    with_stop_signals(lambda: run(args, tool))


def with_stop_signals(fn):
    """fn() with SIGTERM and SIGHUP raised as Stopped where the script is, so that its cleanup runs
    (one ignored at the start, as under nohup, stays ignored); a stop by one of them or by ^C ends
    in one line and the signal's own death, for what waits on this script."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, on_stop_signal)
    try:
        return fn()
    except KeyboardInterrupt:
        signum = signal.SIGINT
    except Stopped as s:
        signum = s.signum
    print(f"{PROG}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)


def run(args, tool):
    global TemplateError
    try:
        from transformers import AutoTokenizer
    except ImportError:
        die("needs the transformers package (pip install transformers)")
    try:
        from jinja2 import TemplateError
    except ImportError:
        pass
    try:
        tok = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()
        die(f"{args.model}: cannot load its tokenizer: {first[0] if first else type(e).__name__}")
    if not getattr(tok, "chat_template", None):
        die(f"{args.model}: the tokenizer has no chat template")
    stats = {"skipped": 0}
    vocab = dataset_vocab(args.model, tok)
    samples = encoded(args, tok, stats, vocab)
    n = build_dataset(tool, args.output, vocab, samples) if args.output else write_jsonl(samples, sys.stdout)
    cut = stats.get("cut", 0)
    print(f"{PROG}: {stats.get('conversations', 0)} conversations, {n} samples, {stats['skipped']} skipped"
          + (f", {cut} dropped (no assistant token within --max-len {args.max_len})" if cut else ""), file=sys.stderr)


def dataset_vocab(model, tok):
    """The vocabulary the dataset is for: the model's (config.json's vocab_size, which the
    coordinator checks the dataset's against) where the model is a folder that has one, else the
    tokenizer's length. (A tokenizer with tokens added past the embedding, a pad token, is longer
    than the model's vocabulary: its length made a dataset every coordinator refused.)"""
    try:
        with open(os.path.join(model, "config.json"), "rb") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return len(tok)
    for c in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        v = c.get("vocab_size") if isinstance(c, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return len(tok)


def sample_line(ids, mask):
    return json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n"


def write_jsonl(samples, out):
    """samples to out as dflash-data build's input lines; their count."""
    n = 0
    try:
        for ids, mask in samples:
            out.write(sample_line(ids, mask))
            n += 1
        out.flush()
    except BrokenPipeError:
        # The reader went away (| head): say so once; the exit's own flush must not try again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        die("standard output: closed by its reader before the end")
    return n


def build_dataset(tool, output, vocab, samples):
    """samples into the dataset file output through dflash-data build; their count. The end line
    goes last, once every sample is through: an input cut short anywhere before it (this script
    stopped by an error, a signal or a kill) makes dflash-data write nothing, the old output kept."""
    try:
        proc = subprocess.Popen([tool, "build", "--end-line", "-o", output, "-v", str(vocab), "-"],
                                stdin=subprocess.PIPE, text=True)
    except OSError as e:
        die(f"{tool}: cannot run: {e.strerror}")
    n = 0
    try:
        for ids, mask in samples:
            proc.stdin.write(sample_line(ids, mask))
            n += 1
        proc.stdin.write(json.dumps({"end": n}) + "\n")
        proc.stdin.close()
    except BrokenPipeError:     # it stopped first, and said why
        close_quietly(proc.stdin)
        die(f"dflash-data build stopped ({how_ended(proc.wait())}) before its input was through: nothing written")
    except BaseException:
        # On SIGTERM dflash-data removes its temp file and says nothing more (this script says
        # why it stopped); were it to stay, its input ends without the end line all the same.
        proc.terminate()
        close_quietly(proc.stdin)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if proc.wait() != 0:
        die(f"dflash-data build failed ({how_ended(proc.returncode)}): nothing written")
    return n


def how_ended(rc):
    """A child's return code as words: "exit 1", "killed by SIGKILL"."""
    if rc >= 0:
        return f"exit {rc}"
    try:
        return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"killed by signal {-rc}"


def close_quietly(f):
    """Close f, its unwritten tail dropped (a pipe whose reader is gone)."""
    try:
        f.close()
    except OSError:
        pass


def records(path):
    """(where, line bytes) of every non-blank line of one input; a read error stops all."""
    name = "<stdin>" if path == "-" else path
    try:
        f = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as e:
        die(f"{name}: cannot open: {e.strerror}")
    lineno = 0
    try:
        with f:
            for lineno, line in enumerate(f, 1):
                if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]     # a UTF-8 BOM (some editors write one), as dflash-data takes it
                if line.strip():
                    yield f"{name}:{lineno}", line
    except OSError as e:
        die(f"{name}:{lineno + 1}: read error: {e.strerror}")


def encoded(args, tok, stats, vocab=0):
    """(ids, mask) of every record of the inputs (ids below vocab, when given); one that is bad
    stops all, or with --skip-bad is counted in stats["skipped"]."""
    for path in args.input or ["-"]:
        for where, line in records(path):
            try:
                samples = encode(tok, conversation(line), args.max_len, vocab)
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                if isinstance(e, RecursionError):   # (nested deep enough to pass json, not the template)
                    e = ValueError("nested too deeply to encode")
                if not args.skip_bad:
                    die(f"{where}: {e}")
                print(f"{PROG}: {where}: skipped: {e}", file=sys.stderr)
                stats["skipped"] += 1
                continue
            stats["conversations"] = stats.get("conversations", 0) + 1
            if not samples:     # every loss token past --max-len: dropped, as the help says
                stats["cut"] = stats.get("cut", 0) + 1
            yield from samples


if __name__ == "__main__":
    main()
