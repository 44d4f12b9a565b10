#!/usr/bin/env python3
"""convert_conversations.py: JSONL conversations -> dflash-data input (or a dataset file).

Reads lines {"id": ..., "conversations": [{"role": "user"|"assistant"|"system", "content": "..."}]}
and renders each with the target model's Hugging Face tokenizer and chat template. The loss
mask is 1 on the tokens of assistant turns (what the drafter learns to predict), 0 elsewhere.

    tools/convert_conversations.py --model /models/Qwen3-8B in.jsonl > tokens.jsonl
    tools/convert_conversations.py --model /models/Qwen3-8B in.jsonl -o data.bin   # runs dflash-data build

Needs `transformers` (pip install transformers). The mask is found by rendering growing
prefixes of the conversation: the tokens a turn adds are the ones that turn owns. A chat
template that re-renders earlier turns differently when later ones are added (some do for
reasoning traces) is detected and reported.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def render(tok, messages, add_generation_prompt=False):
    return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)


def encode(tok, conv, max_len):
    ids, mask = [], []
    for i, msg in enumerate(conv):
        if msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"turn {i}: unknown role {msg.get('role')!r}")
        if not isinstance(msg.get("content"), str):
            raise ValueError(f"turn {i}: content is not a string")
        if msg["role"] == "assistant":
            # The assistant header (e.g. "<|im_start|>assistant\n") is the generation prompt: not learned.
            head = render(tok, conv[:i], add_generation_prompt=True)
            if head[: len(ids)] != ids:
                raise ValueError(f"turn {i}: the chat template re-renders earlier turns; cannot align the mask")
            mask += [0] * (len(head) - len(ids))
            ids = list(head)
        full = render(tok, conv[: i + 1])
        if full[: len(ids)] != ids:
            raise ValueError(f"turn {i}: the chat template re-renders earlier turns; cannot align the mask")
        added = len(full) - len(ids)
        mask += [1 if msg["role"] == "assistant" else 0] * added
        ids = list(full)
    if max_len and len(ids) > max_len:
        ids, mask = ids[:max_len], mask[:max_len]
    return ids, mask


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model dir or id (tokenizer + chat template)")
    ap.add_argument("input", nargs="*", help="JSONL files (default: stdin)")
    ap.add_argument("-o", "--output", help="write a dataset file with dflash-data build (default: JSONL to stdout)")
    ap.add_argument("--max-len", type=int, default=0, help="truncate samples to this many tokens (0 = no)")
    ap.add_argument("--skip-bad", action="store_true", help="skip malformed conversations instead of stopping")
    ap.add_argument("--dflash-data", default=None, help="path of the dflash-data binary")
    args = ap.parse_args()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit("convert_conversations.py: needs the transformers package (pip install transformers)")
    tok = AutoTokenizer.from_pretrained(args.model)
    if not getattr(tok, "chat_template", None):
        sys.exit(f"convert_conversations.py: {args.model}: the tokenizer has no chat template")

    out, proc = sys.stdout, None
    if args.output:
        tool = args.dflash_data or shutil.which("dflash-data") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin", "dflash-data")
        vocab = str(len(tok))
        proc = subprocess.Popen([tool, "build", "-o", args.output, "-v", vocab, "-"], stdin=subprocess.PIPE, text=True)
        out = proc.stdin

    try:
        n_ok, n_bad = convert(args, tok, out)
    except BaseException:
        # A stop on a bad record (or anything else) must not let dflash-data see a clean end of
        # its input: it would finish and rename a partial dataset over the output file. A line
        # it refuses makes it stop and remove its temp file; a kill if it does not.
        if proc:
            try:
                proc.stdin.write("\n(input ended early: convert_conversations.py stopped)\n")
                proc.stdin.close()
                proc.wait(timeout=60)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        raise
    if proc:
        proc.stdin.close()
        if proc.wait() != 0:
            sys.exit("convert_conversations.py: dflash-data build failed")
    print(f"convert_conversations.py: {n_ok} conversations, {n_bad} skipped", file=sys.stderr)


def convert(args, tok, out):
    """Every record of the inputs to `out`: (converted, skipped)."""
    n_ok = n_bad = 0
    files = args.input or ["-"]
    for path in files:
        f = sys.stdin if path == "-" else open(path, encoding="utf-8")
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{'<stdin>' if path == '-' else path}:{lineno}"
            try:
                rec = json.loads(line)
                conv = rec.get("conversations")
                if not isinstance(conv, list) or not conv:
                    raise ValueError("no 'conversations' list")
                ids, mask = encode(tok, conv, args.max_len)
                if not any(mask):
                    raise ValueError("no assistant tokens: nothing to learn")
            except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
                if not args.skip_bad:
                    sys.exit(f"convert_conversations.py: {where}: {e}")
                print(f"convert_conversations.py: {where}: skipped: {e}", file=sys.stderr)
                n_bad += 1
                continue
            out.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
            n_ok += 1
        if f is not sys.stdin:
            f.close()
    return n_ok, n_bad


if __name__ == "__main__":
    main()
