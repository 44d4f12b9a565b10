#!/usr/bin/env python3
# golden_target.py: golden data for the target forward, made with PyTorch + transformers.
# Builds tiny random Qwen3 and Llama checkpoints, runs 3 sequences each alone in fp32 with
# output_hidden_states=True, and writes the checkpoints plus every hidden state for the C tests.
#
# Output (--out DIR; --tar FILE packs DIR as golden/ into FILE, one file to copy):
#   qwen3/      config.json (transformers-5 form) + model.safetensors (bf16, tied embeddings)
#   llama/      config.json (transformers-5 form) + 3 fp32 shards + model.safetensors.index.json
#               (GQA, Llama-3 rope scaling, attention and MLP biases, untied LM head)
#   llama-hub/  config.json only: the same model in the hub form (rope_theta / rope_scaling,
#               no head_dim); the C test pairs it with llama/'s weights.
#   golden.safetensors: for each model M and sequence s:
#     M.tokens.s      I32 [len]
#     M.hs.s.k        F32 [len, H]  output_hidden_states[k], k = 0..num_layers
#     M.layer.s.i     F32 [len, H]  raw output of decoder layer i (forward hook)
# Usage: python3 tools/golden_target.py --out /tmp/golden --tar $OUT/golden.tar.gz
# then: tar -xzf golden.tar.gz -C tests/data/
import argparse
import json
import math
import os
import shutil
import sys
import tarfile

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

LENS = [7, 33, 100]
VOCAB = 512


QWEN3_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def qwen3_config():
    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,   # head_dim != hidden/heads
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, use_sliding_window=False,
        rope_parameters=dict(QWEN3_ROPE),
        hidden_act="silu")


LLAMA_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def llama_config():
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2,                 # GQA 4:1, head_dim 8
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attention_bias=True, mlp_bias=True, rope_parameters=dict(LLAMA_ROPE), hidden_act="silu")


def expected_inv_freq(head_dim, rope):
    """inv_freq as transformers computes it (fp32), to check the config was understood."""
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope["rope_type"] == "llama3":
        f, lo, hi, old = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                          rope["original_max_position_embeddings"])
        wl = 2 * math.pi / inv
        out = torch.where(wl > old / lo, inv / f, inv)
        s = (old / wl - lo) / (hi - lo)
        sm = (1 - s) * out / f + s * out
        med = ~(wl < old / hi) * ~(wl > old / lo)
        inv = torch.where(med, sm, out)
    return inv


