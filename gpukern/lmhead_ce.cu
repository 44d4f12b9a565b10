/* lmhead_ce.cu: chunked LM head + cross entropy: gather the chunk's rows (gk_embed), fp32 logits
 * from cuBLAS, one CTA per row for max/argmax, log-sum-exp, loss and the bf16 logit gradient,
 * then d(hidden) = dlogits @ lm_head from cuBLAS, scattered back to the rows. */
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
    w.dlog = w.logits + align256((size_t)C * Vp * 4);
    w.dhc = w.dlog + align256((size_t)C * Vp * 2);
    w.total = w.dhc + align256((size_t)C * H * 4);
    return w;
}

__device__ __forceinline__ bool better(float v, int j, float m, int a)
{
    return v > m || (v == m && j < a);
}

__global__ void __launch_bounds__(CE_THREADS)
ce_kernel(const float *logits, long ld, int V, const int32_t *rows, const int32_t *labels,
          const float *weights, float *row_loss, uint8_t *hit, bf16 *dlog, long dld)
{
    __shared__ float red_v[CE_THREADS / 32];
    __shared__ int red_i[CE_THREADS / 32];
    __shared__ float bc_v;
    __shared__ int bc_i;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = rows[i], lab = labels[row];
    const float w = weights[row];
    const float *l = logits + (long)i * ld;

    float m = -INFINITY;
    int a = INT_MAX;
    for (int j = tid; j < V; j += CE_THREADS) {
        float v = l[j];
        if (better(v, j, m, a)) { m = v; a = j; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        int a2 = __shfl_xor_sync(0xffffffffu, a, o);
        if (better(m2, a2, m, a)) { m = m2; a = a2; }
    }
    if (lane == 0) { red_v[warp] = m; red_i[warp] = a; }
    __syncthreads();
    if (tid == 0) {
        for (int k = 1; k < CE_THREADS / 32; k++)
            if (better(red_v[k], red_i[k], m, a)) { m = red_v[k]; a = red_i[k]; }
        bc_v = m;
        bc_i = a;
    }
    __syncthreads();
    const float mx = bc_v;
    const int arg = bc_i;
    float s = 0.f;
    for (int j = tid; j < V; j += CE_THREADS) s += __expf(l[j] - mx);
    s = warp_sum(s);
    __syncthreads();    /* red_v reuse */
    if (lane == 0) red_v[warp] = s;
    __syncthreads();
    if (tid == 0) {
        float t = 0.f;
        for (int k = 0; k < CE_THREADS / 32; k++) t += red_v[k];
        bc_v = t;
    }
    __syncthreads();
    const float lse = mx + logf(bc_v);
    if (tid == 0) {
        row_loss[row] = w * (lse - l[lab]);
        hit[row] = arg == lab;
    }
    if (!dlog) return;
    bf16 *d = dlog + (long)i * dld;
    for (int j = tid; j < V; j += CE_THREADS) {
        float g = w * __expf(l[j] - lse);
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
    float *logits = (float *)((char *)work + wl.logits), *dhc = (float *)((char *)work + wl.dhc);
    for (int c0 = 0; c0 < n_rows; c0 += chunk_rows) {
        const int n = n_rows - c0 < chunk_rows ? n_rows - c0 : chunk_rows;
        int r = gk_embed(hidden, n_hidden, H, rows + c0, n, hc, H, stream);
        if (r) return r;
        r = gk_gemmx_gemm(g, stream, 0, 1, n, V, H, 1.0f, hc, H, lm_head, H, 0.0f, logits, GK_F32, Vp);
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
