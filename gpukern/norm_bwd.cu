/* norm_bwd.cu: RMSNorm backward and the per-head q/k norm + RoPE backward.
 *
 * The weight gradient is a column sum over every row. Each CTA sums its own rows in registers
 * (a thread always owns the same columns), writes its partial once to the caller's workspace,
 * and a second kernel adds the partials to dw in a fixed order. No atomics: the result depends
 * only on the shapes (and the build and GPU architecture), not on scheduling, and twin runs agree
 * to the bit.
 *
 * RMSNorm: one CTA per row (rows of up to 16384), each thread K 8-element vectors of it, the row's
 * two sums reduced across the CTA; x, dy and res read once. q/k norm + RoPE: a warp per few heads
 * of a token (their sin / cos computed once), the elements in registers between the passes. */
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

/* The sum of v over the CTA, the same in every thread. red[] (one float per warp) is written
 * here and read after one barrier; a caller alternates two of them, so that the next write to
 * one comes after everyone's read of it (the barrier of the other sum lies between). */
__device__ __forceinline__ float cta_sum(float v, float *red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += red[i];
    return s;
}

/* Thread t owns the vectors t + k * blockDim.x (k < K) of every row; rows blockIdx.x + j * gridDim.x.
 * Its columns' weight-gradient terms summed in acc, written to part[blockIdx.x][H] at the end. */
template <int K>
__global__ void __launch_bounds__(K == 4 ? 512 : 256, K == 4 ? 1 : 4)
rmsnorm_bwd_kernel(const float *dy, long dys, const bf16 *x, long xs, const bf16 *w, const float *res,
                   long rs, float *dx, long dxs, bf16 *dxb, long dxbs, float *part, int rows, int H,
                   float eps)
{
    __shared__ float red[2][32];
    const int vecs = H / 8;
    float acc[K][8];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] = 0.f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const bf16 *xr = x + r * xs;
        const float *dyr = dy + r * dys;
        bf16x8 xv[K];                           /* x stays packed: fewer registers */
        float g[K][8];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int v = threadIdx.x + k * blockDim.x;
            if (v >= vecs) continue;
            float f[8];
            xv[k] = *(const bf16x8 *)(xr + 8 * v);
            load_f32x8(dyr + 8 * v, g[k]);
            bf16x8_to_f32(xv[k], f);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += f[e] * f[e];
        }
        const float rinv = rsqrtf(cta_sum(ss, red[0]) / (float)H + eps);
        float c = 0.f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int v = threadIdx.x + k * blockDim.x;
            if (v >= vecs) continue;
            float f[8], wf[8];
            bf16x8_to_f32(xv[k], f);
            bf16x8_to_f32(*(const bf16x8 *)(w + 8 * v), wf);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float xh = f[e] * rinv;
                acc[k][e] += g[k][e] * xh;
                g[k][e] *= wf[e];                   /* now the gradient of the normed x */
                c += g[k][e] * xh;
            }
        }
        c = cta_sum(c, red[1]) / (float)H;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int v = threadIdx.x + k * blockDim.x;
            if (v >= vecs) continue;
            float f[8], o[8];
            bf16x8_to_f32(xv[k], f);
            if (res) load_f32x8(res + r * rs + 8 * v, o);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float d = rinv * (g[k][e] - f[e] * rinv * c);
                o[e] = res ? o[e] + d : d;
            }
            if (dx) store_f32x8(dx + r * dxs + 8 * v, o);
            if (dxb) *(bf16x8 *)(dxb + r * dxbs + 8 * v) = f32_to_bf16x8(o);
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int v = threadIdx.x + k * blockDim.x;
        if (v < vecs) store_f32x8(part + (long)blockIdx.x * H + 8 * v, acc[k]);
    }
}

/* A warp takes up to R heads of one token (an item): their loads are in flight together and the
 * token's sin / cos (accurate sincosf, most of the kernel's work) are computed once for all of
 * them. Lane l owns the pairs (i, i + half) for i = 2l + 64k, k < KS, two at a time (float2 of dy,
 * bf162 of x), as rope_kernel does. The lane's weight-gradient terms summed in registers over
 * every item of the warp; the CTA's warps added in order at the end into part[blockIdx.x][hd]. */
