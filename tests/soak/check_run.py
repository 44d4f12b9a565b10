#!/usr/bin/env python3
"""check_run.py: after a dflash run ends, checks from three independent records that every
batch of the run was trained exactly once in the surviving checkpoint lineage:
  - the ledger (SQLite): every batch checkpointed, one kept training row each, every kept row
    inside the lineage (generation limits), one kept row per optimizer step;
  - the final checkpoint's training state (optimizer.bin header): its step, and the sequences
    and tokens it has trained equal the sums over every batch of the run;
  - the drafters' metrics (metrics-rank*.jsonl): in the lineage, each batch appears once.
And that the data-parallel replicas stayed identical: every step whose metrics line carries
"params_hash" (CPU backend, the steps a periodic checkpoint is due at) on more than one rank has
the same hash on each (rolled-back generations included: their ranks trained in step too).
Usage: check_run.py LEDGER STATE_DIR [--partial] [--min-hashed=N]
--partial: the run was drained, not completed: only checkpointed batches must have been
trained once; pending ones not at all.
--min-hashed=N: fail unless at least N steps had their hash compared between ranks.
Prints one summary line; exit 0 ok, 1 failed."""
import glob
import json
import os
import sqlite3
import struct
import sys

OPT_HEADER = struct.Struct("<8sIIQQqqQQQQQ40x")     # model/checkpoint.c struct opt_header
PENDING, CHECKPOINTED = 0, 4

failures = []


