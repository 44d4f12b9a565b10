/* embed.h: embedding gather on the GPU (bf16 table, int32 token ids).
 * out[t, :] = table[tokens[t], :]; ids outside [0, vocab) give a zero row. */
#pragma once
#include "gpukern/gk.h"

/* table [vocab, H], out [n_tokens, H] with row stride out_stride (elements).
 * Needs H % 8 == 0 and 16-byte aligned table/out rows. tokens is device memory. */
GK_API int gk_embed(const void *table, int vocab, int H, const int32_t *tokens, int n_tokens,
                    void *out, long out_stride, cudaStream_t stream);

/* Same gather into an fp32 buffer (an fp32 residual stream): out [n_tokens, H] float, row stride
 * out_stride (elements, multiple of 4), 16-byte aligned. */
GK_API int gk_embed_f32(const void *table, int vocab, int H, const int32_t *tokens, int n_tokens,
                        float *out, long out_stride, cudaStream_t stream);
