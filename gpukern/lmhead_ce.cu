/* lmhead_ce.cu: chunked LM head + cross entropy: gather the chunk's rows (gk_embed), bf16 logits
 * from cuBLAS (fp32 accumulation, as a bf16 autocast trainer has them), one CTA per row for
 * max/argmax, log-sum-exp (fp32), loss and the bf16 logit gradient, then d(hidden) = dlogits @
 * lm_head from cuBLAS, scattered back to the rows. */
#include <limits.h>
#include <math.h>
#include "gpukern/embed.h"
#include "gpukern/lmhead_ce.h"
#include "gpukern/gk_impl.cuh"

namespace {

constexpr int CE_THREADS = 512;

long pad8(long n) { return (n + 7) / 8 * 8; }
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct work_layout {
    size_t hc, logits, dlog, dhc, total;
};

work_layout layout(int C, int H, int V)
{
    work_layout w;
    long Vp = pad8(V);
    w.hc = 0;
    w.logits = w.hc + align256((size_t)C * H * 2);
    w.dlog = w.logits + align256((size_t)C * Vp * 2);
    w.dhc = w.dlog + align256((size_t)C * Vp * 2);
    w.total = w.dhc + align256((size_t)C * H * 4);
    return w;
}

__device__ __forceinline__ bool better(float v, int j, float m, int a)
{
    return v > m || (v == m && j < a);
}

/* (m, s): a softmax denominator sum exp(l - m) over the elements seen so far; merge another. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    if (m2 <= m) {
        if (m2 != -INFINITY) s += s2 * __expf(m2 - m);
    } else {
        s = (m == -INFINITY ? 0.f : s * __expf(m - m2)) + s2;
        m = m2;
    }
}

/* One CTA per row. Pass 1 reads the row once for the argmax and the exp sum (online: the sum is
 * rescaled when the running max grows); pass 2 (training only) reads it again for the bf16
 * gradient w * (softmax - onehot). Rows are 16-byte aligned (ld % 8 == 0): 8 logits per load;
 * the V % 8 last ones go one by one. */
__global__ void __launch_bounds__(CE_THREADS)
ce_kernel(const bf16 *logits, long ld, int V, const int32_t *rows, const int32_t *labels,
          const float *weights, float *row_loss, uint8_t *hit, bf16 *dlog, long dld)
{
    __shared__ float red_m[CE_THREADS / 32], red_s[CE_THREADS / 32], red_a[CE_THREADS / 32];
    __shared__ int red_i[CE_THREADS / 32];
    __shared__ float bc_lse;
    __shared__ int bc_i;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = rows[i], lab = labels[row];
    const float w = weights[row];
    const bf16 *l = logits + (long)i * ld;
    const int V8 = V / 8;
    float m = -INFINITY, s = 0.f, am = -INFINITY;  /* exp sum at max m; argmax a of value am */
    int a = INT_MAX;
    for (int q = tid; q < V8; q += CE_THREADS) {
        float v[8];
        bf16x8_to_f32(((const bf16x8 *)l)[q], v);
        float mx = v[0];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (better(v[e], 8 * q + e, am, a)) { am = v[e]; a = 8 * q + e; }
            mx = fmaxf(mx, v[e]);
        }
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) t += __expf(v[e] - mx);
        lse_merge(m, s, mx, t);
    }
    for (int j = 8 * V8 + tid; j < V; j += CE_THREADS) {
        const float v = __bfloat162float(l[j]);
        if (better(v, j, am, a)) { am = v; a = j; }
        lse_merge(m, s, v, 1.f);
    }
    /* warp, then CTA: the argmax (ties: the lower index), the sums merged at the larger max */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        const float am2 = __shfl_xor_sync(0xffffffffu, am, o);
        const int a2 = __shfl_xor_sync(0xffffffffu, a, o);
        if (better(am2, a2, am, a)) { am = am2; a = a2; }
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; red_a[warp] = am; red_i[warp] = a; }
    __syncthreads();
    if (tid == 0) {
        for (int k = 1; k < CE_THREADS / 32; k++) {
            if (better(red_a[k], red_i[k], am, a)) { am = red_a[k]; a = red_i[k]; }
            lse_merge(m, s, red_m[k], red_s[k]);
        }
        bc_lse = m + logf(s);
        bc_i = a;
    }
    __syncthreads();
    const float lse = bc_lse;
    if (tid == 0) {
        row_loss[row] = w * (lse - __bfloat162float(l[lab]));
        hit[row] = bc_i == lab;
    }
    if (!dlog) return;
    bf16 *d = dlog + (long)i * dld;
    for (int q = tid; q < V8; q += CE_THREADS) {
        float g[8];
        bf16x8_to_f32(((const bf16x8 *)l)[q], g);
#pragma unroll
        for (int e = 0; e < 8; e++) g[e] = w * __expf(g[e] - lse);
        const int j = 8 * q;
        if (lab >= j && lab < j + 8) g[lab - j] -= w;
        ((bf16x8 *)d)[q] = f32_to_bf16x8(g);
    }
    for (int j = 8 * V8 + tid; j < V; j += CE_THREADS) {
        const float g = w * __expf(__bfloat162float(l[j]) - lse);
        d[j] = __float2bfloat16(j == lab ? g - w : g);
    }
}

