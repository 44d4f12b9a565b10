/* test_dataset.c: the dataset file: writer -> reader round trip, and bad files
 * (truncated, bad checksum, token id >= vocab, bad magic/version/mask, header fields that do
 * not match the file, empty or damaged index entries) give one-line errors. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/dataset.h"
#include "common/err.h"
#include "common/progress.h"
#include "tests/test.h"

static char dir[400];

static const char *tmp(const char *name)
{
    static char pool[48][512];
    static int k;
    CHECK(k < 48);
    snprintf(pool[k], sizeof pool[k], "%s/%s", dir, name);
    return pool[k++];
}

static void write_set(const char *path, uint32_t vocab, int n, uint32_t bad_id_at)
{
    char err[512];
    struct dataset_writer *w;
    CHECK_OK(dataset_writer_open(&w, path, vocab, err, sizeof err));
    uint32_t tok[300];
    uint8_t mask[300];
    for (int i = 0; i < n; i++) {
        uint32_t len = 1 + (uint32_t)(i * 37 % 300);
        for (uint32_t t = 0; t < len; t++) {
            tok[t] = (uint32_t)(i * 31 + t) % 1000;
            mask[t] = (t + (uint32_t)i) % 3 == 0;
        }
        if ((uint32_t)i == bad_id_at)
            tok[0] = 999;
        CHECK_OK(dataset_writer_add(w, tok, mask, len, err, sizeof err));
    }
    /* finish in its two halves: a commit before the flush is refused; the output appears only
     * with the commit (a flush twice is one) */
    CHECK_INT(dataset_writer_commit(w, err, sizeof err), ==, -DF_ESTATE);
    CHECK_CONTAINS(err, "not flushed");
    unlink(path);
    CHECK_OK(dataset_writer_flush(w, err, sizeof err));
    CHECK_OK(dataset_writer_flush(w, err, sizeof err));
    CHECK(access(path, F_OK) != 0);
    CHECK_OK(dataset_writer_commit(w, err, sizeof err));
    CHECK(access(path, F_OK) == 0);
    dataset_writer_free(w);
}

static void patch(const char *path, long off, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    CHECK_INT(pwrite(fd, bytes, n, off), ==, (long long)n);
    close(fd);
}

/* Rewrite the checksum so that a later structural check is what fails. */
static void fix_checksum(const char *path)
{
    struct dataset ds;
    char err[512];
    int fd = open(path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    uint8_t *b = malloc((size_t)st.st_size);
    CHECK_INT(read(fd, b, (size_t)st.st_size), ==, st.st_size);
    close(fd);
    struct dataset_hash s;
    dataset_hash_init(&s, DATASET_HASH_SEED);
    dataset_hash_update(&s, b + DATASET_HEADER_SIZE, (size_t)st.st_size - DATASET_HEADER_SIZE);
    uint64_t sum = dataset_hash_final(&s);
    patch(path, offsetof(struct dataset_header, checksum), &sum, 8);
    free(b);
    (void)ds; (void)err;
}

static void expect_bad(const char *path, int code, const char *needle)
{
    struct dataset ds;
    char err[512] = "";
    int r = dataset_open(&ds, path, 0, err, sizeof err);
    if (r >= 0)
        TEST_FAIL("%s opened, expected '%s'", path, needle);
    CHECK_INT(r, ==, code);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, needle);
    CHECK(!strchr(err, '\n'));
    printf("  rejected: %s\n", err);
}

static void copy(const char *from, const char *to)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CHECK_INT(system(cmd), ==, 0);
}

/* A copy of `good` with `n` bytes at `off` replaced. The checksum covers the bytes after the
 * header: a change there is resealed, so that the structural check is what fails. */
static const char *spoiled(const char *good, const char *name, long off, const void *bytes, size_t n)
{
    const char *path = tmp(name);
    copy(good, path);
    patch(path, off, bytes, n);
    if (off >= (long)DATASET_HEADER_SIZE)
        fix_checksum(path);
    return path;
}

#define HDR(field) offsetof(struct dataset_header, field)

