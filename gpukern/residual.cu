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

__global__ void bias_f32_kernel(float4 *x, long stride4, const bf16x8 *bias, int rows, int vecs)
{
    long n = (long)rows * vecs;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
         idx += (long)gridDim.x * blockDim.x) {
        long c = idx % vecs, o = (idx / vecs) * stride4 + 2 * c;
        float b[8];
        bf16x8_to_f32(bias[c], b);
        float4 p = x[o], q = x[o + 1];
        x[o] = make_float4(p.x + b[0], p.y + b[1], p.z + b[2], p.w + b[3]);
        x[o + 1] = make_float4(q.x + b[4], q.y + b[5], q.z + b[6], q.w + b[7]);
    }
}

extern "C" int gk_add_bias_f32(float *x, long stride, const void *bias, int rows, int cols, cudaStream_t stream)
{
    if (rows < 0 || cols <= 0 || cols % 8 || stride < cols || stride % 4 || ((uintptr_t)x & 15) ||
        !gk_vec_ok(bias, 0))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (cols / 8);
    unsigned grid = gk_blocks(n, 256);
    if (grid > 132u * 16) grid = 132u * 16;
    bias_f32_kernel<<<grid, 256, 0, stream>>>((float4 *)x, stride / 4, (const bf16x8 *)bias, rows, cols / 8);
    GK_LAUNCH_CHECK();
    return 0;
}

__global__ void to_bf16_kernel(const float4 *src, long src_stride4, bf16x8 *dst, long dst_stride_vec, int rows,
                               int vecs)
{
    long n = (long)rows * vecs;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
         idx += (long)gridDim.x * blockDim.x) {
        long r = idx / vecs, c = idx % vecs;
        float4 p = src[r * src_stride4 + 2 * c], q = src[r * src_stride4 + 2 * c + 1];
        float f[8] = { p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w };
        dst[r * dst_stride_vec + c] = f32_to_bf16x8(f);
    }
}

extern "C" int gk_convert_f32_bf16(const float *src, long src_stride, void *dst, long dst_stride, int rows, int cols,
                              cudaStream_t stream)
{
    if (rows < 0 || cols <= 0 || cols % 8 || src_stride < cols || src_stride % 4 || ((uintptr_t)src & 15) ||
        dst_stride < cols || !gk_vec_ok(dst, dst_stride))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (cols / 8);
    unsigned grid = gk_blocks(n, 256);
    if (grid > 132u * 16) grid = 132u * 16;
    to_bf16_kernel<<<grid, 256, 0, stream>>>((const float4 *)src, src_stride / 4, (bf16x8 *)dst, dst_stride / 8,
                                             rows, cols / 8);
    GK_LAUNCH_CHECK();
    return 0;
}