template <int KS, int R>     /* KS = ceil(head_dim / 128): 1 up to head_dim 128 */
__global__ void __launch_bounds__(WARPS * 32, KS == 1 ? 4 : 2)  /* head_dim <= 128: GK_NORM_BWD_PARTS in one wave */
qknorm_rope_bwd_kernel(const float *dy, long dys, const bf16 *x, long xs, bf16 *dx, long dxs,
                       const bf16 *w, float *part, int n_tokens, int n_heads, int hd,
                       const int32_t *pos, const float *inv_freq, float eps)
{
    extern __shared__ float dw_s[];     /* [WARPS][hd] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = hd / 2;
    const int groups = (n_heads + R - 1) / R;
    const long n = (long)n_tokens * groups;
    float2 acc_a[KS], acc_b[KS], wa[KS], wb[KS];
#pragma unroll
    for (int k = 0; k < KS; k++) acc_a[k] = acc_b[k] = make_float2(0.f, 0.f);
    rope_load_pairs<KS>(w, half, lane, wa, wb);
    for (long item = (long)blockIdx.x * WARPS + warp; item < n; item += (long)gridDim.x * WARPS) {
        const long t = item / groups;
        const int h0 = (int)(item - t * groups) * R, nh = min(R, n_heads - h0);
        const bf16 *xt = x + t * xs + (long)h0 * hd;
        const float *dyt = dy + t * dys + (long)h0 * hd;
        bf16 *dxt = dx + t * dxs + (long)h0 * hd;
        /* x of both halves (packed: fewer registers); dy of both halves, then g = rope^T(dy) (the
         * gradient of the normed, weighted head), then g * w */
        __nv_bfloat162 xa[R][KS], xb[R][KS];
        float2 ga[R][KS], gb[R][KS];
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (j >= nh) continue;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int i = 2 * lane + 64 * k;
                if (i >= half) continue;
                xa[j][k] = *(const __nv_bfloat162 *)(xt + j * hd + i);
                xb[j][k] = *(const __nv_bfloat162 *)(xt + j * hd + half + i);
                ga[j][k] = *(const float2 *)(dyt + j * hd + i);
                gb[j][k] = *(const float2 *)(dyt + j * hd + half + i);
            }
        }
        float2 sn[KS], cs[KS];
        rope_sincos<KS>((float)pos[t], inv_freq, half, lane, sn, cs);
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (j >= nh) continue;
            float ss = 0.f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int i = 2 * lane + 64 * k;
                if (i >= half) continue;
                const float2 a = __bfloat1622float2(xa[j][k]), b = __bfloat1622float2(xb[j][k]);
                ss += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
                const float2 d1 = ga[j][k], d2 = gb[j][k];
                ga[j][k] = make_float2(d1.x * cs[k].x + d2.x * sn[k].x, d1.y * cs[k].y + d2.y * sn[k].y);
                gb[j][k] = make_float2(d2.x * cs[k].x - d1.x * sn[k].x, d2.y * cs[k].y - d1.y * sn[k].y);
            }
            const float rinv = rsqrtf(warp_sum(ss) / (float)hd + eps);
            float c = 0.f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int i = 2 * lane + 64 * k;
                if (i >= half) continue;
                float2 a = __bfloat1622float2(xa[j][k]), b = __bfloat1622float2(xb[j][k]), &g = ga[j][k],
                       &h = gb[j][k];
                a.x *= rinv; a.y *= rinv;       /* the normed x */
                b.x *= rinv; b.y *= rinv;
                acc_a[k].x += g.x * a.x; acc_a[k].y += g.y * a.y;
                acc_b[k].x += h.x * b.x; acc_b[k].y += h.y * b.y;
                /* dx = rinv * (g * w - xhat * c), once c is known: keep g * w */
                g.x *= wa[k].x; g.y *= wa[k].y;
                h.x *= wb[k].x; h.y *= wb[k].y;
                c += g.x * a.x + g.y * a.y + h.x * b.x + h.y * b.y;
            }
            c = warp_sum(c) / (float)hd;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int i = 2 * lane + 64 * k;
                if (i >= half) continue;
                float2 a = __bfloat1622float2(xa[j][k]), b = __bfloat1622float2(xb[j][k]);
                const float2 g = ga[j][k], h = gb[j][k];
                a.x *= rinv; a.y *= rinv;
                b.x *= rinv; b.y *= rinv;
                *(__nv_bfloat162 *)(dxt + j * hd + i) =
                    __floats2bfloat162_rn(rinv * (g.x - a.x * c), rinv * (g.y - a.y * c));
                *(__nv_bfloat162 *)(dxt + j * hd + half + i) =
                    __floats2bfloat162_rn(rinv * (h.x - b.x * c), rinv * (h.y - b.y * c));
            }
        }
    }
    float *mine = dw_s + warp * hd;
