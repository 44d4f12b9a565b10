/* norm_bwd.cu: RMSNorm backward, one warp per row (three passes over the row, the later ones
 * from L1), weight gradient summed per CTA in shared memory then added once to global memory;
 * the per-head q/k norm + RoPE backward the same way with one warp per (token, head), its
 * elements in registers between the passes. */
#include "gpukern/norm_bwd.h"
#include "gpukern/gk_impl.cuh"

namespace {

constexpr int WARPS = 8;

__device__ __forceinline__ void load_f32x8(const float *p, float f[8])
{
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

__device__ __forceinline__ void store_f32x8(float *p, const float f[8])
{
    ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

__global__ void __launch_bounds__(WARPS * 32)
rmsnorm_bwd_kernel(const float *dy, long dys, const bf16 *x, long xs, const bf16 *w, const float *res,
                   long rs, float *dx, long dxs, bf16 *dxb, long dxbs, float *dw, int rows, int H,
                   float eps)
{
    extern __shared__ float dw_s[];     /* [H] */
    for (int i = threadIdx.x; i < H; i += blockDim.x) dw_s[i] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, vecs = H / 8;
    for (long r = (long)blockIdx.x * WARPS + warp; r < rows; r += (long)gridDim.x * WARPS) {
        const bf16 *xr = x + r * xs;
        const float *dyr = dy + r * dys;
        float ss = 0.f;
        for (int i = lane; i < vecs; i += 32) {
            float f[8];
            bf16x8_to_f32(*(const bf16x8 *)(xr + 8 * i), f);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += f[e] * f[e];
        }
        const float rinv = rsqrtf(warp_sum(ss) / (float)H + eps);
        float c = 0.f;
        for (int i = lane; i < vecs; i += 32) {
            float f[8], g[8], wf[8];
            bf16x8_to_f32(*(const bf16x8 *)(xr + 8 * i), f);
            bf16x8_to_f32(*(const bf16x8 *)(w + 8 * i), wf);
            load_f32x8(dyr + 8 * i, g);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float xh = f[e] * rinv;
                c += g[e] * wf[e] * xh;
                atomicAdd(&dw_s[8 * i + e], g[e] * xh);
            }
        }
        c = warp_sum(c) / (float)H;
        for (int i = lane; i < vecs; i += 32) {
            float f[8], g[8], wf[8], o[8];
            bf16x8_to_f32(*(const bf16x8 *)(xr + 8 * i), f);
            bf16x8_to_f32(*(const bf16x8 *)(w + 8 * i), wf);
            load_f32x8(dyr + 8 * i, g);
            if (res) load_f32x8(res + r * rs + 8 * i, o);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float v = rinv * (g[e] * wf[e] - f[e] * rinv * c);
                o[e] = res ? o[e] + v : v;
            }
            if (dx) store_f32x8(dx + r * dxs + 8 * i, o);
            if (dxb) *(bf16x8 *)(dxb + r * dxbs + 8 * i) = f32_to_bf16x8(o);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < H; i += blockDim.x) atomicAdd(&dw[i], dw_s[i]);
}

/* One warp per (token, head); lane l owns the pairs (i, i + half) for i = 2l + 64k, k < 4, two at a
 * time (float2 of dy, bf162 of x), as rope_kernel does: dy and x read once, sincos once per pair. */
__global__ void __launch_bounds__(WARPS * 32)
qknorm_rope_bwd_kernel(const float *dy, long dys, const bf16 *x, long xs, bf16 *dx, long dxs,
                       const bf16 *w, float *dw, int n_tokens, int n_heads, int hd,
                       const int32_t *pos, const float *inv_freq, float eps)
{
    extern __shared__ float dw_s[];     /* [hd] */
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dw_s[i] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = hd / 2;
    const long n = (long)n_tokens * n_heads;
    for (long r = (long)blockIdx.x * WARPS + warp; r < n; r += (long)gridDim.x * WARPS) {
        const long t = r / n_heads;
        const int h = (int)(r % n_heads);
        const bf16 *xh = x + t * xs + (long)h * hd;
        const float *dyh = dy + t * dys + (long)h * hd;
        bf16 *dxh = dx + t * dxs + (long)h * hd;
        const float p = (float)pos[t];
        float2 xa[4], xb[4], ga[4], gb[4];  /* x of both halves; g = rope^T(dy), the gradient of the normed, weighted head */
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = 2 * lane + 64 * k;
            if (i >= half) continue;
            xa[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(xh + i));
            xb[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(xh + half + i));
            ss += xa[k].x * xa[k].x + xa[k].y * xa[k].y + xb[k].x * xb[k].x + xb[k].y * xb[k].y;
            const float2 d1 = *(const float2 *)(dyh + i), d2 = *(const float2 *)(dyh + half + i);
            float s0, c0, s1, c1;
            sincosf(p * inv_freq[i], &s0, &c0);
            sincosf(p * inv_freq[i + 1], &s1, &c1);
            ga[k] = make_float2(d1.x * c0 + d2.x * s0, d1.y * c1 + d2.y * s1);
            gb[k] = make_float2(d2.x * c0 - d1.x * s0, d2.y * c1 - d1.y * s1);
        }
        const float rinv = rsqrtf(warp_sum(ss) / (float)hd + eps);
        float c = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = 2 * lane + 64 * k;
            if (i >= half) continue;
            const float2 wa = __bfloat1622float2(*(const __nv_bfloat162 *)(w + i));
            const float2 wb = __bfloat1622float2(*(const __nv_bfloat162 *)(w + half + i));
            xa[k].x *= rinv; xa[k].y *= rinv;   /* now the normed x */
            xb[k].x *= rinv; xb[k].y *= rinv;
            c += ga[k].x * wa.x * xa[k].x + ga[k].y * wa.y * xa[k].y + gb[k].x * wb.x * xb[k].x +
                 gb[k].y * wb.y * xb[k].y;
            atomicAdd(&dw_s[i], ga[k].x * xa[k].x);
            atomicAdd(&dw_s[i + 1], ga[k].y * xa[k].y);
            atomicAdd(&dw_s[half + i], gb[k].x * xb[k].x);
            atomicAdd(&dw_s[half + i + 1], gb[k].y * xb[k].y);
            /* dx = rinv * (g * w - xhat * c), once c is known: keep g * w */
            ga[k].x *= wa.x; ga[k].y *= wa.y;
            gb[k].x *= wb.x; gb[k].y *= wb.y;
        }
        c = warp_sum(c) / (float)hd;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = 2 * lane + 64 * k;
            if (i >= half) continue;
            *(__nv_bfloat162 *)(dxh + i) = __floats2bfloat162_rn(rinv * (ga[k].x - xa[k].x * c),
                                                                 rinv * (ga[k].y - xa[k].y * c));
            *(__nv_bfloat162 *)(dxh + half + i) = __floats2bfloat162_rn(rinv * (gb[k].x - xb[k].x * c),
                                                                        rinv * (gb[k].y - xb[k].y * c));
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) atomicAdd(&dw[i], dw_s[i]);
}

