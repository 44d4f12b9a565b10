/* attention.cu: packed varlen causal GQA prefill. attn_mma: FlashAttention-2 style tiles
 * with mma.sync m16n8k16 (bf16 -> fp32), cp.async double-buffered K/V; attn_simple: a warp
 * per (query, head) with the same online softmax, for any head_dim and as a cross-check. */
#include <limits.h>
#include <math.h>
#include "gpukern/attention.h"
#include "gpukern/gk_impl.cuh"
#include "gpukern/mma.cuh"

/* ---- simple kernel ---------------------------------------------------------------------- */

/* Keys in chunks of 32, one key per lane for the scores; each lane then owns head_dim/32
 * output dims (at most 8) and accumulates p * v over the chunk. */
__global__ void attn_simple(const bf16 *q, long qs, const bf16 *k, long ks, const bf16 *v, long vs,
                            bf16 *out, long os, const int32_t *cu, int n_seqs, long n_tokens,
                            int n_heads, int group, int hd, float scale_log2)
{
    extern __shared__ float qsh[];  /* [warps][hd] */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    long gid = (long)blockIdx.x * (blockDim.x / 32) + warp;
    int h = (int)(gid % n_heads);
    long t = gid / n_heads;
    if (t >= n_tokens) return;
    if (t < cu[0] || t >= cu[n_seqs]) return;
    int lo = 0, hi = n_seqs - 1;  /* sequence s with cu[s] <= t < cu[s+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    int start = cu[lo];
    int kvh = h / group;
    float *qv = qsh + warp * hd;
    for (int d = lane; d < hd; d += 32) qv[d] = __bfloat162float(q[t * qs + (long)h * hd + d]) * scale_log2;
    __syncwarp();
    float m = -INFINITY, l = 0.f, acc[8];
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    for (long j0 = start; j0 <= t; j0 += 32) {
        long j = j0 + lane;
        float s = -INFINITY;
        if (j <= t) {
            const bf16 *kr = k + j * ks + (long)kvh * hd;
            s = 0.f;
            for (int d = 0; d < hd; d++) s += qv[d] * __bfloat162float(kr[d]);
        }
        float cm = s;
        for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
        float mn = fmaxf(m, cm);  /* finite: key j0 <= t always exists */
        float corr = exp2f(m - mn);
        float p = exp2f(s - mn);
        l = l * corr + warp_sum(p);
        for (int i = 0; i < 8; i++) acc[i] *= corr;
        int nk = (int)min((long)32, t - j0 + 1);
        for (int jj = 0; jj < nk; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const bf16 *vr = v + (j0 + jj) * vs + (long)kvh * hd;
            for (int i = 0; i < 8; i++) {
                int d = lane + 32 * i;
                if (d < hd) acc[i] += pj * __bfloat162float(vr[d]);
            }
        }
        m = mn;
    }
    for (int i = 0; i < 8; i++) {
        int d = lane + 32 * i;
        if (d < hd) out[t * os + (long)h * hd + d] = __float2bfloat16(acc[i] / l);
    }
}

/* ---- tensor-core kernel ----------------------------------------------------------------- */

enum { BM = 64, BN = 64, WARPS = 4, PAD = 8 };

/* Copy rows [row0, row0+64) of one head (row stride `stride`) into a padded smem tile;
 * rows at or past `len` are zero-filled. */
template <int HD>
__device__ __forceinline__ void load_tile(bf16 *tile, const bf16 *base, long stride, int row0, int len)
{
    constexpr int LDS = HD + PAD, CH = HD / 8;
    for (int c = threadIdx.x; c < BM * CH; c += WARPS * 32) {
        int r = c / CH, col = (c % CH) * 8;
        bool ok = row0 + r < len;
        const bf16 *src = base + (ok ? (long)(row0 + r) * stride + col : 0);
        cp_async16(smem_u32(tile + r * LDS + col), src, ok);
    }
}

/* The query tiles of a batch without a rectangular (sequence x tile) grid, which a skewed batch
 * (thousands of short sequences beside one long one) makes billions of blocks large: sequence s
 * owns the tile slots [base(s), base(s + 1)), base(s) = s + cu[s] / 64, and its tiles are the
 * first ceil(len / 64) of them (floor((a + len) / 64) - floor(a / 64) >= floor(len / 64), so
 * base(s + 1) - base(s) >= 1 + floor(len / 64) >= ceil(len / 64)). The slots number
 * n_seqs + n_tokens / 64 in all; at most about one per sequence is idle. */
static long tile_slots(int n_seqs, long n_tokens) { return n_seqs + n_tokens / BM; }