#pragma unroll
    for (int k = 0; k < KS; k++) {
        const int i = 2 * lane + 64 * k;
        if (i >= half) continue;
        *(float2 *)(mine + i) = acc_a[k];
        *(float2 *)(mine + half + i) = acc_b[k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float s = 0.f;
        for (int j = 0; j < WARPS; j++) s += dw_s[j * hd + i];
        part[(long)blockIdx.x * hd + i] = s;
    }
}

/* dw[i] += the sum over p < parts of part[p][i], always in the same order: thread (tx, ty) of a
 * 32 x 32 CTA sums the partials ty, ty + 32, ... of column blockIdx.x * 32 + tx, then row ty = 0
 * adds the 32 sums in order. */
__global__ void __launch_bounds__(1024)
sum_parts_kernel(const float *part, int parts, int width, float *dw)
{
    __shared__ float s[32][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, i = blockIdx.x * 32 + tx;
    float a = 0.f;
    if (i < width)
        for (int p = ty; p < parts; p += 32) a += part[(long)p * width + i];
    s[ty][tx] = a;
    __syncthreads();
    if (ty == 0 && i < width) {
        float t = 0.f;
        for (int j = 0; j < 32; j++) t += s[j][tx];
        dw[i] += t;
    }
}

int sum_parts(const float *part, unsigned parts, int width, float *dw, cudaStream_t stream)
{
    sum_parts_kernel<<<gk_blocks(width, 32), 1024, 0, stream>>>(part, (int)parts, width, dw);
    GK_LAUNCH_CHECK();
    return 0;
}

bool f32_ok(const void *p, long stride) { return ((uintptr_t)p & 15) == 0 && stride % 4 == 0; }

/* RMSNorm: K vectors of 8 per thread, K in {1, 2, 4}; at most 256 threads a CTA (512 for K = 4,
 * H > 8192), so that the row stays in registers. */
int rms_k(int vecs) { return vecs <= 256 ? 1 : vecs <= 512 ? 2 : 4; }

template <int K>
void rms_launch(unsigned grid, int vecs, cudaStream_t stream, const float *dy, long dys, const bf16 *x,
                long xs, const bf16 *w, const float *res, long rs, float *dx, long dxs, bf16 *dxb, long dxbs,
                float *part, int rows, int H, float eps)
{
    const int threads = (((vecs + K - 1) / K) + 31) / 32 * 32;
    rmsnorm_bwd_kernel<K><<<grid, threads, 0, stream>>>(dy, dys, x, xs, w, res, rs, dx, dxs, dxb, dxbs, part,
                                                        rows, H, eps);
}

/* The q/k norm backward with R heads an item; returns its grid (the number of partials). */
template <int KS, int R>
unsigned qk_launch(size_t sm, cudaStream_t stream, const float *dy, long dys, const bf16 *x, long xs, bf16 *dx,
                   long dxs, const bf16 *w, float *part, int n_tokens, int n_heads, int hd, const int32_t *pos,
                   const float *inv_freq, float eps)
{
    const long items = (long)n_tokens * ((n_heads + R - 1) / R), g = (items + WARPS - 1) / WARPS;
    const unsigned grid = (unsigned)(g < GK_NORM_BWD_PARTS ? g : GK_NORM_BWD_PARTS);
    qknorm_rope_bwd_kernel<KS, R><<<grid, WARPS * 32, sm, stream>>>(dy, dys, x, xs, dx, dxs, w, part, n_tokens,
                                                                   n_heads, hd, pos, inv_freq, eps);
    return grid;
}

} // namespace

