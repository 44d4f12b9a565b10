/* rope.cu: packed positions, rotary embedding fused with the optional per-head RMSNorm.
 * One warp per (token, head); the head stays in registers between the norm and the rotation,
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

/* Lane l owns the pairs (i, i + half) for i = 2l + 64k, k < 4, two at a time (bf162). A lane
 * writes only what it has read itself, so src == dst (in place) is safe. */
__global__ void rope_kernel(const bf16 *src, long src_stride, bf16 *dst, long dst_stride, int n_tokens,
                            int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                            const bf16 *norm_w, float eps)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= n_tokens * n_heads) return;
    int lane = threadIdx.x & 31;
    int t = r / n_heads, h = r % n_heads;
    int half = head_dim / 2;
    const bf16 *xh = src + (long)t * src_stride + (long)h * head_dim;
    bf16 *yh = dst + (long)t * dst_stride + (long)h * head_dim;
    float2 a[4], b[4];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int i = 2 * lane + 64 * k;
        if (i < half) {
            a[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(xh + i));
            b[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(xh + half + i));
            ss += a[k].x * a[k].x + a[k].y * a[k].y + b[k].x * b[k].x + b[k].y * b[k].y;
        }
    }
    if (norm_w) {
        float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int i = 2 * lane + 64 * k;
            if (i < half) {
                float2 wa = __bfloat1622float2(*(const __nv_bfloat162 *)(norm_w + i));
                float2 wb = __bfloat1622float2(*(const __nv_bfloat162 *)(norm_w + half + i));
                a[k].x *= inv * wa.x; a[k].y *= inv * wa.y;
                b[k].x *= inv * wb.x; b[k].y *= inv * wb.y;
            }
        }
    }
    float p = (float)pos[t];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int i = 2 * lane + 64 * k;
        if (i < half) {
            float s0, c0, s1, c1;
            sincosf(p * inv_freq[i], &s0, &c0);
            sincosf(p * inv_freq[i + 1], &s1, &c1);
            float2 oa = make_float2(a[k].x * c0 - b[k].x * s0, a[k].y * c1 - b[k].y * s1);
            float2 ob = make_float2(b[k].x * c0 + a[k].x * s0, b[k].y * c1 + a[k].y * s1);
            *(__nv_bfloat162 *)(yh + i) = __float22bfloat162_rn(oa);
            *(__nv_bfloat162 *)(yh + half + i) = __float22bfloat162_rn(ob);
        }
    }
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
    const int warps = 4;
    rope_kernel<<<gk_blocks((long)n_tokens * n_heads, warps), warps * 32, 0, stream>>>(
        (const bf16 *)src, src_stride, (bf16 *)dst, dst_stride, n_tokens, n_heads, head_dim, pos, inv_freq,
        (const bf16 *)norm_w, eps);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_rope(void *x, long stride, int n_tokens, int n_heads, int head_dim,
                       const int32_t *pos, const float *inv_freq, const void *norm_w, float eps,
                       cudaStream_t stream)
{
    return gk_rope_to(x, stride, x, stride, n_tokens, n_heads, head_dim, pos, inv_freq, norm_w, eps, stream);
}
