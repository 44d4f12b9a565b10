/* embed.cu: embedding gather, one warp per token row, 16-byte copies.
 * The forward validates ids on the host; out-of-range ids still never read out of bounds. */
#include "gpukern/embed.h"
#include "gpukern/gk_impl.cuh"

__global__ void embed_kernel(const bf16x8 *table, int vocab, int vecs, const int32_t *tokens,
                             int n_tokens, bf16x8 *out, long out_stride_vec)
{
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= n_tokens) return;
    int lane = threadIdx.x & 31;
    int id = tokens[t];
    bf16x8 *dst = out + (long)t * out_stride_vec;
    if (id < 0 || id >= vocab) {
        bf16x8 z;
        for (int i = 0; i < 4; i++) z.h[i] = __floats2bfloat162_rn(0.f, 0.f);
        for (int i = lane; i < vecs; i += 32) dst[i] = z;
        return;
    }
    const bf16x8 *src = table + (long)id * vecs;
    for (int i = lane; i < vecs; i += 32) dst[i] = src[i];
}

extern "C" int gk_embed(const void *table, int vocab, int H, const int32_t *tokens, int n_tokens,
                        void *out, long out_stride, cudaStream_t stream)
{
    if (n_tokens < 0 || vocab <= 0 || H <= 0 || H % 8 || !gk_vec_ok(table, H) ||
        !gk_vec_ok(out, out_stride) || out_stride < H)
        return -EINVAL;
    if (n_tokens == 0) return 0;
    const int warps = 4;
    embed_kernel<<<gk_blocks(n_tokens, warps), warps * 32, 0, stream>>>(
        (const bf16x8 *)table, vocab, H / 8, tokens, n_tokens, (bf16x8 *)out, out_stride / 8);
    GK_LAUNCH_CHECK();
    return 0;
}