/* 1-D grid over (tile slot, head), heads of a slot adjacent, taken from the last slot down: a
 * sequence's last query tiles (its longest causal rows) start first. Each warp owns 16 query rows
 * of the block's 64. */
template <int HD>
__global__ void __launch_bounds__(WARPS * 32)
attn_mma(const bf16 *q, long qs, const bf16 *k, long ks, const bf16 *v, long vs, bf16 *out, long os,
         const int32_t *cu, int n_seqs, int n_heads, int group, float scale_log2)
{
    constexpr int LDS = HD + PAD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw;
    bf16 *sK = sQ + BM * LDS;       /* two buffers */
    bf16 *sV = sK + 2 * BN * LDS;   /* two buffers */

    const long idx = (long)gridDim.x - 1 - blockIdx.x;
    const int h = (int)(idx % n_heads);
    const long slot = idx / n_heads;
    int lo = 0, hi = n_seqs - 1;    /* the last sequence whose first slot is at or before this one */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (mid + cu[mid] / BM <= slot) lo = mid; else hi = mid - 1;
    }
    const int seq = lo, start = cu[seq], len = cu[seq + 1] - start;
    const long mbl = slot - (seq + start / BM);
    if (mbl < 0 || mbl * BM >= len) return;
    const int mb = (int)mbl;
    const int kvh = h / group;
    const bf16 *qb = q + (long)start * qs + (long)h * HD;
    const bf16 *kb = k + (long)start * ks + (long)kvh * HD;
    const bf16 *vb = v + (long)start * vs + (long)kvh * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;

    load_tile<HD>(sQ, qb, qs, mb * BM, len);
    load_tile<HD>(sK, kb, ks, 0, len);
    load_tile<HD>(sV, vb, vs, 0, len);
    cp_async_commit();

    /* ldmatrix lane roles: matrix mi = lane/8 of the x4, row ri = lane%8 within it. */
    const int mi = lane >> 3, ri = lane & 7;
    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int qrow0 = mb * BM + warp * 16 + (lane >> 2);  /* this thread's rows: qrow0, qrow0 + 8 */

    for (int j = 0; j <= mb; j++) {
        cp_async_wait_all();
        __syncthreads();
        if (j < mb) {
            int nb = (j + 1) & 1;
            load_tile<HD>(sK + nb * BN * LDS, kb, ks, (j + 1) * BN, len);
            load_tile<HD>(sV + nb * BN * LDS, vb, vs, (j + 1) * BN, len);
        }
        cp_async_commit();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                int r = warp * 16 + ri + (mi & 1) * 8, c = kk * 16 + (mi >> 1) * 8;
                ldsm_x4(qf[kk], smem_u32(sQ + r * LDS + c));
            }
        }
        const bf16 *tK = sK + (j & 1) * BN * LDS, *tV = sV + (j & 1) * BN * LDS;

        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t b[4];
                int r = np * 16 + ri + (mi >> 1) * 8, c = kk * 16 + (mi & 1) * 8;
                ldsm_x4(b, smem_u32(tK + r * LDS + c));
                mma16816(s[2 * np], qf[kk], b[0], b[1]);
                mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }

        /* Scale into the log2 domain; mask the diagonal tile (causal, and keys past len). */
        const bool diag = j == mb;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[nt][e] * scale_log2;
                if (diag) {
                    int key = j * BN + nt * 8 + (lane & 3) * 2 + (e & 1);
                    int row = qrow0 + (e >> 1) * 8;
                    if (key > row || key >= len) x = -INFINITY;
                }
                s[nt][e] = x;
            }
        }

        float corr[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = mrow[hr];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hr], s[nt][2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float base = mx == -INFINITY ? 0.f : mx;
            corr[hr] = exp2f(mrow[hr] - base);
            mrow[hr] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[nt][2 * hr] = exp2f(s[nt][2 * hr] - base);
                s[nt][2 * hr + 1] = exp2f(s[nt][2 * hr + 1] - base);
                sum += s[nt][2 * hr] + s[nt][2 * hr + 1];
            }
            lrow[hr] = lrow[hr] * corr[hr] + sum;  /* per-thread partial; reduced at the end */
        }
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            o[dt][0] *= corr[0]; o[dt][1] *= corr[0];
            o[dt][2] *= corr[1]; o[dt][3] *= corr[1];
        }

        /* O += P V: the S accumulators of two adjacent n-tiles form one A fragment. */
