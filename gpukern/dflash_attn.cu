/* dflash_attn.cu: DFlash block attention, flash style: one CTA per (block, kv head, 64 query rows)
 * holds the queries of every head of the kv group and streams the block's visible keys (its
 * context before the anchor, then its own slots) in tiles of 64 with an online softmax. The
 * backward recomputes the scores: dq query-major, dk/dv key-major over gk_dflash_plan's tiles.
 * Three generations of the same kernels: CUDA cores (any head_dim, fp32), mma.sync (head_dim 64 /
 * 128) and, on Hopper, warpgroup MMA (head_dim 128, sm_90a); gk_dflash_attn_fwd/_bwd pick. */
#include <limits.h>
#include <math.h>
#include <algorithm>
#include "gpukern/dflash_attn.h"
#include "gpukern/gk_impl.cuh"
#include "gpukern/mma.cuh"
#include "gpukern/wgmma.cuh"

namespace {

constexpr int QT = 64;                  /* query rows per tile */
constexpr int KT = GK_DFLASH_KEY_TILE;  /* keys per tile */
constexpr int NT = 256;                 /* threads: 64 rows x 4 parts */

template <int HD> struct Geo {
    static constexpr int LD = HD + 8;               /* smem row stride (bf16): keeps rows off one bank */
    static constexpr int W = HD >= 32 ? 8 : HD / 4; /* dims per chunk */
    static constexpr int NC = HD / W / 4;           /* chunks per part (part p owns chunks p + 4i) */
    static constexpr int VPR = HD / 8;              /* 16-byte vectors per row */
};

template <int W>
__device__ __forceinline__ void load_w(const bf16 *p, float *f)
{
    if constexpr (W == 8) {
        bf16x8 v = *(const bf16x8 *)p;
        bf16x8_to_f32(v, f);
    } else {
#pragma unroll
        for (int i = 0; i < W / 2; i++) {
            float2 t = __bfloat1622float2(((const __nv_bfloat162 *)p)[i]);
            f[2 * i] = t.x;
            f[2 * i + 1] = t.y;
        }
    }
}

template <int W>
__device__ __forceinline__ void store_w(bf16 *p, const float *f)
{
#pragma unroll
    for (int i = 0; i < W / 2; i++)
        ((__nv_bfloat162 *)p)[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
}

/* rows [0, nrows) of a [*, LD] smem tile from rowptr(r) (NULL: zeros). */
template <int HD, typename F>
__device__ __forceinline__ void load_rows(bf16 *dst, int nrows, F rowptr)
{
    using G = Geo<HD>;
    for (int i = threadIdx.x; i < nrows * G::VPR; i += NT) {
        int r = i / G::VPR, c = (i % G::VPR) * 8;
        const bf16 *src = rowptr(r);
        *(uint4 *)(dst + r * G::LD + c) = src ? *(const uint4 *)(src + c) : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ float group4_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float group4_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Key j of tile t0 of block b: context row, then the block's own rows; NULL past the end. */
__device__ __forceinline__ const bf16 *key_row(const bf16 *ctx, long cs, const bf16 *own, long os,
                                               const gk_dflash_block &blk, int b, int bs, int g,
                                               int hd, int kk)
{
    int nctx = blk.ctx_end - blk.ctx0;
    if (kk < nctx) return ctx + (long)(blk.ctx0 + kk) * cs + (long)g * hd;
    if (kk < nctx + bs) return own + ((long)b * bs + (kk - nctx)) * os + (long)g * hd;
    return nullptr;
}

template <int HD>
__global__ void __launch_bounds__(NT) fwd_kernel(gk_dflash_attn a)
{
    using G = Geo<HD>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + QT * G::LD, *Vs = Ks + KT * G::LD;
    float *Ps = (float *)(Vs + KT * G::LD);
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads;
    const int R = bs * grp, tid = threadIdx.x, row = tid >> 2, part = tid & 3;
    const int qr = blockIdx.z * QT + row;
    const bool valid = qr < R;
    const long qrow = (long)b * bs + (valid ? qr / grp : 0);
    const int h = g * grp + (valid ? qr % grp : 0);
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs;
    const bf16 *q = (const bf16 *)a.q, *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc;
    const bf16 *kb = (const bf16 *)a.kb, *vb = (const bf16 *)a.vb;

    load_rows<HD>(Qs, QT, [&](int r) -> const bf16 * {
        int x = blockIdx.z * QT + r;
        if (x >= R) return nullptr;
        return q + ((long)b * bs + x / grp) * a.q_stride + (long)(g * grp + x % grp) * HD;
    });
    float m_run = -INFINITY, l_run = 0.f, acc[HD / 4];
#pragma unroll
    for (int i = 0; i < HD / 4; i++) acc[i] = 0.f;

    for (int t0 = 0; t0 < nk; t0 += KT) {
        __syncthreads();    /* the previous tile's K, V, P are consumed */
        load_rows<HD>(Ks, KT, [&](int j) { return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, t0 + j); });
        load_rows<HD>(Vs, KT, [&](int j) { return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, t0 + j); });
        __syncthreads();
        float s[KT / 4];
#pragma unroll
        for (int jj = 0; jj < KT / 4; jj++) s[jj] = 0.f;
        const bf16 *qs = Qs + row * G::LD;
        for (int c = 0; c < HD; c += 8) {
            float qf[8];
            bf16x8_to_f32(*(const bf16x8 *)(qs + c), qf);
#pragma unroll
            for (int jj = 0; jj < KT / 4; jj++) {
                float kf[8];
                bf16x8_to_f32(*(const bf16x8 *)(Ks + (part + 4 * jj) * G::LD + c), kf);
#pragma unroll
                for (int e = 0; e < 8; e++) s[jj] += qf[e] * kf[e];
            }
        }
        float mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < KT / 4; jj++) {
            s[jj] = t0 + part + 4 * jj < nk ? s[jj] * a.scale : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        mt = group4_max(mt);
        const float m_new = fmaxf(m_run, mt);   /* finite: key t0 exists */
        const float corr = __expf(m_run - m_new);
        float lt = 0.f;
#pragma unroll
        for (int jj = 0; jj < KT / 4; jj++) {
            float p = __expf(s[jj] - m_new);
            lt += p;
            Ps[row * (KT + 1) + part + 4 * jj] = p;
        }
        l_run = l_run * corr + group4_sum(lt);
        m_run = m_new;
#pragma unroll
        for (int i = 0; i < HD / 4; i++) acc[i] *= corr;
        __syncthreads();
        const int jn = min(KT, nk - t0);
        for (int j = 0; j < jn; j++) {
            const float p = Ps[row * (KT + 1) + j];
#pragma unroll
            for (int ci = 0; ci < G::NC; ci++) {
                float vf[G::W];
                load_w<G::W>(Vs + j * G::LD + (part + 4 * ci) * G::W, vf);
#pragma unroll
                for (int e = 0; e < G::W; e++) acc[ci * G::W + e] += p * vf[e];
            }
        }
    }
    if (!valid) return;
    const float inv = 1.f / l_run;
    bf16 *o = (bf16 *)a.o + qrow * a.o_stride + (long)h * HD;
#pragma unroll
    for (int ci = 0; ci < G::NC; ci++) {
        float f[G::W];
#pragma unroll
        for (int e = 0; e < G::W; e++) f[e] = acc[ci * G::W + e] * inv;
        store_w<G::W>(o + (part + 4 * ci) * G::W, f);
    }
    if (part == 0) a.lse[qrow * a.n_heads + h] = m_run + logf(l_run);
}

/* dq = scale * sum_k dS K, dS = P (dP - delta), dP = dO V^T; also writes delta = rowsum(dO o). */
template <int HD>
__global__ void __launch_bounds__(NT) bwd_q_kernel(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
    using G = Geo<HD>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + QT * G::LD, *Ks = dOs + QT * G::LD, *Vs = Ks + KT * G::LD;
    float *Ss = (float *)(Vs + KT * G::LD);
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads;
    const int R = bs * grp, tid = threadIdx.x, row = tid >> 2, part = tid & 3;
    const int qr = blockIdx.z * QT + row;
    const bool valid = qr < R;
    const long qrow = (long)b * bs + (valid ? qr / grp : 0);
    const int h = g * grp + (valid ? qr % grp : 0);
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs;
    const bf16 *q = (const bf16 *)a.q, *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc;
    const bf16 *kb = (const bf16 *)a.kb, *vb = (const bf16 *)a.vb, *dout = (const bf16 *)gr.dout;

    load_rows<HD>(Qs, QT, [&](int r) -> const bf16 * {
        int x = blockIdx.z * QT + r;
        if (x >= R) return nullptr;
        return q + ((long)b * bs + x / grp) * a.q_stride + (long)(g * grp + x % grp) * HD;
    });
    load_rows<HD>(dOs, QT, [&](int r) -> const bf16 * {
        int x = blockIdx.z * QT + r;
        if (x >= R) return nullptr;
        return dout + ((long)b * bs + x / grp) * gr.dout_stride + (long)(g * grp + x % grp) * HD;
    });
    __syncthreads();
    float delta = 0.f;
    if (valid) {
        const bf16 *o = (const bf16 *)a.o + qrow * a.o_stride + (long)h * HD;
#pragma unroll
        for (int ci = 0; ci < G::NC; ci++) {
            float of[G::W], df[G::W];
            int c = (part + 4 * ci) * G::W;
            load_w<G::W>(o + c, of);
            load_w<G::W>(dOs + row * G::LD + c, df);
#pragma unroll
            for (int e = 0; e < G::W; e++) delta += of[e] * df[e];
        }
    }
    delta = group4_sum(delta);
    if (valid && part == 0) gr.delta[qrow * a.n_heads + h] = delta;
    const float lse = valid ? a.lse[qrow * a.n_heads + h] : 0.f;
    float acc[HD / 4];
#pragma unroll
    for (int i = 0; i < HD / 4; i++) acc[i] = 0.f;

    for (int t0 = 0; t0 < nk; t0 += KT) {
        __syncthreads();
        load_rows<HD>(Ks, KT, [&](int j) { return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, t0 + j); });
        load_rows<HD>(Vs, KT, [&](int j) { return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, t0 + j); });
        __syncthreads();
        float s[KT / 4], dp[KT / 4];
#pragma unroll
        for (int jj = 0; jj < KT / 4; jj++) s[jj] = dp[jj] = 0.f;
        for (int c = 0; c < HD; c += 8) {
            float qf[8], df[8];
            bf16x8_to_f32(*(const bf16x8 *)(Qs + row * G::LD + c), qf);
            bf16x8_to_f32(*(const bf16x8 *)(dOs + row * G::LD + c), df);
#pragma unroll
            for (int jj = 0; jj < KT / 4; jj++) {
                float kf[8], vf[8];
                bf16x8_to_f32(*(const bf16x8 *)(Ks + (part + 4 * jj) * G::LD + c), kf);
                bf16x8_to_f32(*(const bf16x8 *)(Vs + (part + 4 * jj) * G::LD + c), vf);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    s[jj] += qf[e] * kf[e];
                    dp[jj] += df[e] * vf[e];
                }
            }
        }
#pragma unroll
        for (int jj = 0; jj < KT / 4; jj++) {
            float p = t0 + part + 4 * jj < nk ? __expf(s[jj] * a.scale - lse) : 0.f;
            Ss[row * (KT + 1) + part + 4 * jj] = p * (dp[jj] - delta);
        }
        __syncthreads();
        const int jn = min(KT, nk - t0);
        for (int j = 0; j < jn; j++) {
            const float ds = Ss[row * (KT + 1) + j];
#pragma unroll
            for (int ci = 0; ci < G::NC; ci++) {
                float kf[G::W];
                load_w<G::W>(Ks + j * G::LD + (part + 4 * ci) * G::W, kf);
#pragma unroll
                for (int e = 0; e < G::W; e++) acc[ci * G::W + e] += ds * kf[e];
            }
        }
    }
    if (!valid) return;
    float *dq = gr.dq + qrow * gr.dq_stride + (long)h * HD;