/* Header fields that do not match the file, and index entries validate() refuses. */
static void test_header_checks(const char *good)
{
    struct dataset ds;
    char err[512], want[160];
    CHECK_OK(dataset_open(&ds, good, 0, err, sizeof err));
    struct dataset_header h = *ds.hdr;
    long idx = (long)h.index_off;
    uint32_t len3 = ds.index[3].length;
    struct dataset_index_entry e0 = ds.index[0], e1 = ds.index[1], e3 = ds.index[3], last = ds.index[h.n_samples - 1];
    dataset_close(&ds);
    CHECK(len3 < h.max_len);        /* (emptying it leaves max_len as it is) */
    CHECK(h.masked_tokens > 0 && h.masked_tokens < h.n_tokens);

    uint32_t u32 = 64;
    expect_bad(spoiled(good, "hsize.bin", HDR(header_size), &u32, 4), -DF_EFORMAT, "header_size 64, expected 128");
    u32 = 0;
    expect_bad(spoiled(good, "vocab0.bin", HDR(vocab_size), &u32, 4), -DF_EFORMAT, "vocab_size 0 out of range [1, ");
    u32 = DATASET_MAX_VOCAB + 1;
    snprintf(want, sizeof want, "vocab_size %u out of range [1, %u]", u32, DATASET_MAX_VOCAB);
    expect_bad(spoiled(good, "vocabbig.bin", HDR(vocab_size), &u32, 4), -DF_EFORMAT, want);
    uint64_t u64 = 0;
    expect_bad(spoiled(good, "nosamples.bin", HDR(n_samples), &u64, 8), -DF_EFORMAT, "no samples");
    u64 = (1ull << 40) + 1;
    expect_bad(spoiled(good, "hugecount.bin", HDR(n_tokens), &u64, 8), -DF_EFORMAT, "implausible counts");
    /* sections out of place: the mask and the index swapped, the tokens not right after the header */
    uint64_t swapped[3] = { h.tokens_off, h.index_off, h.mask_off };
    snprintf(want, sizeof want, "section offsets (%llu, %llu, %llu) do not match the counts",
             (unsigned long long)h.tokens_off, (unsigned long long)h.index_off, (unsigned long long)h.mask_off);
    expect_bad(spoiled(good, "swapped.bin", HDR(tokens_off), swapped, sizeof swapped), -DF_EFORMAT, want);
    u64 = h.tokens_off + 8;
    expect_bad(spoiled(good, "tokoff.bin", HDR(tokens_off), &u64, 8), -DF_EFORMAT, "section offsets (136, ");
    u64 = h.mask_off - 4;       /* overlapping the tokens */
    expect_bad(spoiled(good, "maskoff.bin", HDR(mask_off), &u64, 8), -DF_EFORMAT, "do not match the counts");
    u64 = h.mask_off + 8;       /* overlapping the mask */
    expect_bad(spoiled(good, "idxoff.bin", HDR(index_off), &u64, 8), -DF_EFORMAT, "do not match the counts");
    /* one sample fewer than the index holds */
    u64 = h.n_samples - 1;
    snprintf(want, sizeof want, "file size %llu does not match the counts (%llu)", (unsigned long long)h.file_size,
             (unsigned long long)(h.file_size - 16));
    expect_bad(spoiled(good, "fewer.bin", HDR(n_samples), &u64, 8), -DF_EFORMAT, want);
    /* header totals the data do not bear out */
    u32 = h.max_len + 1;
    snprintf(want, sizeof want, "max_len %u, samples say %u", h.max_len + 1, h.max_len);
    expect_bad(spoiled(good, "maxlen.bin", HDR(max_len), &u32, 4), -DF_EFORMAT, want);
    u64 = h.masked_tokens + 1;
    snprintf(want, sizeof want, "masked_tokens %llu, mask says %llu", (unsigned long long)h.masked_tokens + 1,
             (unsigned long long)h.masked_tokens);
    expect_bad(spoiled(good, "masked.bin", HDR(masked_tokens), &u64, 8), -DF_EFORMAT, want);
    /* index entries (resealed): an empty sample, a reserved field set */
    u32 = 0;
    expect_bad(spoiled(good, "empty.bin", idx + 16 * 3 + 8, &u32, 4), -DF_EFORMAT, "sample 3: empty");
    u32 = 1;
    expect_bad(spoiled(good, "idxres.bin", idx + 16 * 5 + 12, &u32, 4), -DF_EFORMAT, "sample 5: reserved field not 0");
    /* an index that does not tile the tokens (resealed): sample 4 the same tokens as sample 3,
     * the first two swapped, the last one short of the end (its token never trained) */
    snprintf(want, sizeof want, "sample 4: starts at token %llu, expected %llu (samples tile the tokens in order)",
             (unsigned long long)e3.offset, (unsigned long long)(e3.offset + e3.length));
    expect_bad(spoiled(good, "overlap.bin", idx + 16 * 4, &e3, 16), -DF_EFORMAT, want);
    struct dataset_index_entry swap[2] = { e1, e0 };
    snprintf(want, sizeof want, "sample 0: starts at token %llu, expected 0", (unsigned long long)e1.offset);
    expect_bad(spoiled(good, "swap.bin", idx, swap, sizeof swap), -DF_EFORMAT, want);
    CHECK(last.length > 1 && last.length < h.max_len);
    u32 = last.length - 1;
    snprintf(want, sizeof want, "the samples end at token %llu, the tokens at %llu",
             (unsigned long long)h.n_tokens - 1, (unsigned long long)h.n_tokens);
    expect_bad(spoiled(good, "gap.bin", idx + 16 * ((long)h.n_samples - 1) + 8, &u32, 4), -DF_EFORMAT, want);
}