def fail(msg):
    failures.append(msg)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    partial = "--partial" in sys.argv
    min_hashed = max([int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--min-hashed=")] or [0])
    ledger, state = args
    db = sqlite3.connect("file:%s?mode=ro" % ledger, uri=True)
    q = lambda sql, *a: db.execute(sql, a).fetchall()

    batches = {r[0]: r[1:] for r in q("SELECT id, state, n_samples, n_tokens, leases FROM batches")}
    n_epochs = len({bid >> 32 for bid in batches})
    meta = dict(q("SELECT key, value FROM meta"))
    limits = dict(q("SELECT gen, keep_limit FROM generations"))
    head_gen, head_step = int(meta.get("ckpt_gen", 0)), int(meta.get("ckpt_step", 0))
    head_dir = meta.get("ckpt_dir", "")
    if not head_dir:
        fail("no checkpoint in the ledger")
    # The lineage: ended generations up to their limit; the head's generation up to the head.
    def kept(gen, step):
        if gen == head_gen:
            return step <= head_step
        return step <= limits.get(gen, -1)

    rows = q("SELECT batch, gen, step, rank, rolled_back FROM trains")
    kept_rows = [r for r in rows if not r[4]]
    per_batch = {}
    for b, g, s, rank, _ in kept_rows:
        per_batch.setdefault(b, []).append((g, s, rank))
        if not kept(g, s):
            fail("batch %d: kept training row (gen %d, step %d) is outside the lineage" % (b, g, s))
    for b, g, s, rank, rb in rows:
        if rb and kept(g, s) and g != head_gen:
            fail("batch %d: rolled-back row (gen %d, step %d) inside the lineage" % (b, g, s))

    states = {}
    for bid, (st, ns, nt, leases) in batches.items():
        states[st] = states.get(st, 0) + 1
        n = len(per_batch.get(bid, []))
        if st == CHECKPOINTED and n != 1:
            fail("batch %d:%d checkpointed, trained %d times in the lineage %s" % (bid >> 32, bid & 0xffffffff, n,
                                                                                  per_batch.get(bid)))
        elif st == PENDING and partial and n:
            fail("batch %d:%d pending, yet trained in the lineage %s" % (bid >> 32, bid & 0xffffffff, per_batch[bid]))
        elif st != CHECKPOINTED and not (partial and st == PENDING):
            fail("batch %d:%d ends in state %d" % (bid >> 32, bid & 0xffffffff, st))
    done = [bid for bid, v in batches.items() if v[0] == CHECKPOINTED]

    # One optimizer step per kept (gen, step): the lineage's steps are 1..head_step.
    steps = {(g, s) for _, g, s, _, _ in kept_rows}
    if len(steps) != head_step:
        fail("%d distinct kept steps in the ledger, the head checkpoint is step %d" % (len(steps), head_step))

    # The final checkpoint's own record of what it trained.
    ck = {}
    try:
        with open(os.path.join(head_dir, "optimizer.bin"), "rb") as f:
            h = OPT_HEADER.unpack(f.read(OPT_HEADER.size))
        ck = dict(zip(("magic", "version", "size", "n_params", "layout", "opt_step", "step", "epoch", "batch_in_epoch",
                       "seed", "samples", "tokens"), h))
        want_samples = sum(batches[b][1] for b in done)
        want_tokens = sum(batches[b][2] for b in done)
        if ck["step"] != head_step:
            fail("%s: step %d, the ledger's head is step %d" % (head_dir, ck["step"], head_step))
        if ck["samples"] != want_samples or ck["tokens"] != want_tokens:
            fail("%s: trained %d sequences / %d tokens; the checkpointed batches hold %d / %d" %
                 (head_dir, ck["samples"], ck["tokens"], want_samples, want_tokens))
    except (OSError, struct.error) as e:
        fail("final checkpoint %s: %s" % (head_dir, e))

    # The drafters' metrics: each batch of the lineage once (a SIGKILL may cut the last line).
    seen, listed, cut, nonfinite = {}, set(), 0, 0
    hashes = {}     # (generation, step) -> {rank: {params_hash}}
    for path in sorted(glob.glob(os.path.join(state, "metrics-rank*.jsonl"))):
        for line in open(path):
            try:
                m = json.loads(line)
            except ValueError:
                cut += 1
                continue
            if "params_hash" in m:
                hashes.setdefault((m["generation"], m["step"]), {}).setdefault(m["rank"], set()).add(m["params_hash"])
            if not kept(m["generation"], m["step"]):
                continue
            # rank 0 lists the group's batches of the step: a peer killed before its own line
            listed.update(m.get("group_batches", []))
            if m["batch"] < 0:
                continue
            if not (abs(m["loss"]) < float("inf")):
                nonfinite += 1
            seen.setdefault(m["batch"], []).append((m["generation"], m["step"], m["rank"]))
    twice = {b: v for b, v in seen.items() if len(v) > 1}
    missing = [b for b in done if b not in seen and b not in listed]
    done_set = set(done)
    extra = [b for b in seen if b not in done_set]
    if twice:
        fail("metrics: %d batches trained more than once in the lineage, e.g. %s" % (len(twice), list(twice.items())[:3]))
    if len(missing) > cut:
        fail("metrics: %d checkpointed batches have no metrics row in the lineage (%d cut lines), e.g. %s" %
             (len(missing), cut, missing[:5]))
    if extra:
        fail("metrics: %d batches in the lineage are not checkpointed, e.g. %s" % (len(extra), extra[:5]))
    if nonfinite:
        fail("metrics: %d kept steps with a non-finite loss" % nonfinite)
    # The replicas: one hash per hashed step over every rank that wrote it.
    compared = {k: v for k, v in hashes.items() if len(v) > 1}
    differ = sorted((k, {r: sorted(h) for r, h in v.items()}) for k, v in hashes.items()
                    if len(set().union(*v.values())) > 1)
    if differ:     # listed first: replicas that drifted apart explain much of what else fails
        failures.insert(0, "metrics: %d steps whose parameters differ between ranks (or within one), first "
                        "(generation, step) %s" % (len(differ), differ[:3]))
    if len(compared) < min_hashed:
        fail("metrics: %d steps with params_hash on more than one rank, wanted at least %d" %
             (len(compared), min_hashed))

    gens = max(list(limits) + [head_gen])
    rolled = sum(1 for r in rows if r[4])
    releases = sum(max(0, v[3] - 1) for v in batches.values())
    print("%s: %d batches (%d epochs), %d checkpointed each trained once; head gen %d step %d (%d generations); "
          "checkpoint: %s sequences, %s tokens; %d training rows rolled back, %d re-leases; metrics: %d rows kept, "
          "%d cut lines, %d steps' parameters compared between ranks; states %s" %
          ("FAIL" if failures else "ok", len(batches), n_epochs, len(done), head_gen, head_step, gens,
           ck.get("samples"), ck.get("tokens"), rolled, releases, len(seen), cut, len(compared), states))
    for f in failures[:20]:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