#pragma unroll
    for (int ci = 0; ci < G::NC; ci++)
#pragma unroll
        for (int e = 0; e < G::W; e++) dq[(part + 4 * ci) * G::W + e] = acc[ci * G::W + e] * a.scale;
}

/* One CTA per (key tile, kv head): dV = sum P^T dO, dK = scale * sum dS^T Q over the query rows of
 * every block that sees the tile; thread (key kr = tid/4, part) keeps its dK/dV in registers. */
template <int HD>
__global__ void __launch_bounds__(NT) bwd_kv_kernel(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
    using G = Geo<HD>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + KT * G::LD, *Qs = Vs + KT * G::LD, *dOs = Qs + QT * G::LD;
    float *Ps = (float *)(dOs + QT * G::LD), *Ss = Ps + QT * (KT + 1);
    float *lse_s = Ss + QT * (KT + 1), *dl_s = lse_s + QT;
    const gk_dflash_ktile tile = gr.tiles[blockIdx.x];
    const int g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int tid = threadIdx.x, kr = tid >> 2, part = tid & 3;
    const bool self = tile.key0 < 0;
    const int bself = -1 - tile.key0, n_keys = tile.n_keys;
    const bf16 *q = (const bf16 *)a.q, *dout = (const bf16 *)gr.dout;
    const bf16 *kbase = self ? (const bf16 *)a.kb + (long)bself * bs * a.kb_stride
                             : (const bf16 *)a.kc + (long)tile.key0 * a.kc_stride;
    const bf16 *vbase = self ? (const bf16 *)a.vb + (long)bself * bs * a.vb_stride
                             : (const bf16 *)a.vc + (long)tile.key0 * a.vc_stride;
    const long ks = self ? a.kb_stride : a.kc_stride, vs = self ? a.vb_stride : a.vc_stride;

    load_rows<HD>(Ks, KT, [&](int j) -> const bf16 * { return j < n_keys ? kbase + j * ks + (long)g * HD : nullptr; });
    load_rows<HD>(Vs, KT, [&](int j) -> const bf16 * { return j < n_keys ? vbase + j * vs + (long)g * HD : nullptr; });
    float dk[HD / 4], dv[HD / 4];
#pragma unroll
    for (int i = 0; i < HD / 4; i++) dk[i] = dv[i] = 0.f;

    const int nq = self ? 1 : tile.q1 - tile.q0;
    for (int qi = 0; qi < nq; qi++) {
        const int b = self ? bself : gr.qlist[tile.q0 + qi];
        const int ctx_end = a.blocks[b].ctx_end;
        const bool kvis = kr < n_keys && (self || tile.key0 + kr < ctx_end);
        for (int r0 = 0; r0 < R; r0 += QT) {
            __syncthreads();    /* the previous chunk's Q, dO, P, dS are consumed */
            load_rows<HD>(Qs, QT, [&](int r) -> const bf16 * {
                int x = r0 + r;
                if (x >= R) return nullptr;
                return q + ((long)b * bs + x / grp) * a.q_stride + (long)(g * grp + x % grp) * HD;
            });
            load_rows<HD>(dOs, QT, [&](int r) -> const bf16 * {
                int x = r0 + r;
                if (x >= R) return nullptr;
                return dout + ((long)b * bs + x / grp) * gr.dout_stride + (long)(g * grp + x % grp) * HD;
            });
            for (int r = tid; r < QT; r += NT) {
                int x = r0 + r;
                long i = x < R ? ((long)b * bs + x / grp) * a.n_heads + g * grp + x % grp : 0;
                lse_s[r] = x < R ? a.lse[i] : 0.f;
                dl_s[r] = x < R ? gr.delta[i] : 0.f;
            }
            __syncthreads();
            float s[QT / 4], dp[QT / 4];
#pragma unroll
            for (int ii = 0; ii < QT / 4; ii++) s[ii] = dp[ii] = 0.f;
            for (int c = 0; c < HD; c += 8) {
                float kf[8], vf[8];
                bf16x8_to_f32(*(const bf16x8 *)(Ks + kr * G::LD + c), kf);
                bf16x8_to_f32(*(const bf16x8 *)(Vs + kr * G::LD + c), vf);
#pragma unroll
                for (int ii = 0; ii < QT / 4; ii++) {
                    float qf[8], df[8];
                    bf16x8_to_f32(*(const bf16x8 *)(Qs + (part + 4 * ii) * G::LD + c), qf);
                    bf16x8_to_f32(*(const bf16x8 *)(dOs + (part + 4 * ii) * G::LD + c), df);
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        s[ii] += qf[e] * kf[e];
                        dp[ii] += df[e] * vf[e];
                    }
                }
            }
#pragma unroll
            for (int ii = 0; ii < QT / 4; ii++) {
                const int qq = part + 4 * ii;
                float p = kvis && r0 + qq < R ? __expf(s[ii] * a.scale - lse_s[qq]) : 0.f;
                Ps[qq * (KT + 1) + kr] = p;
                Ss[qq * (KT + 1) + kr] = p * (dp[ii] - dl_s[qq]);
            }
            __syncthreads();
            const int nrows = min(QT, R - r0);
            for (int qq = 0; qq < nrows; qq++) {
                const float p = Ps[qq * (KT + 1) + kr], ds = Ss[qq * (KT + 1) + kr];
#pragma unroll
                for (int ci = 0; ci < G::NC; ci++) {
                    float qf[G::W], df[G::W];
                    const int c = (part + 4 * ci) * G::W;
                    load_w<G::W>(Qs + qq * G::LD + c, qf);
                    load_w<G::W>(dOs + qq * G::LD + c, df);
#pragma unroll
                    for (int e = 0; e < G::W; e++) {
                        dv[ci * G::W + e] += p * df[e];
                        dk[ci * G::W + e] += ds * qf[e];
                    }
                }
            }
        }
    }
    if (kr >= n_keys) return;
    const long krow = self ? (long)bself * bs + kr : (long)tile.key0 + kr;
    float *dkp = (self ? gr.dkb + krow * gr.dkb_stride : gr.dkc + krow * gr.dkc_stride) + (long)g * HD;
    bf16 *dvp = (bf16 *)(self ? gr.dvb : gr.dvc) + krow * (self ? gr.dvb_stride : gr.dvc_stride) + (long)g * HD;
#pragma unroll
    for (int ci = 0; ci < G::NC; ci++) {
        const int c = (part + 4 * ci) * G::W;
        float f[G::W];
#pragma unroll
        for (int e = 0; e < G::W; e++) {
            dkp[c + e] = dk[ci * G::W + e] * a.scale;
            f[e] = dv[ci * G::W + e];
        }
        store_w<G::W>(dvp + c, f);
    }
}

/* ---- tensor-core kernels (head_dim 64 / 128): mma.sync m16n8k16, bf16 in, fp32 accumulators ----
 * The same CTAs as above (64 query rows of one block and kv head; 64 keys of a tile and kv head),
 * four warps of 16 rows (or keys) each. P and dS are rounded to bf16 as mma operands, as in
 * FlashAttention; scores, softmax statistics and every accumulator stay fp32. */

constexpr int MB = 64, MW = 4, MPAD = 8;    /* rows per CTA (= keys per tile KT), warps, smem row pad */
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

/* nrows rows of a [*, HD + MPAD] smem tile from rowptr(r) (NULL: zeros), asynchronously, by
 * threads tid of nthr (default: the CTA's MW warps). */
template <int HD, typename F>
__device__ __forceinline__ void cp_rows(bf16 *tile, int nrows, const void *any, F rowptr, int tid = threadIdx.x,
                                        int nthr = MW * 32)
{
    constexpr int LDS = HD + MPAD, CH = HD / 8;
    for (int c = tid; c < nrows * CH; c += nthr) {
        int r = c / CH, col = (c % CH) * 8;
        const bf16 *src = rowptr(r);
        cp_async16(smem_u32(tile + r * LDS + col), src ? (const void *)(src + col) : any, src != nullptr);
    }
}

/* acc[16 x 8*NT8] += A[16 x 16] (a fragment) B^T: B rows [8*NT8 x 16] of a smem tile from column k0.
 * Lane roles of ldmatrix: matrix mi = lane/8, row ri = lane%8. */
template <int LDS, int NT8>
__device__ __forceinline__ void mma_nt_step(float (*acc)[4], const uint32_t a[4], const bf16 *B, int k0, int mi, int ri)
{
#pragma unroll
    for (int np = 0; np < NT8 / 2; np++) {
        uint32_t b[4];
        ldsm_x4(b, smem_u32(B + (np * 16 + ri + (mi >> 1) * 8) * LDS + k0 + (mi & 1) * 8));
        mma16816(acc[2 * np], a, b[0], b[1]);
        mma16816(acc[2 * np + 1], a, b[2], b[3]);
    }
}

/* The A fragment of rows [16*w, 16*w + 16), columns [16*kk, 16*kk + 16) of a smem tile. */
template <int LDS>
__device__ __forceinline__ void ld_a(uint32_t a[4], const bf16 *tile, int w, int kk, int mi, int ri)
{
    ldsm_x4(a, smem_u32(tile + (w * 16 + ri + (mi & 1) * 8) * LDS + kk * 16 + (mi >> 1) * 8));
}

/* acc[16 x HD] += P[16 x 64] (accumulator layout, 8 n-tiles) X[64 x HD] (smem rows = the k dim). */
template <int HD>
__device__ __forceinline__ void mma_pv(float (*acc)[4], const float (*p)[4], const bf16 *X, int mi, int ri)
{
    constexpr int LDS = HD + MPAD;
#pragma unroll
    for (int kt = 0; kt < MB / 16; kt++) {
        uint32_t pa[4] = { pack_bf16x2(p[2 * kt][0], p[2 * kt][1]), pack_bf16x2(p[2 * kt][2], p[2 * kt][3]),
                           pack_bf16x2(p[2 * kt + 1][0], p[2 * kt + 1][1]), pack_bf16x2(p[2 * kt + 1][2], p[2 * kt + 1][3]) };
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_t(b, smem_u32(X + (kt * 16 + ri + (mi & 1) * 8) * LDS + dp * 16 + (mi >> 1) * 8));
            mma16816(acc[2 * dp], pa, b[0], b[1]);
            mma16816(acc[2 * dp + 1], pa, b[2], b[3]);
        }
    }
}