static int ticks;
static void count_tick(void *arg)
{
    (void)arg;
    ticks++;
}

/* The checksum pass and the structural one tick the start's progress hook (a daemon's watchdog)
 * every PROGRESS_CHUNK_BYTES of a large file read; without the checksum the structural pass still
 * reads index, tokens and mask, and ticks for them (it once ticked none: a target's start on a
 * large dataset on slow storage went unseen by the watchdog). */
static void test_progress(void)
{
    const char *big = tmp("big.bin");
    write_set(big, 1000, 15000, UINT32_MAX);
    struct stat st;
    CHECK_OK(stat(big, &st));
    size_t body = (size_t)st.st_size - DATASET_HEADER_SIZE;
    CHECK(body > PROGRESS_CHUNK_BYTES);
    struct dataset ds;
    char err[512];
    progress_set(count_tick, NULL);
    CHECK_OK(dataset_open(&ds, big, 0, err, sizeof err));
    const size_t structure = 16 * (size_t)ds.n_samples + 5 * (size_t)ds.n_tokens;
    CHECK(structure > PROGRESS_CHUNK_BYTES);
    CHECK_INT(ticks, ==, (int)((body + structure) / PROGRESS_CHUNK_BYTES));
    dataset_close(&ds);
    progress_set(count_tick, NULL);
    ticks = 0;
    CHECK_OK(dataset_open(&ds, big, DATASET_OPEN_NO_CHECKSUM, err, sizeof err));
    CHECK_INT(ticks, ==, (int)(structure / PROGRESS_CHUNK_BYTES));
    dataset_close(&ds);
    progress_set(NULL, NULL);
    unlink(big);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    char err[512];

    /* Hash: incremental == one shot, whatever the split. */
    uint8_t data[1000];
    for (int i = 0; i < 1000; i++)
        data[i] = (uint8_t)(i * 7 + 3);
    struct dataset_hash a, b;
    dataset_hash_init(&a, 1);
    dataset_hash_update(&a, data, 1000);
    for (int split = 0; split < 20; split++) {
        dataset_hash_init(&b, 1);
        dataset_hash_update(&b, data, (size_t)split);
        dataset_hash_update(&b, data + split, 3);
        dataset_hash_update(&b, data + split + 3, 1000 - (size_t)split - 3);
        CHECK_INT(dataset_hash_final(&a), ==, dataset_hash_final(&b));
    }
    dataset_hash_init(&b, 1);
    data[500] ^= 1;
    dataset_hash_update(&b, data, 1000);
    CHECK(dataset_hash_final(&a) != dataset_hash_final(&b));

    const char *good = tmp("good.bin");
    write_set(good, 1000, 200, UINT32_MAX);
    struct dataset ds;
    CHECK_OK(dataset_open(&ds, good, 0, err, sizeof err));
    CHECK_INT(ds.n_samples, ==, 200);
    CHECK_INT(ds.vocab_size, ==, 1000);
    uint64_t total = 0;
    for (int i = 0; i < 200; i++) {
        uint32_t len = dataset_sample_len(&ds, (uint64_t)i);
        CHECK_INT(len, ==, 1 + (uint32_t)(i * 37 % 300));
        CHECK_INT(dataset_sample_tokens(&ds, (uint64_t)i)[len - 1], ==, (uint32_t)(i * 31 + len - 1) % 1000);
        CHECK_INT(dataset_sample_mask(&ds, (uint64_t)i)[0], ==, i % 3 == 0);
        total += len;
    }
    CHECK_INT(ds.n_tokens, ==, total);
    dataset_close(&ds);
    dataset_close(&ds);  /* idempotent */

    /* vocab 0 = max id + 1 */
    const char *auto_vocab = tmp("auto.bin");
    write_set(auto_vocab, 0, 50, UINT32_MAX);
    CHECK_OK(dataset_open(&ds, auto_vocab, 0, err, sizeof err));
    CHECK(ds.vocab_size <= 1000 && ds.vocab_size > 900);
    dataset_close(&ds);

    /* The schedule's lengths: 0 for a sample with no two loss tokens in a row before the cut. */
    {
        const char *sl = tmp("sched-lengths.bin");
        struct dataset_writer *sw;
        CHECK_OK(dataset_writer_open(&sw, sl, 10, err, sizeof err));
        static const struct { uint8_t mask[6]; uint32_t len; } s[] = {
            { { 0, 0, 0, 1, 1, 0 }, 6 },     /* a pair at 3-4: kept, also cut to 5, not to 4 */
            { { 1, 0, 1, 0, 1, 0 }, 6 },     /* loss tokens, none in a row: left out */
            { { 0, 0, 0, 0, 0, 0 }, 6 },     /* none in the loss */
            { { 1, 1 }, 2 },                 /* the shortest that trains */
            { { 1 }, 1 },
            { { 0, 0, 0, 0, 1, 1 }, 6 },     /* the pair ends the sample: gone when cut to 5 */
        };
        uint32_t tok[6] = { 1, 2, 3, 4, 5, 6 };
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
            CHECK_OK(dataset_writer_add(sw, tok, s[i].mask, s[i].len, err, sizeof err));
        CHECK_OK(dataset_writer_finish(sw, err, sizeof err));
        dataset_writer_free(sw);
        CHECK_OK(dataset_open(&ds, sl, 0, err, sizeof err));
        uint32_t len[6];
        CHECK_INT(dataset_sched_lengths(&ds, 0, true, len), ==, 3);
        static const uint32_t whole[6] = { 6, 0, 0, 2, 0, 6 }, cut5[6] = { 6, 0, 0, 2, 0, 0 },
                              cut4[6] = { 0, 0, 0, 2, 0, 0 };
        for (int i = 0; i < 6; i++)
            CHECK_INT(len[i], ==, whole[i]);
        CHECK_INT(dataset_sched_lengths(&ds, 5, true, len), ==, 4);
        for (int i = 0; i < 6; i++)     /* the length itself is not cut: the schedule cuts it */
            CHECK_INT(len[i], ==, cut5[i]);
        CHECK_INT(dataset_sched_lengths(&ds, 4, true, len), ==, 5);
        for (int i = 0; i < 6; i++)
            CHECK_INT(len[i], ==, cut4[i]);
        CHECK_INT(dataset_sched_lengths(&ds, 4, false, len), ==, 5);    /* (runs from before: every sample) */
        for (int i = 0; i < 6; i++)
            CHECK_INT(len[i], ==, s[i].len);
        dataset_close(&ds);
    }

    /* Writer-side rejection. */
    struct dataset_writer *w;
    CHECK_OK(dataset_writer_open(&w, tmp("w.bin"), 10, err, sizeof err));
    uint32_t t3[3] = { 1, 2, 10 };
    uint8_t m3[3] = { 0, 1, 1 }, m3bad[3] = { 0, 2, 1 };
    CHECK_INT(dataset_writer_add(w, t3, m3, 3, err, sizeof err), ==, -DF_ERANGE);
    CHECK_CONTAINS(err, "id 10 >= vocab size 10");
    t3[2] = 9;
    CHECK_INT(dataset_writer_add(w, t3, m3bad, 3, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "loss mask 2");
    CHECK_INT(dataset_writer_add(w, t3, m3, 0, err, sizeof err), ==, -DF_EFORMAT);
    CHECK(dataset_writer_finish(w, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "no samples");
    dataset_writer_free(w);
    CHECK(access(tmp("w.bin"), F_OK) < 0);  /* nothing half-written left behind */

    /* ---- bad files ---- */
    expect_bad(tmp("missing.bin"), -ENOENT, "cannot open");

    const char *trunc = tmp("trunc.bin");
    copy(good, trunc);
    CHECK_OK(truncate(trunc, 1000));
    expect_bad(trunc, -DF_ETRUNC, "truncated");
    CHECK_OK(truncate(trunc, 50));
    expect_bad(trunc, -DF_ETRUNC, "truncated: 50 bytes");

    const char *flip = tmp("flip.bin");
    copy(good, flip);
    uint8_t x = 0x55;
    patch(flip, DATASET_HEADER_SIZE + 40, &x, 1);
    expect_bad(flip, -DF_ECHECKSUM, "checksum mismatch");

    const char *magic = tmp("magic.bin");
    copy(good, magic);
    patch(magic, 0, "NOTADATA", 8);
    expect_bad(magic, -DF_EMAGIC, "not a dflash dataset");

    const char *ver = tmp("ver.bin");
    copy(good, ver);
    uint32_t v = 99;
    patch(ver, offsetof(struct dataset_header, version), &v, 4);
    expect_bad(ver, -DF_EVERSION, "format version 99");

    /* Token id >= vocab with a valid checksum: the id check catches it. */
    const char *badid = tmp("badid.bin");
    write_set(badid, 1000, 20, 7);
    uint32_t vocab = 998;
    patch(badid, offsetof(struct dataset_header, vocab_size), &vocab, 4);
    fix_checksum(badid);
    expect_bad(badid, -DF_ERANGE, ">= vocab size 998");

    /* An index entry pointing past the tokens. */
    const char *badidx = tmp("badidx.bin");
    copy(good, badidx);
    CHECK_OK(dataset_open(&ds, good, 0, err, sizeof err));
    long idx_off = (long)ds.hdr->index_off;
    uint64_t far = ds.n_tokens;
    dataset_close(&ds);
    patch(badidx, idx_off + 16 * 3, &far, 8);
    fix_checksum(badidx);
    expect_bad(badidx, -DF_ERANGE, "sample 3: tokens");

    /* A mask byte that is not 0/1. */
    const char *badmask = tmp("badmask.bin");
    copy(good, badmask);
    CHECK_OK(dataset_open(&ds, good, 0, err, sizeof err));
    long mask_off = (long)ds.hdr->mask_off;
    dataset_close(&ds);
    uint8_t seven = 7;
    patch(badmask, mask_off + 5, &seven, 1);
    fix_checksum(badmask);
    expect_bad(badmask, -DF_EFORMAT, "loss mask 7");

    /* Extra bytes at the end. */
    const char *longer = tmp("long.bin");
    copy(good, longer);
    int fd = open(longer, O_WRONLY | O_APPEND);
    CHECK_INT(write(fd, "xx", 2), ==, 2);
    close(fd);
    expect_bad(longer, -DF_EFORMAT, "size mismatch");

    expect_bad(dir, -DF_EFORMAT, "not a regular file");
    const char *fifo = tmp("fifo.bin");     /* refused at once, not waited on for a writer */
    CHECK_OK(mkfifo(fifo, 0600));
    expect_bad(fifo, -DF_EFORMAT, "not a regular file");
    expect_bad(tmp("absent.bin"), -ENOENT, "cannot open");
    test_header_checks(good);
    test_progress();
    printf("dataset ok\n");
    return 0;
}
