/* adamw.cu: sum of squares in a fixed grid and a fixed reduction order (the same norm every run),
 * the clip factor computed on the device, and the AdamW update. Both passes stream ~30 bytes per
 * parameter, so they are written for bandwidth: 16-byte loads, several in flight per thread, and
 * the AdamW segment (decay or not) tracked by a per-thread cursor instead of a search per element. */
#include <math.h>
#include "gpukern/adamw.h"
#include "gpukern/gk_impl.cuh"

namespace {

constexpr int SQ_THREADS = 256;
constexpr int SQ_UNROLL = 4;    /* float4 loads in flight per thread and iteration */
constexpr int AW_THREADS = 256;
constexpr int AW_MIN_BLOCKS = 4;    /* per SM, guaranteed by the register cap of __launch_bounds__ */

/* Elements before the first 16-byte boundary of p (p 4-byte aligned), at most n. */
__host__ __device__ __forceinline__ size_t head_elems(const void *p, size_t n)
{
    size_t h = ((16 - ((uintptr_t)p & 15)) & 15) / 4;
    return h < n ? h : n;
}

__device__ __forceinline__ void sq4(double &s, float4 x)
{
    double a = x.x, b = x.y, c = x.z, d = x.w;
    s += a * a;
    s += b * b;
    s += c * c;
    s += d * d;
}

/* One partial per block, over a fixed partition of [0, n): the aligned body as float4 strided over
 * the grid, the (at most 3 + 3) elements before and after it in block 0. Launched with exactly
 * GK_GRAD_CLIP_WORK blocks; the register cap keeps 8 blocks per SM, so on 132 SMs all 1024 are
 * resident at once (a second wave would double the time: every block has an equal share). */
__global__ void __launch_bounds__(SQ_THREADS, 8) sumsq_kernel(const float *g, size_t n, double *partial)
{
    __shared__ double red[SQ_THREADS];
    const size_t head = head_elems(g, n);
    const size_t n4 = (n - head) / 4;
    const float4 *g4 = (const float4 *)(g + head);
    const size_t stride = (size_t)gridDim.x * SQ_THREADS;
    double s = 0.0;
    size_t q = (size_t)blockIdx.x * SQ_THREADS + threadIdx.x;
    for (; q + (SQ_UNROLL - 1) * stride < n4; q += SQ_UNROLL * stride) {
        float4 x[SQ_UNROLL];
#pragma unroll
        for (int u = 0; u < SQ_UNROLL; u++) x[u] = __ldg(g4 + q + u * stride);
#pragma unroll
        for (int u = 0; u < SQ_UNROLL; u++) sq4(s, x[u]);
    }
    for (; q < n4; q += stride) sq4(s, __ldg(g4 + q));
    if (blockIdx.x == 0 && threadIdx.x < 8) {
        /* threads 0-3: the unaligned head, 4-7: the tail after the last float4 */
        size_t i = threadIdx.x < 4 ? threadIdx.x : head + 4 * n4 + (threadIdx.x - 4);
        if (threadIdx.x < 4 ? i < head : i < n) {
            double x = g[i];
            s += x * x;
        }
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

struct adamw_hp {
    float gs, b1, b2, eps, step_size, inv_sqrt_bc2;
    float dec;              /* 1 - lr * wd: the decay segments' factor */
};

/* The decay factor of element i: the last segment with offset <= i (segment 0 before the first),
 * as a binary search over the sorted offsets would find it. Calls with non-decreasing i walk the
 * segment list once in all. */
struct seg_cursor {
    const gk_adamw_seg *seg;
    int n_seg, s;
    uint64_t next;          /* offset of segment s + 1 (none: UINT64_MAX) */
    float decay, dec;

    __device__ __forceinline__ void init(const gk_adamw_seg *sg, int n, float d)
    {
        seg = sg;
        n_seg = n;
        dec = d;
        s = 0;
        load();
    }
    __device__ __forceinline__ void load()
    {
        decay = seg[s].decay ? dec : 1.f;
        next = s + 1 < n_seg ? seg[s + 1].offset : UINT64_MAX;
    }
    __device__ __forceinline__ float at(uint64_t i)
    {
        while (i >= next) {
            s++;
            load();
        }
        return decay;
    }
};

/* The per-element update, the same fp32 expressions for every path. */
__device__ __forceinline__ void adamw_elem(float &w, float g, float &m, float &v, float decay, const adamw_hp &p)
{
    const float gi = g * p.gs;
    const float mi = p.b1 * m + (1.f - p.b1) * gi;
    const float vi = p.b2 * v + (1.f - p.b2) * gi * gi;
    m = mi;
    v = vi;
    w = w * decay - p.step_size * mi / (sqrtf(vi) * p.inv_sqrt_bc2 + p.eps);
}

/* Element i in memory (the scalar paths). */
__device__ __forceinline__ void adamw_at(float *w, const float *g, float *m, float *v, bf16 *wb, size_t i,
                                         float decay, const adamw_hp &p)
{
    float wi = w[i], mi = m[i], vi = v[i];
    adamw_elem(wi, g[i], mi, vi, decay, p);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (wb) wb[i] = __float2bfloat16(wi);
}

__device__ __forceinline__ uint32_t bf16_bits(float x)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(x));
}

/* The constants from the device (gk_adamw_scheduled) where dc is given, else p's from the host. */
__device__ __forceinline__ void device_hp(adamw_hp &p, const float *gscale, const gk_adamw_count *dc)
{
    p.gs = gscale[1];
    if (dc) {
        p.step_size = dc->step_size;
        p.inv_sqrt_bc2 = dc->inv_sqrt_bc2;
        p.dec = dc->decay;
    }
}

/* Elements [base, base + 4 * n4) as float4 (w, g, m, v 16-byte aligned there, wb 8-byte aligned),
 * grid-stride; block 0 also does the < 4 elements before base and the < 4 after the body. */
__global__ void __launch_bounds__(AW_THREADS, AW_MIN_BLOCKS)
adamw_vec_kernel(float *w, const float *g, float *m, float *v, bf16 *wb, size_t n, size_t base, size_t n4,
                 const gk_adamw_seg *seg, int n_seg, const float *gscale, const gk_adamw_count *dc, adamw_hp p)
{
    if (gscale[2] == 0.f) return;
    device_hp(p, gscale, dc);
    seg_cursor c;
    if (blockIdx.x == 0 && threadIdx.x < 8) {
        size_t i = threadIdx.x < 4 ? threadIdx.x : base + 4 * n4 + (threadIdx.x - 4);
        if (threadIdx.x < 4 ? i < base : i < n) {
            c.init(seg, n_seg, p.dec);
            adamw_at(w, g, m, v, wb, i, c.at(i), p);
        }
    }
    float4 *w4 = (float4 *)(w + base), *m4 = (float4 *)(m + base), *v4 = (float4 *)(v + base);
    const float4 *g4 = (const float4 *)(g + base);
    uint2 *wb4 = wb ? (uint2 *)(wb + base) : nullptr;
    c.init(seg, n_seg, p.dec);
    const size_t stride = (size_t)gridDim.x * AW_THREADS;
    for (size_t q = (size_t)blockIdx.x * AW_THREADS + threadIdx.x; q < n4; q += stride) {
        const uint64_t i = base + 4 * q;
        float4 wq = w4[q], mq = m4[q], vq = v4[q];
        const float4 gq = __ldg(g4 + q);
        float d0 = c.at(i), d1 = d0, d2 = d0, d3 = d0;
        if (i + 3 >= c.next) {      /* a segment starts inside these four */
            d1 = c.at(i + 1);
            d2 = c.at(i + 2);
            d3 = c.at(i + 3);
        }
        adamw_elem(wq.x, gq.x, mq.x, vq.x, d0, p);
        adamw_elem(wq.y, gq.y, mq.y, vq.y, d1, p);
        adamw_elem(wq.z, gq.z, mq.z, vq.z, d2, p);
        adamw_elem(wq.w, gq.w, mq.w, vq.w, d3, p);
        w4[q] = wq;
        m4[q] = mq;
        v4[q] = vq;
        if (wb4)
            wb4[q] = make_uint2(bf16_bits(wq.x) | bf16_bits(wq.y) << 16, bf16_bits(wq.z) | bf16_bits(wq.w) << 16);
    }
}

/* Any alignment: one element per thread and iteration, grid-stride. */
__global__ void __launch_bounds__(AW_THREADS, AW_MIN_BLOCKS)
adamw_kernel(float *w, const float *g, float *m, float *v, bf16 *wb, size_t n, const gk_adamw_seg *seg,
             int n_seg, const float *gscale, const gk_adamw_count *dc, adamw_hp p)
{
    if (gscale[2] == 0.f) return;
    device_hp(p, gscale, dc);
    seg_cursor c;
    c.init(seg, n_seg, p.dec);
    for (size_t i = (size_t)blockIdx.x * AW_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * AW_THREADS)
        adamw_at(w, g, m, v, wb, i, c.at(i), p);
}

/* model/optim.c's optim_lr, in the same double expressions. */
__device__ double sched_lr(const gk_adamw_sched &s, int64_t step)
{
    if (s.warmup_steps > 0 && step < s.warmup_steps)
        return s.lr * (double)(step + 1) / (double)s.warmup_steps;
    if (s.total_steps <= s.warmup_steps)
        return s.lr;
    double t = (double)(step - s.warmup_steps) / (double)(s.total_steps - s.warmup_steps);
    if (t > 1.0)
        t = 1.0;
    const double min_lr = s.lr * s.min_lr_ratio;
    return min_lr + (s.lr - min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * t));
}