/* Query row x of the (block b, kv head g) group: block row b*bs + x/grp, head g*grp + x%grp. */
__device__ __forceinline__ const bf16 *qrow_ptr(const void *base, long stride, int b, int bs, int grp, int g,
                                                int hd, int x, int R)
{
    if (x >= R) return nullptr;
    return (const bf16 *)base + ((long)b * bs + x / grp) * stride + (long)(g * grp + x % grp) * hd;
}

/* x / d for 0 <= x < 2^16 and 1 <= d < 2^16 without a division: m = div_magic(d), exact there
 * (x * m / 2^32 exceeds x / d by less than 2^-16, less than the distance to the next integer). */
__host__ __device__ __forceinline__ uint64_t div_magic(int d) { return ((1ull << 32) + (uint64_t)d - 1) / (uint64_t)d; }
__device__ __forceinline__ int div_by(int x, uint64_t m) { return (int)(((uint64_t)(uint32_t)x * m) >> 32); }

/* qrow_ptr with the division by grp as a multiplication (gm = div_magic(grp)), for the loops */
__device__ __forceinline__ const bf16 *qrow_fast(const void *base, long stride, int b, int bs, int grp, uint64_t gm,
                                                 int g, int hd, int x, int R)
{
    if (x >= R) return nullptr;
    const int qr = div_by(x, gm);
    return (const bf16 *)base + ((long)b * bs + qr) * stride + (long)(g * grp + x - qr * grp) * hd;
}

/* The forward's online softmax over one tile of scores s (log2 units, masked keys -INFINITY), in
 * the accumulator layout of 16 rows x 64 keys (this thread: rows lane / 4 and + 8): the running max
 * and sum of both rows, s replaced by exp2(s - max), corr = the factor for what came before. */
__device__ __forceinline__ void online_softmax(float (*s)[4], float mrow[2], float lrow[2], float corr[2])
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float mx = mrow[hr];
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hr], s[nt][2 * hr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx;
        corr[hr] = exp2f(mrow[hr] - base);
        mrow[hr] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++) {
            s[nt][2 * hr] = exp2f(s[nt][2 * hr] - base);
            s[nt][2 * hr + 1] = exp2f(s[nt][2 * hr + 1] - base);
            sum += s[nt][2 * hr] + s[nt][2 * hr + 1];
        }
        lrow[hr] = lrow[hr] * corr[hr] + sum;
    }
}

/* The forward's output rows x and x + 8 of the CTA's (block b, kv head g) group: O / l as bf16 and
 * the lse; o in the accumulator layout (HD / 8 n8 tiles). */
template <int HD>
__device__ __forceinline__ void store_o(const gk_dflash_attn &a, const float (*o)[4], const float mrow[2],
                                        const float lrow[2], int b, int g, int x, int lane)
{
    const int bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = lrow[hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int xr = x + hr * 8;
        if (xr >= R) continue;
        const long qrow = (long)b * bs + xr / grp;
        const int h = g * grp + xr % grp;
        const float inv = 1.f / l;
        bf16 *orow = (bf16 *)a.o + qrow * a.o_stride + (long)h * HD + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162 *)(orow + dt * 8) = __floats2bfloat162_rn(o[dt][2 * hr] * inv, o[dt][2 * hr + 1] * inv);
        if ((lane & 3) == 0) a.lse[qrow * a.n_heads + h] = (mrow[hr] + log2f(l)) * LN2;
    }
}

/* Q is read into registers before the first prefetch, so it shares the second K buffer: four
 * tiles of shared memory and at most 168 registers let three CTAs share an SM. */
template <int HD>
__global__ void __launch_bounds__(MW * 32, 3) fwd_mma(gk_dflash_attn a)
{
    constexpr int LDS = HD + MPAD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = (bf16 *)smem, *sV = sK + 2 * MB * LDS;     /* K, V: two buffers each */
    bf16 *sQ = sK + MB * LDS;                             /* = K buffer 1 until t = 0 is under way */
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int r0 = blockIdx.z * MB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mi = lane >> 3, ri = lane & 7;
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs, n_tiles = (nk + MB - 1) / MB;
    const bf16 *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc, *kb = (const bf16 *)a.kb, *vb = (const bf16 *)a.vb;
    const float sl2 = a.scale * LOG2E;

    cp_rows<HD>(sQ, MB, a.q, [&](int r) { return qrow_ptr(a.q, a.q_stride, b, bs, grp, g, HD, r0 + r, R); });
    cp_rows<HD>(sK, MB, a.q, [&](int j) { return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, j); });
    cp_rows<HD>(sV, MB, a.q, [&](int j) { return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, j); });
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = { -INFINITY, -INFINITY }, lrow[2] = { 0.f, 0.f };

    for (int t = 0; t < n_tiles; t++) {
        cp_async_wait_all();
        __syncthreads();    /* tile t landed; everyone is done with tile t - 1's buffers */
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) ld_a<LDS>(qf[kk], sQ, warp, kk, mi, ri);
            __syncthreads();    /* Q is in registers everywhere: K buffer 1 is free */
        }
        if (t + 1 < n_tiles) {
            const int t1 = (t + 1) * MB, nb_ = (t + 1) & 1;
            cp_rows<HD>(sK + nb_ * MB * LDS, MB, a.q, [&](int j) {
                return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, t1 + j); });
            cp_rows<HD>(sV + nb_ * MB * LDS, MB, a.q, [&](int j) {
                return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, t1 + j); });
        }
        cp_async_commit();
        const bf16 *tK = sK + (t & 1) * MB * LDS, *tV = sV + (t & 1) * MB * LDS;
        float s[MB / 8][4];
#pragma unroll
        for (int i = 0; i < MB / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) mma_nt_step<LDS, MB / 8>(s, qf[kk], tK, kk * 16, mi, ri);
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = t * MB + nt * 8 + (lane & 3) * 2 + (e & 1);
                s[nt][e] = key < nk ? s[nt][e] * sl2 : -INFINITY;
            }
        float corr[2];
        online_softmax(s, mrow, lrow, corr);
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            o[dt][0] *= corr[0]; o[dt][1] *= corr[0];
            o[dt][2] *= corr[1]; o[dt][3] *= corr[1];
        }
        mma_pv<HD>(o, s, tV, mi, ri);
    }
    cp_async_wait_all();
    store_o<HD>(a, o, mrow, lrow, b, g, r0 + warp * 16 + (lane >> 2), lane);
}

/* The query pass's row statistics, two threads a row (half the dims each): delta = rowsum(dO o) of
 * query row r0 + threadIdx.x / 2 to gr.delta and dl_s, its lse in log2 units to lse_s (zeros past
 * the block's rows). dchunk(r, c): the 8 dO values of tile row r from dim 8 c, in shared memory. */
template <int HD, typename F>
__device__ __forceinline__ void row_stats(const gk_dflash_attn &a, const gk_dflash_attn_grad &gr, int b, int g, int r0,
                                          float *lse_s, float *dl_s, F dchunk)
{
    const int bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1, x = r0 + r;
    float d = 0.f;
    const bf16 *orow = qrow_ptr(a.o, a.o_stride, b, bs, grp, g, HD, x, R);
    if (orow) {
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {
            const int c = half * (HD / 16) + j;
            float of[8], df[8];
            bf16x8_to_f32(*(const bf16x8 *)(orow + c * 8), of);
            bf16x8_to_f32(*(const bf16x8 *)dchunk(r, c), df);
#pragma unroll
            for (int e = 0; e < 8; e++) d += of[e] * df[e];
        }
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if (half == 0) {
        dl_s[r] = d;
        float l2 = 0.f;
        if (orow) {
            const long i = ((long)b * bs + x / grp) * a.n_heads + g * grp + x % grp;
            gr.delta[i] = d;
            l2 = a.lse[i] * LOG2E;
        }
        lse_s[r] = l2;
    }
}

/* The query pass's output rows x and x + 8 of the CTA's (block b, kv head g) group: scale * dQ as
 * fp32; acc in the accumulator layout (HD / 8 n8 tiles). */
template <int HD>
__device__ __forceinline__ void store_dq(const gk_dflash_attn &a, const gk_dflash_attn_grad &gr, const float (*acc)[4],
                                         int b, int g, int x, int lane)
{
    const int bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int xr = x + hr * 8;
        if (xr >= R) continue;
        const long qrow = (long)b * bs + xr / grp;
        float *dq = gr.dq + qrow * gr.dq_stride + (long)(g * grp + xr % grp) * HD + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(float2 *)(dq + dt * 8) = make_float2(acc[dt][2 * hr] * a.scale, acc[dt][2 * hr + 1] * a.scale);
    }
}

/* dQ query-major: S = Q K^T and dP = dO V^T per key tile, dS = P (dP - delta), dQ += dS K.
 * Also writes delta = rowsum(dO o) for the key-major pass. */
template <int HD>
__global__ void __launch_bounds__(MW * 32) bwd_q_mma(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
    constexpr int LDS = HD + MPAD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sD = sQ + MB * LDS, *sK = sD + MB * LDS, *sV = sK + 2 * MB * LDS;
    float *lse_s = (float *)(sV + 2 * MB * LDS), *dl_s = lse_s + MB;
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int r0 = blockIdx.z * MB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mi = lane >> 3, ri = lane & 7;
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs, n_tiles = (nk + MB - 1) / MB;
    const bf16 *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc, *kb = (const bf16 *)a.kb, *vb = (const bf16 *)a.vb;
    const float sl2 = a.scale * LOG2E;

    cp_rows<HD>(sQ, MB, a.q, [&](int r) { return qrow_ptr(a.q, a.q_stride, b, bs, grp, g, HD, r0 + r, R); });
    cp_rows<HD>(sD, MB, a.q, [&](int r) { return qrow_ptr(gr.dout, gr.dout_stride, b, bs, grp, g, HD, r0 + r, R); });
    cp_rows<HD>(sK, MB, a.q, [&](int j) { return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, j); });
    cp_rows<HD>(sV, MB, a.q, [&](int j) { return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, j); });
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    row_stats<HD>(a, gr, b, g, r0, lse_s, dl_s, [&](int r, int c) { return sD + r * LDS + c * 8; });
    __syncthreads();
    uint32_t qf[HD / 16][4], df[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        ld_a<LDS>(qf[kk], sQ, warp, kk, mi, ri);
        ld_a<LDS>(df[kk], sD, warp, kk, mi, ri);
    }
    const int row_a = warp * 16 + (lane >> 2);      /* this thread's rows: row_a, row_a + 8 */
    const float lse2[2] = { lse_s[row_a], lse_s[row_a + 8] }, dl[2] = { dl_s[row_a], dl_s[row_a + 8] };
    float acc[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int t = 0; t < n_tiles; t++) {
        if (t > 0) {
            cp_async_wait_all();
            __syncthreads();
        }
        if (t + 1 < n_tiles) {
            const int t1 = (t + 1) * MB, nb_ = (t + 1) & 1;
            cp_rows<HD>(sK + nb_ * MB * LDS, MB, a.q, [&](int j) {
                return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, t1 + j); });
            cp_rows<HD>(sV + nb_ * MB * LDS, MB, a.q, [&](int j) {
                return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, t1 + j); });
        }
        cp_async_commit();
        const bf16 *tK = sK + (t & 1) * MB * LDS, *tV = sV + (t & 1) * MB * LDS;
        float s[MB / 8][4], dp[MB / 8][4];
