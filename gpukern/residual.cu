/* residual.cu: residual add, 8 elements per thread, grid-stride loop. */
#include "gpukern/residual.h"
#include "gpukern/gk_impl.cuh"

__global__ void add_kernel(const bf16x8 *a, const bf16x8 *b, bf16x8 *out, long stride_vec, int rows,
                           int vecs)
{
    long n = (long)rows * vecs;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
         idx += (long)gridDim.x * blockDim.x) {
        long o = (idx / vecs) * stride_vec + idx % vecs;
        float x[8], y[8];
        bf16x8_to_f32(a[o], x);
        bf16x8_to_f32(b[o], y);
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] += y[j];
        out[o] = f32_to_bf16x8(x);
    }
}

extern "C" int gk_add(const void *a, const void *b, void *out, long stride, int rows, int H,
                      cudaStream_t stream)
{
    if (rows < 0 || H <= 0 || H % 8 || stride < H || !gk_vec_ok(a, stride) || !gk_vec_ok(b, stride) ||
        !gk_vec_ok(out, stride))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (H / 8);
    unsigned grid = gk_blocks(n, 256);
    if (grid > 132u * 16) grid = 132u * 16;
    add_kernel<<<grid, 256, 0, stream>>>((const bf16x8 *)a, (const bf16x8 *)b, (bf16x8 *)out,
                                         stride / 8, rows, H / 8);
    GK_LAUNCH_CHECK();
    return 0;
}

__global__ void bias_kernel(bf16x8 *x, long stride_vec, const bf16x8 *bias, int rows, int vecs)
{
    long n = (long)rows * vecs;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
         idx += (long)gridDim.x * blockDim.x) {
        long c = idx % vecs, o = (idx / vecs) * stride_vec + c;
        float a[8], b[8];
        bf16x8_to_f32(x[o], a);
        bf16x8_to_f32(bias[c], b);
#pragma unroll
        for (int j = 0; j < 8; j++) a[j] += b[j];
        x[o] = f32_to_bf16x8(a);
    }
}

extern "C" int gk_add_bias(void *x, long stride, const void *bias, int rows, int cols, cudaStream_t stream)
{
    if (rows < 0 || cols <= 0 || cols % 8 || stride < cols || !gk_vec_ok(x, stride) || !gk_vec_ok(bias, 0))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (cols / 8);
    unsigned grid = gk_blocks(n, 256);
    if (grid > 132u * 16) grid = 132u * 16;
    bias_kernel<<<grid, 256, 0, stream>>>((bf16x8 *)x, stride / 8, (const bf16x8 *)bias, rows, cols / 8);
    GK_LAUNCH_CHECK();
    return 0;
}
