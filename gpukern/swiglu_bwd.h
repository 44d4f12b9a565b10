/* swiglu_bwd.h: backward of SwiGLU (z = silu(gate) * up) on the GPU, bf16 in/out, fp32 math. */
#pragma once
#include "gpukern/gk.h"

/* dz [rows, I] (stride dz_stride); gate, up [rows, I] with in_stride (e.g. the halves of one fused
 * [rows, 2I] buffer); dgate, dup [rows, I] with out_stride (may be the halves of one [rows, 2I]).
 * I % 8 == 0, 16-byte aligned rows. */
GK_API int gk_swiglu_bwd(const void *dz, long dz_stride, const void *gate, const void *up, long in_stride,
                         void *dgate, void *dup, long out_stride, int rows, int I, cudaStream_t stream);