def randomize(model, gen):
    """Weights big enough that every layer visibly changes the residual stream."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif "embed_tokens" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.1 * r)


def shard(dirpath, n):
    """Split model.safetensors into n shards with an index, the way sharded hub checkpoints look."""
    sd = load_file(os.path.join(dirpath, "model.safetensors"))
    names = sorted(sd)
    per = (len(names) + n - 1) // n
    weight_map, total = {}, 0
    for i in range(n):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        part = {k: sd[k].contiguous() for k in names[i * per:(i + 1) * per]}
        save_file(part, os.path.join(dirpath, fname), metadata={"format": "pt"})
        for k, t in part.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.remove(os.path.join(dirpath, "model.safetensors"))


def hub_form(src_dir, dst_dir):
    """Rewrite a transformers-5 config.json into the hub form: rope_theta + rope_scaling, no head_dim."""
    with open(os.path.join(src_dir, "config.json")) as f:
        d = json.load(f)
    if "rope_parameters" not in d:
        print("WARNING: %s/config.json has no rope_parameters; hub form copied as is" % src_dir)
        rp = {"rope_theta": d.pop("rope_theta", 10000.0)}
        rp.update(d.pop("rope_scaling", None) or {"rope_type": "default"})
    else:
        rp = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rp.pop("rope_theta")
    d["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    d.pop("head_dim", None)
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(dst_dir, "config.json"), "w") as f:
        json.dump(d, f, indent=2)


def run_alone(model, tokens):
    """One sequence alone: all hidden states and each decoder layer's raw output."""
    L = model.config.num_hidden_layers
    raw = [None] * L
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, i=i):
            raw[i] = (out[0] if isinstance(out, (tuple, list)) else out).detach().clone()
        hooks.append(layer.register_forward_hook(hook))
    with torch.no_grad():
        out = model(input_ids=tokens[None], output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    hs = [h[0].float().clone() for h in out.hidden_states]
    assert len(hs) == L + 1, "expected %d hidden states, got %d" % (L + 1, len(hs))
    return hs, [r[0].float().clone() for r in raw]


def check_convention(model, tokens, hs, raw):
    """Report how output_hidden_states relates to the layers (the C side relies on it)."""
    L = len(raw)
    with torch.no_grad():
        emb = model.model.embed_tokens(tokens[None])[0].float()
        normed = model.model.norm(raw[L - 1][None])[0]
    d0 = (hs[0] - emb).abs().max().item()
    dmid = max((hs[i + 1] - raw[i]).abs().max().item() for i in range(L - 1))
    dlast = (hs[L] - normed).abs().max().item()
    dlast_raw = (hs[L] - raw[L - 1]).abs().max().item()
    return d0, dmid, dlast, dlast_raw


def make(kind, outdir, gen, golden, seqs):
    cfg = qwen3_config() if kind == "qwen3" else llama_config()
    cls = Qwen3ForCausalLM if kind == "qwen3" else LlamaForCausalLM
    model = cls(cfg).float().eval()
    randomize(model, gen)
    d = os.path.join(outdir, kind)
    if kind == "qwen3":
        # Stored bf16: round the weights first so the fp32 reference uses the stored values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.bfloat16().float())
        model.to(torch.bfloat16).save_pretrained(d)
    else:
        model.save_pretrained(d)
        shard(d, 3)
        hub_form(d, os.path.join(outdir, "llama-hub"))
    del model

    # The reference runs the checkpoint as loaded back from disk, in fp32, eager attention.
    ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    c = ref.config
    rope = getattr(c, "rope_parameters", None)
    print("%s: transformers %s, config %s, layers %d, hidden %d, heads %d/%d, head_dim %s, rope %s"
          % (kind, transformers.__version__, type(c).__name__, c.num_hidden_layers, c.hidden_size,
             c.num_attention_heads, c.num_key_value_heads, getattr(c, "head_dim", None), rope))
    with open(os.path.join(d, "config.json")) as f:
        print("%s config.json keys: %s" % (kind, sorted(json.load(f).keys())))
    hd = c.head_dim
    want = expected_inv_freq(hd, QWEN3_ROPE if kind == "qwen3" else LLAMA_ROPE)
    got = getattr(getattr(ref.model, "rotary_emb", None), "inv_freq", None)
    if got is None:
        print("%s WARNING: no rotary_emb.inv_freq to check" % kind)
    else:
        err = (got.float().cpu() - want).abs().max().item()
        print("%s inv_freq %s, max diff vs expected %.3g%s" % (
            kind, [float("%.6g" % x) for x in got.float().cpu()], err,
            "" if err <= 1e-6 * want.abs().max().item() else "  WARNING: rope config not understood"))

    for s, tokens in enumerate(seqs):
        hs, raw = run_alone(ref, tokens)
        d0, dmid, dlast, dlast_raw = check_convention(ref, tokens, hs, raw)
        print("%s seq %d len %d: |hs0-emb| %.3g  |hs[i+1]-layer i| %.3g  |hs[L]-norm(layer L-1)| %.3g"
              "  |hs[L]-layer L-1| %.3g  |hs| per k %s"
              % (kind, s, len(tokens), d0, dmid, dlast, dlast_raw,
                 ["%.3f" % h.norm().item() for h in hs]))
        golden["%s.tokens.%d" % (kind, s)] = tokens.to(torch.int32).contiguous()
        for k, h in enumerate(hs):
            golden["%s.hs.%d.%d" % (kind, s, k)] = h.clone()
        for i, r in enumerate(raw):
            golden["%s.layer.%d.%d" % (kind, s, i)] = r.clone()

    if kind == "llama":
        # The hub-form config must load to the same model (transformers reads both forms).
        hubdir = os.path.join(outdir, "llama-hub-check")
        shutil.copytree(d, hubdir)
        shutil.copy(os.path.join(outdir, "llama-hub", "config.json"), os.path.join(hubdir, "config.json"))
        hub = cls.from_pretrained(hubdir, dtype=torch.float32, attn_implementation="eager").eval()
        hs_hub, _ = run_alone(hub, seqs[2])
        diff = max((a - b).abs().max().item() for a, b in zip(hs_hub, golden_hs(golden, kind, 2)))
        print("llama hub-form config: max diff vs transformers-5 form %.3g%s"
              % (diff, "" if diff == 0.0 else "  WARNING: hub form loads differently"))
        shutil.rmtree(hubdir)


def golden_hs(golden, kind, s):
    k = 0
    while "%s.hs.%d.%d" % (kind, s, k) in golden:
        yield golden["%s.hs.%d.%d" % (kind, s, k)]
        k += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tar", help="also pack --out into this .tar.gz (as golden/)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(4)
    gen = torch.Generator().manual_seed(20240611)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENS]
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    golden = {}
    make("qwen3", args.out, gen, golden, seqs)
    make("llama", args.out, gen, golden, seqs)
    save_file(golden, os.path.join(args.out, "golden.safetensors"), metadata={
        "lens": ",".join(map(str, LENS)), "torch": torch.__version__, "transformers": transformers.__version__})
    total = 0
    for root, _, files in os.walk(args.out):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
            print("  %s %d" % (os.path.relpath(os.path.join(root, f), args.out), os.path.getsize(os.path.join(root, f))))
    print("wrote %s (%d bytes)" % (args.out, total))
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as t:
            t.add(args.out, arcname="golden")
        print("packed %s (%d bytes)" % (args.tar, os.path.getsize(args.tar)))


if __name__ == "__main__":
    sys.exit(main())