#pragma unroll
        for (int i = 0; i < MB / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            mma_nt_step<LDS, MB / 8>(s, qf[kk], tK, kk * 16, mi, ri);
            mma_nt_step<LDS, MB / 8>(dp, df[kk], tV, kk * 16, mi, ri);
        }
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = t * MB + nt * 8 + (lane & 3) * 2 + (e & 1), hr = e >> 1;
                float p = key < nk ? exp2f(s[nt][e] * sl2 - lse2[hr]) : 0.f;
                s[nt][e] = p * (dp[nt][e] - dl[hr]);
            }
        mma_pv<HD>(acc, s, tK, mi, ri);
    }
    cp_async_wait_all();
    store_dq<HD>(a, gr, acc, b, g, r0 + row_a, lane);
}

/* One unit of the key pass for warp `warp`'s 16 keys of the K, V tiles (this thread's keys
 * visible where kvis): S^T = K Q^T and dP^T = V dO^T over 64 query rows (the first `rows` of
 * them real), P^T and dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q. */
template <int HD>
__device__ __forceinline__ void kv_unit(float (*dk)[4], float (*dv)[4], const bf16 *sK, const bf16 *sV, const bf16 *sQ,
                                        const bf16 *sD, const float *lse_s, const float *dl_s, const bool kvis[2],
                                        int rows, float sl2, int warp, int lane)
{
    constexpr int LDS = HD + MPAD;
    const int mi = lane >> 3, ri = lane & 7;
    float st[MB / 8][4], dpt[MB / 8][4];
#pragma unroll
    for (int i = 0; i < MB / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t ka[4], va[4];
        ld_a<LDS>(ka, sK, warp, kk, mi, ri);
        ld_a<LDS>(va, sV, warp, kk, mi, ri);
        mma_nt_step<LDS, MB / 8>(st, ka, sQ, kk * 16, mi, ri);
        mma_nt_step<LDS, MB / 8>(dpt, va, sD, kk * 16, mi, ri);
    }
#pragma unroll
    for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = nt * 8 + (lane & 3) * 2 + (e & 1), hr = e >> 1;
            const float p = kvis[hr] && col < rows ? exp2f(st[nt][e] * sl2 - lse_s[col]) : 0.f;
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - dl_s[col]);
        }
    mma_pv<HD>(dv, st, sD, mi, ri);
    mma_pv<HD>(dk, dpt, sQ, mi, ri);
}

/* This thread's two keys (key_a, key_a + 8; those < n_keys) of the tile: scale * dK as fp32 at
 * dk_base + key * dks, dV as bf16 at dv_base + key * dvs. */
template <int HD>
__device__ __forceinline__ void store_kv(const float (*dk)[4], const float (*dv)[4], float *dk_base, long dks,
                                         bf16 *dv_base, long dvs, int key_a, int n_keys, int lane, float scale)
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int k = key_a + hr * 8;
        if (k >= n_keys) continue;
        float *dkp = dk_base + k * dks + (lane & 3) * 2;
        bf16 *dvp = dv_base + k * dvs + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            *(float2 *)(dkp + dt * 8) = make_float2(dk[dt][2 * hr] * scale, dk[dt][2 * hr + 1] * scale);
            *(__nv_bfloat162 *)(dvp + dt * 8) = __floats2bfloat162_rn(dv[dt][2 * hr], dv[dt][2 * hr + 1]);
        }
    }
}

/* dK, dV key-major: per (key tile, kv head), for every block that sees the tile and 64 of its
 * query rows at a time: S^T = K Q^T, dP^T = V dO^T, then dV += P^T dO, dK += dS^T Q. Warp w
 * owns keys [16w, 16w + 16) of the tile. Used for the blocks' own keys (tiles[tile0 + x]);
 * bwd_kv_mma2 below takes the context tiles. */
template <int HD>
__global__ void __launch_bounds__(MW * 32) bwd_kv_mma(gk_dflash_attn a, gk_dflash_attn_grad gr, int tile0)
{
    constexpr int LDS = HD + MPAD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = (bf16 *)smem, *sV = sK + MB * LDS, *sQ = sV + MB * LDS, *sD = sQ + MB * LDS;
    float *lse_s = (float *)(sD + MB * LDS), *dl_s = lse_s + MB;
    const gk_dflash_ktile tile = gr.tiles[tile0 + blockIdx.x];
    const int g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool self = tile.key0 < 0;
    const int bself = -1 - tile.key0, n_keys = tile.n_keys;
    const bf16 *kbase = self ? (const bf16 *)a.kb + (long)bself * bs * a.kb_stride
                             : (const bf16 *)a.kc + (long)tile.key0 * a.kc_stride;
    const bf16 *vbase = self ? (const bf16 *)a.vb + (long)bself * bs * a.vb_stride
                             : (const bf16 *)a.vc + (long)tile.key0 * a.vc_stride;
    const long ks = self ? a.kb_stride : a.kc_stride, vs = self ? a.vb_stride : a.vc_stride;
    const float sl2 = a.scale * LOG2E;

    cp_rows<HD>(sK, MB, a.q, [&](int j) -> const bf16 * { return j < n_keys ? kbase + j * ks + (long)g * HD : nullptr; });
    cp_rows<HD>(sV, MB, a.q, [&](int j) -> const bf16 * { return j < n_keys ? vbase + j * vs + (long)g * HD : nullptr; });
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    const int key_a = warp * 16 + (lane >> 2);      /* this thread's keys: key_a, key_a + 8 */

    const int nq = self ? 1 : tile.q1 - tile.q0;
    for (int qi = 0; qi < nq; qi++) {
        const int b = self ? bself : gr.qlist[tile.q0 + qi];
        const int ctx_end = a.blocks[b].ctx_end;
        bool kvis[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int k = key_a + hr * 8;
            kvis[hr] = k < n_keys && (self || tile.key0 + k < ctx_end);
        }
        for (int r0 = 0; r0 < R; r0 += MB) {
            __syncthreads();    /* the previous chunk's Q, dO, lse, delta are consumed */
            cp_rows<HD>(sQ, MB, a.q, [&](int r) { return qrow_ptr(a.q, a.q_stride, b, bs, grp, g, HD, r0 + r, R); });
            cp_rows<HD>(sD, MB, a.q, [&](int r) {
                return qrow_ptr(gr.dout, gr.dout_stride, b, bs, grp, g, HD, r0 + r, R); });
            cp_async_commit();
            for (int r = threadIdx.x; r < MB; r += MW * 32) {
                int x = r0 + r;
                long i = x < R ? ((long)b * bs + x / grp) * a.n_heads + g * grp + x % grp : 0;
                lse_s[r] = x < R ? a.lse[i] * LOG2E : 0.f;
                dl_s[r] = x < R ? gr.delta[i] : 0.f;
            }
            cp_async_wait_all();
            __syncthreads();
            kv_unit<HD>(dk, dv, sK, sV, sQ, sD, lse_s, dl_s, kvis, R - r0, sl2, warp, lane);
        }
    }
    if (self)
        store_kv<HD>(dk, dv, gr.dkb + (long)bself * bs * gr.dkb_stride + (long)g * HD, gr.dkb_stride,
                     (bf16 *)gr.dvb + (long)bself * bs * gr.dvb_stride + (long)g * HD, gr.dvb_stride, key_a, n_keys,
                     lane, a.scale);
    else
        store_kv<HD>(dk, dv, gr.dkc + (long)tile.key0 * gr.dkc_stride + (long)g * HD, gr.dkc_stride,
                     (bf16 *)gr.dvc + (long)tile.key0 * gr.dvc_stride + (long)g * HD, gr.dvc_stride, key_a, n_keys,
                     lane, a.scale);
}


/* dK, dV of a context key tile (gr.tiles[x / nkv], kv head x % nkv: a 1-D grid, as the tiles can
 * number more than a y dimension's 65535) with two warpgroups: warpgroup j takes the
 * work units j, j + 2, ... (a unit: 64 query rows of one block of the tile's list) and prefetches
 * its next unit's Q, dO, lse and delta while it computes the current one; at the end warpgroup 1
 * hands its sums to warpgroup 0 through shared memory (a fixed order: the same result every run).
 * Half the serial work of the one-warpgroup kernel on the tiles every block sees, and the heads of
 * a tile are next to each other in the grid, so the longest tiles start first. */
constexpr int KV_WG = 2;

__device__ __forceinline__ void wg_sync(int wg)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wg), "r"(MW * 32) : "memory");
}

