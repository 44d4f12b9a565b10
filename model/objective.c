/* objective.c: anchor sampling, labels and decay weights of the DFlash objective.
 * Same rules as the reference trainers; see objective.h. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "common/err.h"
#include "model/objective.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void obj_rng_seed(struct obj_rng *r, uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    /* Mix every word of the key through splitmix so nearby keys give unrelated streams. */
    uint64_t x = a;
    uint64_t h = splitmix64(&x);
    x = h ^ b; h = splitmix64(&x);
    x = h ^ c; h = splitmix64(&x);
    x = h ^ d; h = splitmix64(&x);
    x = h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t obj_rng_next(struct obj_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

uint64_t obj_rng_below(struct obj_rng *r, uint64_t n)
{
    /* Lemire's multiply-shift with rejection: unbiased. */
    uint64_t x = obj_rng_next(r);
    unsigned __int128 m = (unsigned __int128)x * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t thresh = -n % n;
        while (low < thresh) {
            x = obj_rng_next(r);
            m = (unsigned __int128)x * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double obj_rng_normal(struct obj_rng *r)
{
    double u1 = ((obj_rng_next(r) >> 11) + 1.0) * 0x1.0p-53;   /* (0, 1] */
    double u2 = (obj_rng_next(r) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void obj_rng_fill_normal(struct obj_rng *r, float *out, size_t n, double std)
{
    /* The radius in double keeps the tails (|z| up to 8.5 from 53-bit u1); the angle needs no
     * more than float, and sincosf makes the fill about 1.7x faster than cos + sin in double. */
    for (size_t j = 0; j < n; j += 2) {
        double u1 = ((obj_rng_next(r) >> 11) + 1.0) * 0x1.0p-53;   /* (0, 1] */
        float u2 = (float)(obj_rng_next(r) >> 40) * 0x1.0p-24f;     /* [0, 1) */
        float radius = (float)(std * sqrt(-2.0 * log(u1))), s, c;
        sincosf(6.28318530717958648f * u2, &s, &c);
        out[j] = radius * c;
        if (j + 1 < n)
            out[j + 1] = radius * s;
    }
}

int obj_batch_check(const struct obj_batch *b, int vocab, char *err, size_t errlen)
{
    if (b->n_seqs < 1 || b->n_tokens < 1) {
        snprintf(err, errlen, "batch: %d sequences, %d tokens", b->n_seqs, b->n_tokens);
        return -DF_EFORMAT;
    }
    if (!b->tokens || !b->loss_mask || !b->cu_seqlens) {
        snprintf(err, errlen, "batch: tokens, loss mask and cu_seqlens are required");
        return -EINVAL;
    }
    if (!b->hidden_bf16 == !b->hidden_f32) {
        snprintf(err, errlen, "batch: exactly one of hidden_bf16 / hidden_f32 must be set");
        return -EINVAL;
    }
    if (b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_seqs] != b->n_tokens) {
        snprintf(err, errlen, "batch: cu_seqlens must run from 0 to n_tokens %d (got %d..%d)",
                 b->n_tokens, b->cu_seqlens[0], b->cu_seqlens[b->n_seqs]);
        return -DF_EFORMAT;
    }
    for (int s = 0; s < b->n_seqs; s++)
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s]) {
            snprintf(err, errlen, "batch: cu_seqlens decreases at sequence %d", s);
            return -DF_EFORMAT;
        }
    for (int t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] >= (uint32_t)vocab) {
            snprintf(err, errlen, "batch: token %u at %d is outside the vocabulary (%d)",
                     b->tokens[t], t, vocab);
            return -DF_ERANGE;
        }
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int obj_blocks_check(const struct obj_batch *b, const struct obj_block *blk, int nb)
{
    for (int i = 0; i < nb; i++) {
        int s = blk[i].seq;
        if (s < 0 || s >= b->n_seqs || blk[i].anchor < b->cu_seqlens[s] || blk[i].anchor >= b->cu_seqlens[s + 1])
            return -DF_ERANGE;
    }
    return 0;
}

int obj_sample_anchors(const struct obj_batch *b, int num_anchors, const struct obj_rng_key *key,
                       struct obj_block *out, int max_blocks, int32_t *work)
{
    int n_out = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->cu_seqlens[s], end = b->cu_seqlens[s + 1];
        int n_cand = 0;
        for (int p = start; p + 1 < end; p++)
            if (b->loss_mask[p] && b->loss_mask[p + 1])
                work[n_cand++] = p;
        int take = n_cand < num_anchors ? n_cand : num_anchors;
        if (take == 0)
            continue;
        if (n_out + take > max_blocks)
            return -DF_ERANGE;
        if (take < n_cand) {
            struct obj_rng r;
            obj_rng_seed(&r, key->seed, key->epoch, key->batch_id,
                         ((uint64_t)key->rank << 32) ^ (uint64_t)(uint32_t)s);
            /* Partial Fisher-Yates: the first `take` entries are a uniform draw. */
            for (int i = 0; i < take; i++) {
                int j = i + (int)obj_rng_below(&r, (uint64_t)(n_cand - i));
                int32_t t = work[i]; work[i] = work[j]; work[j] = t;
            }
            qsort(work, (size_t)take, sizeof *work, cmp_i32);
        }
        for (int i = 0; i < take; i++) {
            out[n_out].anchor = work[i];
            out[n_out].seq = s;
            n_out++;
        }
    }
    return n_out;
}

double obj_decay(int k, double gamma)
{
    if (k <= 0)
        return 0.0;
    if (gamma <= 0)
        return 1.0;
    return exp(-(double)(k - 1) / gamma);
}

void obj_block_targets(const struct obj_batch *b, const struct obj_block *blk, int block_size,
                       double gamma, int32_t *label, float *weight)
{
    int end = b->cu_seqlens[blk->seq + 1];
    for (int k = 0; k < block_size; k++) {
        int idx = blk->anchor + k;
        if (idx >= end) {
            label[k] = -1;
            weight[k] = 0.0f;
            continue;
        }
        label[k] = (int32_t)b->tokens[idx];
        float w = (k > 0 && b->loss_mask[idx]) ? (float)obj_decay(k, gamma) : 0.0f;
        /* a decay below float's range (a small gamma) keeps the slot supervised, with a weight
         * that adds nothing measurable: w > 0 is what marks a label everywhere (rows, accuracy) */
        weight[k] = k > 0 && b->loss_mask[idx] && w < FLT_MIN ? FLT_MIN : w;
    }
}
