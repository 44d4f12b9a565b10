#!/usr/bin/env python3
"""bench_drafter_torch.py: the PyTorch eager reference of bench/drafter_bench: the same DFlash
drafter training step at the same shape (default: 5 layers of Qwen3-8B shape, one 3072-token
sequence, 512 anchors of block 16), written as a PyTorch trainer would: fp32 master weights under
bf16 autocast, fc + hidden_norm over the context, Qwen3 layers (q/k norm, RoPE, SwiGLU) whose
queries are the blocks and whose keys/values are [context ; blocks], attention through
scaled_dot_product_attention with a dense DFlash mask (or flex_attention with a block mask), the
LM head on the supervised rows with the decay-weighted cross entropy, global-norm clipping and
fused AdamW. Prints "RESULT key value" lines (model FLOPs counted as drafter_bench does).

usage: bench_drafter_torch.py [--device 0] [--layers 5] [--seq 3072] [--anchors 512]
                              [--warmup 2] [--iters 5] [--attn sdpa|flex|both] [--budget 240]
"""
import argparse
import math
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import torch
import torch.nn.functional as F

H, NH, NKV, HD, FFN, V, BS, NCTX = 4096, 32, 8, 128, 12288, 151936, 16, 5
EPS, THETA, GAMMA, PEAK_TFLOPS = 1e-6, 1e6, 7.0, 989.4


def make_params(dev, layers):
    g = torch.Generator(device=dev).manual_seed(1)

    def mat(o, i):
        return (torch.randn(o, i, device=dev, generator=g) * 0.02).requires_grad_()

    def ones(n):
        return torch.ones(n, device=dev, requires_grad=True)

    top = {"fc": mat(H, NCTX * H), "hidden_norm": ones(H), "norm": ones(H)}
    ls = [dict(q=mat(NH * HD, H), k=mat(NKV * HD, H), v=mat(NKV * HD, H), o=mat(H, NH * HD),
               q_norm=ones(HD), k_norm=ones(HD), in_ln=ones(H), post_ln=ones(H),
               gate=mat(FFN, H), up=mat(FFN, H), down=mat(H, FFN)) for _ in range(layers)]
    return top, ls


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w).to(torch.bfloat16)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(torch.bfloat16)


class Batch:
    """One packed batch: tokens, loss mask, features (pinned), and a fresh draw of anchors."""

    def __init__(self, n_seqs, seq, dev):
        self.T, self.seq, self.dev = n_seqs * seq, seq, dev
        gen = torch.Generator().manual_seed(3)
        self.tokens = torch.randint(0, V - 1, (self.T,), generator=gen)
        pos = torch.arange(self.T)
        self.start = pos - pos % seq                  # first token of each token's sequence
        self.mask = (pos % seq) >= seq // 8           # a prompt of 1/8 without loss
        self.hidden = torch.randn(self.T, NCTX * H, generator=gen).to(torch.bfloat16).pin_memory()
        nxt = torch.zeros_like(self.mask)
        nxt[:-1] = self.mask[1:]
        self.cand = self.mask & nxt & ((pos % seq) < seq - 1)
        self.inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, device=dev).float() / HD))

    def cos_sin(self, positions):
        f = positions[:, None].float() * self.inv_freq[None]
        e = torch.cat([f, f], dim=-1)
        return e.cos(), e.sin()

    def draw(self, anchors, step):
        """Anchors (up to `anchors` per sequence, without replacement) and everything the step needs."""
        gen = torch.Generator().manual_seed(1000 + step)
        picks = []
        for s0 in range(0, self.T, self.seq):
            c = torch.nonzero(self.cand[s0:s0 + self.seq]).flatten() + s0
            picks.append(c[torch.randperm(len(c), generator=gen)[:anchors]].sort().values)
        a = torch.cat(picks)
        nb, k = len(a), torch.arange(BS)
        idx = a[:, None] + k[None, :]
        start = self.start[a]
        valid = idx < (start + self.seq)[:, None]
        idxc = idx.clamp(max=self.T - 1)
        w = torch.exp(-(k - 1).clamp(min=0).double() / GAMMA).float()
        w[0] = 0
        w = w[None, :] * (self.mask[idxc] & valid)
        tok = torch.full((nb, BS), V - 1, dtype=torch.long)
        tok[:, 0] = self.tokens[a]
        d = self.dev
        out = dict(nb=nb, anchors=a.to(d), starts=start.to(d), block_tok=tok.flatten().to(d),
                   labels=self.tokens[idxc].flatten().to(d), w=w.flatten().to(d))
        out["cos_q"], out["sin_q"] = self.cos_sin(((a - start)[:, None] + k[None, :]).flatten().to(d))
        pos_ctx = (torch.arange(self.T) - self.start).to(d)
        cq, sq = out["cos_q"], out["sin_q"]
        cc, sc = self.cos_sin(pos_ctx)
        out["cos_k"], out["sin_k"] = torch.cat([cc, cq]), torch.cat([sc, sq])
        out["keys"] = float((a - start).sum().item() + nb * BS)
        out["rows"] = float((w > 0).sum().item())
        return out


