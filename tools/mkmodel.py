#!/usr/bin/env python3
"""mkmodel.py: writes a tiny random Qwen3ForCausalLM target model (config.json +
model.safetensors, bf16) in the Hugging Face layout, with the Python standard library only.

Used by `make demo` and the cluster tests: the CPU backend runs it in milliseconds. The
weights are N(0, std) like transformers' init (norms 1), so the hidden states mostly carry
the token embeddings through the layers and a drafter has something real to learn.
"""
import argparse
import json
import os
import random
import struct
import sys


def bf16_bytes(values):
    """float list -> little-endian bf16 bytes (round to nearest even)."""
    raw = struct.pack("<%df" % len(values), *values)
    words = struct.unpack("<%dI" % len(values), raw)
    out = bytearray(2 * len(values))
    for i, w in enumerate(words):
        w = (w + 0x7FFF + ((w >> 16) & 1)) >> 16
        out[2 * i] = w & 0xFF
        out[2 * i + 1] = (w >> 8) & 0xFF
    return bytes(out)


def tensors(cfg, rng, std):
    h, v, ff = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def normal(*shape):
        n = 1
        for s in shape:
            n *= s
        return list(shape), [rng.gauss(0.0, std) for _ in range(n)]

    def ones(n):
        return [n], [1.0] * n

    # The embedding is wider than the rest so tokens stay distinguishable in the states.
    yield "model.embed_tokens.weight", normal(v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        yield p + "input_layernorm.weight", ones(h)
        yield p + "self_attn.q_proj.weight", normal(nh * hd, h)
        yield p + "self_attn.k_proj.weight", normal(nkv * hd, h)
        yield p + "self_attn.v_proj.weight", normal(nkv * hd, h)
        yield p + "self_attn.o_proj.weight", normal(h, nh * hd)
        yield p + "self_attn.q_norm.weight", ones(hd)
        yield p + "self_attn.k_norm.weight", ones(hd)
        yield p + "post_attention_layernorm.weight", ones(h)
        yield p + "mlp.gate_proj.weight", normal(ff, h)
        yield p + "mlp.up_proj.weight", normal(ff, h)
        yield p + "mlp.down_proj.weight", normal(h, ff)
    yield "model.norm.weight", ones(h)
    if not cfg["tie_word_embeddings"]:
        yield "lm_head.weight", normal(v, h)


def write_safetensors(path, items):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (shape, values) in items:
        b = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--max-pos", type=int, default=4096)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--tied", action="store_true", help="tie the LM head to the embedding")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "max_pos"):
        if getattr(a, name) < 1:
            sys.exit("mkmodel: --%s must be at least 1" % name.replace("_", "-"))
    if not a.std > 0:
        sys.exit("mkmodel: --std must be above 0")
    if a.heads % a.kv_heads:
        sys.exit("mkmodel: --heads must be a multiple of --kv-heads")
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": a.tied,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    rng = random.Random(a.seed)
    try:
        os.makedirs(a.outdir, exist_ok=True)
        write_safetensors(os.path.join(a.outdir, "model.safetensors"), tensors(cfg, rng, a.std))
        with open(os.path.join(a.outdir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
    except OSError as e:
        sys.exit("mkmodel: %s: %s" % (e.filename or a.outdir, e.strerror))
    print("mkmodel: %s: Qwen3 %d layers, hidden %d, vocab %d" % (a.outdir, a.layers, a.hidden, a.vocab))


if __name__ == "__main__":
    main()
