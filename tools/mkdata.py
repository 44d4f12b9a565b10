#!/usr/bin/env python3
"""mkdata.py: writes a small training set with real structure as JSONL lines
{"input_ids": [...], "loss_mask": [...]} for `dflash-data build`.

Each sample is a "prompt" (loss mask 0) then a "response" (loss mask 1). Inside a sample
every token follows from the previous one through one of a few fixed permutations of the
vocabulary (which one is a property of the sample, visible from its context), with a little
noise. A drafter that learns the permutations predicts whole blocks, so the loss falls and the
accepted length grows within a few hundred steps.
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="-", help="output JSONL ('-' = stdout)")
    ap.add_argument("-n", "--samples", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256, help="target vocabulary (ids < vocab-1: the last id is MASK)")
    ap.add_argument("--min-len", type=int, default=24)
    ap.add_argument("--max-len", type=int, default=96)
    ap.add_argument("--rules", type=int, default=2, help="distinct permutations")
    ap.add_argument("--noise", type=float, default=0.05, help="chance a token is random")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--inert", type=float, default=0.0,
                    help="share of samples whose loss tokens are never two in a row (they train nothing)")
    a = ap.parse_args()
    if a.vocab < 8 or a.min_len < 4 or a.max_len < a.min_len:
        sys.exit("mkdata: need vocab >= 8 and 4 <= min-len <= max-len")
    if a.rules < 1 or a.samples < 0 or not 0 <= a.noise <= 1 or not 0 <= a.inert <= 1:
        sys.exit("mkdata: need --rules >= 1, --samples >= 0, --noise and --inert in [0, 1]")
    rng = random.Random(a.seed)
    usable = a.vocab - 1
    perms = []
    for _ in range(a.rules):
        p = list(range(usable))
        rng.shuffle(p)
        perms.append(p)
    try:
        out = sys.stdout if a.out == "-" else open(a.out, "w")
    except OSError as e:
        sys.exit("mkdata: %s: %s" % (a.out, e.strerror))
    for _ in range(a.samples):
        n = rng.randint(a.min_len, a.max_len)
        perm = perms[rng.randrange(a.rules)]
        ids = [rng.randrange(usable)]
        for _ in range(n - 1):
            ids.append(rng.randrange(usable) if rng.random() < a.noise else perm[ids[-1]])
        prompt = rng.randint(2, max(2, n // 4))
        mask = [0] * prompt + [1] * (n - prompt)
        if a.inert and rng.random() < a.inert:
            mask = [0] * prompt + [(i + 1) % 2 for i in range(n - prompt)]
        out.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