/* One thread: the update constants of step count->step (as gk_adamw's caller would compute them on
 * the host), then the count advanced if the update will be applied. */
__global__ void sched_kernel(gk_adamw_sched s, gk_adamw_count *c, const float *gscale)
{
    const int64_t t0 = c->step;
    const double lr = sched_lr(s, t0), t = (double)(t0 + 1);
    const double bc1 = 1.0 - pow(s.beta1, t), bc2 = 1.0 - pow(s.beta2, t);
    c->lr = lr;
    c->step_size = (float)(lr / bc1);
    c->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    c->decay = 1.f - __fmul_rn((float)lr, (float)s.weight_decay);     /* as the host's float expression */
    if (gscale[2] != 0.f)
        c->step = t0 + 1;
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

/* Blocks of the AdamW kernels resident at once on the current device (their grid-stride grid),
 * looked up once per device: each SM holds at least AW_MIN_BLOCKS of them. */
unsigned aw_resident_blocks(void)
{
    static gk_device_cache cache;
    const int c = gk_device_once(cache, [](int dev) {
        int sms = 0, per_sm = 0, per_sm2 = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adamw_vec_kernel, AW_THREADS, 0) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm2, adamw_kernel, AW_THREADS, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        const int per = per_sm2 < per_sm ? per_sm2 : per_sm;
        return sms * (per > 1 ? per : 1);
    });
    return c > 0 ? (unsigned)c : 1024;
}

