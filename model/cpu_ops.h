/* cpu_ops.h: fp32 building blocks of the CPU backends (target, drafter) and the references for the
 * CUDA kernels: GEMM (OpenBLAS), RMSNorm, RoPE (HF rotate_half, Llama-3 scaling), SwiGLU, varlen attention. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/hfconfig.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtype conversion ---- */
static inline float cpu_bf16_to_f32_one(uint16_t h)
{
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t cpu_f32_to_bf16_one(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}
float cpu_f16_to_f32_one(uint16_t h);

/* Sources may be unaligned (safetensors mappings). */
void cpu_bf16_to_f32(float *dst, const void *src, size_t n);
void cpu_f16_to_f32(float *dst, const void *src, size_t n);
void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);

/* ---- OpenBLAS's kernels ---- */
/* OpenBLAS picks its kernels from the CPU's model number when it loads; a model newer than the
 * library (an Emerald Rapids, model 207, under Debian 12's 0.3.21) gets its generic SSE3 kernels,
 * "Prescott", a third of the speed or less. First thing in main: when that happened and
 * OPENBLAS_CORETYPE is not set, set it from the CPU's features (SkylakeX with AVX-512, Haswell with
 * AVX2 + FMA, SandyBridge with AVX) and exec this program again, once (same pid, arguments and
 * descriptors); when the exec fails the process goes on as it is. */
void cpu_blas_pick_kernels(char **argv);
/* After cpu_blas_pick_kernels: NULL, or a line saying what it changed (to log once logging is up). */
const char *cpu_blas_note(void);

/* ---- GEMM ---- */
/* y[n, out] = beta * y + x[n, in] @ w[out, in]^T (+ b[out] if b). HF nn.Linear layout.
 * beta = 1 fuses a residual add. */
void cpu_linear(float *y, const float *x, const float *w, const float *b, int n, int in, int out, float beta);

/* ---- normalisation / activation ---- */
/* out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w (w may be NULL) over `rows` rows of `width`
 * contiguous values. out may equal x. */
void cpu_rmsnorm(float *out, const float *x, const float *w, int rows, int width, float eps);
/* out[i] = silu(gate[i]) * up[i]; out may equal gate or up. */
void cpu_swiglu(float *out, const float *gate, const float *up, size_t n);

/* ---- RoPE ---- */
/* inv_freq[head_dim/2] as transformers computes it in fp32 (default or Llama-3 scaling). */
void cpu_rope_inv_freq(float *inv_freq, int head_dim, const struct hf_rope *rope);
/* cos/sin tables [max_pos, head_dim/2]: angle = pos * inv_freq in fp32, like HF. */
void cpu_rope_table(float *cos_t, float *sin_t, int max_pos, int head_dim, const float *inv_freq);
/* Rotate x[rows, n_heads*head_dim] in place, row r at position pos[r]: HF rotate_half convention
 * (pairs i and i + head_dim/2). Tables from cpu_rope_table with max_pos > every pos. */
void cpu_rope_apply(float *x, int rows, int n_heads, int head_dim, const int32_t *pos,
                    const float *cos_t, const float *sin_t);
/* pos[t] = t - start of t's sequence. */
void cpu_positions(int32_t *pos, const int32_t *cu_seqlens, int n_seqs);

/* ---- attention ---- */
/* Causal GQA attention over a packed varlen batch: q[T, nh*hd], k/v[T, nkv*hd], out[T, nh*hd];
 * query head h uses kv head h / (nh/nkv); token t attends to tokens s <= t of its own sequence.
 * softmax(q.k * scale) in fp32. scratch: cpu_attention_scratch_floats(max_seq_len) floats. */
size_t cpu_attention_scratch_floats(int max_seq_len);
void cpu_attention_varlen(float *out, const float *q, const float *k, const float *v,
                          const int32_t *cu_seqlens, int n_seqs, int n_heads, int n_kv_heads,
                          int head_dim, float scale, float *scratch);

#ifdef __cplusplus
}
#endif
