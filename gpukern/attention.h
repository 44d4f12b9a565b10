/* attention.h: causal self-attention for packed variable-length prefill with GQA on the GPU.
 * Flash-style (online softmax, no T x T scores in memory); bf16 in/out, fp32 softmax and accumulation. */
#pragma once
#include "gpukern/gk.h"

enum gk_attn_impl {
    GK_ATTN_AUTO = 0,    /* tensor-core kernel when head_dim is 64 or 128, else the simple kernel */
    GK_ATTN_SIMPLE = 1,  /* one warp per (query, head); any head_dim % 8 == 0 up to 256 */
    GK_ATTN_MMA = 2,     /* mma.sync tiles of 64 queries x 64 keys; head_dim 64 or 128 */
};

/* Token t (packed; sequence s spans cu_seqlens[s] .. cu_seqlens[s+1]) attends to the tokens
 * of its own sequence at positions <= its own. Query head h reads key/value head
 * h / (n_heads / n_kv_heads). Head h of token t: q + t*q_stride + h*head_dim (likewise k, v
 * with kv heads; out with query heads). cu_seqlens is device memory [n_seqs+1], non-negative
 * and non-decreasing; n_tokens is cu_seqlens[n_seqs] (host value; a larger one only launches
 * idle blocks, a smaller one leaves the last tokens unwritten). The grids grow with n_tokens and
 * n_seqs only, not with the longest sequence: -EINVAL when one would pass 2^31 - 1 blocks.
 * scale multiplies q.k (usually 1/sqrt(head_dim)). */
GK_API int gk_attention_prefill(const void *q, long q_stride, const void *k, long k_stride,
                                const void *v, long v_stride, void *out, long out_stride,
                                const int32_t *cu_seqlens, int n_seqs, int n_tokens,
                                int n_heads, int n_kv_heads, int head_dim, float scale,
                                int impl, cudaStream_t stream);
