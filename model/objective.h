/* objective.h: the DFlash training objective on a packed batch: anchor sampling (seeded by
 * seed, epoch, batch id, rank), block construction, same-position labels and decay weights. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* What a ring slot holds. Sequence s is tokens [cu_seqlens[s], cu_seqlens[s+1]). */
struct obj_batch {
    const uint32_t *tokens;         /* [n_tokens] */
    const uint8_t *loss_mask;       /* [n_tokens], 0 or not 0 */
    const int32_t *cu_seqlens;      /* [n_seqs + 1] */
    int n_seqs;
    int n_tokens;
    /* Captured target states [n_tokens, n_ctx * H], layer k at column k*H: set exactly one. */
    const uint16_t *hidden_bf16;
    const float *hidden_f32;
    size_t hidden_pitch;            /* elements between rows; 0 = n_ctx * H */
};

/* One draft block: anchor = index into the packed arrays; the block's input is
 * [tokens[anchor], MASK x (bs-1)], slot k at position (anchor - seq start) + k, and it
 * predicts tokens[anchor + k] (same position, no shift) for k >= 1. */
struct obj_block {
    int32_t anchor;
    int32_t seq;
};

struct obj_rng_key {
    uint64_t seed;
    uint64_t epoch;
    uint64_t batch_id;
    uint32_t rank;
};

/* xoshiro256** */
struct obj_rng {
    uint64_t s[4];
};
void obj_rng_seed(struct obj_rng *r, uint64_t a, uint64_t b, uint64_t c, uint64_t d);
uint64_t obj_rng_next(struct obj_rng *r);
/* Uniform in [0, n). */
uint64_t obj_rng_below(struct obj_rng *r, uint64_t n);
/* Standard normal (Box-Muller, double; one output of each pair). */
double obj_rng_normal(struct obj_rng *r);
/* n values ~ N(0, std^2) as floats: Box-Muller using both outputs of each pair (out[2k] the
 * cosine, out[2k+1] the sine one), an odd n's last value the cosine one of a fresh pair. */
void obj_rng_fill_normal(struct obj_rng *r, float *out, size_t n, double std);

/* cu_seqlens monotone from 0 to n_tokens, token ids < vocab, one hidden pointer set. */
int obj_batch_check(const struct obj_batch *b, int vocab, char *err, size_t errlen);

/* Anchor p of sequence s (relative position) is a candidate when loss_mask[p] and
 * loss_mask[p+1] are set, p+1 inside the sequence. Each sequence gets min(num_anchors,
 * candidates) anchors drawn without replacement; the draw depends only on (key, sequence index).
 * Blocks come out by sequence, anchors ascending. work: n_tokens int32 of scratch.
 * Returns the number of blocks, or -DF_ERANGE when more than max_blocks would be made. */
int obj_sample_anchors(const struct obj_batch *b, int num_anchors, const struct obj_rng_key *key,
                       struct obj_block *out, int max_blocks, int32_t *work);

/* 0 when every block's sequence exists and its anchor lies inside that sequence, else -DF_ERANGE
 * (what a forward pass checks before it indexes anything with them). */
int obj_blocks_check(const struct obj_batch *b, const struct obj_block *blk, int nb);

/* Decay weight of slot k >= 1: exp(-(k-1)/gamma); gamma <= 0: 1. Slot 0: 0. */
double obj_decay(int k, double gamma);

/* Labels and weights of one block: for k in [0, bs): label[k] = tokens[anchor+k] (or -1 past the
 * sequence's end), weight[k] = 0 for k = 0, past the end or with loss_mask 0 at the label,
 * else obj_decay(k, gamma), at least FLT_MIN (w > 0 marks a supervised slot). */
void obj_block_targets(const struct obj_batch *b, const struct obj_block *blk, int block_size,
                       double gamma, int32_t *label, float *weight);
