/* gk_impl.cuh: device helpers shared by the gpukern .cu files (not a public header).
 * 16-byte vector access of 8 bf16, warp reductions, the RoPE kernels' lane layout, alignment checks
 * for launchers, a per-device answer looked up once. */
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

/* The RoPE kernels (rope.cu forward, norm_bwd.cu's q/k backward) take a token's heads a warp at a
 * time: lane l owns the rotation pairs (i, i + half) for i = 2l + 64k, k < KS, two at a time. */

/* sin and cos of pos * inv_freq[i] and [i + 1] for the lane's pairs (accurate sincosf). */
template <int KS>
__device__ __forceinline__ void rope_sincos(float pos, const float *inv_freq, int half, int lane, float2 sn[KS],
                                            float2 cs[KS])
{
#pragma unroll
    for (int k = 0; k < KS; k++) {
        const int i = 2 * lane + 64 * k;
        if (i >= half) continue;
        sincosf(pos * inv_freq[i], &sn[k].x, &cs[k].x);
        sincosf(pos * inv_freq[i + 1], &sn[k].y, &cs[k].y);
    }
}

/* The lane's pairs of a bf16 row of 2 * half values: first half in a, second half in b. */
template <int KS>
__device__ __forceinline__ void rope_load_pairs(const bf16 *row, int half, int lane, float2 a[KS], float2 b[KS])
{
#pragma unroll
    for (int k = 0; k < KS; k++) {
        const int i = 2 * lane + 64 * k;
        if (i >= half) continue;
        a[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(row + i));
        b[k] = __bfloat1622float2(*(const __nv_bfloat162 *)(row + half + i));
    }
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
