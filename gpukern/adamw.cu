/* adamw.cu: sum of squares in a fixed grid and a fixed reduction order (the same norm every run),
 * the clip factor computed on the device, and the AdamW update, one thread per element with the
 * element's segment found by binary search. */
#include <math.h>
#include "gpukern/adamw.h"
#include "gpukern/gk_impl.cuh"

namespace {

constexpr int SQ_THREADS = 256;

__global__ void __launch_bounds__(SQ_THREADS) sumsq_kernel(const float *g, size_t n, double *partial)
{
    __shared__ double red[SQ_THREADS];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * SQ_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * SQ_THREADS) {
        double x = g[i];
        s += x * x;
    }
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = SQ_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

/* scale: the host's, or (wsum != NULL) 1 / wsum[0] from the device; loss (optional) must be finite. */
__global__ void __launch_bounds__(SQ_THREADS) clip_kernel(const double *partial, int n_partial, float scale,
                                                          const double *wsum, const double *loss, float clip,
                                                          float *out)
{
    __shared__ double red[SQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += SQ_THREADS) s += partial[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = SQ_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x) return;
    bool ok = true;
    if (wsum) {
        ok = wsum[0] > 0.0 && (!loss || isfinite(loss[0]));
        scale = wsum[0] > 0.0 ? (float)(1.0 / wsum[0]) : 0.f;
        out[3] = wsum[0] > 0.0 ? 1.f : 0.f;
    }
    double norm = sqrt(red[0]) * (double)scale;
    double f = clip > 0 && norm > clip ? (double)clip / (norm + 1e-6) : 1.0;
    out[0] = (float)norm;
    out[1] = (float)(scale * f);
    out[2] = ok && isfinite(norm) ? 1.f : 0.f;
}

__global__ void adamw_kernel(float *w, const float *g, float *m, float *v, bf16 *wb, size_t n,
                             const gk_adamw_seg *seg, int n_seg, const float *gscale, float lr,
                             float b1, float b2, float eps, float wd, float step_size, float inv_sqrt_bc2)
{
    if (gscale[2] == 0.f) return;
    const float gs = gscale[1];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n_seg - 1;     /* last segment with offset <= i */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (seg[mid].offset <= i) lo = mid;
            else hi = mid - 1;
        }
        const float decay = seg[lo].decay ? 1.f - lr * wd : 1.f;
        const float gi = g[i] * gs;
        const float mi = b1 * m[i] + (1.f - b1) * gi;
        const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float wi = w[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
        w[i] = wi;
        if (wb) wb[i] = __float2bfloat16(wi);
    }
}

__global__ void cast_kernel(const float *src, bf16 *dst, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

unsigned grid_for(size_t n, int threads)
{
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g > 8192 ? 8192 : g);
}

} // namespace

extern "C" int gk_grad_clip(const float *g, size_t n, float scale, float clip, double *work, float *out,
                            cudaStream_t stream)
{
    if ((n && !g) || !work || !out) return -EINVAL;
    /* the grid does not depend on n: the same partial sums, in the same order, every time */
    sumsq_kernel<<<GK_GRAD_CLIP_WORK, SQ_THREADS, 0, stream>>>(g, n, work);
    GK_LAUNCH_CHECK();
    clip_kernel<<<1, SQ_THREADS, 0, stream>>>(work, GK_GRAD_CLIP_WORK, scale, nullptr, nullptr, clip, out);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_grad_clip_dev(const float *g, size_t n, const double *wsum, const double *loss, float clip,
                                double *work, float *out, cudaStream_t stream)
{
    if ((n && !g) || !wsum || !work || !out) return -EINVAL;
    sumsq_kernel<<<GK_GRAD_CLIP_WORK, SQ_THREADS, 0, stream>>>(g, n, work);
    GK_LAUNCH_CHECK();
    clip_kernel<<<1, SQ_THREADS, 0, stream>>>(work, GK_GRAD_CLIP_WORK, 0.f, wsum, loss, clip, out);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_adamw(float *w, const float *g, float *m, float *v, void *w_bf16, size_t n,
                        const gk_adamw_seg *seg, int n_seg, const float *gscale, float lr, float beta1,
                        float beta2, float eps, float weight_decay, float step_size, float inv_sqrt_bc2,
                        cudaStream_t stream)
{
    if (n_seg < 1 || !seg || !gscale || (n && (!w || !g || !m || !v))) return -EINVAL;
    if (n == 0) return 0;
    adamw_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, g, m, v, (bf16 *)w_bf16, n, seg, n_seg, gscale,
                                                       lr, beta1, beta2, eps, weight_decay, step_size,
                                                       inv_sqrt_bc2);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_cast_f32_bf16(const float *src, void *dst, size_t n, cudaStream_t stream)
{
    if (n && (!src || !dst)) return -EINVAL;
    if (n == 0) return 0;
    cast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src, (bf16 *)dst, n);
    GK_LAUNCH_CHECK();
    return 0;
}
