/* gk_impl.cuh: device helpers shared by the gpukern .cu files (not a public header).
 * 16-byte vector access of 8 bf16, warp reductions, alignment checks for launchers, a per-device
 * answer looked up once. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include <errno.h>
#include <atomic>
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

/* A fact about the current device, found once per device ordinal: find(dev) the first time it
 * answers (>= 0), the cached answer after. find must give the same answer each time (racing first
 * calls then agree); a negative one (it failed) is returned and asked again next time. -1 when
 * there is no current device. */
constexpr int GK_MAX_DEVICES = 64;
typedef std::atomic<int> gk_device_cache[GK_MAX_DEVICES];   /* zero-initialised: static storage */

template <typename F>
static inline int gk_device_once(gk_device_cache &cache, F find)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        (void)cudaGetLastError();
        return -1;
    }
    if (dev >= GK_MAX_DEVICES) return find(dev);
    int v = cache[dev].load(std::memory_order_relaxed);     /* the answer + 1; 0: not known yet */
    if (v > 0) return v - 1;
    const int got = find(dev);
    if (got >= 0) cache[dev].store(got + 1, std::memory_order_relaxed);
    return got;
}
