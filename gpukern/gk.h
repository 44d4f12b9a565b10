/* gk.h: conventions shared by the gpukern launchers.
 * bf16 tensors are passed as void* (row-major, 2 bytes per element); strides count elements. */
#pragma once
#include <stdint.h>
#include <string.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
#define GK_API extern "C"
#else
#define GK_API
#endif

/* Every launcher returns 0, -EINVAL when a shape or alignment assumption does not
 * hold (nothing is launched), or -DF_ECUDA when the launch fails. Launchers never
 * synchronise: errors inside a kernel surface at the caller's next sync. */

/* Host-side bf16 helpers (round to nearest even), for tests and loaders. */
static inline uint16_t gk_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float gk_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Whether device index `device` names no GPU this process can see (CUDA_VISIBLE_DEVICES limits
 * them; none there, or a driver too old for this runtime): what a restart cannot mend (the daemons
 * exit 78 on it, -ENODEV). *count gets the GPUs visible (0 when none), *why the runtime's reason
 * when it found none ("" otherwise). */
static inline int gk_device_missing(int device, int *count, const char **why)
{
    int n = 0;
    *why = "";
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
        if (e != cudaErrorNoDevice && e != cudaErrorInsufficientDriver)
            return 0;       /* another failure: the caller's cudaSetDevice says what */
        *why = cudaGetErrorString(e);
    }
    *count = n;
    return device < 0 || device >= n;
}

/* What a process's CUDA context, cuBLAS handles and NCCL communicator take on the device beside
 * the buffers it sizes itself: an allowance, not a measurement of this process. */
#define GK_DEVICE_RESERVE_BYTES ((size_t)1 << 30)

/* The current device's whole memory in bytes less GK_DEVICE_RESERVE_BYTES: what a process's own
 * buffers can never exceed. 0 when the runtime cannot say (its error cleared). */
static inline size_t gk_device_usable_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return total_b > GK_DEVICE_RESERVE_BYTES ? total_b - GK_DEVICE_RESERVE_BYTES : 1;
}