__global__ void scatter_rows_kernel(const float *src, int H, const int32_t *rows, int n, float *dst)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int q = H / 4;
    if (i >= (long)n * q) return;
    long r = i / q, c = (i % q) * 4;
    *(float4 *)(dst + (long)rows[r] * H + c) = *(const float4 *)(src + r * H + c);
}

constexpr int MT = 256;

__global__ void __launch_bounds__(MT)
metrics_kernel(const float *row_loss, const uint8_t *hit, const float *weights, int n_blocks, int bs,
               double *out, double *block_loss)
{
    __shared__ double red[4][MT];
    double loss = 0, correct = 0, acc = 0, acc_n = 0;
    for (int b = threadIdx.x; b < n_blocks; b += MT) {
        double bl = 0;
        int any = 0, run = 0, alive = 1;
        for (int k = 0; k < bs; k++) {
            long r = (long)b * bs + k;
            bl += row_loss[r];
            int sup = weights[r] > 0.f, ok = sup && hit[r];
            correct += ok;
            if (k == 0) continue;
            any |= sup;
            if (alive && ok) run++;
            else alive = 0;
        }
        loss += bl;
        if (any) { acc += 1 + run; acc_n += 1; }
        if (block_loss) block_loss[b] = bl;
    }
    red[0][threadIdx.x] = loss;
    red[1][threadIdx.x] = correct;
    red[2][threadIdx.x] = acc;
    red[3][threadIdx.x] = acc_n;
    __syncthreads();
    for (int o = MT / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o)
            for (int k = 0; k < 4; k++) red[k][threadIdx.x] += red[k][threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x < 4) out[threadIdx.x] = red[threadIdx.x][0];
}

} // namespace

extern "C" size_t gk_lmhead_ce_work_bytes(int chunk_rows, int H, int V)
{
    if (chunk_rows < 1 || H < 1 || V < 1) return 0;
    return layout(chunk_rows, H, V).total;
}

extern "C" int gk_lmhead_ce(gk_gemmx *g, cudaStream_t stream, const void *hidden, int n_hidden, int H,
                            const void *lm_head, int V, const int32_t *rows, int n_rows,
                            const int32_t *labels, const float *weights, int chunk_rows, void *work,
                            float *row_loss, uint8_t *hit, float *dhidden)
{
    if (!g || n_hidden < 0 || H <= 0 || H % 8 || V <= 0 || n_rows < 0 || n_rows > n_hidden ||
        chunk_rows < 1 || !row_loss || !hit || !work || ((uintptr_t)work & 255) ||
        !gk_vec_ok(hidden, H) || !gk_vec_ok(lm_head, H) || (dhidden && ((uintptr_t)dhidden & 15)) ||
        (n_rows && (!rows || !labels || !weights)))
        return -EINVAL;
    if (n_hidden == 0) return 0;
    if (cudaMemsetAsync(row_loss, 0, (size_t)n_hidden * 4, stream) != cudaSuccess ||
        cudaMemsetAsync(hit, 0, (size_t)n_hidden, stream) != cudaSuccess ||
        (dhidden && cudaMemsetAsync(dhidden, 0, (size_t)n_hidden * H * 4, stream) != cudaSuccess))
        return -DF_ECUDA;
    const work_layout wl = layout(chunk_rows, H, V);
    const long Vp = pad8(V);
    bf16 *hc = (bf16 *)((char *)work + wl.hc), *dlog = (bf16 *)((char *)work + wl.dlog);
    bf16 *logits = (bf16 *)((char *)work + wl.logits);
    float *dhc = (float *)((char *)work + wl.dhc);
    for (int c0 = 0; c0 < n_rows; c0 += chunk_rows) {
        const int n = n_rows - c0 < chunk_rows ? n_rows - c0 : chunk_rows;
        int r = gk_embed(hidden, n_hidden, H, rows + c0, n, hc, H, stream);
        if (r) return r;
        r = gk_gemmx_gemm(g, stream, 0, 1, n, V, H, 1.0f, hc, H, lm_head, H, 0.0f, logits, GK_BF16, Vp);
        if (r) return r;
        ce_kernel<<<n, CE_THREADS, 0, stream>>>(logits, Vp, V, rows + c0, labels, weights, row_loss, hit,
                                                dhidden ? dlog : nullptr, Vp);
        GK_LAUNCH_CHECK();
        if (!dhidden) continue;
        r = gk_gemmx_gemm(g, stream, 0, 0, n, H, V, 1.0f, dlog, Vp, lm_head, H, 0.0f, dhc, GK_F32, H);
        if (r) return r;
        scatter_rows_kernel<<<gk_blocks((long)n * (H / 4), 256), 256, 0, stream>>>(dhc, H, rows + c0, n, dhidden);
        GK_LAUNCH_CHECK();
    }
    return 0;
}

extern "C" int gk_block_metrics(const float *row_loss, const uint8_t *hit, const float *weights, int n_blocks,
                                int bs, double *out, double *block_loss, cudaStream_t stream)
{
    if (n_blocks < 0 || bs < 1 || !out || (n_blocks && (!row_loss || !hit || !weights))) return -EINVAL;
    metrics_kernel<<<1, MT, 0, stream>>>(row_loss, hit, weights, n_blocks, bs, out, block_loss);
    GK_LAUNCH_CHECK();
    return 0;
}