#pragma unroll
        for (int kt = 0; kt < BN / 16; kt++) {
            uint32_t pa[4];
            pa[0] = pack_bf16x2(s[2 * kt][0], s[2 * kt][1]);
            pa[1] = pack_bf16x2(s[2 * kt][2], s[2 * kt][3]);
            pa[2] = pack_bf16x2(s[2 * kt + 1][0], s[2 * kt + 1][1]);
            pa[3] = pack_bf16x2(s[2 * kt + 1][2], s[2 * kt + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                int r = kt * 16 + ri + (mi & 1) * 8, c = dp * 16 + (mi >> 1) * 8;
                ldsm_x4_t(b, smem_u32(tV + r * LDS + c));
                mma16816(o[2 * dp], pa, b[0], b[1]);
                mma16816(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
    }
    cp_async_wait_all();

#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = lrow[hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.f / l : 0.f;
        int row = qrow0 + hr * 8;
        if (row < len) {
            bf16 *orow = out + (long)(start + row) * os + (long)h * HD + (lane & 3) * 2;
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++)
                *(__nv_bfloat162 *)(orow + dt * 8) =
                    __floats2bfloat162_rn(o[dt][2 * hr] * inv, o[dt][2 * hr + 1] * inv);
        }
    }
}

template <int HD>
static int launch_mma(const void *q, long qs, const void *k, long ks, const void *v, long vs, void *out,
                      long os, const int32_t *cu, int n_seqs, long blocks, int n_heads, int group,
                      float scale_log2, cudaStream_t stream)
{
    const int smem = (BM + 4 * BN) * (HD + PAD) * 2;
    /* Set on every launch (a host-side call of about a microsecond): the attribute belongs to
     * the current device, and the caller may switch devices between launches. */
    if (cudaFuncSetAttribute(attn_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
        cudaSuccess)
        return -DF_ECUDA;
    attn_mma<HD><<<(unsigned)blocks, WARPS * 32, smem, stream>>>((const bf16 *)q, qs, (const bf16 *)k, ks,
                                                                 (const bf16 *)v, vs, (bf16 *)out, os, cu, n_seqs,
                                                                 n_heads, group, scale_log2);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_attention_prefill(const void *q, long q_stride, const void *k, long k_stride,
                                    const void *v, long v_stride, void *out, long out_stride,
                                    const int32_t *cu_seqlens, int n_seqs, int n_tokens,
                                    int n_heads, int n_kv_heads, int head_dim, float scale,
                                    int impl, cudaStream_t stream)
{
    if (n_seqs < 0 || n_tokens < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
        head_dim <= 0 || head_dim % 8 || head_dim > 256 || !(scale > 0) ||
        q_stride < (long)n_heads * head_dim || out_stride < (long)n_heads * head_dim ||
        k_stride < (long)n_kv_heads * head_dim || v_stride < (long)n_kv_heads * head_dim ||
        !gk_vec_ok(q, q_stride) || !gk_vec_ok(k, k_stride) || !gk_vec_ok(v, v_stride) ||
        !gk_vec_ok(out, out_stride) || !cu_seqlens)
        return -EINVAL;
    if (impl < GK_ATTN_AUTO || impl > GK_ATTN_MMA) return -EINVAL;
    const bool mma_ok = head_dim == 64 || head_dim == 128;
    if (impl == GK_ATTN_MMA && !mma_ok) return -EINVAL;
    if (n_seqs == 0 || n_tokens == 0) return 0;
    const int group = n_heads / n_kv_heads;
    const float scale_log2 = scale * 1.4426950408889634f;
    /* both grids are 1-D: at most 2^31 - 1 blocks */
    if (impl != GK_ATTN_SIMPLE && mma_ok) {
        const long blocks = tile_slots(n_seqs, n_tokens) * n_heads;
        if (blocks > INT_MAX) return -EINVAL;
        if (head_dim == 128)
            return launch_mma<128>(q, q_stride, k, k_stride, v, v_stride, out, out_stride, cu_seqlens,
                                   n_seqs, blocks, n_heads, group, scale_log2, stream);
        return launch_mma<64>(q, q_stride, k, k_stride, v, v_stride, out, out_stride, cu_seqlens,
                              n_seqs, blocks, n_heads, group, scale_log2, stream);
    }
    /* a warp per (token, head) of the n_tokens tokens; each finds its sequence in cu_seqlens */
    const int warps = 4;
    const long rows = (long)n_tokens * n_heads;
    if ((rows + warps - 1) / warps > INT_MAX) return -EINVAL;
    attn_simple<<<gk_blocks(rows, warps), warps * 32, warps * head_dim * sizeof(float), stream>>>(
        (const bf16 *)q, q_stride, (const bf16 *)k, k_stride, (const bf16 *)v, v_stride, (bf16 *)out,
        out_stride, cu_seqlens, n_seqs, n_tokens, n_heads, group, head_dim, scale_log2);
    GK_LAUNCH_CHECK();
    return 0;
}
