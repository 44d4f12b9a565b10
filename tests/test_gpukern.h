/* test_gpukern.h: helpers for the gpukern tests: GPU presence (skip with 77), random bf16
 * data, device buffers poisoned with NaN, and the relative error against a CPU reference. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <errno.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include "tests/test.h"
#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "gpukern/cuda_check.h"
#include "gpukern/gk.h"

/* Exit 77 when this machine has no usable GPU. */
static inline void gk_test_require_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) SKIP("no CUDA device");
    CUDA_CHECK(cudaSetDevice(0));
}

/* xorshift64*, seeded from time and pid so each run draws fresh data; the seed is printed. */
static uint64_t gk_rng_state;
static inline void gk_rng_seed(void)
{
    const char *s = getenv("GK_TEST_SEED");
    gk_rng_state = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (!gk_rng_state) gk_rng_state = 1;
    fprintf(stderr, "seed %llu (set GK_TEST_SEED to repeat)\n", (unsigned long long)gk_rng_state);
}
static inline uint64_t gk_rng_u64(void)
{
    gk_rng_state ^= gk_rng_state >> 12;
    gk_rng_state ^= gk_rng_state << 25;
    gk_rng_state ^= gk_rng_state >> 27;
    return gk_rng_state * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [-1, 1). */
static inline float gk_rng_uniform(void) { return (float)((gk_rng_u64() >> 40) * (2.0 / 16777216.0) - 1.0); }
static inline int gk_rng_int(int lo, int hi) { return lo + (int)(gk_rng_u64() % (uint64_t)(hi - lo + 1)); }

/* n random bf16 values (uniform * scale + offset); f (optional) receives the exact floats. */
static inline uint16_t *gk_rand_bf16(size_t n, float scale, float offset, float **f)
{
    uint16_t *h = (uint16_t *)malloc(n * 2);
    float *ff = f ? (float *)malloc(n * 4) : NULL;
    CHECK(h && (!f || ff));
    for (size_t i = 0; i < n; i++) {
        h[i] = gk_f32_to_bf16(gk_rng_uniform() * scale + offset);
        if (ff) ff[i] = gk_bf16_to_f32(h[i]);
    }
    if (f) *f = ff;
    return h;
}

static inline void *gk_dev_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Device buffer of n bf16 filled with NaN, so unwritten outputs are caught. */
static inline void *gk_dev_poisoned(size_t n)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 2 + 16));
    CUDA_CHECK(cudaMemset(d, 0xff, n * 2 + 16));
    return d;
}

static inline float *gk_dev_download_f32(const void *d, size_t n)
{
    uint16_t *h = (uint16_t *)malloc(n * 2);
    float *f = (float *)malloc(n * 4);
    CHECK(h && f);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) f[i] = gk_bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* ||out - ref|| / ||ref|| over rows x cols of strided buffers; any non-finite output fails. */
static inline double gk_rel_err(const float *out, long out_stride, const double *ref, long ref_stride,
                                long rows, long cols)
{
    double num = 0, den = 0;
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++) {
            double o = out[r * out_stride + c], x = ref[r * ref_stride + c];
            if (!isfinite(o)) TEST_FAIL("non-finite output at row %ld col %ld", r, c);
            num += (o - x) * (o - x);
            den += x * x;
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double gk_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
#endif
