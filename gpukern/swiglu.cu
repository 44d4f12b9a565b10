/* swiglu.cu: SwiGLU, 8 elements per thread with 16-byte loads and stores.
 * silu(g) = g / (1 + exp(-g)) in fp32; one rounding to bf16. */
#include "gpukern/swiglu.h"
#include "gpukern/gk_impl.cuh"

__global__ void swiglu_kernel(const bf16x8 *gate, const bf16x8 *up, long in_stride_vec, bf16x8 *out,
                              long out_stride_vec, int rows, int vecs)
{
    long n = (long)rows * vecs;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
         idx += (long)gridDim.x * blockDim.x) {
        long r = idx / vecs, c = idx % vecs;
        float g[8], u[8];
        bf16x8_to_f32(gate[r * in_stride_vec + c], g);
        bf16x8_to_f32(up[r * in_stride_vec + c], u);
#pragma unroll
        for (int j = 0; j < 8; j++) g[j] = g[j] / (1.f + __expf(-g[j])) * u[j];
        out[r * out_stride_vec + c] = f32_to_bf16x8(g);
    }
}

extern "C" int gk_swiglu(const void *gate, const void *up, long in_stride, void *out, long out_stride,
                         int rows, int I, cudaStream_t stream)
{
    if (rows < 0 || I <= 0 || I % 8 || in_stride < I || out_stride < I || !gk_vec_ok(gate, in_stride) ||
        !gk_vec_ok(up, in_stride) || !gk_vec_ok(out, out_stride))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (I / 8);
    unsigned grid = gk_blocks(n, 256);
    if (grid > 132u * 16) grid = 132u * 16;
    swiglu_kernel<<<grid, 256, 0, stream>>>((const bf16x8 *)gate, (const bf16x8 *)up, in_stride / 8,
                                            (bf16x8 *)out, out_stride / 8, rows, I / 8);
    GK_LAUNCH_CHECK();
    return 0;
}
