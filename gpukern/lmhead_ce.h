/* lmhead_ce.h: the frozen LM head fused with the weighted cross entropy of the DFlash objective
 * on the GPU, chunked over rows so that only chunk_rows x V logits exist at once; and the
 * per-block metrics (loss, accuracy, accepted length) of the scored rows. */
#pragma once
#include <stddef.h>
#include "gpukern/gemmx.h"
#include "gpukern/gk.h"

/* Device bytes of `work` for gk_lmhead_ce. */
GK_API size_t gk_lmhead_ce_work_bytes(int chunk_rows, int H, int V);

/* For each of the n_rows rows r = rows[i] of hidden [n_hidden, H] (bf16, contiguous):
 * logits = hidden[r] @ lm_head^T (lm_head [V, H] bf16; bf16 logits from cuBLAS with fp32
 * accumulation; everything after in fp32), then with
 * label = labels[r] (in [0, V)) and w = weights[r]:
 *   row_loss[r] = w * (logsumexp(logits) - logits[label]), hit[r] = (argmax == label, lowest index
 *   on ties), and when dhidden != NULL: dhidden[r] = (w * (softmax - onehot(label))) @ lm_head (fp32).
 * Every row of row_loss, hit and dhidden (all [n_hidden ...]) is written: rows not in `rows` get 0.
 * Chunks of chunk_rows rows: logits and their gradient (bf16) of one chunk at a time.
 * rows, labels, weights are device memory; H % 8 == 0. */
GK_API int gk_lmhead_ce(gk_gemmx *g, cudaStream_t stream, const void *hidden, int n_hidden, int H,
                        const void *lm_head, int V, const int32_t *rows, int n_rows,
                        const int32_t *labels, const float *weights, int chunk_rows, void *work,
                        float *row_loss, uint8_t *hit, float *dhidden);

/* Metrics of n_blocks blocks of bs rows (row b*bs + k is slot k of block b; supervised: weight > 0).
 * out (device, 4 doubles): sum of row_loss, supervised rows with hit, sum over blocks with a
 * supervised slot of 1 + the leading run of supervised hit slots from k = 1, and that block count.
 * block_loss (device, optional, n_blocks doubles): sum of row_loss per block. Deterministic. */
GK_API int gk_block_metrics(const float *row_loss, const uint8_t *hit, const float *weights, int n_blocks,
                            int bs, double *out, double *block_loss, cudaStream_t stream);
