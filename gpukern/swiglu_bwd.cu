/* swiglu_bwd.cu: dgate = dz * up * s * (1 + g (1 - s)), dup = dz * g * s with s = sigmoid(g);
 * one thread per 8 elements. */
#include "gpukern/swiglu_bwd.h"
#include "gpukern/gk_impl.cuh"

__global__ void swiglu_bwd_kernel(const bf16 *dz, long dzs, const bf16 *gate, const bf16 *up, long ins,
                                  bf16 *dgate, bf16 *dup, long outs, int rows, int vecs)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * vecs) return;
    long r = i / vecs, c = (i % vecs) * 8;
    float d[8], g[8], u[8], dg[8], du[8];
    bf16x8_to_f32(*(const bf16x8 *)(dz + r * dzs + c), d);
    bf16x8_to_f32(*(const bf16x8 *)(gate + r * ins + c), g);
    bf16x8_to_f32(*(const bf16x8 *)(up + r * ins + c), u);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float s = 1.f / (1.f + __expf(-g[e]));
        dg[e] = d[e] * u[e] * s * (1.f + g[e] * (1.f - s));
        du[e] = d[e] * g[e] * s;
    }
    *(bf16x8 *)(dgate + r * outs + c) = f32_to_bf16x8(dg);
    *(bf16x8 *)(dup + r * outs + c) = f32_to_bf16x8(du);
}

extern "C" int gk_swiglu_bwd(const void *dz, long dz_stride, const void *gate, const void *up, long in_stride,
                             void *dgate, void *dup, long out_stride, int rows, int I, cudaStream_t stream)
{
    if (rows < 0 || I <= 0 || I % 8 || dz_stride < I || in_stride < I || out_stride < I ||
        !gk_vec_ok(dz, dz_stride) || !gk_vec_ok(gate, in_stride) || !gk_vec_ok(up, in_stride) ||
        !gk_vec_ok(dgate, out_stride) || !gk_vec_ok(dup, out_stride))
        return -EINVAL;
    if (rows == 0) return 0;
    long n = (long)rows * (I / 8);
    swiglu_bwd_kernel<<<gk_blocks(n, 256), 256, 0, stream>>>(
        (const bf16 *)dz, dz_stride, (const bf16 *)gate, (const bf16 *)up, in_stride, (bf16 *)dgate,
        (bf16 *)dup, out_stride, rows, I / 8);
    GK_LAUNCH_CHECK();
    return 0;
}
