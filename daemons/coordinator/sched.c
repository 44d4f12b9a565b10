/* sched.c: bucketing, packing and shuffling of one epoch's batches.
 * splitmix64 seeded from (seed, epoch) drives both shuffles, so restarts rebuild the same epoch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemons/coordinator/sched.h"

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias. */
static uint32_t below(uint64_t *s, uint32_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = splitmix(s);
    while (x >= limit);
    return (uint32_t)(x % n);
}

static void shuffle(uint32_t *a, uint32_t n, uint64_t *s)
{
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = below(s, i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

int sched_check(const struct sched_params *p, char *err, size_t errlen)
{
    if (!p->token_budget || !p->max_seq_len || !p->bucket_width || !p->max_seqs) {
        snprintf(err, errlen, "schedule: token budget, max_seq_len, bucket width and max seqs must be > 0");
        return -EINVAL;
    }
    if (p->max_seq_len > p->token_budget) {
        snprintf(err, errlen, "data.max_seq_len (%u) is larger than data.token_budget (%u): a sample would not fit a batch",
                 p->max_seq_len, p->token_budget);
        return -EINVAL;
    }
    return 0;
}

void sched_epoch_done(struct sched_epoch *e)
{
    if (!e)
        return;
    free(e->first);
    free(e->samples);
    free(e->tokens);
    memset(e, 0, sizeof *e);
}

int sched_build(const uint32_t *lengths, uint32_t n, const struct sched_params *p, uint32_t epoch,
                struct sched_epoch *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int r = sched_check(p, err, errlen);
    if (r < 0)
        return r;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++)
        kept += lengths[i] > 0;
    if (kept == 0) {
        snprintf(err, errlen, "schedule: no samples%s", n ? " that train anything" : "");
        return -EINVAL;
    }
    uint64_t s = p->seed * 0x2545f4914f6cdd1dull ^ ((uint64_t)epoch + 1) * 0x9e3779b97f4a7c15ull;
    uint32_t nb = (p->max_seq_len + p->bucket_width - 1) / p->bucket_width;
    uint32_t *perm = malloc((size_t)n * 4), *order = malloc((size_t)n * 4);
    uint32_t *count = calloc((size_t)nb + 1, 4);
    out->epoch = epoch;
    out->samples = order;
    out->first = malloc(((size_t)n + 1) * 4);
    out->tokens = malloc((size_t)n * 4);
    if (!perm || !order || !count || !out->first || !out->tokens) {
        free(perm);
        free(count);
        sched_epoch_done(out);
        return -ENOMEM;
    }
    for (uint32_t i = 0, k = 0; i < n; i++)
        if (lengths[i])
            perm[k++] = i;
    n = kept;
    shuffle(perm, n, &s);

    /* Stable counting sort by length bucket keeps the shuffled order inside a bucket. */
#define LEN(i) (lengths[i] < p->max_seq_len ? lengths[i] : p->max_seq_len)
#define BUCKET(i) ((LEN(i) - 1) / p->bucket_width)   /* (every length > 0) */
    for (uint32_t i = 0; i < n; i++)
        count[BUCKET(perm[i]) + 1]++;
    for (uint32_t b = 0; b < nb; b++)
        count[b + 1] += count[b];
    for (uint32_t i = 0; i < n; i++)
        order[count[BUCKET(perm[i])]++] = perm[i];

    /* Greedy packing in bucket order: similar lengths share a batch. */
    uint32_t batches = 0, tok = 0, seqs = 0;
    out->first[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = LEN(order[i]);
        if (seqs && (tok + len > p->token_budget || seqs == p->max_seqs)) {
            out->tokens[batches] = tok;
            out->first[++batches] = i;
            tok = seqs = 0;
        }
        tok += len;
        seqs++;
    }
    out->tokens[batches] = tok;
    out->first[++batches] = n;
    out->n_batches = batches;
#undef LEN
#undef BUCKET

    /* Shuffle the batch order: rewrite samples/first/tokens in a permuted order. */
    uint32_t *bperm = malloc((size_t)batches * 4), *first2 = malloc(((size_t)batches + 1) * 4);
    uint32_t *tokens2 = malloc((size_t)batches * 4);
    if (!bperm || !first2 || !tokens2) {
        free(bperm), free(first2), free(tokens2), free(count);
        sched_epoch_done(out);
        free(perm);
        return -ENOMEM;
    }
    for (uint32_t b = 0; b < batches; b++)
        bperm[b] = b;
    shuffle(bperm, batches, &s);
    uint32_t at = 0;
    for (uint32_t b = 0; b < batches; b++) {
        uint32_t src = bperm[b], k = out->first[src + 1] - out->first[src];
        memcpy(perm + at, order + out->first[src], (size_t)k * 4);
        first2[b] = at;
        tokens2[b] = out->tokens[src];
        at += k;
    }
    first2[batches] = at;
    free(out->first);
    free(out->tokens);
    free(order);
    free(bperm);
    free(count);
    out->samples = perm;
    out->first = first2;
    out->tokens = tokens2;
    return 0;
}

uint64_t sched_fingerprint(const uint32_t *lengths, uint32_t n, const struct sched_params *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t words[6] = { p->seed, p->token_budget, p->max_seq_len, p->bucket_width, p->max_seqs, n };
    for (int i = 0; i < 6; i++)
        h = (h ^ words[i]) * 0x100000001b3ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ lengths[i]) * 0x100000001b3ull;
    return h;
}