def dense_mask(b, T):
    """[Q, T + Q] bool: block i sees context [start_i, anchor_i) and its own block."""
    nb = b["nb"]
    Q = nb * BS
    blk = torch.arange(Q, device=b["anchors"].device) // BS
    j = torch.arange(T, device=blk.device)
    ctx = (j[None, :] >= b["starts"][blk][:, None]) & (j[None, :] < b["anchors"][blk][:, None])
    own = blk[:, None] == (torch.arange(Q, device=blk.device) // BS)[None, :]
    return torch.cat([ctx, own], dim=1)


def flex_mask(b, T):
    from torch.nn.attention.flex_attention import create_block_mask
    starts, anchors = b["starts"], b["anchors"]
    Q = b["nb"] * BS

    def mod(bb, hh, q, kv):
        blk = q // BS
        ctx = (kv < T) & (kv >= starts[blk]) & (kv < anchors[blk])
        own = (kv >= T) & ((kv - T) // BS == blk)
        return ctx | own

    return create_block_mask(mod, None, None, Q, T + Q, device=starts.device)


def step_flops(layers, T, keys, rows, Q):
    qd, kvd, LcH = NH * HD, NKV * HD, NCTX * H
    fc = 2 * (2 * T * LcH * H)
    proj = layers * 3 * (2 * T * H * 2 * kvd + 2 * Q * H * (qd + 2 * kvd) + 2 * Q * qd * H)
    attn = layers * 3 * (4 * BS * NH * HD * keys)
    mlp = layers * 3 * (2 * Q * H * 3 * FFN)
    head = 2 * (2 * rows * H * V)
    return fc + proj + attn + mlp + head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "flex", "both"])
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; later variants are skipped past it")
    args = ap.parse_args()
    t_begin = time.perf_counter()
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    top, layers = make_params(dev, args.layers)
    params = [top["fc"]] + [p for l in layers for p in l.values()] + [top["hidden_norm"], top["norm"]]
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    head = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16)     # frozen, tied embedding / LM head
    batch = Batch(args.seqs, args.seq, dev)
    T = batch.T
    n_params = sum(p.numel() for p in params)
    print(f"torch {torch.__version__}: drafter {args.layers} layers, {n_params / 1e9:.2f} B parameters; "
          f"batch {args.seqs} x {args.seq} tokens, {args.anchors} anchors/seq, block {BS}", flush=True)

    flex_fn = None

    def step(i, mode):
        nonlocal flex_fn
        b = batch.draw(args.anchors, i)
        Q = b["nb"] * BS
        hidden = batch.hidden.to(dev, non_blocking=True)
        if mode == "sdpa":
            mask = dense_mask(b, T)[None, None]
        else:
            bm = flex_mask(b, T)
            if flex_fn is None:
                from torch.nn.attention.flex_attention import flex_attention
                flex_fn = torch.compile(flex_attention)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ctx = rms(F.linear(hidden, top["fc"]), top["hidden_norm"])
            x = head[b["block_tok"]]
            for lp in layers:
                h = rms(x, lp["in_ln"])
                q = F.linear(h, lp["q"]).view(Q, NH, HD)
                k = torch.cat([F.linear(ctx, lp["k"]), F.linear(h, lp["k"])]).view(T + Q, NKV, HD)
                v = torch.cat([F.linear(ctx, lp["v"]), F.linear(h, lp["v"])]).view(T + Q, NKV, HD)
                q = rope(rms(q, lp["q_norm"]), b["cos_q"], b["sin_q"])
                k = rope(rms(k, lp["k_norm"]), b["cos_k"], b["sin_k"])
                q4 = q.transpose(0, 1)[None]
                k4 = k.transpose(0, 1)[None]
                v4 = v.to(torch.bfloat16).transpose(0, 1)[None]
                if mode == "sdpa":
                    rep = NH // NKV
                    o = F.scaled_dot_product_attention(q4, k4.repeat_interleave(rep, dim=1),
                                                       v4.repeat_interleave(rep, dim=1), attn_mask=mask)
                else:
                    o = flex_fn(q4, k4, v4, block_mask=bm, enable_gqa=True)
                o = o[0].transpose(0, 1).reshape(Q, NH * HD)
                x = x + F.linear(o, lp["o"])
                h2 = rms(x, lp["post_ln"])
                x = x + F.linear(F.silu(F.linear(h2, lp["gate"])) * F.linear(h2, lp["up"]), lp["down"])
            xf = rms(x, top["norm"])
            sel = b["w"] > 0
            logits = F.linear(xf[sel], head)
        ce = F.cross_entropy(logits.float(), b["labels"][sel], reduction="none")
        loss = (ce * b["w"][sel]).sum() / b["w"].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), step_flops(args.layers, T, b["keys"], b["rows"], Q)

    modes = ["sdpa", "flex"] if args.attn == "both" else [args.attn]
    for mode in modes:
        if time.perf_counter() - t_begin > args.budget:
            print(f"{mode}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
            continue
        try:
            tw = time.perf_counter()
            for i in range(args.warmup):
                step(i, mode)
            torch.cuda.synchronize()
            warm_s = time.perf_counter() - tw
            torch.cuda.reset_peak_memory_stats(dev)
            flops, losses = 0.0, []
            t0 = time.perf_counter()
            for i in range(args.iters):
                l, f = step(args.warmup + i, mode)
                losses.append(l)
                flops += f
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / args.iters
            tf = flops / args.iters / dt / 1e12
            print(f"{mode}: warm-up {warm_s:.1f} s; loss {losses[0].item():.4f} -> {losses[-1].item():.4f}; "
                  f"peak memory {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB; "
                  f"model FLOPs/step {flops / args.iters / 1e12:.2f} T", flush=True)
            print(f"RESULT torch_{mode}_step_ms {dt * 1e3:.2f}")
            print(f"RESULT torch_{mode}_tokens_per_s {T / dt:.0f}")
            print(f"RESULT torch_{mode}_tflops {tf:.1f}")
            print(f"RESULT torch_{mode}_mfu {tf / PEAK_TFLOPS:.3f}", flush=True)
        except Exception as e:  # report and go on to the next variant
            print(f"{mode}: failed: {type(e).__name__}: {str(e)[:500]}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
