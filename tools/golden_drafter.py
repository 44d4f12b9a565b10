#!/usr/bin/env python3
"""golden_drafter.py: PyTorch reference of the DFlash drafter objective for tests/test_drafter_golden.c.

Builds a tiny drafter the way the published DFlash model code does (Qwen3 layers; keys/values =
[k_proj(hidden_norm(fc(target_hidden))) ; k_proj(block)], queries = block; RoPE at absolute
positions), runs the reference training objective on a padded batch of three sequences with FIXED
anchors (same-position labels, slot 0 excluded, loss-mask and exp(-(k-1)/gamma) weights, a block
sees context strictly before its anchor and its own block only), and saves inputs, loss, accuracy,
accepted length and every parameter gradient.

The golden numbers are computed in float64 on the CPU; the same model in float32 and, when
transformers is importable, a second build from transformers' Qwen3 modules (as the published
model file imports them) are run as cross-checks and their deviations printed.

    python3 tools/golden_drafter.py --out DIR      # writes DIR/inputs.safetensors, DIR/golden.safetensors

rms_norm_eps is 1e-3, larger than a real model's, so that a norm that drops or misplaces it moves
the loss and gradients well past the tests' tolerances (at 1e-6 it was below float32 rounding).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

CFG = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=16, intermediate_size=80, vocab_size=97, num_target_layers=8,
           target_layer_ids=[1, 3, 5], block_size=4, mask_token_id=96, rms_norm_eps=1e-3,
           rope_theta=10000.0, gamma=7.0)
SEQ_LENS = [13, 10, 9]
PROMPT = [3, 0, 4]            # loss mask 0 on the first PROMPT[s] tokens of sequence s
HOLES = [(0, 8)]              # (seq, pos) with loss mask 0 inside the answer
ANCHORS = [[3, 6, 11], [0, 4, 8], [4, 5, 7]]   # per sequence, relative positions
PAD_ID = 0


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


def make_inputs(c):
    g = torch.Generator().manual_seed(20240611)
    V, H, Lc = c["vocab_size"], c["hidden_size"], len(c["target_layer_ids"])
    tokens, mask = [], []
    for s, n in enumerate(SEQ_LENS):
        tokens.append(torch.randint(0, V - 1, (n,), generator=g))
        m = torch.ones(n, dtype=torch.uint8)
        m[:PROMPT[s]] = 0
        for hs, hp in HOLES:
            if hs == s:
                m[hp] = 0
        mask.append(m)
    T = sum(SEQ_LENS)
    hidden = torch.randn(T, Lc * H, generator=g, dtype=torch.float64).float()
    embed = torch.randn(V, H, generator=g, dtype=torch.float64).float()
    lm_head = (0.3 * torch.randn(V, H, generator=g, dtype=torch.float64)).float()
    params = {}
    for name, shape in param_shapes(c):
        if len(shape) == 1:
            params[name] = (1.0 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)).float()
        else:
            params[name] = (0.25 * torch.randn(shape, generator=g, dtype=torch.float64)).float()
    for s, anchors in enumerate(ANCHORS):
        for a in anchors:
            assert mask[s][a] and mask[s][a + 1], f"anchor {a} of sequence {s} is not a candidate"
    return tokens, mask, hidden, embed, lm_head, params


# ---- the drafter, plain torch, structured as the published DFlashDraftModel ----

def rmsnorm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(position_ids, hd, theta, dtype):
    # transformers' default rope: inv_freq and angles in fp32
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def draft_forward(P, c, noise_embedding, target_hidden, position_ids, attn_bias):
    """noise_embedding [B, Q, H]; target_hidden [B, S, Lc*H]; position_ids [B, S+Q];
    attn_bias [B, 1, Q, S+Q] additive."""
    eps, hd = c["rms_norm_eps"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    B, q_len, _ = noise_embedding.shape
    ctx_len = target_hidden.shape[1]
    th = rmsnorm(target_hidden @ P["fc.weight"].T, P["hidden_norm.weight"], eps)
    cos, sin = rope_cos_sin(position_ids, hd, c["rope_theta"], noise_embedding.dtype)
    cos, sin = cos[:, None], sin[:, None]
    x = noise_embedding
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        residual = x
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, q_len, nh, hd)
        q = rmsnorm(q, P[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k_ctx = th @ P[p + "self_attn.k_proj.weight"].T
        k_noise = h @ P[p + "self_attn.k_proj.weight"].T
        v_ctx = th @ P[p + "self_attn.v_proj.weight"].T
        v_noise = h @ P[p + "self_attn.v_proj.weight"].T
        k = torch.cat([k_ctx, k_noise], dim=1).view(B, ctx_len + q_len, nkv, hd)
        v = torch.cat([v_ctx, v_noise], dim=1).view(B, ctx_len + q_len, nkv, hd)
        k = rmsnorm(k, P[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        w = (q @ k.transpose(2, 3)) * hd ** -0.5 + attn_bias
        w = torch.softmax(w, dim=-1)
        o = (w @ v).transpose(1, 2).reshape(B, q_len, nh * hd)
        x = residual + o @ P[p + "self_attn.o_proj.weight"].T
        residual = x
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        g_ = h @ P[p + "mlp.gate_proj.weight"].T
        u = h @ P[p + "mlp.up_proj.weight"].T
        x = residual + (F.silu(g_) * u) @ P[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, P["norm.weight"], eps)


# ---- the same drafter from transformers' Qwen3 modules, as the published model file builds it ----

def build_hf_forward(c, P):
    from transformers import Qwen3Config
    from transformers.models.qwen3 import modeling_qwen3 as mq
    kw = dict(hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
              num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
              head_dim=c["head_dim"], intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
              rms_norm_eps=c["rms_norm_eps"], hidden_act="silu", attention_bias=False,
              max_position_embeddings=4096)
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]}, **kw)
    except TypeError:
        cfg = Qwen3Config(rope_theta=c["rope_theta"], **kw)
    cfg._attn_implementation = "eager"
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]

    # The modules use the tensors of P themselves (not copies), so the gradients land in P.
    def lin(w):
        m = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        del m.weight
        m.weight = w
        return m

    def norm(w):
        m = mq.Qwen3RMSNorm(w.shape[0], eps=eps)
        del m.weight
        m.weight = w
        return m

    class Attn(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}.self_attn."
            self.q_proj, self.k_proj = lin(P[p + "q_proj.weight"]), lin(P[p + "k_proj.weight"])
            self.v_proj, self.o_proj = lin(P[p + "v_proj.weight"]), lin(P[p + "o_proj.weight"])
            self.q_norm, self.k_norm = norm(P[p + "q_norm.weight"]), norm(P[p + "k_norm.weight"])
            self.head_dim, self.num_key_value_groups = hd, nh // nkv
            self.scaling, self.config, self.is_causal = hd ** -0.5, cfg, False

        def forward(self, hidden_states, target_hidden, position_embeddings, attention_mask):
            bsz, q_len = hidden_states.shape[:-1]
            ctx_len = target_hidden.shape[1]
            q = self.q_norm(self.q_proj(hidden_states).view(bsz, q_len, -1, hd)).transpose(1, 2)
            k = torch.cat([self.k_proj(target_hidden), self.k_proj(hidden_states)], dim=1)
            v = torch.cat([self.v_proj(target_hidden), self.v_proj(hidden_states)], dim=1)
            k = self.k_norm(k.view(bsz, ctx_len + q_len, -1, hd)).transpose(1, 2)
            v = v.view(bsz, ctx_len + q_len, -1, hd).transpose(1, 2)
            cos, sin = position_embeddings
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q = q * cos[..., -q_len:, :] + mq.rotate_half(q) * sin[..., -q_len:, :]
            k = k * cos + mq.rotate_half(k) * sin
            out, _ = mq.eager_attention_forward(self, q, k, v, attention_mask, dropout=0.0,
                                                scaling=self.scaling)
            return self.o_proj(out.reshape(bsz, q_len, -1))

    class Layer(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}."
            self.self_attn = Attn(i)
            self.mlp = mq.Qwen3MLP(cfg)
            self.mlp.gate_proj, self.mlp.up_proj = lin(P[p + "mlp.gate_proj.weight"]), lin(P[p + "mlp.up_proj.weight"])
            self.mlp.down_proj = lin(P[p + "mlp.down_proj.weight"])
            self.input_layernorm = norm(P[p + "input_layernorm.weight"])
            self.post_attention_layernorm = norm(P[p + "post_attention_layernorm.weight"])

        def forward(self, target_hidden, hidden_states, attention_mask, position_embeddings):
            residual = hidden_states
            h = self.self_attn(self.input_layernorm(hidden_states), target_hidden, position_embeddings,
                               attention_mask)
            hidden_states = residual + h
            return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

    layers = [Layer(i) for i in range(c["num_hidden_layers"])]
    fc, hidden_norm, final_norm = lin(P["fc.weight"]), norm(P["hidden_norm.weight"]), norm(P["norm.weight"])
    rotary = mq.Qwen3RotaryEmbedding(config=cfg)
    want = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if not torch.allclose(rotary.inv_freq.float(), want):
        raise ValueError("Qwen3RotaryEmbedding did not take rope_theta from the config")

    def forward(noise_embedding, target_hidden, position_ids, attn_bias):
        th = hidden_norm(fc(target_hidden))
        pe = rotary(noise_embedding, position_ids)
        x = noise_embedding
        for layer in layers:
            x = layer(th, x, attn_bias, pe)
        return final_norm(x)
    return forward


# ---- the reference objective on a padded batch (B sequences, S positions) ----

def objective(c, forward, tokens, mask, hidden, embed, lm_head, dtype):
    bs, gamma, V = c["block_size"], c["gamma"], c["vocab_size"]
    B, S, N = len(SEQ_LENS), max(SEQ_LENS), max(len(a) for a in ANCHORS)
    Lc, H = len(c["target_layer_ids"]), c["hidden_size"]
    input_ids = torch.full((B, S), PAD_ID, dtype=torch.long)
    loss_mask = torch.zeros(B, S, dtype=dtype)
    target_hidden = torch.zeros(B, S, Lc * H, dtype=dtype)
    anchors = torch.zeros(B, N, dtype=torch.long)
    keep = torch.zeros(B, N, dtype=torch.bool)
    off = 0
    for s, n in enumerate(SEQ_LENS):
        input_ids[s, :n] = tokens[s]
        loss_mask[s, :n] = mask[s].to(dtype)
        target_hidden[s, :n] = hidden[off:off + n].to(dtype)
        off += n
        anchors[s, :len(ANCHORS[s])] = torch.tensor(ANCHORS[s])
        keep[s, :len(ANCHORS[s])] = True
    # block input: [anchor token, MASK x (bs-1)]
    noise_ids = torch.full((B, N * bs), c["mask_token_id"], dtype=torch.long)
    starts = torch.arange(N) * bs
    anchor_tok = torch.gather(input_ids, 1, anchors)
    for b in range(B):
        noise_ids[b, starts] = torch.where(keep[b], anchor_tok[b], torch.tensor(c["mask_token_id"]))
    noise_embedding = embed.to(dtype)[noise_ids]
    # positions: context 0..S-1, block slots anchor..anchor+bs-1
    ctx_pos = torch.arange(S).unsqueeze(0).expand(B, -1)
    draft_pos = (anchors.unsqueeze(-1) + torch.arange(bs).view(1, 1, -1)).view(B, -1)
    position_ids = torch.cat([ctx_pos, draft_pos], dim=1)
    # mask: context kv < anchor; same block; valid blocks only
    Q, KV = N * bs, S + N * bs
    qi = torch.arange(Q).view(1, 1, -1, 1)
    kv = torch.arange(KV).view(1, 1, 1, -1)
    anchor_exp = anchors.view(B, 1, N, 1).repeat_interleave(bs, dim=2)
    mask_ctx = (kv < S) & (kv < anchor_exp)
    mask_draft = (kv >= S) & ((qi // bs) == ((kv - S) // bs))
    valid = keep.view(B, 1, N, 1).repeat_interleave(bs, dim=2)
    allowed = (mask_ctx | mask_draft) & valid
    attn_bias = torch.zeros(B, 1, Q, KV, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)

    out = forward(noise_embedding, target_hidden, position_ids, attn_bias)
    logits = out @ lm_head.to(dtype).T
    # labels: slot k predicts input_ids[anchor + k] (same position, no shift)
    label_idx = anchors.unsqueeze(-1) + torch.arange(bs).view(1, 1, -1)
    valid_label = label_idx < S
    safe = label_idx.clamp(max=S - 1)
    target_ids = torch.gather(input_ids.unsqueeze(1).expand(-1, N, -1), 2, safe)
    weight_mask = keep.unsqueeze(-1).expand(-1, -1, bs).to(dtype) * valid_label.to(dtype)
    weight_mask = weight_mask * (torch.arange(bs).view(1, 1, -1) > 0).to(dtype)
    weight_mask = weight_mask * torch.gather(loss_mask.unsqueeze(1).expand(-1, N, -1), 2, safe)
    k = torch.arange(bs).view(1, 1, -1)
    decay = torch.exp(-(k - 1).clamp(min=0).to(dtype) / gamma)
    w = weight_mask * decay
    ce = F.cross_entropy(logits.reshape(-1, V), target_ids.reshape(-1), reduction="none").view(B, N, bs)
    loss = (ce * w).sum() / w.sum()
    pred = logits.argmax(-1).view(B, N, bs)
    correct = ((pred == target_ids) & (weight_mask > 0.5)).sum().to(dtype)
    accuracy = correct / weight_mask.sum()
    sup = weight_mask[:, :, 1:] > 0.5
    alive = ((pred == target_ids)[:, :, 1:] & sup).to(dtype)
    block_valid = sup.any(-1).to(dtype)
    accept = ((1.0 + alive.cumprod(-1).sum(-1)) * block_valid).sum() / block_valid.sum()
    block_loss = (ce * w).sum(-1)[keep]          # by sequence, anchors ascending = packed order
    return loss, accuracy, accept, w.sum(), weight_mask.sum(), block_loss, pred


def plant_hits(c, tokens, mask, hidden, embed, lm_head, params):
    """Make some labels equal to the model's own predictions, so accuracy and the accepted
    length are not trivially 0 / 1. Only positions that are no block's input (not an anchor) are
    changed: the forward does not read them, so the predictions stay what they were."""
    P = {k: v.double() for k, v in params.items()}
    with torch.no_grad():
        pred = objective(c, lambda *a: draft_forward(P, c, *a), tokens, mask, hidden, embed, lm_head,
                         torch.float64)[-1]
    for s, anchors in enumerate(ANCHORS):
        for j, a in enumerate(anchors):
            for k in range(1, c["block_size"]):
                pos = a + k
                if pos < SEQ_LENS[s] and pos not in anchors and (j + k) % 3 != 0:
                    tokens[s][pos] = pred[s, j, k]


def run(c, tokens, mask, hidden, embed, lm_head, params, dtype, hf=False):
    P = {k: v.to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    if hf:
        fwd = build_hf_forward(c, P)
    else:
        def fwd(*a):
            return draft_forward(P, c, *a)
    loss, acc, accept, wsum, sup, block_loss, _ = objective(c, fwd, tokens, mask, hidden, embed, lm_head, dtype)
    loss.backward()
    grads = {k: P[k].grad.detach().clone() for k in P}
    return dict(loss=loss.item(), accuracy=acc.item(), accept_len=accept.item(), weight_sum=wsum.item(),
                supervised=sup.item(), block_loss=block_loss.detach(), grads=grads)


# ---- safetensors writer (the format is a JSON header and raw little-endian data) ----

def save_safetensors(path, tensors, metadata):
    names = {torch.float64: "F64", torch.float32: "F32", torch.int32: "I32", torch.uint8: "U8"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()
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


def max_rel(a, b):
    return max(((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max()).item() for k in b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rms-norm-eps", type=float, default=CFG["rms_norm_eps"],
                    help="another eps (e.g. 0, to see how far a norm without it lands from the golden)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    c = dict(CFG, rms_norm_eps=args.rms_norm_eps)
    print(f"torch {torch.__version__}")
    tokens, mask, hidden, embed, lm_head, params = make_inputs(c)
    plant_hits(c, tokens, mask, hidden, embed, lm_head, params)

    ref = run(c, tokens, mask, hidden, embed, lm_head, params, torch.float64)
    f32 = run(c, tokens, mask, hidden, embed, lm_head, params, torch.float32)
    print(f"fp64: loss {ref['loss']:.12f} acc {ref['accuracy']:.6f} accept {ref['accept_len']:.6f} "
          f"wsum {ref['weight_sum']:.6f} supervised {ref['supervised']:.0f}")
    print(f"fp32 vs fp64: loss rel {abs(f32['loss'] - ref['loss']) / abs(ref['loss']):.3e}, "
          f"grads max rel {max_rel(f32['grads'], ref['grads']):.3e}")
    T = sum(SEQ_LENS)
    cu = [0]
    for n in SEQ_LENS:
        cu.append(cu[-1] + n)
    anchors = [cu[s] + a for s in range(len(ANCHORS)) for a in ANCHORS[s]]
    anchor_seq = [s for s in range(len(ANCHORS)) for _ in ANCHORS[s]]
    cfg_meta = dict(c)
    inputs = {
        "tokens": torch.cat(tokens).to(torch.int32),
        "loss_mask": torch.cat(mask).to(torch.uint8),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "anchors": torch.tensor(anchors, dtype=torch.int32),
        "anchor_seq": torch.tensor(anchor_seq, dtype=torch.int32),
        "hidden": hidden.view(T, -1),
        "embed": embed,
        "lm_head": lm_head,
    }
    inputs.update({k: v for k, v in params.items()})
    save_safetensors(os.path.join(args.out, "inputs.safetensors"), inputs,
                     {"config": json.dumps(cfg_meta), "torch": torch.__version__})
    gold = {
        "loss": torch.tensor([ref["loss"]], dtype=torch.float64),
        "accuracy": torch.tensor([ref["accuracy"]], dtype=torch.float64),
        "accept_len": torch.tensor([ref["accept_len"]], dtype=torch.float64),
        "weight_sum": torch.tensor([ref["weight_sum"]], dtype=torch.float64),
        "supervised": torch.tensor([ref["supervised"]], dtype=torch.float64),
        "block_loss": ref["block_loss"].to(torch.float64),
        "loss_fp32": torch.tensor([f32["loss"]], dtype=torch.float64),
    }
    gold.update({"grad." + k: v.to(torch.float64) for k, v in ref["grads"].items()})
    save_safetensors(os.path.join(args.out, "golden.safetensors"), gold,
                     {"torch": torch.__version__, "dtype": "float64"})
    print("wrote", os.path.join(args.out, "inputs.safetensors"), os.path.join(args.out, "golden.safetensors"))
    hf_note = "not run"
    status = 0
    try:
        import transformers
        hf = run(c, tokens, mask, hidden, embed, lm_head, params, torch.float32, hf=True)
        lrel = abs(hf["loss"] - f32["loss"]) / abs(f32["loss"])
        grel = max_rel(hf["grads"], f32["grads"])
        hf_note = (f"transformers {transformers.__version__} Qwen3 modules vs plain (fp32): "
                   f"loss rel {lrel:.3e}, grads max rel {grel:.3e}")
        print(hf_note)
        if lrel > 1e-5 or grel > 1e-4:
            print("ERROR: the transformers-module build disagrees with the plain build")
            status = 1
    except ImportError as e:
        hf_note = f"transformers not importable: {e}"
        print(hf_note)
    except Exception:
        import traceback
        traceback.print_exc()
        print("ERROR: the transformers-module build failed to run")
        status = 1
    with open(os.path.join(args.out, "cross_check.txt"), "w") as f:
        f.write(hf_note + "\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
