/* fuzz_dataset.c: fuzz target for the dataset reader (common/dataset.c dataset_open).
 * Each input is opened as is, without the checksum, and with size and checksum fixed up
 * (so mutations reach the checks behind them); an opened dataset is then read in full. */
#include "common/dataset.h"
#include "tests/fuzz/fuzz.h"

/* Walk everything dataset_open vouched for: every sample in bounds and the samples tiling the
 * tokens, ids < vocab, mask 0/1. */
static void dataset_walk(const struct dataset *ds)
{
    uint64_t masked = 0, tokens = 0, pairs = 0;
    uint32_t max_len = 0;
    FUZZ_ASSERT(ds->n_samples >= 1 && ds->vocab_size >= 1);
    for (uint64_t i = 0; i < ds->n_samples; i++) {
        uint32_t n = dataset_sample_len(ds, i);
        const uint32_t *t = dataset_sample_tokens(ds, i);
        const uint8_t *m = dataset_sample_mask(ds, i);
        FUZZ_ASSERT(n >= 1);
        FUZZ_ASSERT(t >= ds->tokens && t + n <= ds->tokens + ds->n_tokens);
        FUZZ_ASSERT(t == ds->tokens + tokens);     /* the samples tile the tokens in order */
        for (uint32_t j = 0; j < n; j++) {
            FUZZ_ASSERT(t[j] < ds->vocab_size);
            FUZZ_ASSERT(m[j] <= 1);
            pairs += j + 1 < n && m[j] && m[j + 1];     /* an anchor: within its sample */
        }
        tokens += n;
        max_len = n > max_len ? n : max_len;
    }
    for (uint64_t t = 0; t < ds->n_tokens; t++)
        masked += ds->mask[t];
    FUZZ_ASSERT(max_len == ds->hdr->max_len);
    FUZZ_ASSERT(masked == ds->hdr->masked_tokens);
    FUZZ_ASSERT(pairs == ds->anchor_pairs);
    FUZZ_ASSERT(tokens == ds->n_tokens);
}

static void dataset_try(int *fd, const uint8_t *data, size_t size, unsigned flags)
{
    char path[64], err[512];
    struct dataset ds;
    const char *p = fuzz_memfile(fd, path, sizeof path, data, size);
    if (!p)
        return;
    err[0] = 0;
    if (dataset_open(&ds, p, flags, err, sizeof err) == 0) {
        dataset_walk(&ds);
        dataset_close(&ds);
    } else {
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        FUZZ_ASSERT(ds.map == NULL && ds.fd == -1);   /* "ds is then closed" */
    }
}

int fuzz_dataset(const uint8_t *data, size_t size)
{
    static int fd = -1;
    dataset_try(&fd, data, size, 0);
    dataset_try(&fd, data, size, DATASET_OPEN_NO_CHECKSUM);
    if (size < DATASET_HEADER_SIZE)
        return 0;
    uint8_t *fixed = malloc(size);
    if (!fixed)
        return 0;
    memcpy(fixed, data, size);
    struct dataset_header h;
    memcpy(&h, fixed, sizeof h);
    h.file_size = size;
    struct dataset_hash s;
    dataset_hash_init(&s, DATASET_HASH_SEED);
    dataset_hash_update(&s, fixed + DATASET_HEADER_SIZE, size - DATASET_HEADER_SIZE);
    h.checksum = dataset_hash_final(&s);
    memcpy(fixed, &h, sizeof h);
    dataset_try(&fd, fixed, size, 0);
    free(fixed);
    return 0;
}