extern "C" size_t gk_norm_bwd_ws_bytes(int width)
{
    return width > 0 ? (size_t)GK_NORM_BWD_PARTS * (size_t)width * sizeof(float) : 0;
}

extern "C" int gk_rmsnorm_bwd(const float *dy, long dy_stride, const void *x, long x_stride, const void *w,
                              const float *res, long res_stride, float *dx, long dx_stride, void *dx_bf16,
                              long dxb_stride, float *dw, float *ws, int rows, int H, float eps,
                              cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || H > 16384 || !dw || !ws || dy_stride < H || x_stride < H ||
        !f32_ok(dy, dy_stride) || !gk_vec_ok(x, x_stride) || !gk_vec_ok(w, 0) || !f32_ok(ws, 0) ||
        (res && (res_stride < H || !f32_ok(res, res_stride))) ||
        (dx && (dx_stride < H || !f32_ok(dx, dx_stride))) ||
        (dx_bf16 && (dxb_stride < H || !gk_vec_ok(dx_bf16, dxb_stride))))
        return -EINVAL;
    if (rows == 0) return 0;
    const unsigned grid = (unsigned)(rows < GK_NORM_BWD_PARTS ? rows : GK_NORM_BWD_PARTS);
    const int vecs = H / 8;
    switch (rms_k(vecs)) {
    case 1:
        rms_launch<1>(grid, vecs, stream, dy, dy_stride, (const bf16 *)x, x_stride, (const bf16 *)w, res,
                      res_stride, dx, dx_stride, (bf16 *)dx_bf16, dxb_stride, ws, rows, H, eps);
        break;
    case 2:
        rms_launch<2>(grid, vecs, stream, dy, dy_stride, (const bf16 *)x, x_stride, (const bf16 *)w, res,
                      res_stride, dx, dx_stride, (bf16 *)dx_bf16, dxb_stride, ws, rows, H, eps);
        break;
    default:
        rms_launch<4>(grid, vecs, stream, dy, dy_stride, (const bf16 *)x, x_stride, (const bf16 *)w, res,
                      res_stride, dx, dx_stride, (bf16 *)dx_bf16, dxb_stride, ws, rows, H, eps);
        break;
    }
    GK_LAUNCH_CHECK();
    return sum_parts(ws, grid, H, dw, stream);
}

extern "C" int gk_qknorm_rope_bwd(const float *dy, long dy_stride, const void *x, long x_stride, void *dx,
                                  long dx_stride, const void *w, float *dw, float *ws, int n_tokens,
                                  int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                                  float eps, cudaStream_t stream)
{
    long width = (long)n_heads * head_dim;
    /* pairs of elements: float2 of dy, bf162 of x, dx and w */
    if (n_tokens < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 4 || head_dim > 512 || !dy ||
        !x || !dx || !w || !dw || !ws || !pos || !inv_freq || dy_stride < width || x_stride < width ||
        dx_stride < width || dy_stride % 2 || x_stride % 2 || dx_stride % 2 || (uintptr_t)dy % 8 ||
        (uintptr_t)x % 4 || (uintptr_t)dx % 4 || (uintptr_t)w % 4 || (uintptr_t)ws % 16)
        return -EINVAL;
    if (n_tokens == 0) return 0;
    const size_t sm = (size_t)WARPS * head_dim * sizeof(float);
    unsigned grid;
    if (head_dim <= 128)
        grid = qk_launch<1, 4>(sm, stream, dy, dy_stride, (const bf16 *)x, x_stride, (bf16 *)dx, dx_stride,
                               (const bf16 *)w, ws, n_tokens, n_heads, head_dim, pos, inv_freq, eps);
    else if (head_dim <= 256)
        grid = qk_launch<2, 2>(sm, stream, dy, dy_stride, (const bf16 *)x, x_stride, (bf16 *)dx, dx_stride,
                               (const bf16 *)w, ws, n_tokens, n_heads, head_dim, pos, inv_freq, eps);
    else
        grid = qk_launch<4, 1>(sm, stream, dy, dy_stride, (const bf16 *)x, x_stride, (bf16 *)dx, dx_stride,
                               (const bf16 *)w, ws, n_tokens, n_heads, head_dim, pos, inv_freq, eps);
    GK_LAUNCH_CHECK();
    return sum_parts(ws, grid, head_dim, dw, stream);
}
