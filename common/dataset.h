/* dataset.h: the tokenized dataset file (token ids u32 + loss mask u8 + sample index),
 * memory-mapped and validated on open; and a streaming writer for it (dflash-data). */
#pragma once
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

/* File layout, little-endian (bump DATASET_VERSION when any of it changes):
 *   [0, 128)                      struct dataset_header
 *   [128, +4*n_tokens)            token ids, u32, every id < vocab_size
 *   [mask_off, +n_tokens)         loss mask, u8, 0 or 1 (1 = the drafter learns this token)
 *   [index_off, +16*n_samples)    struct dataset_index_entry, index_off 8-aligned
 * Samples are contiguous token ranges [offset, offset+length), length >= 1, that tile the tokens
 * in order: sample 0 starts at token 0, each next one where the one before ends, the last ends
 * at n_tokens.
 * checksum = dataset_hash64 of bytes [128, file end) seeded with DATASET_HASH_SEED. */
#define DATASET_MAGIC "DFLDATA1"
#define DATASET_VERSION 1u
#define DATASET_HEADER_SIZE 128u
#define DATASET_HASH_SEED 0x6466646174617365ull
#define DATASET_MAX_VOCAB (1u << 30)

struct dataset_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t n_samples;
    uint64_t n_tokens;
    uint32_t vocab_size;
    uint32_t max_len;           /* longest sample */
    uint64_t tokens_off;
    uint64_t mask_off;
    uint64_t index_off;
    uint64_t file_size;
    uint64_t checksum;
    uint64_t masked_tokens;     /* tokens with loss mask 1 */
    uint8_t reserved[40];
};
_Static_assert(sizeof(struct dataset_header) == DATASET_HEADER_SIZE, "dataset header is part of the file format");

struct dataset_index_entry {
    uint64_t offset;            /* first token, in tokens from tokens_off */
    uint32_t length;
    uint32_t reserved;
};
_Static_assert(sizeof(struct dataset_index_entry) == 16, "index entry is part of the file format");

struct dataset {
    int fd;
    void *map;
    size_t map_len;
    const struct dataset_header *hdr;
    const uint32_t *tokens;
    const uint8_t *mask;
    const struct dataset_index_entry *index;
    uint64_t n_samples, n_tokens;
    uint32_t vocab_size;
    uint64_t checksum;          /* the header's, as opened (identifies the file's contents) */
    uint64_t anchor_pairs;      /* two loss tokens in a row in one sample: where a block can be anchored */
    char path[256];
};

#define DATASET_OPEN_NO_CHECKSUM 1u /* skip the full-file checksum (structure still checked) */

/* Map and validate: magic, version, header fields, file size, section offsets, every
 * index entry in bounds and the entries tiling the tokens, token ids < vocab, mask values 0/1,
 * checksum. On failure returns <0 (-DF_EMAGIC, -DF_EVERSION, -DF_ETRUNC, -DF_EFORMAT,
 * -DF_ERANGE, -DF_ECHECKSUM, -errno) and err holds one line "<path>: <reason>". ds is then
 * closed. */
int dataset_open(struct dataset *ds, const char *path, unsigned flags, char *err, size_t errlen);
void dataset_close(struct dataset *ds);   /* zero-filled or half-opened is fine */

static inline uint32_t dataset_sample_len(const struct dataset *ds, uint64_t i) { return ds->index[i].length; }
static inline const uint32_t *dataset_sample_tokens(const struct dataset *ds, uint64_t i) { return ds->tokens + ds->index[i].offset; }
static inline const uint8_t *dataset_sample_mask(const struct dataset *ds, uint64_t i) { return ds->mask + ds->index[i].offset; }
/* Sample i's entry still inside the token section: dataset_open checked every entry, but a file
 * rewritten in place under the mapping can change them (a rename-replace, as dflash-data does,
 * cannot). */
static inline int dataset_sample_in_bounds(const struct dataset *ds, uint64_t i)
{
    uint64_t off = ds->index[i].offset, len = ds->index[i].length;
    return off <= ds->n_tokens && len <= ds->n_tokens - off;
}

/* What a cut to max_len tokens a sample takes out of the loss, over every sample longer: loss
 * tokens past the cut (*masked) and anchor pairs (two loss tokens in a row) that reach past it
 * (*pairs). Reads only the cut tails. */
void dataset_cut_loss(const struct dataset *ds, uint32_t max_len, uint64_t *masked, uint64_t *pairs);

/* The lengths the batch schedule is built from, into lengths[n_samples]: each sample's length,
 * or (leave_out) 0 for a sample that trains nothing when cut to max_len tokens (0: not cut): one
 * without two loss tokens in a row (a block's anchor and its first label) in them, whose blocks
 * would be none. A batch of such samples alone would be a step with nothing supervised (runs begun
 * before they were left out schedule every sample: !leave_out). Returns how many train nothing.
 * Reads each sample's mask up to its first anchor pair. */
uint64_t dataset_sched_lengths(const struct dataset *ds, uint32_t max_len, bool leave_out, uint32_t *lengths);

/* Incremental 64-bit hash used for the checksum (not cryptographic). */
struct dataset_hash { uint64_t h; uint64_t total; uint8_t tail[8]; unsigned ntail; };
void dataset_hash_init(struct dataset_hash *s, uint64_t seed);
void dataset_hash_update(struct dataset_hash *s, const void *data, size_t len);
uint64_t dataset_hash_final(const struct dataset_hash *s);

/* Streaming writer: samples are appended, the file appears (atomically renamed into
 * place, fsync'd) only on dataset_writer_finish. vocab_size 0 = max id + 1. A path that exists
 * and is not a regular file is refused at open; through a symlink, the file it leads to is
 * replaced (the link stays) and keeps its mode; a new file gets 0666 less the umask. Its temp
 * files are beside that file. */
struct dataset_writer;
int dataset_writer_open(struct dataset_writer **w, const char *path, uint32_t vocab_size, char *err, size_t errlen);
/* Append one sample; rejects length 0, ids >= vocab (when set), mask values other than 0/1. */
int dataset_writer_add(struct dataset_writer *w, const uint32_t *tokens, const uint8_t *mask, uint32_t n,
                       char *err, size_t errlen);
/* Flush then commit. */
int dataset_writer_finish(struct dataset_writer *w, char *err, size_t errlen);
/* The two halves of finish: flush writes the temp file whole and fsyncs it (the long part);
 * commit gives it its name in place (a quick rename: a caller may hold signals off for it). */
int dataset_writer_flush(struct dataset_writer *w, char *err, size_t errlen);
int dataset_writer_commit(struct dataset_writer *w, char *err, size_t errlen);
/* Drop an unfinished writer and its temp files (NULL is fine). */
void dataset_writer_free(struct dataset_writer *w);
uint64_t dataset_writer_samples(const struct dataset_writer *w);
uint64_t dataset_writer_masked_tokens(const struct dataset_writer *w);  /* with loss mask 1, so far */
/* Places where a block can be anchored so far: two loss tokens in a row in one sample (the
 * anchor and its first label; dataset.anchor_pairs of the file). */
uint64_t dataset_writer_anchor_pairs(const struct dataset_writer *w);
/* The temp file the writer fills and renames into place at finish, for a caller that removes it
 * from a signal handler (dataset_writer_free does otherwise). */
const char *dataset_writer_temp_path(const struct dataset_writer *w);
struct stat;
/* Whether st (an input's) is the file the output replaces: reading it would read what is being
 * written over (dflash-data build -o x x). */
bool dataset_writer_is_output(const struct dataset_writer *w, const struct stat *st);
