/* cuda_check.h: CUDA and cuBLAS error checks that report file:line and the error string.
 * Tests and tools use the *_CHECK forms (abort); library code uses the *_TRY forms (return -DF_ECUDA). */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include <cublas_api.h>
#include "common/err.h"

/* Abort with "file:line: call: message"; for tests, benches and tools only. */
#define CUDA_CHECK(call) do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) { \
        fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
        abort(); } } while (0)

#define CUBLAS_CHECK(call) do { \
    cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) { \
        fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
        abort(); } } while (0)

/* Library form: on failure write "file:line: call: message" into err (may be NULL)
 * and return -DF_ECUDA from the enclosing function. */
#define CUDA_TRY(call, err, errlen) do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) { \
        if (err) snprintf((err), (errlen), "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
        return -DF_ECUDA; } } while (0)

#define CUBLAS_TRY(call, err, errlen) do { \
    cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) { \
        if (err) snprintf((err), (errlen), "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
        return -DF_ECUDA; } } while (0)

/* After a kernel launch in a launcher: launch-time errors become -DF_ECUDA. */
#define GK_LAUNCH_CHECK() do { \
    if (cudaGetLastError() != cudaSuccess) return -DF_ECUDA; } while (0)
