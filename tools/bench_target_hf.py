#!/usr/bin/env python3
# bench_target_hf.py: the transformers side of the CUDA target checks, run on a CUDA host.
#
#   parity --out DIR   random Qwen3 of realistic shape (hidden 1024, 24 layers, GQA 16/8, head_dim
#                      128), saved to DIR/model (bf16 safetensors, transformers-5 config); a packed
#                      batch of 4 sequences run one sequence at a time with output_hidden_states in
#                      bf16 and again in fp32 (same weights upcast); DIR/ref.safetensors holds tokens,
#                      cu_seqlens, layer_ids, hs.K (bf16 run) and hs32.K (fp32 run), K = capture index.
#                      tests/test_target_cuda_hf (DFLASH_HF_PARITY_DIR=DIR) compares the C forward.
#   bench --out DIR    random Qwen3-8B-shaped model (bf16) saved to DIR (config.json + shards holding the
#                      embedding, layers 0..max(ids) and the final norm: all the C forward reads),
#                      DIR/batches.txt (packed batches of ~16K tokens from sequences of 512..3072),
#                      then the reference timing (c): transformers forward per sequence with
#                      output_hidden_states=True, the captured layers concatenated and copied into
#                      pinned CPU memory, for all 36 layers and again truncated to max(ids)+1 layers;
#                      each after an untimed pass over every batch (cuBLAS sees every shape first).
#                      Prints "RESULT key value" lines; bench/target_bench measures (a) and (b).
import argparse
import json
import os
import random
import time

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM


def randomize_norms(model, gen_std=0.1):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * gen_std)


def hidden_states(model, tokens, cu, ids):
    """Each sequence alone (batch 1); returns per capture index k a [T, H] fp32 tensor."""
    out = [[] for _ in ids]
    with torch.no_grad():
        for s in range(len(cu) - 1):
            x = tokens[cu[s]:cu[s + 1]][None]
            hs = model.model(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states
            for k, i in enumerate(ids):
                out[k].append(hs[i + 1][0].float().cpu())
    return [torch.cat(o, 0) for o in out]


def parity(args):
    torch.manual_seed(args.seed)
    cfg = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      attention_bias=False, use_sliding_window=False, hidden_act="silu",
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    randomize_norms(model)
    mdir = os.path.join(args.out, "model")
    model.save_pretrained(mdir)
    lens = [700, 1300, 57, 1999]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    tokens = torch.randint(0, cfg.vocab_size, (cu[-1],), device="cuda")
    ids = [1, 6, 11, 16, 21, 23]            # 23 = last layer: HF takes it after the final norm
    t0 = time.time()
    hs = hidden_states(model, tokens, cu, ids)
    model.float()
    hs32 = hidden_states(model, tokens, cu, ids)
    ref = {"tokens": tokens.to(torch.int32).cpu(), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
           "layer_ids": torch.tensor(ids, dtype=torch.int32)}
    for k in range(len(ids)):
        ref["hs.%d" % k] = hs[k].contiguous()
        ref["hs32.%d" % k] = hs32[k].contiguous()
        e = ((hs[k] - hs32[k]).norm() / hs32[k].norm()).item()
        print("transformers bf16 vs fp32, layer %d: rel err %.3e" % (ids[k], e))
    save_file(ref, os.path.join(args.out, "ref.safetensors"))
    print("parity data in %s (%.1f s)" % (args.out, time.time() - t0))


def make_batches(n, budget, lo, hi, seed):
    rng = random.Random(seed)
    batches = []
    for _ in range(n):
        lens, total = [], 0
        while True:
            l = rng.randint(lo, hi)
            if total + l > budget:
                break
            lens.append(l)
            total += l
        batches.append(lens)
    return batches


def flops_per_batch(cfg, n_layers, lens):
    H, D, NH, NKV, FF = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.intermediate_size)
    per_tok = 2 * (H * (NH + 2 * NKV) * D + NH * D * H + 3 * H * FF)
    att = sum(4 * D * NH * l * (l + 1) / 2 for l in lens)
    return n_layers * (per_tok * sum(lens) + att)


def bench(args):
    ids = [int(x) for x in args.ids.split(",")]
    last = max(ids)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      attention_bias=False, use_sliding_window=False, hidden_act="silu",
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    randomize_norms(model)
    print("model built in %.1f s" % (time.time() - t0))

    os.makedirs(args.out, exist_ok=True)
    if not args.no_save:
        t0 = time.time()
        model.config.architectures = ["Qwen3ForCausalLM"]
        model.config.save_pretrained(args.out)
        keep = {"model.embed_tokens.weight", "model.norm.weight"}
        sd = {k: v for k, v in model.state_dict().items()
              if k in keep or (k.startswith("model.layers.") and int(k.split(".")[2]) <= last)}
        names = sorted(sd)
        shards, cur, size, weight_map = [], {}, 0, {}
        for k in names:
            cur[k] = sd[k]
            size += sd[k].numel() * 2
            if size > (4 << 30):
                shards.append(cur)
                cur, size = {}, 0
        if cur:
            shards.append(cur)
        total = 0
        for i, part in enumerate(shards):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
            save_file({k: v.detach().cpu().contiguous() for k, v in part.items()},
                      os.path.join(args.out, fname), metadata={"format": "pt"})
            for k, v in part.items():
                weight_map[k] = fname
                total += v.numel() * 2
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
        print("saved %d tensors (%.1f GB) in %.1f s" % (len(names), total / 1e9, time.time() - t0))

    batches = make_batches(args.warmup + args.batches, args.budget, 512, 3072, args.seed)
    with open(os.path.join(args.out, "batches.txt"), "w") as f:
        for b in batches:
            f.write(" ".join(str(x) for x in b) + "\n")
    maxT = max(sum(b) for b in batches)
    pinned = torch.empty((maxT, len(ids) * cfg.hidden_size), dtype=torch.bfloat16, pin_memory=True)
    vocab = cfg.vocab_size

    def run(tag, n_layers):
        toks = [torch.randint(0, vocab, (sum(b),), device="cuda") for b in batches]
        with torch.no_grad():
            def one(i):
                off = 0
                for l in batches[i]:
                    hs = model.model(input_ids=toks[i][off:off + l][None], output_hidden_states=True,
                                     use_cache=False).hidden_states
                    cat = torch.cat([hs[j + 1][0] for j in ids], dim=-1)
                    pinned[off:off + l].copy_(cat, non_blocking=True)
                    off += l
                torch.cuda.synchronize()
            for i in range(len(batches)):     # warm pass: every sequence shape seen once
                one(i)
            t = time.perf_counter()
            for i in range(args.warmup, len(batches)):
                one(i)
            dt = time.perf_counter() - t
        ntok = sum(sum(b) for b in batches[args.warmup:])
        fl = sum(flops_per_batch(cfg, n_layers, b) for b in batches[args.warmup:])
        print("RESULT hf_%s_tok_s %.1f" % (tag, ntok / dt))
        print("RESULT hf_%s_tflops %.1f" % (tag, fl / dt / 1e12))
        print("RESULT hf_%s_batches %d" % (tag, len(batches) - args.warmup))

    run("full36", cfg.num_hidden_layers)
    model.model.layers = model.model.layers[:last + 1]
    model.config.num_hidden_layers = last + 1
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:last + 1]
    run("trunc%d" % (last + 1), last + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["parity", "bench"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ids", default="1,9,17,25,33")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parity(args) if args.mode == "parity" else bench(args)


if __name__ == "__main__":
    main()
