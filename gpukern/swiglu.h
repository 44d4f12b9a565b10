/* swiglu.h: SwiGLU activation on the GPU: out = silu(gate) * up, bf16 in/out, fp32 math. */
#pragma once
#include "gpukern/gk.h"

/* gate, up: [rows, I] with row stride in_stride (e.g. the two halves of one fused
 * gate_up GEMM output: up = gate + I, in_stride = 2I); out [rows, I] with out_stride.
 * Needs I % 8 == 0 and 16-byte aligned rows. */
GK_API int gk_swiglu(const void *gate, const void *up, long in_stride, void *out, long out_stride,
                     int rows, int I, cudaStream_t stream);