/* Enough CTAs to fill the GPU a few times over; each adds its dw partial once. */
unsigned grid_for(long warps_of_work)
{
    long g = (warps_of_work + WARPS - 1) / WARPS;
    return (unsigned)(g < 1 ? 1 : g > 1024 ? 1024 : g);
}

bool f32_ok(const void *p, long stride) { return ((uintptr_t)p & 15) == 0 && stride % 4 == 0; }

} // namespace

extern "C" int gk_rmsnorm_bwd(const float *dy, long dy_stride, const void *x, long x_stride, const void *w,
                              const float *res, long res_stride, float *dx, long dx_stride, void *dx_bf16,
                              long dxb_stride, float *dw, int rows, int H, float eps, cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || !dw || dy_stride < H || x_stride < H ||
        !f32_ok(dy, dy_stride) || !gk_vec_ok(x, x_stride) || !gk_vec_ok(w, 0) ||
        (res && (res_stride < H || !f32_ok(res, res_stride))) ||
        (dx && (dx_stride < H || !f32_ok(dx, dx_stride))) ||
        (dx_bf16 && (dxb_stride < H || !gk_vec_ok(dx_bf16, dxb_stride))))
        return -EINVAL;
    if (rows == 0) return 0;
    size_t sm = (size_t)H * sizeof(float);
    if (sm > 48 * 1024 &&
        cudaFuncSetAttribute(rmsnorm_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess)
        return -EINVAL;
    rmsnorm_bwd_kernel<<<grid_for(rows), WARPS * 32, sm, stream>>>(
        dy, dy_stride, (const bf16 *)x, x_stride, (const bf16 *)w, res, res_stride, dx, dx_stride,
        (bf16 *)dx_bf16, dxb_stride, dw, rows, H, eps);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_qknorm_rope_bwd(const float *dy, long dy_stride, const void *x, long x_stride, void *dx,
                                  long dx_stride, const void *w, float *dw, int n_tokens, int n_heads,
                                  int head_dim, const int32_t *pos, const float *inv_freq, float eps,
                                  cudaStream_t stream)
{
    long width = (long)n_heads * head_dim;
    /* pairs of elements: float2 of dy, bf162 of x, dx and w */
    if (n_tokens < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 4 || head_dim > 512 || !dy ||
        !x || !dx || !w || !dw || !pos || !inv_freq || dy_stride < width || x_stride < width ||
        dx_stride < width || dy_stride % 2 || x_stride % 2 || dx_stride % 2 || (uintptr_t)dy % 8 ||
        (uintptr_t)x % 4 || (uintptr_t)dx % 4 || (uintptr_t)w % 4)
        return -EINVAL;
    if (n_tokens == 0) return 0;
    qknorm_rope_bwd_kernel<<<grid_for((long)n_tokens * n_heads), WARPS * 32, head_dim * sizeof(float), stream>>>(
        dy, dy_stride, (const bf16 *)x, x_stride, (bf16 *)dx, dx_stride, (const bf16 *)w, dw, n_tokens,
        n_heads, head_dim, pos, inv_freq, eps);
    GK_LAUNCH_CHECK();
    return 0;
}