template <int HD>
__global__ void __launch_bounds__(KV_WG * MW * 32) bwd_kv_mma2(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
    constexpr int LDS = HD + MPAD, TILE = MB * LDS;
    extern __shared__ __align__(16) unsigned char smem[];
    const int wg = threadIdx.x / (MW * 32), tid = threadIdx.x % (MW * 32), warp = tid >> 5, lane = tid & 31;
    bf16 *sK = (bf16 *)smem, *sV = sK + TILE;
    bf16 *sQD = sV + TILE + wg * 4 * TILE;                      /* this warpgroup's [2 buffers][Q, dO] */
    float *stat = (float *)(sK + (2 + 4 * KV_WG) * TILE) + wg * 4 * MB;    /* [2 buffers][lse, delta] */
    const gk_dflash_ktile tile = gr.tiles[blockIdx.x / a.n_kv_heads];
    if (tile.key0 < 0) return;      /* not a context tile: the plan's layout was not kept */
    const int g = blockIdx.x % a.n_kv_heads, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int n_keys = tile.n_keys, nch = (R + MB - 1) / MB, units = (tile.q1 - tile.q0) * nch;
    const bf16 *kbase = (const bf16 *)a.kc + (long)tile.key0 * a.kc_stride + (long)g * HD;
    const bf16 *vbase = (const bf16 *)a.vc + (long)tile.key0 * a.vc_stride + (long)g * HD;
    const float sl2 = a.scale * LOG2E;

    cp_rows<HD>(sK, MB, a.q, [&](int j) -> const bf16 * { return j < n_keys ? kbase + j * a.kc_stride : nullptr; },
                threadIdx.x, KV_WG * MW * 32);
    cp_rows<HD>(sV, MB, a.q, [&](int j) -> const bf16 * { return j < n_keys ? vbase + j * a.vc_stride : nullptr; },
                threadIdx.x, KV_WG * MW * 32);
    cp_async_commit();

    /* unit u: block qlist[q0 + u / nch], its query rows from (u % nch) * MB */
    const uint64_t gm = div_magic(grp);
    auto prefetch = [&](int u, int buf) {
        const int b = gr.qlist[tile.q0 + u / nch], r0 = (u % nch) * MB;
        bf16 *q = sQD + buf * 2 * TILE;
        cp_rows<HD>(q, MB, a.q, [&](int r) { return qrow_fast(a.q, a.q_stride, b, bs, grp, gm, g, HD, r0 + r, R); },
                    tid, MW * 32);
        cp_rows<HD>(q + TILE, MB, a.q, [&](int r) {
            return qrow_fast(gr.dout, gr.dout_stride, b, bs, grp, gm, g, HD, r0 + r, R); }, tid, MW * 32);
        float *st = stat + buf * 2 * MB;
        for (int r = tid; r < MB; r += MW * 32) {
            const int x = r0 + r, qr = div_by(x, gm);
            const long i = x < R ? ((long)b * bs + qr) * a.n_heads + g * grp + x - qr * grp : 0;
            st[r] = x < R ? a.lse[i] * LOG2E : 0.f;
            st[MB + r] = x < R ? gr.delta[i] : 0.f;
        }
    };
    if (wg < units) prefetch(wg, 0);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();    /* K, V from every thread; this warpgroup's first unit */

    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    const int key_a = warp * 16 + (lane >> 2);      /* this thread's keys: key_a, key_a + 8 */

    for (int u = wg, k = 0; u < units; u += KV_WG, k++) {
        if (u + KV_WG < units) prefetch(u + KV_WG, (k + 1) & 1);
        cp_async_commit();
        cp_async_wait_group1();
        wg_sync(wg);        /* unit u landed for the whole warpgroup */
        const bf16 *sQ = sQD + (k & 1) * 2 * TILE, *sD = sQ + TILE;
        const float *lse_s = stat + (k & 1) * 2 * MB, *dl_s = lse_s + MB;
        const int b = gr.qlist[tile.q0 + u / nch], r0 = (u % nch) * MB, ctx_end = a.blocks[b].ctx_end;
        bool kvis[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int kk = key_a + hr * 8;
            kvis[hr] = kk < n_keys && tile.key0 + kk < ctx_end;
        }
        kv_unit<HD>(dk, dv, sK, sV, sQ, sD, lse_s, dl_s, kvis, R - r0, sl2, warp, lane);
        wg_sync(wg);        /* buffer k & 1 is free for unit u + 2 * KV_WG */
    }
    cp_async_wait_all();

    /* warpgroup 1's sums to warpgroup 0, thread by thread, through its own (now idle) buffers */
    float4 *red = (float4 *)(sK + (2 + 4) * TILE);
    if (wg == 1) {
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            red[dt * MW * 32 + tid] = make_float4(dk[dt][0], dk[dt][1], dk[dt][2], dk[dt][3]);
            red[(HD / 8 + dt) * MW * 32 + tid] = make_float4(dv[dt][0], dv[dt][1], dv[dt][2], dv[dt][3]);
        }
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        const float4 x = red[dt * MW * 32 + tid], y = red[(HD / 8 + dt) * MW * 32 + tid];
        dk[dt][0] += x.x; dk[dt][1] += x.y; dk[dt][2] += x.z; dk[dt][3] += x.w;
        dv[dt][0] += y.x; dv[dt][1] += y.y; dv[dt][2] += y.z; dv[dt][3] += y.w;
    }
    store_kv<HD>(dk, dv, gr.dkc + (long)tile.key0 * gr.dkc_stride + (long)g * HD, gr.dkc_stride,
                 (bf16 *)gr.dvc + (long)tile.key0 * gr.dvc_stride + (long)g * HD, gr.dvc_stride, key_a, n_keys, lane,
                 a.scale);
}

/* ---- the key pass on Hopper's warpgroup MMA (sm_90a, head_dim 128) ----
 * bwd_kv_mma2's split (a tile and kv head per CTA, two warpgroups taking alternate units of 64
 * query rows, each prefetching its next unit) with each warpgroup's four products as wgmma over
 * 128-byte-swizzled tiles (wgmma.cuh): S^T = K Q^T and dP^T = V dO^T from shared memory, then
 * dV += P^T dO and dK += dS^T Q with P^T and dS^T from registers. One grid takes every tile of
 * the plan, the context tiles first and then the blocks' own keys (only their block's rows), which
 * fill the tail of the long context tiles. */
constexpr int SWT = MB * 128 * 2;       /* bytes of a swizzled [64 x 128] bf16 tile */
bool wgmma_ok();

/* rows [0, 64) of a swizzled tile at shared address tile from rowptr(r) (NULL: zeros) */
template <int NTHR, typename F>
__device__ __forceinline__ void cp_rows_sw(uint32_t tile, const void *any, F rowptr, int tid)
{
    const int ch = tid & 15;        /* a thread's chunk column is fixed; its rows are NTHR / 16 apart */
#pragma unroll
    for (int i = 0; i < MB * 16 / NTHR; i++) {
        const int r = (tid >> 4) + i * (NTHR / 16);
        const bf16 *src = rowptr(r);
        cp_async16(tile + sw128_off(r, ch, MB), src ? (const void *)(src + ch * 8) : any, src != nullptr);
    }
}

/* The same with row r (of this thread's: tid / 16 + i NTHR / 16) at p0 + i * step, rows from
 * nvalid on zeros: for rows evenly spaced in memory, no per-row address arithmetic. */
template <int NTHR>
__device__ __forceinline__ void cp_rows_sw_lin(uint32_t tile, const void *any, const bf16 *p0, long step, int nvalid,
                                               int tid)
{
    const int ch = tid & 15;
#pragma unroll
    for (int i = 0; i < MB * 16 / NTHR; i++) {
        const int r = (tid >> 4) + i * (NTHR / 16);
        const bool ok = r < nvalid;
        cp_async16(tile + sw128_off(r, ch, MB), ok ? (const void *)(p0 + i * step + ch * 8) : any, ok);
    }
}

#ifdef GK_WGMMA
/* 4 bytes at src (valid) or zeros to shared address dst, asynchronously */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
#endif

/* shared memory: K, V; per warpgroup two buffers of (Q, dO) and two of (lse, delta, ctx_end) */
constexpr int WG_STAT = 2 * MB + 4;     /* floats per stat buffer: lse, delta, ctx_end (an int), pad */
constexpr size_t bwd_kv_wg_smem() { return 1024 + (size_t)(2 + 4 * KV_WG) * SWT + KV_WG * 2 * WG_STAT * 4; }

