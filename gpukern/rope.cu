/* rope.cu: packed positions, rotary embedding fused with the optional per-head RMSNorm.
 * A warp per few heads of a token; a head stays in registers between the norm and the rotation,
 * read from one strided buffer and written in place or to another. */
#include <math.h>
#include "gpukern/rope.h"
#include "gpukern/gk_impl.cuh"

extern "C" int gk_rope_inv_freq(float *inv_freq, int head_dim, double theta, const gk_rope_scaling *sc)
{
    if (head_dim <= 0 || head_dim % 2 || !(theta > 0)) return -EINVAL;
    int half = head_dim / 2;
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)head_dim);
    if (!sc || sc->type == GK_ROPE_DEFAULT) return 0;
    if (!(sc->factor > 0)) return -EINVAL;
    if (sc->type == GK_ROPE_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / (float)sc->factor;
        return 0;
    }
    if (sc->type != GK_ROPE_LLAMA3 || !(sc->high_freq_factor > sc->low_freq_factor) ||
        !(sc->low_freq_factor > 0) || !(sc->original_max_pos > 0))
        return -EINVAL;
    /* transformers' _compute_llama3_parameters, in fp32 like torch does it. */
    float factor = (float)sc->factor, lo = (float)sc->low_freq_factor, hi = (float)sc->high_freq_factor;
    float old_ctx = (float)sc->original_max_pos;
    float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = 2.0f * (float)M_PI / f;
        float g = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            g = (1.0f - smooth) * g / factor + smooth * g;
        }
        inv_freq[i] = g;
    }
    return 0;
}

__global__ void positions_kernel(const int32_t *cu, int n_seqs, int32_t *pos, int n_tokens)
{
    int s = blockIdx.x;
    if (s >= n_seqs) return;
    int b = cu[s], e = cu[s + 1];
    if (e > n_tokens) e = n_tokens;
    for (int t = b + threadIdx.x; t < e; t += blockDim.x) pos[t] = t - b;
}

extern "C" int gk_positions(const int32_t *cu_seqlens, int n_seqs, int32_t *pos, int n_tokens,
                            cudaStream_t stream)
{
    if (n_seqs < 0 || n_tokens < 0) return -EINVAL;
    if (n_seqs == 0 || n_tokens == 0) return 0;
    positions_kernel<<<n_seqs, 256, 0, stream>>>(cu_seqlens, n_seqs, pos, n_tokens);
    GK_LAUNCH_CHECK();
    return 0;
}

/* A warp takes up to R heads of one token: their loads are in flight together, and the token's
 * sin / cos (accurate sincosf, the kernel's main cost) are computed once for all of them. Lane l
 * owns the pairs (i, i + half) for i = 2l + 64k, k < KS (KS = ceil(head_dim / 128)), two at a time
 * (bf162). A lane writes only what it has read itself, so src == dst (in place) is safe. */
template <int KS, int R>
__global__ void __launch_bounds__(128)
rope_kernel(const bf16 *src, long src_stride, bf16 *dst, long dst_stride, int n_tokens, int n_heads,
            int head_dim, const int32_t *pos, const float *inv_freq, const bf16 *norm_w, float eps)
{
    const int groups = (n_heads + R - 1) / R;
    const long w = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= (long)n_tokens * groups) return;
    const long t = w / groups;
    const int h0 = (int)(w - t * groups) * R, nh = min(R, n_heads - h0), lane = threadIdx.x & 31;
    const int half = head_dim / 2;
    const bf16 *xt = src + t * src_stride + (long)h0 * head_dim;
    bf16 *yt = dst + t * dst_stride + (long)h0 * head_dim;
    float2 a[R][KS], b[R][KS];
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (j >= nh) continue;
        rope_load_pairs<KS>(xt + j * head_dim, half, lane, a[j], b[j]);
    }
    float2 sn[KS], cs[KS];
    rope_sincos<KS>((float)pos[t], inv_freq, half, lane, sn, cs);
    float2 wa[KS], wb[KS];
    if (norm_w)
        rope_load_pairs<KS>(norm_w, half, lane, wa, wb);
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (j >= nh) continue;
        if (norm_w) {
            float ss = 0.f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int i = 2 * lane + 64 * k;
                if (i < half)
                    ss += a[j][k].x * a[j][k].x + a[j][k].y * a[j][k].y + b[j][k].x * b[j][k].x +
                          b[j][k].y * b[j][k].y;
            }
            const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
            for (int k = 0; k < KS; k++) {
                if (2 * lane + 64 * k >= half) continue;
                a[j][k].x *= inv * wa[k].x; a[j][k].y *= inv * wa[k].y;
                b[j][k].x *= inv * wb[k].x; b[j][k].y *= inv * wb[k].y;
            }
        }
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const int i = 2 * lane + 64 * k;
            if (i >= half) continue;
            const float2 oa = make_float2(a[j][k].x * cs[k].x - b[j][k].x * sn[k].x,
                                          a[j][k].y * cs[k].y - b[j][k].y * sn[k].y);
            const float2 ob = make_float2(b[j][k].x * cs[k].x + a[j][k].x * sn[k].x,
                                          b[j][k].y * cs[k].y + a[j][k].y * sn[k].y);
            *(__nv_bfloat162 *)(yt + j * head_dim + i) = __float22bfloat162_rn(oa);
            *(__nv_bfloat162 *)(yt + j * head_dim + half + i) = __float22bfloat162_rn(ob);
        }
    }
}

template <int KS, int R>
void rope_launch(const bf16 *src, long src_stride, bf16 *dst, long dst_stride, int n_tokens, int n_heads,
                 int head_dim, const int32_t *pos, const float *inv_freq, const bf16 *norm_w, float eps,
                 cudaStream_t stream)
{
    const int warps = 4;
    const long items = (long)n_tokens * ((n_heads + R - 1) / R);
    rope_kernel<KS, R><<<gk_blocks(items, warps), warps * 32, 0, stream>>>(
        src, src_stride, dst, dst_stride, n_tokens, n_heads, head_dim, pos, inv_freq, norm_w, eps);
}

extern "C" int gk_rope_to(const void *src, long src_stride, void *dst, long dst_stride, int n_tokens,
                          int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                          const void *norm_w, float eps, cudaStream_t stream)
{
    if (n_tokens < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 8 || head_dim > 512 ||
        src_stride < (long)n_heads * head_dim || dst_stride < (long)n_heads * head_dim ||
        !gk_vec_ok(src, src_stride) || !gk_vec_ok(dst, dst_stride) || (norm_w && !gk_vec_ok(norm_w, 0)) ||
        (src == dst && src_stride != dst_stride))
        return -EINVAL;
    if (n_tokens == 0) return 0;
    auto launch = head_dim <= 128   ? rope_launch<1, 8>
                  : head_dim <= 256 ? rope_launch<2, 4>
                                    : rope_launch<4, 2>;
    launch((const bf16 *)src, src_stride, (bf16 *)dst, dst_stride, n_tokens, n_heads, head_dim, pos, inv_freq,
           (const bf16 *)norm_w, eps, stream);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_rope(void *x, long stride, int n_tokens, int n_heads, int head_dim,
                       const int32_t *pos, const float *inv_freq, const void *norm_w, float eps,
                       cudaStream_t stream)
{
    return gk_rope_to(x, stride, x, stride, n_tokens, n_heads, head_dim, pos, inv_freq, norm_w, eps, stream);
}
