/* dflash_attn.cu: DFlash block attention, flash style: one CTA per (block, kv head, 64 query rows)
 * holds the queries of every head of the kv group and streams the block's visible keys (its
 * context before the anchor, then its own slots) in tiles of 64 with an online softmax. The
 * backward recomputes the scores: dq query-major, dk/dv key-major over gk_dflash_plan's tiles. */
#include <math.h>
#include <algorithm>
#include "gpukern/dflash_attn.h"
#include "gpukern/gk_impl.cuh"

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
    if (a->n_blocks < 0 || a->block_size < 1 || a->block_size > KT || a->n_heads <= 0 ||
        a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return false;
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256) return false;
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
    if (a->n_blocks == 0) {
        if (g->n_ctx > 0 &&
            (cudaMemset2DAsync(g->dkc, g->dkc_stride * 4, 0, kvd * 4, g->n_ctx, stream) != cudaSuccess ||
             cudaMemset2DAsync(g->dvc, g->dvc_stride * 2, 0, kvd * 2, g->n_ctx, stream) != cudaSuccess))
            return -DF_ECUDA;
        return 0;
    }
    switch (a->head_dim) {
    case 16: return launch_bwd<16>(a, g, stream);
    case 32: return launch_bwd<32>(a, g, stream);
    case 64: return launch_bwd<64>(a, g, stream);
    case 128: return launch_bwd<128>(a, g, stream);
    default: return launch_bwd<256>(a, g, stream);
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
