#!/usr/bin/env python3
"""parity_drafter_torch.py: the PyTorch side of tests/test_drafter_cuda_torch.c: one DFlash drafter
training step at a realistic shape, for the CUDA drafter to be compared against.

Builds a random drafter (default: hidden 1024, 2 layers, 16/8 heads x 128, intermediate 3072,
vocabulary 32000, 5 captured target layers), a packed batch of three sequences (3072, 2048 and
1008 tokens, prompts without loss, a hole in the loss mask), 512 anchors per sequence (block 16)
drawn here and written out explicitly, and random target hidden states. Every weight, the frozen
embedding / LM head and the features are bf16 values, so both sides start from identical numbers.

The step follows the published DFlash drafter (as tools/golden_drafter.py): keys/values =
[k_proj(hidden_norm(fc(target_hidden))) ; k_proj(block)], queries = the blocks, q/k RMSNorm, RoPE
at positions relative to the sequence start, SwiGLU, final norm, LM head, cross entropy at the
same position weighted by exp(-(k-1)/gamma) and the loss mask, loss = sum(w*CE)/sum(w). A block
sees the context strictly before its anchor in its own sequence and its own block.

It is run twice on the GPU: as a PyTorch trainer would in bf16 (fp32 master weights under bf16
autocast, norms and RoPE in fp32 rounded to bf16, SDPA in bf16, the LM head from bf16 operands with
fp32 logits) -- the reference of the acceptance bounds -- and in fp32 (TF32 off) for context.

    python3 tools/parity_drafter_torch.py --out DIR
writes DIR/ckpt/{config.json,model.safetensors} (a drafter checkpoint, bf16, as model/checkpoint.c
reads it), DIR/inputs.safetensors (tokens, loss_mask, cu_seqlens, anchors, anchor_seq, hidden,
embed, lm_head, gamma) and DIR/reference.safetensors (loss_bf16, loss_fp32, weight_sum, and
grad_bf16.<name>, grad_fp32.<name> of the normalised loss, fp32).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F


def param_shapes(c):
    H, qd = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    kvd, I, hd = c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"], c["head_dim"]
    shapes = [("fc.weight", (H, len(c["target_layer_ids"]) * H)), ("hidden_norm.weight", (H,))]
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes += [(p + "input_layernorm.weight", (H,)),
                   (p + "self_attn.q_proj.weight", (qd, H)),
                   (p + "self_attn.k_proj.weight", (kvd, H)),
                   (p + "self_attn.v_proj.weight", (kvd, H)),
                   (p + "self_attn.q_norm.weight", (hd,)),
                   (p + "self_attn.k_norm.weight", (hd,)),
                   (p + "self_attn.o_proj.weight", (H, qd)),
                   (p + "post_attention_layernorm.weight", (H,)),
                   (p + "mlp.gate_proj.weight", (I, H)),
                   (p + "mlp.up_proj.weight", (I, H)),
                   (p + "mlp.down_proj.weight", (H, I))]
    shapes.append(("norm.weight", (H,)))
    return shapes


def bf16_values(t):
    """fp32 tensor holding exactly the bf16 rounding of t."""
    return t.to(torch.bfloat16).float()


def make_problem(c, seq_lens, num_anchors, seed):
    g = torch.Generator().manual_seed(seed)
    V, H, Lc = c["vocab_size"], c["hidden_size"], len(c["target_layer_ids"])
    T = sum(seq_lens)
    tokens = torch.randint(0, V - 1, (T,), generator=g)             # never the mask id (V - 1)
    mask = torch.ones(T, dtype=torch.uint8)
    cu = [0]
    for n in seq_lens:
        cu.append(cu[-1] + n)
    for s, n in enumerate(seq_lens):
        s0 = cu[s]
        mask[s0:s0 + max(1, n // 10)] = 0                              # the prompt
        h0 = s0 + n // 2
        mask[h0:h0 + 7] = 0                                            # a hole in the answer
    anchors, anchor_seq = [], []
    for s, n in enumerate(seq_lens):
        s0 = cu[s]
        rel = torch.arange(n - 1)
        cand = rel[(mask[s0:s0 + n - 1] != 0) & (mask[s0 + 1:s0 + n] != 0)]
        pick = cand[torch.randperm(len(cand), generator=g)[:num_anchors]].sort().values
        anchors += (pick + s0).tolist()
        anchor_seq += [s] * len(pick)
    hidden = torch.randn(T, Lc * H, generator=g).to(torch.bfloat16)
    embed = bf16_values(torch.randn(V, H, generator=g))
    lm_head = bf16_values(0.05 * torch.randn(V, H, generator=g))
    params = {}
    for name, shape in param_shapes(c):
        if len(shape) == 1:
            params[name] = bf16_values(1.0 + 0.1 * torch.randn(shape, generator=g))
        else:
            params[name] = bf16_values(c["initializer_range"] * torch.randn(shape, generator=g))
    return dict(tokens=tokens, mask=mask, cu=cu, anchors=torch.tensor(anchors), anchor_seq=torch.tensor(anchor_seq),
                hidden=hidden, embed=embed, lm_head=lm_head, params=params, seq_lens=seq_lens)


def rope_tables(pos, hd, theta, dev):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.int64).float() / hd))
    f = pos.float()[:, None] * inv_freq[None]
    e = torch.cat([f, f], dim=-1)
    return e.cos(), e.sin()


def step(c, pb, P, dev, bf16):
    """Loss sum(w*CE)/sum(w) of the batch and its metrics; the caller runs backward."""
    eps, hd, bs, V = c["rms_norm_eps"], c["head_dim"], c["block_size"], c["vocab_size"]
    nh, nkv, gamma = c["num_attention_heads"], c["num_key_value_heads"], c["gamma"]
    act = torch.bfloat16 if bf16 else torch.float32

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(act)

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        xf = x.float()
        rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos[:, None] + rot * sin[:, None]).to(act)

    tokens, mask = pb["tokens"].to(dev), pb["mask"].to(dev)
    anchors, aseq = pb["anchors"].to(dev), pb["anchor_seq"].to(dev)
    cu = torch.tensor(pb["cu"], device=dev)
    T, nb = tokens.numel(), anchors.numel()
    Q = nb * bs
    start = cu[aseq]                                  # first token of each block's sequence
    end = cu[aseq + 1]
    k = torch.arange(bs, device=dev)
    # block inputs, positions, labels and weights
    blk_tok = torch.full((nb, bs), c["mask_token_id"], device=dev, dtype=torch.long)
    blk_tok[:, 0] = tokens[anchors]
    lab_idx = anchors[:, None] + k[None, :]
    inside = lab_idx < end[:, None]
    lab_c = lab_idx.clamp(max=T - 1)
    labels = tokens[lab_c]
    decay = torch.exp(-(k - 1).clamp(min=0).double() / gamma).float()
    decay[0] = 0
    w = decay[None, :] * (inside & (mask[lab_c] != 0)).float()
    pos_q = ((anchors - start)[:, None] + k[None, :]).flatten()
    tok_seq = torch.repeat_interleave(torch.arange(len(pb["seq_lens"]), device=dev),
                                      torch.tensor(pb["seq_lens"], device=dev))
    pos_c = torch.arange(T, device=dev) - cu[tok_seq]
    cos_q, sin_q = rope_tables(pos_q, hd, c["rope_theta"], dev)
    cos_c, sin_c = rope_tables(pos_c, hd, c["rope_theta"], dev)
    # per sequence: its queries (rows of its blocks) see its context before the anchor + own block
    seqs = []
    for s in range(len(pb["seq_lens"])):
        sel = torch.nonzero(pb["anchor_seq"] == s).flatten()
        if len(sel) == 0:
            continue
        b0, b1 = int(sel[0]), int(sel[-1]) + 1
        s0, s1 = pb["cu"][s], pb["cu"][s + 1]
        n, qn = s1 - s0, (b1 - b0) * bs
        rel = (anchors[b0:b1] - s0).repeat_interleave(bs)               # [qn]
        ctx_ok = torch.arange(n, device=dev)[None, :] < rel[:, None]
        qb = torch.arange(qn, device=dev) // bs
        own = qb[:, None] == qb[None, :]
        seqs.append((b0 * bs, b1 * bs, s0, s1, torch.cat([ctx_ok, own], dim=1)))

    from torch.nn.attention import SDPBackend, sdpa_kernel
    ac = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)
    # memory-efficient attention (any mask, bf16 and fp32); the math kernel only where it cannot run
    with ac, sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        hid = pb["hidden"].to(dev)
        hid = hid if bf16 else hid.float()
        ctx = rms(F.linear(hid, P["fc.weight"]), P["hidden_norm.weight"])
        x = pb["embed"].to(dev)[blk_tok.flatten()].to(act)
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            h = rms(x, P[p + "input_layernorm.weight"])
            q = F.linear(h, P[p + "self_attn.q_proj.weight"]).view(Q, nh, hd)
            kc = F.linear(ctx, P[p + "self_attn.k_proj.weight"]).view(T, nkv, hd)
            vc = F.linear(ctx, P[p + "self_attn.v_proj.weight"]).view(T, nkv, hd)
            kb = F.linear(h, P[p + "self_attn.k_proj.weight"]).view(Q, nkv, hd)
            vb = F.linear(h, P[p + "self_attn.v_proj.weight"]).view(Q, nkv, hd)
            q = rope(rms(q, P[p + "self_attn.q_norm.weight"]), cos_q, sin_q)
            kc = rope(rms(kc, P[p + "self_attn.k_norm.weight"]), cos_c, sin_c)
            kb = rope(rms(kb, P[p + "self_attn.k_norm.weight"]), cos_q, sin_q)
            vc, vb = vc.to(act), vb.to(act)
            outs = []
            for q0, q1, s0, s1, allowed in seqs:
                qs = q[q0:q1].transpose(0, 1)[None]
                ks = torch.cat([kc[s0:s1], kb[q0:q1]]).transpose(0, 1)[None]
                vs = torch.cat([vc[s0:s1], vb[q0:q1]]).transpose(0, 1)[None]
                rep = nh // nkv
                o = F.scaled_dot_product_attention(qs, ks.repeat_interleave(rep, dim=1),
                                                   vs.repeat_interleave(rep, dim=1), attn_mask=allowed[None, None])
                outs.append(o[0].transpose(0, 1).reshape(q1 - q0, nh * hd))
            o = torch.cat(outs)
            x = x + F.linear(o, P[p + "self_attn.o_proj.weight"])
            h2 = rms(x, P[p + "post_attention_layernorm.weight"])
            x = x + F.linear(F.silu(F.linear(h2, P[p + "mlp.gate_proj.weight"])) *
                             F.linear(h2, P[p + "mlp.up_proj.weight"]), P[p + "mlp.down_proj.weight"])
        xf = rms(x, P["norm.weight"])
    wf = w.flatten()
    sel = wf > 0
    # the LM head from the (bf16) final states and bf16 head, fp32 logits and cross entropy
    logits = xf[sel].float() @ pb["lm_head"].to(dev).T
    ce = F.cross_entropy(logits, labels.flatten()[sel], reduction="none")
    loss_sum = (ce * wf[sel]).sum()
    correct = (logits.argmax(-1) == labels.flatten()[sel]).sum()
    return loss_sum / wf.sum(), dict(weight_sum=wf.sum().item(), supervised=int(sel.sum()),
                                     correct=int(correct), blocks=nb, tokens=T)


def run(c, pb, dev, bf16):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    P = {k: v.to(dev).clone().requires_grad_(True) for k, v in pb["params"].items()}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    loss, m = step(c, pb, P, dev, bf16)
    loss.backward()
    torch.cuda.synchronize()
    m["seconds"] = time.perf_counter() - t0
    m["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    grads = {k: P[k].grad.detach().float().cpu() for k in P}
    return loss.item(), grads, m


# ---- safetensors writer (JSON header, raw little-endian data) ----

def save_safetensors(path, tensors, metadata):
    names = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.int32: "I32",
             torch.uint8: "U8"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        data = raw.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def config_json(c):
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
        "block_size": c["block_size"],
        "dflash_config": {"mask_token_id": c["mask_token_id"], "target_layer_ids": c["target_layer_ids"]},
        "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["hidden_size"],
        "initializer_range": c["initializer_range"], "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "num_attention_heads": c["num_attention_heads"], "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"], "num_target_layers": c["num_target_layers"],
        "rms_norm_eps": c["rms_norm_eps"], "rope_theta": c["rope_theta"], "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": c["vocab_size"],
    }


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return (a @ b / (a.norm() * b.norm())).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seqs", default="3072,2048,1008", help="sequence lengths of the packed batch")
    ap.add_argument("--anchors", type=int, default=512, help="per sequence")
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    c = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
             num_key_value_heads=args.kv_heads, head_dim=args.head_dim, intermediate_size=args.intermediate,
             vocab_size=args.vocab, num_target_layers=36, target_layer_ids=[1, 9, 17, 25, 33], block_size=16,
             mask_token_id=args.vocab - 1, rms_norm_eps=1e-6, rope_theta=1e6, initializer_range=0.02,
             max_position_embeddings=40960, gamma=7.0)
    seq_lens = [int(s) for s in args.seqs.split(",")]
    pb = make_problem(c, seq_lens, args.anchors, args.seed)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev)}: hidden {c['hidden_size']}, "
          f"{c['num_hidden_layers']} layers, {c['num_attention_heads']}/{c['num_key_value_heads']} heads x "
          f"{c['head_dim']}, intermediate {c['intermediate_size']}, vocab {c['vocab_size']}; sequences {seq_lens}, "
          f"{len(pb['anchors'])} blocks of {c['block_size']}", flush=True)

    l16, g16, m16 = run(c, pb, dev, True)
    l32, g32, m32 = run(c, pb, dev, False)
    print(f"bf16: loss {l16:.6f}  ({m16['seconds']:.2f} s, peak {m16['peak_gib']:.1f} GiB); weight_sum "
          f"{m16['weight_sum']:.3f} supervised {m16['supervised']} correct {m16['correct']}")
    print(f"fp32: loss {l32:.6f}  ({m32['seconds']:.2f} s); bf16 vs fp32: loss rel "
          f"{abs(l16 - l32) / abs(l32):.2e}, worst gradient cosine "
          f"{min(cosine(g16[k], g32[k]) for k in g32):.6f}", flush=True)

    os.makedirs(os.path.join(args.out, "ckpt"), exist_ok=True)
    with open(os.path.join(args.out, "ckpt", "config.json"), "w") as f:
        json.dump(config_json(c), f, indent=2)
    save_safetensors(os.path.join(args.out, "ckpt", "model.safetensors"),
                     {k: v.to(torch.bfloat16) for k, v in pb["params"].items()}, {"format": "pt"})
    T = len(pb["tokens"])
    save_safetensors(os.path.join(args.out, "inputs.safetensors"), {
        "tokens": pb["tokens"].to(torch.int32), "loss_mask": pb["mask"],
        "cu_seqlens": torch.tensor(pb["cu"], dtype=torch.int32),
        "anchors": pb["anchors"].to(torch.int32), "anchor_seq": pb["anchor_seq"].to(torch.int32),
        "hidden": pb["hidden"].view(T, -1), "embed": pb["embed"].to(torch.bfloat16),
        "lm_head": pb["lm_head"].to(torch.bfloat16), "gamma": torch.tensor([c["gamma"]], dtype=torch.float64),
    }, {"torch": torch.__version__})
    ref = {"loss_bf16": torch.tensor([l16], dtype=torch.float64), "loss_fp32": torch.tensor([l32], dtype=torch.float64),
           "weight_sum": torch.tensor([m16["weight_sum"]], dtype=torch.float64)}
    ref.update({"grad_bf16." + k: v for k, v in g16.items()})
    ref.update({"grad_fp32." + k: v for k, v in g32.items()})
    save_safetensors(os.path.join(args.out, "reference.safetensors"), ref, {"torch": torch.__version__})
    print("wrote", args.out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
