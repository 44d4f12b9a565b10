/* rmsnorm.cu: RMSNorm kernels, one warp per row (or per head), two passes over the row
 * (the second pass hits L1); statistics and scaling in fp32, one rounding to bf16. */
#include "gpukern/rmsnorm.h"
#include "gpukern/gk_impl.cuh"

/* Row r = (token r / heads, head r % heads); vecs = head width / 8. With ADD, the row is
 * a + b, stored to sum before normalising. */
template <bool ADD>
__global__ void rmsnorm_kernel(const bf16x8 *x, const bf16x8 *b, bf16x8 *sum, long stride_vec,
                               const bf16x8 *w, bf16x8 *out, long out_stride_vec, int rows,
                               int heads, int vecs, float eps)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    long t = r / heads, h = r % heads;
    const bf16x8 *xr = x + t * stride_vec + h * vecs;
    const bf16x8 *br = ADD ? b + t * stride_vec + h * vecs : nullptr;
    bf16x8 *sr = ADD ? sum + t * stride_vec + h * vecs : nullptr;
    bf16x8 *orow = out + t * out_stride_vec + h * vecs;

    float ss = 0.f;
    for (int i = lane; i < vecs; i += 32) {
        float f[8];
        bf16x8_to_f32(xr[i], f);
        if (ADD) {
            float g[8];
            bf16x8_to_f32(br[i], g);
            for (int j = 0; j < 8; j++) f[j] += g[j];
            bf16x8 s = f32_to_bf16x8(f);
            bf16x8_to_f32(s, f);  /* normalise the stored (rounded) sum, as a separate add would */
            sr[i] = s;
        }
        for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / (float)(vecs * 8) + eps);
    if (ADD) __syncwarp();
    for (int i = lane; i < vecs; i += 32) {
        float f[8], g[8];
        bf16x8_to_f32(ADD ? sr[i] : xr[i], f);
        bf16x8_to_f32(w[i], g);
        for (int j = 0; j < 8; j++) f[j] = f[j] * inv * g[j];
        orow[i] = f32_to_bf16x8(f);
    }
}

/* fp32 input rows (the fp32 residual stream), bf16 output; vecs = H / 8. */
__global__ void rmsnorm_f32_kernel(const float4 *x, long x_stride4, const bf16x8 *w, bf16x8 *out,
                                   long out_stride_vec, int rows, int vecs, float eps)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    const float4 *xr = x + (long)r * x_stride4;
    bf16x8 *orow = out + (long)r * out_stride_vec;
    float ss = 0.f;
    for (int i = lane; i < vecs; i += 32) {
        float4 a = xr[2 * i], b = xr[2 * i + 1];
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / (float)(vecs * 8) + eps);
    for (int i = lane; i < vecs; i += 32) {
        float4 a = xr[2 * i], b = xr[2 * i + 1];
        float f[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w }, g[8];
        bf16x8_to_f32(w[i], g);
        for (int j = 0; j < 8; j++) f[j] = f[j] * inv * g[j];
        orow[i] = f32_to_bf16x8(f);
    }
}

extern "C" int gk_rmsnorm_f32(const float *x, long x_stride, const void *w, void *out, long out_stride,
                              int rows, int H, float eps, cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || x_stride < H || x_stride % 4 || ((uintptr_t)x & 15) ||
        out_stride < H || !gk_vec_ok(out, out_stride) || !gk_vec_ok(w, 0))
        return -EINVAL;
    if (rows == 0) return 0;
    const int warps = 4;
    rmsnorm_f32_kernel<<<gk_blocks(rows, warps), warps * 32, 0, stream>>>(
        (const float4 *)x, x_stride / 4, (const bf16x8 *)w, (bf16x8 *)out, out_stride / 8, rows, H / 8, eps);
    GK_LAUNCH_CHECK();
    return 0;
}

static int launch(const void *x, const void *b, void *sum, long stride, const void *w, void *out,
                  long out_stride, int rows, int heads, int width, float eps, cudaStream_t stream)
{
    const int warps = 4;
    unsigned grid = gk_blocks(rows, warps);
    if (b)
        rmsnorm_kernel<true><<<grid, warps * 32, 0, stream>>>(
            (const bf16x8 *)x, (const bf16x8 *)b, (bf16x8 *)sum, stride / 8, (const bf16x8 *)w,
            (bf16x8 *)out, out_stride / 8, rows, heads, width / 8, eps);
    else
        rmsnorm_kernel<false><<<grid, warps * 32, 0, stream>>>(
            (const bf16x8 *)x, nullptr, nullptr, stride / 8, (const bf16x8 *)w,
            (bf16x8 *)out, out_stride / 8, rows, heads, width / 8, eps);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_rmsnorm(const void *x, long x_stride, const void *w, void *out, long out_stride,
                          int rows, int H, float eps, cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || x_stride < H || out_stride < H || !gk_vec_ok(x, x_stride) ||
        !gk_vec_ok(out, out_stride) || !gk_vec_ok(w, 0))
        return -EINVAL;
    if (rows == 0) return 0;
    return launch(x, nullptr, nullptr, x_stride, w, out, out_stride, rows, 1, H, eps, stream);
}

extern "C" int gk_rmsnorm_heads(void *x, long stride, int n_tokens, int n_heads, int head_dim,
                                const void *w, float eps, cudaStream_t stream)
{
    if (n_tokens < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 8 ||
        stride < (long)n_heads * head_dim || !gk_vec_ok(x, stride) || !gk_vec_ok(w, 0))
        return -EINVAL;
    if (n_tokens == 0) return 0;
    return launch(x, nullptr, nullptr, stride, w, x, stride, n_tokens * n_heads, n_heads, head_dim,
                  eps, stream);
}

extern "C" int gk_add_rmsnorm(const void *a, const void *b, void *sum, long stride, const void *w,
                              void *out, long out_stride, int rows, int H, float eps,
                              cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || stride < H || out_stride < H || !gk_vec_ok(a, stride) ||
        !gk_vec_ok(b, stride) || !gk_vec_ok(sum, stride) || !gk_vec_ok(out, out_stride) ||
        !gk_vec_ok(w, 0))
        return -EINVAL;
    if (rows == 0) return 0;
    return launch(a, b, sum, stride, w, out, out_stride, rows, 1, H, eps, stream);
}
