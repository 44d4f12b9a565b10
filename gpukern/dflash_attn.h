/* dflash_attn.h: attention of DFlash draft blocks on the GPU, forward and backward; bf16 in/out,
 * fp32 softmax and accumulation, GQA. Block b's query rows [b*bs, (b+1)*bs) attend to the context
 * keys [ctx0, ctx_end) of its entry in `blocks` (its sequence's packed rows before its anchor)
 * and to the bs keys of the block itself; nothing else is read or scored. */
#pragma once
#include "gpukern/gk.h"

typedef struct gk_dflash_block {
    int32_t ctx0, ctx_end;          /* context key rows [ctx0, ctx_end) */
} gk_dflash_block;

/* A tile of keys for the backward's key-major pass: context rows [key0, key0 + n_keys) with the
 * blocks qlist[q0..q1) that see some of them, or (key0 < 0) the bs keys of block -1 - key0. */
typedef struct gk_dflash_ktile {
    int32_t key0, n_keys, q0, q1;
} gk_dflash_ktile;

#define GK_DFLASH_KEY_TILE 64

typedef struct gk_dflash_attn {
    int n_blocks, block_size, n_heads, n_kv_heads, head_dim;
    float scale;                            /* multiplies q.k, usually 1/sqrt(head_dim) */
    const gk_dflash_block *blocks;          /* device [n_blocks] */
    /* head h of row r at ptr + r*stride + h*head_dim; query head h reads kv head h/(nh/nkv) */
    const void *q; long q_stride;           /* [n_blocks*bs, nh*hd] */
    const void *kc; long kc_stride;         /* context [n_ctx, nkv*hd] */
    const void *vc; long vc_stride;
    const void *kb; long kb_stride;         /* the blocks' own [n_blocks*bs, nkv*hd] */
    const void *vb; long vb_stride;
    void *o; long o_stride;                 /* forward output [n_blocks*bs, nh*hd] */
    float *lse;                             /* [n_blocks*bs, nh]: log-sum-exp of the scaled scores */
    int impl;                               /* enum gk_dflash_impl; 0 (auto) when zero-initialised */
} gk_dflash_attn;

/* auto: tensor cores for head_dim 64 and 128 (P and dS rounded to bf16 as operands): for head_dim
 * 128 Hopper's warpgroup MMA where gk_dflash_attn_has_wgmma() (forward, query and key passes), else
 * mma.sync; other head_dims the CUDA-core kernels (fp32 throughout); simple: always the CUDA-core
 * kernels; mma: the mma.sync kernels only (head_dim 64 / 128); wgmma: as auto, and -EINVAL unless
 * head_dim 128 and wgmma. */
enum gk_dflash_impl { GK_DFLASH_AUTO = 0, GK_DFLASH_SIMPLE = 1, GK_DFLASH_MMA = 2, GK_DFLASH_WGMMA = 3 };

/* 1 if the current device runs the warpgroup-MMA kernels (compute capability 9.0 and a build
 * with sm_90a code), else 0. */
GK_API int gk_dflash_attn_has_wgmma(void);

/* The most dynamic shared memory per block the forward and backward ask for at this head_dim and
 * impl on the current device (to compare with cudaDevAttrMaxSharedMemoryPerBlockOptin: a GPU with
 * less cannot launch them). */
GK_API size_t gk_dflash_attn_smem(int head_dim, int impl);

/* Supported head_dim: 16, 32, 64, 128, 256; every stride % 8 == 0 and 16-byte aligned bases;
 * n_kv_heads <= 65535 and block_size * (n_heads / n_kv_heads) + 64 < 65536 (else -EINVAL). */
GK_API int gk_dflash_attn_fwd(const gk_dflash_attn *a, cudaStream_t stream);

/* Host: the key tiles of the backward. blocks (host copy, any order) sharing a ctx0 are one
 * sequence; different sequences' context ranges must not overlap. qlist [n_blocks], tiles
 * [max_tiles] (gk_dflash_max_tiles). Returns the tile count or -EINVAL. */
GK_API int gk_dflash_max_tiles(int n_ctx, int n_blocks);
GK_API int gk_dflash_plan(const gk_dflash_block *blocks, int n_blocks, int block_size, int n_ctx,
                          int32_t *qlist, gk_dflash_ktile *tiles, int max_tiles);

typedef struct gk_dflash_attn_grad {
    const void *dout; long dout_stride;     /* [n_blocks*bs, nh*hd] bf16 */
    float *delta;                           /* scratch [n_blocks*bs, nh]: rowsum(dout * o) */
    float *dq; long dq_stride;              /* fp32, written (not accumulated) */
    float *dkc; long dkc_stride;            /* fp32 [n_ctx, nkv*hd]; rows no block sees get 0 */
    void *dvc; long dvc_stride;             /* bf16 [n_ctx, nkv*hd] */
    float *dkb; long dkb_stride;            /* fp32 [n_blocks*bs, nkv*hd] */
    void *dvb; long dvb_stride;             /* bf16 */
    int n_ctx;
    const int32_t *qlist;                   /* device copies of gk_dflash_plan's output, as it */
    const gk_dflash_ktile *tiles;           /* lays them out (the context tiles, then the n_blocks */
    int n_tiles;                            /* tiles of own keys); n_tiles: its count, or 0 (no dk/dv) */
} gk_dflash_attn_grad;

/* Gradients from the forward's q, k, v, o and lse (a as given to the forward). dq in the query
 * pass, dk/dv in a key-major pass over the tiles: deterministic, no atomics. A CTA per (tile,
 * kv head) in a 1-D grid: n_tiles * n_kv_heads <= 2^31 - 1 (else -EINVAL). */
GK_API int gk_dflash_attn_bwd(const gk_dflash_attn *a, const gk_dflash_attn_grad *g,
                              cudaStream_t stream);