__global__ void __launch_bounds__(KV_WG * MW * 32, 1) bwd_kv_wg(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
#ifdef GK_WGMMA
    constexpr int HD = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);    /* swizzle atoms */
    const int wg = threadIdx.x / (MW * 32), tid = threadIdx.x % (MW * 32), warp = tid >> 5, lane = tid & 31;
    const uint32_t sK = smem_u32(smem), sV = sK + SWT, sQD = sV + SWT + wg * 4 * SWT;
    float *stat = (float *)(smem + (2 + 4 * KV_WG) * SWT) + wg * 2 * WG_STAT;
    /* CTA x: tile x / nkv, kv head x % nkv (the heads of a tile adjacent; within a sequence the
     * plan puts the tiles every block sees first, so the longest start first) */
    const gk_dflash_ktile tile = gr.tiles[blockIdx.x / a.n_kv_heads];
    const int g = blockIdx.x % a.n_kv_heads, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    /* a context tile: the blocks qlist[q0..q1) see it; a block's own keys: only that block does */
    const bool self = tile.key0 < 0;
    const int bself = -1 - tile.key0, n_keys = tile.n_keys, nch = (R + MB - 1) / MB;
    const int units = (self ? 1 : tile.q1 - tile.q0) * nch;
    const long ks = self ? a.kb_stride : a.kc_stride, vs = self ? a.vb_stride : a.vc_stride;
    const bf16 *kbase = self ? (const bf16 *)a.kb + (long)bself * bs * ks : (const bf16 *)a.kc + (long)tile.key0 * ks;
    const bf16 *vbase = self ? (const bf16 *)a.vb + (long)bself * bs * vs : (const bf16 *)a.vc + (long)tile.key0 * vs;
    kbase += (long)g * HD;
    vbase += (long)g * HD;
    const float sl2 = a.scale * LOG2E;

    cp_rows_sw<KV_WG * MW * 32>(sK, a.q, [&](int j) -> const bf16 * { return j < n_keys ? kbase + j * ks : nullptr; },
                                threadIdx.x);
    cp_rows_sw<KV_WG * MW * 32>(sV, a.q, [&](int j) -> const bf16 * { return j < n_keys ? vbase + j * vs : nullptr; },
                                threadIdx.x);
    const uint64_t gm = div_magic(grp);
    const bool lin_rows = 8 % grp == 0;
    cp_async_commit();

    /* A unit: query rows [MB c, MB c + MB) of the q-th block of the tile's list; this warpgroup's
     * units are KV_WG apart: cursors step without a division (nch is usually 1). */
    struct cursor { int q, c; };
    auto step = [&](cursor x) {
        x.c += KV_WG;
        while (x.c >= nch) { x.c -= nch; x.q++; }
        return x;
    };
    auto block_of = [&](cursor x) { return self ? bself : gr.qlist[tile.q0 + x.q]; };
    /* a unit into buffer buf, all of it asynchronously: Q, dO, lse and delta of its rows, the
     * block's ctx_end */
    auto prefetch = [&](cursor x, int buf, int b) {
        const int r0 = x.c * MB;
        const uint32_t q = sQD + buf * 2 * SWT;
        if (lin_rows) {     /* this thread's rows, 8 apart, are 8 / grp block rows apart, same head */
            const int x0 = r0 + (tid >> 4), qr = div_by(x0, gm);
            const long row = (long)b * bs + qr, col = (long)(g * grp + x0 - qr * grp) * HD;
            cp_rows_sw_lin<MW * 32>(q, a.q, (const bf16 *)a.q + row * a.q_stride + col, (8 / grp) * a.q_stride,
                                    R - r0, tid);
            cp_rows_sw_lin<MW * 32>(q + SWT, a.q, (const bf16 *)gr.dout + row * gr.dout_stride + col,
                                    (8 / grp) * gr.dout_stride, R - r0, tid);
        } else {
            cp_rows_sw<MW * 32>(q, a.q, [&](int r) {
                return qrow_fast(a.q, a.q_stride, b, bs, grp, gm, g, HD, r0 + r, R); }, tid);
            cp_rows_sw<MW * 32>(q + SWT, a.q, [&](int r) {
                return qrow_fast(gr.dout, gr.dout_stride, b, bs, grp, gm, g, HD, r0 + r, R); }, tid);
        }
        const uint32_t st = smem_u32(stat + buf * WG_STAT);
        for (int r = tid; r < MB; r += MW * 32) {
            const int x = r0 + r, qr = div_by(x, gm);
            const long i = x < R ? ((long)b * bs + qr) * a.n_heads + g * grp + x - qr * grp : 0;
            cp_async4(st + r * 4, a.lse + i, x < R);
            cp_async4(st + (MB + r) * 4, gr.delta + i, x < R);
        }
        if (tid == 0) cp_async4(st + 2 * MB * 4, &a.blocks[b].ctx_end, true);
    };
    cursor cur = { wg / nch, wg % nch };            /* unit wg: this warpgroup's first */
    cursor pf = step(cur), nx = step(pf);           /* the next two of this warpgroup's units */
    if (wg < units) prefetch(cur, 0, block_of(cur));
    int b_next = wg + KV_WG < units ? block_of(pf) : 0;     /* the block of the unit prefetched next */
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();    /* K, V from every thread; this warpgroup's first unit */

    float dk[HD / 2], dv[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;
    const int key_a = warp * 16 + (lane >> 2);      /* this thread's keys: key_a, key_a + 8 */

    for (int u = wg, k = 0; u < units; u += KV_WG, k++) {
        if (u + KV_WG < units) prefetch(pf, (k + 1) & 1, b_next);
        b_next = u + 2 * KV_WG < units ? block_of(nx) : 0;     /* read now, used an iteration later */
        const int rows = R - cur.c * MB;
        cur = pf;
        pf = nx;
        nx = step(nx);
        cp_async_commit();
        cp_async_wait_group1();
        fence_proxy_async();
        wg_sync(wg);        /* unit u landed for the whole warpgroup */
        const uint32_t sQ = sQD + (k & 1) * 2 * SWT, sD = sQ + SWT;
        const float *lse_s = stat + (k & 1) * WG_STAT, *dl_s = lse_s + MB;
        const int ctx_end = self ? 0 : *(const int *)(lse_s + 2 * MB);

        float st[MB / 2], dpt[MB / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_m64n64_ss(st, wg_desc_k(sK, MB, kk), wg_desc_k(sQ, MB, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_m64n64_ss(dpt, wg_desc_k(sV, MB, kk), wg_desc_k(sD, MB, kk), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_pin(st);
        wg_pin(dpt);

        bool kvis[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int kk = key_a + hr * 8;
            kvis[hr] = kk < n_keys && (self || tile.key0 + kk < ctx_end);
        }
        uint32_t pa[MB / 16][4], sa[MB / 16][4];
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++) {
            float p[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = nt * 8 + (lane & 3) * 2 + (e & 1);
                p[e] = kvis[e >> 1] && col < rows ? exp2f(fmaf(st[nt * 4 + e], sl2, -LOG2E * lse_s[col])) : 0.f;
                ds[e] = p[e] * (dpt[nt * 4 + e] - dl_s[col]);
            }
            pa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(p[0], p[1]);
            pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(p[2], p[3]);
            sa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(ds[0], ds[1]);
            sa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(ds[2], ds[3]);
        }
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < MB / 16; kt++) wgmma_m64n128_rs_nt(dv, pa[kt], wg_desc_n(sD, MB, kt), 1);
#pragma unroll
        for (int kt = 0; kt < MB / 16; kt++) wgmma_m64n128_rs_nt(dk, sa[kt], wg_desc_n(sQ, MB, kt), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin(dv);
        wg_pin(dk);
        wg_sync(wg);        /* buffer k & 1 is free for unit u + 2 * KV_WG */
    }
    cp_async_wait_all();

    /* warpgroup 1's sums to warpgroup 0 through its own (now idle) buffers, in a fixed order */
    static_assert(KV_WG == 2 && 2 * (HD / 8) * MW * 32 * 16 <= 4 * SWT, "the reduction area is warpgroup 1's buffers");
    float4 *red = (float4 *)(smem + (2 + 4) * SWT);
    if (wg == 1) {
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            red[dt * MW * 32 + tid] = make_float4(dk[4 * dt], dk[4 * dt + 1], dk[4 * dt + 2], dk[4 * dt + 3]);
            red[(HD / 8 + dt) * MW * 32 + tid] = make_float4(dv[4 * dt], dv[4 * dt + 1], dv[4 * dt + 2], dv[4 * dt + 3]);
        }
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        const float4 x = red[dt * MW * 32 + tid], y = red[(HD / 8 + dt) * MW * 32 + tid];
        dk[4 * dt] += x.x; dk[4 * dt + 1] += x.y; dk[4 * dt + 2] += x.z; dk[4 * dt + 3] += x.w;
        dv[4 * dt] += y.x; dv[4 * dt + 1] += y.y; dv[4 * dt + 2] += y.z; dv[4 * dt + 3] += y.w;
    }
    if (self)
        store_kv<HD>((const float (*)[4])dk, (const float (*)[4])dv,
                     gr.dkb + (long)bself * bs * gr.dkb_stride + (long)g * HD, gr.dkb_stride,
                     (bf16 *)gr.dvb + (long)bself * bs * gr.dvb_stride + (long)g * HD, gr.dvb_stride, key_a, n_keys,
                     lane, a.scale);
    else
        store_kv<HD>((const float (*)[4])dk, (const float (*)[4])dv,
                     gr.dkc + (long)tile.key0 * gr.dkc_stride + (long)g * HD, gr.dkc_stride,
                     (bf16 *)gr.dvc + (long)tile.key0 * gr.dvc_stride + (long)g * HD, gr.dvc_stride, key_a, n_keys,
                     lane, a.scale);
#else
    __trap();   /* launched only where gk_dflash_attn_has_wgmma() */
#endif
}

/* ---- the forward and the backward's query pass on warpgroup MMA (sm_90a, head_dim 128) ----
 * The CTAs of fwd_mma / bwd_q_mma (64 query rows of one block and kv head: one warpgroup), the
 * block's keys streamed in tiles of 64 through two swizzled buffers: S = Q K^T (and dP = dO V^T)
 * from shared memory, then O += P V (dQ += dS K) with P (dS) from registers. */
template <typename F>
__device__ __forceinline__ void cp_keys_sw(uint32_t tile, const void *any, F keyptr, int tid)
{
    cp_rows_sw<MW * 32>(tile, any, keyptr, tid);
}

/* Keys [k0, k0 + 64) of block b (its context, then its own rows) into swizzled K and V tiles of
 * kv head blockIdx.y; a tile inside the context by evenly spaced rows. */
template <int HD>
__device__ __forceinline__ void load_key_tile(uint32_t tK, uint32_t tV, const gk_dflash_attn &a,
                                              const gk_dflash_block &blk, int b, int k0, int tid)
{
    const int g = blockIdx.y, bs = a.block_size;
    if (k0 + MB <= blk.ctx_end - blk.ctx0) {
        const long r = blk.ctx0 + k0 + (tid >> 4);
        cp_rows_sw_lin<MW * 32>(tK, a.q, (const bf16 *)a.kc + r * a.kc_stride + (long)g * HD, 8 * a.kc_stride, MB, tid);
        cp_rows_sw_lin<MW * 32>(tV, a.q, (const bf16 *)a.vc + r * a.vc_stride + (long)g * HD, 8 * a.vc_stride, MB, tid);
        return;
    }
    const bf16 *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc, *kb = (const bf16 *)a.kb, *vb = (const bf16 *)a.vb;
    cp_keys_sw(tK, a.q, [&](int j) { return key_row(kc, a.kc_stride, kb, a.kb_stride, blk, b, bs, g, HD, k0 + j); }, tid);
    cp_keys_sw(tV, a.q, [&](int j) { return key_row(vc, a.vc_stride, vb, a.vb_stride, blk, b, bs, g, HD, k0 + j); }, tid);
}

constexpr size_t fwd_wg_smem() { return 1024 + (size_t)5 * SWT; }                 /* Q, K[2], V[2] */
constexpr size_t bwd_q_wg_smem() { return 1024 + (size_t)6 * SWT + 2 * MB * 4; }  /* Q, dO, K[2], V[2]; lse, delta */

__global__ void __launch_bounds__(MW * 32, 2) fwd_wg(gk_dflash_attn a)
{
#ifdef GK_WGMMA
    constexpr int HD = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sQ = smem_u32(smem), sK = sQ + SWT, sV = sK + 2 * SWT;
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int r0 = blockIdx.z * MB, tid = threadIdx.x, lane = tid & 31;
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs, n_tiles = (nk + MB - 1) / MB;
    const float sl2 = a.scale * LOG2E;

    cp_keys_sw(sQ, a.q, [&](int r) { return qrow_ptr(a.q, a.q_stride, b, bs, grp, g, HD, r0 + r, R); }, tid);
    load_key_tile<HD>(sK, sV, a, blk, b, 0, tid);
    cp_async_commit();

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    float mrow[2] = { -INFINITY, -INFINITY }, lrow[2] = { 0.f, 0.f };

    for (int t = 0; t < n_tiles; t++) {
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();    /* tile t landed; tile t - 1's buffers are free (its MMAs were waited for) */
        if (t + 1 < n_tiles)
            load_key_tile<HD>(sK + ((t + 1) & 1) * SWT, sV + ((t + 1) & 1) * SWT, a, blk, b, (t + 1) * MB, tid);
        cp_async_commit();
        const uint32_t tK = sK + (t & 1) * SWT, tV = sV + (t & 1) * SWT;
        float s[MB / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) wgmma_m64n64_ss(s, wg_desc_k(sQ, MB, kk), wg_desc_k(tK, MB, kk), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_pin(s);
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = t * MB + nt * 8 + (lane & 3) * 2 + (e & 1);
                s[nt * 4 + e] = key < nk ? s[nt * 4 + e] * sl2 : -INFINITY;
            }
        float corr[2];
        online_softmax((float (*)[4])s, mrow, lrow, corr);
        uint32_t pa[MB / 16][4];
#pragma unroll
        for (int kt = 0; kt < MB / 16; kt++) {
            pa[kt][0] = pack_bf16x2(s[8 * kt], s[8 * kt + 1]);
            pa[kt][1] = pack_bf16x2(s[8 * kt + 2], s[8 * kt + 3]);
            pa[kt][2] = pack_bf16x2(s[8 * kt + 4], s[8 * kt + 5]);
            pa[kt][3] = pack_bf16x2(s[8 * kt + 6], s[8 * kt + 7]);
        }
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            o[4 * dt] *= corr[0]; o[4 * dt + 1] *= corr[0];
            o[4 * dt + 2] *= corr[1]; o[4 * dt + 3] *= corr[1];
        }
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < MB / 16; kt++) wgmma_m64n128_rs_nt(o, pa[kt], wg_desc_n(tV, MB, kt), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin(o);
    }
    cp_async_wait_all();
    store_o<HD>(a, (const float (*)[4])o, mrow, lrow, b, g, r0 + (tid >> 5) * 16 + (lane >> 2), lane);
#else
    __trap();   /* launched only where gk_dflash_attn_has_wgmma() */
#endif
}

/* dQ (and delta = rowsum(dO o) for the key pass) */
__global__ void __launch_bounds__(MW * 32, 2) bwd_q_wg(gk_dflash_attn a, gk_dflash_attn_grad gr)
{
#ifdef GK_WGMMA
    constexpr int HD = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sQ = smem_u32(smem), sD = sQ + SWT, sK = sD + SWT, sV = sK + 2 * SWT;
    float *lse_s = (float *)(smem + 6 * SWT), *dl_s = lse_s + MB;
    const int b = blockIdx.x, g = blockIdx.y, bs = a.block_size, grp = a.n_heads / a.n_kv_heads, R = bs * grp;
    const int r0 = blockIdx.z * MB, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const gk_dflash_block blk = a.blocks[b];
    const int nk = blk.ctx_end - blk.ctx0 + bs, n_tiles = (nk + MB - 1) / MB;
    const float sl2 = a.scale * LOG2E;

    cp_keys_sw(sQ, a.q, [&](int r) { return qrow_ptr(a.q, a.q_stride, b, bs, grp, g, HD, r0 + r, R); }, tid);
    cp_keys_sw(sD, a.q, [&](int r) { return qrow_ptr(gr.dout, gr.dout_stride, b, bs, grp, g, HD, r0 + r, R); }, tid);
    load_key_tile<HD>(sK, sV, a, blk, b, 0, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    row_stats<HD>(a, gr, b, g, r0, lse_s, dl_s, [&](int r, int c) {    /* dO from the swizzled tile */
        return (const bf16 *)(smem + (sD - sQ) + sw128_off(r, c, MB)); });
    fence_proxy_async();
    __syncthreads();
    const int row_a = warp * 16 + (lane >> 2);      /* this thread's rows: row_a, row_a + 8 */
    const float nl2[2] = { -lse_s[row_a], -lse_s[row_a + 8] }, dl[2] = { dl_s[row_a], dl_s[row_a + 8] };
    float dq[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

    for (int t = 0; t < n_tiles; t++) {
        if (t > 0) {
            cp_async_wait_all();
            fence_proxy_async();
            __syncthreads();    /* tile t landed; tile t - 1's buffers are free */
        }
        if (t + 1 < n_tiles)
            load_key_tile<HD>(sK + ((t + 1) & 1) * SWT, sV + ((t + 1) & 1) * SWT, a, blk, b, (t + 1) * MB, tid);
        cp_async_commit();
        const uint32_t tK = sK + (t & 1) * SWT, tV = sV + (t & 1) * SWT;
        float s[MB / 2], dp[MB / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) wgmma_m64n64_ss(s, wg_desc_k(sQ, MB, kk), wg_desc_k(tK, MB, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) wgmma_m64n64_ss(dp, wg_desc_k(sD, MB, kk), wg_desc_k(tV, MB, kk), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_pin(s);
        wg_pin(dp);
        uint32_t sa[MB / 16][4];
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++) {
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = t * MB + nt * 8 + (lane & 3) * 2 + (e & 1), hr = e >> 1;
                const float p = key < nk ? exp2f(fmaf(s[nt * 4 + e], sl2, nl2[hr])) : 0.f;
                ds[e] = p * (dp[nt * 4 + e] - dl[hr]);
            }
            sa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(ds[0], ds[1]);
            sa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(ds[2], ds[3]);
        }
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < MB / 16; kt++) wgmma_m64n128_rs_nt(dq, sa[kt], wg_desc_n(tK, MB, kt), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin(dq);
    }
    cp_async_wait_all();
    store_dq<HD>(a, gr, (const float (*)[4])dq, b, g, r0 + row_a, lane);
#else
    __trap();   /* launched only where gk_dflash_attn_has_wgmma() */
#endif
}

template <int HD> size_t fwd_mma_smem() { return (size_t)4 * MB * (HD + MPAD) * 2; }
template <int HD> size_t bwd_q_mma_smem() { return (size_t)6 * MB * (HD + MPAD) * 2 + 2 * MB * 4; }
template <int HD> size_t bwd_kv_mma_smem() { return (size_t)4 * MB * (HD + MPAD) * 2 + 2 * MB * 4; }
/* K, V; per warpgroup two buffers of Q, dO; per warpgroup two buffers of lse, delta */
template <int HD> size_t bwd_kv_mma2_smem() { return (size_t)(2 + 4 * KV_WG) * MB * (HD + MPAD) * 2 + KV_WG * 4 * MB * 4; }

template <int HD>
int launch_fwd_mma(const gk_dflash_attn *a, cudaStream_t stream)
{
    int R = a->block_size * (a->n_heads / a->n_kv_heads);
    dim3 grid((unsigned)a->n_blocks, (unsigned)a->n_kv_heads, (unsigned)((R + MB - 1) / MB));
    if (HD == 128 && a->impl != GK_DFLASH_MMA && wgmma_ok()) {
        if (cudaFuncSetAttribute(fwd_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_wg_smem()) != cudaSuccess)
            return -DF_ECUDA;
        fwd_wg<<<grid, MW * 32, fwd_wg_smem(), stream>>>(*a);
        GK_LAUNCH_CHECK();
        return 0;
    }
    size_t sm = fwd_mma_smem<HD>();
    if (cudaFuncSetAttribute(fwd_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess)
        return -DF_ECUDA;
    fwd_mma<HD><<<grid, MW * 32, sm, stream>>>(*a);
    GK_LAUNCH_CHECK();
    return 0;
}

template <int HD>
int launch_bwd_mma(const gk_dflash_attn *a, const gk_dflash_attn_grad *g, cudaStream_t stream)
{
    size_t sq = bwd_q_mma_smem<HD>(), skv = bwd_kv_mma_smem<HD>(), skv2 = bwd_kv_mma2_smem<HD>();
    if (cudaFuncSetAttribute(bwd_q_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq) != cudaSuccess ||
        cudaFuncSetAttribute(bwd_kv_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv) != cudaSuccess ||
        cudaFuncSetAttribute(bwd_kv_mma2<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv2) != cudaSuccess)
        return -DF_ECUDA;
    int R = a->block_size * (a->n_heads / a->n_kv_heads);
    long kvd = (long)a->n_kv_heads * HD;
    if (g->n_ctx > 0) {
        if (cudaMemset2DAsync(g->dkc, g->dkc_stride * 4, 0, kvd * 4, g->n_ctx, stream) != cudaSuccess ||
            cudaMemset2DAsync(g->dvc, g->dvc_stride * 2, 0, kvd * 2, g->n_ctx, stream) != cudaSuccess)
            return -DF_ECUDA;
    }
    dim3 grid((unsigned)a->n_blocks, (unsigned)a->n_kv_heads, (unsigned)((R + MB - 1) / MB));
    const bool wg = HD == 128 && a->impl != GK_DFLASH_MMA && wgmma_ok();
    if (wg) {
        if (cudaFuncSetAttribute(bwd_q_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bwd_q_wg_smem()) !=
            cudaSuccess)
            return -DF_ECUDA;
        bwd_q_wg<<<grid, MW * 32, bwd_q_wg_smem(), stream>>>(*a, *g);
    } else {
        bwd_q_mma<HD><<<grid, MW * 32, sq, stream>>>(*a, *g);
    }
    GK_LAUNCH_CHECK();
    /* gk_dflash_plan's layout: the context tiles, then one tile of own keys per block */
    int n_self = std::min(g->n_tiles, a->n_blocks), n_ctx_tiles = g->n_tiles - n_self;
    if (wg) {   /* every tile in one grid: the blocks' own keys fill the context tiles' tail */
        const size_t sw = bwd_kv_wg_smem();
        if (g->n_tiles == 0) return 0;
        if (cudaFuncSetAttribute(bwd_kv_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw) != cudaSuccess)
            return -DF_ECUDA;
        bwd_kv_wg<<<(unsigned)g->n_tiles * (unsigned)a->n_kv_heads, KV_WG * MW * 32, sw, stream>>>(*a, *g);
        GK_LAUNCH_CHECK();
        return 0;
    }
    if (n_ctx_tiles > 0) {
        bwd_kv_mma2<HD><<<(unsigned)n_ctx_tiles * (unsigned)a->n_kv_heads, KV_WG * MW * 32, skv2, stream>>>(*a, *g);
        GK_LAUNCH_CHECK();
    }
    if (n_self > 0) {
        bwd_kv_mma<HD><<<dim3((unsigned)n_self, (unsigned)a->n_kv_heads), MW * 32, skv, stream>>>(*a, *g, n_ctx_tiles);
        GK_LAUNCH_CHECK();
    }
    return 0;
}

/* Writes 1 where this code was compiled with the warpgroup MMA (the sm_90a build the driver
 * loaded), 0 where it is the compute_90 PTX (another GPU, or CUDA_FORCE_PTX_JIT): there the wgmma
 * kernels' bodies are a trap. */
#ifdef GK_SM90A
__global__ void wgmma_probe(int *out)
{
#ifdef GK_WGMMA
    *out = 1;
#else
    *out = 0;
#endif
}
#endif

/* The wgmma kernels need a Hopper GPU (compute capability 9.0) running this build's sm_90a code
 * (the Makefile defines GK_SM90A with it): asked once per device (drafter_cuda_create asks, through
 * gk_dflash_attn_smem, before any step), the probe on a stream of its own. A probe that cannot run
 * answers no for good (mma.sync from then on): asked again, it would allocate and wait inside the
 * steps, and a forward and its backward could take different kernels. */
bool wgmma_ok()
{
#ifdef GK_SM90A
    static gk_device_cache known;
    return gk_device_once(known, [](int dev) {
        int major = 0, minor = 0, got = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        if (major != 9 || minor != 0) return 0;
        cudaStream_t st = nullptr;
        int *d = nullptr;
        if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        void *args[] = { &d };
        bool ok = cudaMalloc((void **)&d, sizeof(int)) == cudaSuccess &&    /* (no pool needed) */
                  cudaLaunchKernel((const void *)wgmma_probe, dim3(1), dim3(1), args, 0, st) == cudaSuccess &&
                  cudaMemcpyAsync(&got, d, sizeof(int), cudaMemcpyDeviceToHost, st) == cudaSuccess;
        ok = cudaStreamSynchronize(st) == cudaSuccess && ok;
        if (d) cudaFree(d);
        cudaStreamDestroy(st);
        if (!ok) {
            (void)cudaGetLastError();
            return 0;
        }
        return got == 1 ? 1 : 0;        /* 0: the sm_90a code is not what runs (PTX) */
    }) == 1;
#else
    return false;
#endif
}

bool use_mma(const gk_dflash_attn *a)
{
    return a->impl != GK_DFLASH_SIMPLE && (a->head_dim == 64 || a->head_dim == 128);
}

template <int HD> size_t fwd_smem() { return (size_t)(QT + 2 * KT) * Geo<HD>::LD * 2 + (size_t)QT * (KT + 1) * 4; }
template <int HD> size_t bwd_q_smem() { return (size_t)(2 * QT + 2 * KT) * Geo<HD>::LD * 2 + (size_t)QT * (KT + 1) * 4; }
template <int HD> size_t bwd_kv_smem()
{
    return (size_t)(2 * QT + 2 * KT) * Geo<HD>::LD * 2 + (size_t)2 * QT * (KT + 1) * 4 + (size_t)2 * QT * 4;
}

template <int HD>
int launch_fwd(const gk_dflash_attn *a, cudaStream_t stream)
{
    size_t sm = fwd_smem<HD>();
    if (cudaFuncSetAttribute(fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess)
        return -DF_ECUDA;
    int R = a->block_size * (a->n_heads / a->n_kv_heads);
    dim3 grid((unsigned)a->n_blocks, (unsigned)a->n_kv_heads, (unsigned)((R + QT - 1) / QT));
    fwd_kernel<HD><<<grid, NT, sm, stream>>>(*a);
    GK_LAUNCH_CHECK();
    return 0;
}

template <int HD>
int launch_bwd(const gk_dflash_attn *a, const gk_dflash_attn_grad *g, cudaStream_t stream)
{
    size_t sq = bwd_q_smem<HD>(), skv = bwd_kv_smem<HD>();
    if (cudaFuncSetAttribute(bwd_q_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq) != cudaSuccess ||
        cudaFuncSetAttribute(bwd_kv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv) != cudaSuccess)
        return -DF_ECUDA;
    int R = a->block_size * (a->n_heads / a->n_kv_heads);
    long kvd = (long)a->n_kv_heads * HD;
    if (g->n_ctx > 0) {
        if (cudaMemset2DAsync(g->dkc, g->dkc_stride * 4, 0, kvd * 4, g->n_ctx, stream) != cudaSuccess ||
            cudaMemset2DAsync(g->dvc, g->dvc_stride * 2, 0, kvd * 2, g->n_ctx, stream) != cudaSuccess)
            return -DF_ECUDA;
    }
    dim3 grid((unsigned)a->n_blocks, (unsigned)a->n_kv_heads, (unsigned)((R + QT - 1) / QT));
    bwd_q_kernel<HD><<<grid, NT, sq, stream>>>(*a, *g);
    GK_LAUNCH_CHECK();
    if (g->n_tiles > 0) {
        bwd_kv_kernel<HD><<<dim3((unsigned)g->n_tiles, (unsigned)a->n_kv_heads), NT, skv, stream>>>(*a, *g);
        GK_LAUNCH_CHECK();
    }
    return 0;
}

bool check_args(const gk_dflash_attn *a)
{
    int hd = a->head_dim;
    /* the kv heads are a y grid dimension (at most 65535) of the query-major kernels */
    if (a->n_blocks < 0 || a->block_size < 1 || a->block_size > KT || a->n_heads <= 0 ||
        a->n_kv_heads <= 0 || a->n_kv_heads > 65535 || a->n_heads % a->n_kv_heads)
        return false;
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256) return false;
    if ((long)a->block_size * (a->n_heads / a->n_kv_heads) + MB >= 65536) return false;    /* div_by's range */
    if (a->impl < GK_DFLASH_AUTO || a->impl > GK_DFLASH_WGMMA || (a->impl == GK_DFLASH_MMA && hd != 64 && hd != 128) ||
        (a->impl == GK_DFLASH_WGMMA && (hd != 128 || !wgmma_ok())))
        return false;
    long qd = (long)a->n_heads * hd, kvd = (long)a->n_kv_heads * hd;
    if (a->q_stride < qd || a->o_stride < qd || a->kc_stride < kvd || a->vc_stride < kvd ||
        a->kb_stride < kvd || a->vb_stride < kvd)
        return false;
    return a->blocks && a->lse && gk_vec_ok(a->q, a->q_stride) && gk_vec_ok(a->kc, a->kc_stride) &&
           gk_vec_ok(a->vc, a->vc_stride) && gk_vec_ok(a->kb, a->kb_stride) &&
           gk_vec_ok(a->vb, a->vb_stride) && gk_vec_ok(a->o, a->o_stride);
}

} // namespace

extern "C" int gk_dflash_attn_fwd(const gk_dflash_attn *a, cudaStream_t stream)
{
    if (!a || !check_args(a)) return -EINVAL;
    if (a->n_blocks == 0) return 0;
    if (use_mma(a))
        return a->head_dim == 128 ? launch_fwd_mma<128>(a, stream) : launch_fwd_mma<64>(a, stream);
    switch (a->head_dim) {
    case 16: return launch_fwd<16>(a, stream);
    case 32: return launch_fwd<32>(a, stream);
    case 64: return launch_fwd<64>(a, stream);
    case 128: return launch_fwd<128>(a, stream);
    default: return launch_fwd<256>(a, stream);
    }
}

extern "C" int gk_dflash_attn_bwd(const gk_dflash_attn *a, const gk_dflash_attn_grad *g, cudaStream_t stream)
{
    if (!a || !g || !check_args(a)) return -EINVAL;
    long qd = (long)a->n_heads * a->head_dim, kvd = (long)a->n_kv_heads * a->head_dim;
    if (g->n_ctx < 0 || g->n_tiles < 0 || (g->n_tiles && (!g->tiles || !g->qlist)) || !g->delta ||
        g->dq_stride < qd || g->dkc_stride < kvd || g->dvc_stride < kvd || g->dkb_stride < kvd ||
        g->dvb_stride < kvd || g->dvc_stride % 2 || g->dvb_stride % 2 ||
        !gk_vec_ok(g->dout, g->dout_stride) || !g->dq || !g->dkc || !g->dvc || !g->dkb || !g->dvb)
        return -EINVAL;
    if ((long)g->n_tiles * a->n_kv_heads > INT_MAX)
        return -EINVAL;     /* the key pass's 1-D grids: a CTA per (tile, kv head) */
    if (use_mma(a) && (g->dq_stride % 2 || g->dkc_stride % 2 || g->dkb_stride % 2 || (uintptr_t)g->dq % 8 ||
                       (uintptr_t)g->dkc % 8 || (uintptr_t)g->dkb % 8))
        return -EINVAL;     /* the tensor-core kernels store float2 */
    if (a->n_blocks == 0) {
        if (g->n_ctx > 0 &&
            (cudaMemset2DAsync(g->dkc, g->dkc_stride * 4, 0, kvd * 4, g->n_ctx, stream) != cudaSuccess ||
             cudaMemset2DAsync(g->dvc, g->dvc_stride * 2, 0, kvd * 2, g->n_ctx, stream) != cudaSuccess))
            return -DF_ECUDA;
        return 0;
    }
    if (use_mma(a))
        return a->head_dim == 128 ? launch_bwd_mma<128>(a, g, stream) : launch_bwd_mma<64>(a, g, stream);
    switch (a->head_dim) {
    case 16: return launch_bwd<16>(a, g, stream);
    case 32: return launch_bwd<32>(a, g, stream);
    case 64: return launch_bwd<64>(a, g, stream);
    case 128: return launch_bwd<128>(a, g, stream);
    default: return launch_bwd<256>(a, g, stream);
    }
}

extern "C" int gk_dflash_attn_has_wgmma(void)
{
    return wgmma_ok();
}

extern "C" size_t gk_dflash_attn_smem(int head_dim, int impl)
{
    gk_dflash_attn a;
    memset(&a, 0, sizeof a);
    a.head_dim = head_dim;
    a.impl = impl;
    size_t m = 0;
    if (use_mma(&a)) {      /* the backward sets all three mma.sync kernels' attribute, wgmma or not */
        if (head_dim == 128) {
            m = std::max({ fwd_mma_smem<128>(), bwd_q_mma_smem<128>(), bwd_kv_mma_smem<128>(), bwd_kv_mma2_smem<128>() });
            if (impl != GK_DFLASH_MMA && wgmma_ok())
                m = std::max({ m, fwd_wg_smem(), bwd_q_wg_smem(), bwd_kv_wg_smem() });
        } else {
            m = std::max({ fwd_mma_smem<64>(), bwd_q_mma_smem<64>(), bwd_kv_mma_smem<64>(), bwd_kv_mma2_smem<64>() });
        }
        return m;
    }
    switch (head_dim) {
    case 16: return std::max({ fwd_smem<16>(), bwd_q_smem<16>(), bwd_kv_smem<16>() });
    case 32: return std::max({ fwd_smem<32>(), bwd_q_smem<32>(), bwd_kv_smem<32>() });
    case 64: return std::max({ fwd_smem<64>(), bwd_q_smem<64>(), bwd_kv_smem<64>() });
    case 128: return std::max({ fwd_smem<128>(), bwd_q_smem<128>(), bwd_kv_smem<128>() });
    default: return std::max({ fwd_smem<256>(), bwd_q_smem<256>(), bwd_kv_smem<256>() });
    }
}

extern "C" int gk_dflash_max_tiles(int n_ctx, int n_blocks)
{
    /* each sequence's context range in tiles (at most one partial tile per sequence), plus one
     * tile of own keys per block */
    return n_ctx / KT + 2 * n_blocks + 1;
}

extern "C" int gk_dflash_plan(const gk_dflash_block *blocks, int n_blocks, int block_size, int n_ctx,
                              int32_t *qlist, gk_dflash_ktile *tiles, int max_tiles)
{
    if (n_blocks < 0 || n_ctx < 0 || block_size < 1 || block_size > KT ||
        (n_blocks && (!blocks || !qlist || !tiles)))
        return -EINVAL;
    for (int i = 0; i < n_blocks; i++) {
        if (blocks[i].ctx0 < 0 || blocks[i].ctx0 > blocks[i].ctx_end || blocks[i].ctx_end > n_ctx)
            return -EINVAL;
        qlist[i] = i;
    }
    std::sort(qlist, qlist + n_blocks, [&](int32_t x, int32_t y) {
        const gk_dflash_block &a = blocks[x], &b = blocks[y];
        if (a.ctx0 != b.ctx0) return a.ctx0 < b.ctx0;
        if (a.ctx_end != b.ctx_end) return a.ctx_end < b.ctx_end;
        return x < y;
    });
    int n = 0, prev_end = 0;
    for (int i = 0; i < n_blocks;) {
        int j = i, ctx0 = blocks[qlist[i]].ctx0;
        while (j < n_blocks && blocks[qlist[j]].ctx0 == ctx0) j++;
        int max_end = blocks[qlist[j - 1]].ctx_end;
        if (ctx0 < prev_end) return -EINVAL;   /* sequences' context ranges overlap */
        if (max_end > ctx0) prev_end = max_end;
        int f = i;
        for (int k0 = ctx0; k0 < max_end; k0 += KT) {
            while (f < j && blocks[qlist[f]].ctx_end <= k0) f++;
            if (n >= max_tiles) return -EINVAL;
            tiles[n++] = gk_dflash_ktile{ k0, std::min(KT, max_end - k0), f, j };
        }
        i = j;
    }
    for (int b = 0; b < n_blocks; b++) {
        if (n >= max_tiles) return -EINVAL;
        tiles[n++] = gk_dflash_ktile{ -1 - b, block_size, b, b + 1 };
    }
    return n;
}
