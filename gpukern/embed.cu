/* embed.cu: embedding gather, one warp per token row, 16-byte copies.
 * The forward validates ids on the host; out-of-range ids still never read out of bounds. */
#include "gpukern/embed.h"
#include "gpukern/gk_impl.cuh"

__device__ __forceinline__ void store8(bf16x8 *dst, const bf16x8 &v) { *dst = v; }
__device__ __forceinline__ void store8(float4 *dst, const bf16x8 &v)
{
    float f[8];
    bf16x8_to_f32(v, f);
    dst[0] = make_float4(f[0], f[1], f[2], f[3]);
    dst[1] = make_float4(f[4], f[5], f[6], f[7]);
}

/* OUT = bf16x8 (one vector per 8 values) or float4 (two per 8 values). */
template <typename OUT> struct vecs_per8 { static constexpr int v = 1; };
template <> struct vecs_per8<float4> { static constexpr int v = 2; };

template <typename OUT>
__global__ void embed_kernel(const bf16x8 *table, int vocab, int vecs, const int32_t *tokens,
                             int n_tokens, OUT *out, long out_stride_elems)
{
    constexpr int per8 = vecs_per8<OUT>::v;
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= n_tokens) return;
    int lane = threadIdx.x & 31;
    int id = tokens[t];
    OUT *dst = out + (long)t * out_stride_elems / (8 / per8);
    bf16x8 z;
    for (int i = 0; i < 4; i++) z.h[i] = __floats2bfloat162_rn(0.f, 0.f);
    const bf16x8 *src = table + (long)(id < 0 || id >= vocab ? 0 : id) * vecs;
    for (int i = lane; i < vecs; i += 32) store8(dst + i * per8, id < 0 || id >= vocab ? z : src[i]);
}

extern "C" int gk_embed(const void *table, int vocab, int H, const int32_t *tokens, int n_tokens,
                        void *out, long out_stride, cudaStream_t stream)
{
    if (n_tokens < 0 || vocab <= 0 || H <= 0 || H % 8 || !gk_vec_ok(table, H) ||
        !gk_vec_ok(out, out_stride) || out_stride < H)
        return -EINVAL;
    if (n_tokens == 0) return 0;
    const int warps = 4;
    embed_kernel<bf16x8><<<gk_blocks(n_tokens, warps), warps * 32, 0, stream>>>(
        (const bf16x8 *)table, vocab, H / 8, tokens, n_tokens, (bf16x8 *)out, out_stride);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_embed_f32(const void *table, int vocab, int H, const int32_t *tokens, int n_tokens,
                            float *out, long out_stride, cudaStream_t stream)
{
    if (n_tokens < 0 || vocab <= 0 || H <= 0 || H % 8 || !gk_vec_ok(table, H) ||
        ((uintptr_t)out & 15) || out_stride % 4 || out_stride < H)
        return -EINVAL;
    if (n_tokens == 0) return 0;
    const int warps = 4;
    embed_kernel<float4><<<gk_blocks(n_tokens, warps), warps * 32, 0, stream>>>(
        (const bf16x8 *)table, vocab, H / 8, tokens, n_tokens, (float4 *)out, out_stride);
    GK_LAUNCH_CHECK();
    return 0;
}
