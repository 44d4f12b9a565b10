/* gk_impl.cuh: device helpers shared by the gpukern .cu files (not a public header).
 * 16-byte vector access of 8 bf16, warp reductions, alignment checks for launchers. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include <errno.h>
#include "gpukern/cuda_check.h"

typedef __nv_bfloat16 bf16;

struct __align__(16) bf16x8 { __nv_bfloat162 h[4]; };

__device__ __forceinline__ void bf16x8_to_f32(const bf16x8 &v, float f[8])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(v.h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ bf16x8 f32_to_bf16x8(const float f[8])
{
    bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return v;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* 16-byte aligned pointer and a row stride that keeps every row 16-byte aligned. */
static inline bool gk_vec_ok(const void *p, long stride)
{
    return ((uintptr_t)p & 15) == 0 && stride % 8 == 0;
}

static inline unsigned gk_blocks(long n, int per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}