/* The update with p's constants, or (dc) those sched_kernel left on the device. */
int launch_adamw(float *w, const float *g, float *m, float *v, bf16 *wb, size_t n, const gk_adamw_seg *seg,
                 int n_seg, const float *gscale, const gk_adamw_count *dc, const adamw_hp &p, cudaStream_t stream)
{
    /* float4 access needs w, g, m, v equally placed within 16 bytes (then one scalar head brings all
     * four to a boundary) and the bf16 copy 8-byte aligned from there */
    const uintptr_t a = (uintptr_t)w & 15;
    const size_t base = head_elems(w, n);
    const bool vec = (a & 3) == 0 && ((uintptr_t)g & 15) == a && ((uintptr_t)m & 15) == a &&
                     ((uintptr_t)v & 15) == a && (!wb || ((uintptr_t)(wb + base) & 7) == 0);
    const unsigned resident = aw_resident_blocks();
    if (vec) {
        const size_t n4 = (n - base) / 4;
        unsigned grid = grid_for(n4, AW_THREADS);
        if (grid > resident) grid = resident;
        adamw_vec_kernel<<<grid, AW_THREADS, 0, stream>>>(w, g, m, v, wb, n, base, n4, seg, n_seg, gscale, dc, p);
    } else {
        unsigned grid = grid_for(n, AW_THREADS);
        if (grid > resident) grid = resident;
        adamw_kernel<<<grid, AW_THREADS, 0, stream>>>(w, g, m, v, wb, n, seg, n_seg, gscale, dc, p);
    }
    GK_LAUNCH_CHECK();
    return 0;
}

} // namespace

extern "C" int gk_grad_clip(const float *g, size_t n, float scale, float clip, double *work, float *out,
                            cudaStream_t stream)
{
    if ((n && !g) || ((uintptr_t)g & 3) || !work || !out) return -EINVAL;
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
    if ((n && !g) || ((uintptr_t)g & 3) || !wsum || !work || !out) return -EINVAL;
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
    adamw_hp p;
    p.gs = 0.f;     /* read on the device */
    p.b1 = beta1;
    p.b2 = beta2;
    p.eps = eps;
    p.step_size = step_size;
    p.inv_sqrt_bc2 = inv_sqrt_bc2;
    p.dec = 1.f - lr * weight_decay;
    return launch_adamw(w, g, m, v, (bf16 *)w_bf16, n, seg, n_seg, gscale, nullptr, p, stream);
}

extern "C" int gk_adamw_scheduled(float *w, const float *g, float *m, float *v, void *w_bf16, size_t n,
                                  const gk_adamw_seg *seg, int n_seg, const float *gscale,
                                  const gk_adamw_sched *sched, gk_adamw_count *count, cudaStream_t stream)
{
    if (n_seg < 1 || !seg || !gscale || !sched || !count || (n && (!w || !g || !m || !v))) return -EINVAL;
    sched_kernel<<<1, 1, 0, stream>>>(*sched, count, gscale);
    GK_LAUNCH_CHECK();
    if (n == 0) return 0;
    adamw_hp p;
    p.gs = 0.f;     /* these three from the device */
    p.step_size = p.inv_sqrt_bc2 = p.dec = 0.f;
    p.b1 = (float)sched->beta1;
    p.b2 = (float)sched->beta2;
    p.eps = (float)sched->eps;
    return launch_adamw(w, g, m, v, (bf16 *)w_bf16, n, seg, n_seg, gscale, count, p, stream);
}

extern "C" int gk_cast_f32_bf16(const float *src, void *dst, size_t n, cudaStream_t stream)
{
    if (n && (!src || !dst)) return -EINVAL;
    if (n == 0) return 0;
    cast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src, (bf16 *)dst, n);
    GK_LAUNCH_CHECK();
    return 0;
}
