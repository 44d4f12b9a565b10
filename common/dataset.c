/* dataset.c: open/validate the memory-mapped dataset file, and its streaming writer.
 * Every check fails with "<path>: <reason>" so a bad file is named in one line. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/dataset.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/mapname.h"
#include "common/progress.h"

#define P1 0x9e3779b185ebca87ull
#define P2 0xc2b2ae3d27d4eb4full

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t hash_word(uint64_t h, uint64_t w) { return rotl64(h ^ (w * P1), 29) * P2; }

void dataset_hash_init(struct dataset_hash *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->h = seed ^ P2;
}

void dataset_hash_update(struct dataset_hash *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->total += len;
    while (s->ntail && len) {
        s->tail[s->ntail++] = *p++;
        len--;
        if (s->ntail == 8) {
            uint64_t w;
            memcpy(&w, s->tail, 8);
            s->h = hash_word(s->h, w);
            s->ntail = 0;
        }
    }
    uint64_t h = s->h;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = hash_word(h, w);
    }
    s->h = h;
    if (len) {  /* here ntail is 0: the partial word above was completed */
        memcpy(s->tail, p, len);
        s->ntail = (unsigned)len;
    }
}

uint64_t dataset_hash_final(const struct dataset_hash *s)
{
    uint64_t h = s->h;
    if (s->ntail) {
        uint64_t w = 0;
        memcpy(&w, s->tail, s->ntail);
        h = hash_word(h, w ^ ((uint64_t)s->ntail << 56));
    }
    h ^= s->total;
    h ^= h >> 33; h *= P1; h ^= h >> 29; h *= P2; h ^= h >> 32;
    return h;
}

static int fail(char *err, size_t errlen, const char *path, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(char *err, size_t errlen, const char *path, int code, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: ", path);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

void dataset_close(struct dataset *ds)
{
    if (!ds)
        return;
    if (ds->map && ds->map != MAP_FAILED) {
        mapname_remove(ds->map);
        munmap(ds->map, ds->map_len);
    }
    if (ds->fd >= 0)
        close(ds->fd);
    memset(ds, 0, sizeof *ds);
    ds->fd = -1;
}

#define STRUCT_PIECE 65536u     /* index entries or tokens between two progress counts */

static int validate(struct dataset *ds, const char *path, unsigned flags, char *err, size_t errlen)
{
    const struct dataset_header *h = ds->map;
    if (ds->map_len < DATASET_HEADER_SIZE)
        return fail(err, errlen, path, -DF_ETRUNC, "truncated: %zu bytes, header needs %u", ds->map_len, DATASET_HEADER_SIZE);
    if (memcmp(h->magic, DATASET_MAGIC, 8))
        return fail(err, errlen, path, -DF_EMAGIC, "not a dflash dataset (bad magic)");
    if (h->version != DATASET_VERSION)
        return fail(err, errlen, path, -DF_EVERSION, "format version %u, expected %u", h->version, DATASET_VERSION);
    if (h->header_size != DATASET_HEADER_SIZE)
        return fail(err, errlen, path, -DF_EFORMAT, "header_size %u, expected %u", h->header_size, DATASET_HEADER_SIZE);
    if (h->file_size != ds->map_len)
        return fail(err, errlen, path, h->file_size > ds->map_len ? -DF_ETRUNC : -DF_EFORMAT,
                    "%s: file has %zu bytes, header says %llu", h->file_size > ds->map_len ? "truncated" : "size mismatch",
                    ds->map_len, (unsigned long long)h->file_size);
    if (h->vocab_size == 0 || h->vocab_size > DATASET_MAX_VOCAB)
        return fail(err, errlen, path, -DF_EFORMAT, "vocab_size %u out of range [1, %u]", h->vocab_size, DATASET_MAX_VOCAB);
    if (h->n_samples == 0)
        return fail(err, errlen, path, -DF_EFORMAT, "no samples");
    /* Sections in order, each exactly where the counts put it (no overflow: counts are capped). */
    if (h->n_tokens > (1ull << 40) || h->n_samples > (1ull << 36))
        return fail(err, errlen, path, -DF_EFORMAT, "implausible counts: %llu tokens, %llu samples",
                    (unsigned long long)h->n_tokens, (unsigned long long)h->n_samples);
    uint64_t mask_off = DATASET_HEADER_SIZE + 4 * h->n_tokens;
    uint64_t index_off = (mask_off + h->n_tokens + 7) & ~7ull;
    uint64_t end = index_off + 16 * h->n_samples;
    if (h->tokens_off != DATASET_HEADER_SIZE || h->mask_off != mask_off || h->index_off != index_off)
        return fail(err, errlen, path, -DF_EFORMAT, "section offsets (%llu, %llu, %llu) do not match the counts",
                    (unsigned long long)h->tokens_off, (unsigned long long)h->mask_off, (unsigned long long)h->index_off);
    if (end != h->file_size)
        return fail(err, errlen, path, -DF_EFORMAT, "file size %llu does not match the counts (%llu)",
                    (unsigned long long)h->file_size, (unsigned long long)end);

    ds->hdr = h;
    ds->tokens = (const uint32_t *)((const uint8_t *)ds->map + h->tokens_off);
    ds->mask = (const uint8_t *)ds->map + h->mask_off;
    ds->index = (const struct dataset_index_entry *)((const uint8_t *)ds->map + h->index_off);
    ds->n_samples = h->n_samples;
    ds->n_tokens = h->n_tokens;
    ds->vocab_size = h->vocab_size;
    ds->checksum = h->checksum;

    if (!(flags & DATASET_OPEN_NO_CHECKSUM)) {
        struct dataset_hash s;
        dataset_hash_init(&s, DATASET_HASH_SEED);
        const uint8_t *p = (const uint8_t *)ds->map + DATASET_HEADER_SIZE;
        for (size_t left = ds->map_len - DATASET_HEADER_SIZE, k; left; left -= k, p += k) {
            k = left < PROGRESS_CHUNK_BYTES ? left : PROGRESS_CHUNK_BYTES;
            dataset_hash_update(&s, p, k);
            progress_add(k);
        }
        uint64_t sum = dataset_hash_final(&s);
        if (sum != h->checksum)
            return fail(err, errlen, path, -DF_ECHECKSUM, "checksum mismatch (file %016llx, computed %016llx): corrupted",
                        (unsigned long long)h->checksum, (unsigned long long)sum);
    }
    /* The samples tile the tokens in order, as the writer lays them: each token in exactly one
     * sample, so the header's totals (masked_tokens: is there anything to learn?) are the
     * samples' too. */
    uint32_t max_len = 0;
    uint64_t next = 0;
    /* (these passes read the file too: minutes on a large one on slow storage, each piece
     * counted as progress like the checksum's) */
    for (uint64_t i = 0; i < h->n_samples; i++) {
        if (!(i & (STRUCT_PIECE - 1)))
            progress_add(16 * (size_t)(h->n_samples - i < STRUCT_PIECE ? h->n_samples - i : STRUCT_PIECE));
        const struct dataset_index_entry *e = &ds->index[i];
        if (e->length == 0 || e->reserved)
            return fail(err, errlen, path, -DF_EFORMAT, "sample %llu: %s", (unsigned long long)i,
                        e->length ? "reserved field not 0" : "empty");
        if (e->offset > h->n_tokens || e->length > h->n_tokens - e->offset)
            return fail(err, errlen, path, -DF_ERANGE, "sample %llu: tokens [%llu, +%u) beyond the %llu tokens",
                        (unsigned long long)i, (unsigned long long)e->offset, e->length, (unsigned long long)h->n_tokens);
        if (e->offset != next)
            return fail(err, errlen, path, -DF_EFORMAT, "sample %llu: starts at token %llu, expected %llu (samples "
                        "tile the tokens in order)", (unsigned long long)i, (unsigned long long)e->offset,
                        (unsigned long long)next);
        next += e->length;
        if (e->length > max_len)
            max_len = e->length;
    }
    if (next != h->n_tokens)
        return fail(err, errlen, path, -DF_EFORMAT, "the samples end at token %llu, the tokens at %llu",
                    (unsigned long long)next, (unsigned long long)h->n_tokens);
    if (max_len != h->max_len)
        return fail(err, errlen, path, -DF_EFORMAT, "max_len %u, samples say %u", h->max_len, max_len);
    uint64_t masked = 0, pairs = 0, sample = 0, sample_end = h->n_samples ? ds->index[0].length : 0;
    for (uint64_t t = 0; t < h->n_tokens; t++) {
        if (!(t & (STRUCT_PIECE - 1)))     /* a token id and its mask byte */
            progress_add(5 * (size_t)(h->n_tokens - t < STRUCT_PIECE ? h->n_tokens - t : STRUCT_PIECE));
        if (ds->tokens[t] >= h->vocab_size)
            return fail(err, errlen, path, -DF_ERANGE, "token %llu: id %u >= vocab size %u",
                        (unsigned long long)t, ds->tokens[t], h->vocab_size);
        if (ds->mask[t] > 1)
            return fail(err, errlen, path, -DF_EFORMAT, "token %llu: loss mask %u is not 0 or 1",
                        (unsigned long long)t, ds->mask[t]);
        masked += ds->mask[t];
        if (t + 1 == sample_end)    /* a sample's last token (the samples tile the tokens) */
            sample_end += ++sample < h->n_samples ? ds->index[sample].length : 0;
        else
            pairs += ds->mask[t] && ds->mask[t + 1];
    }
    ds->anchor_pairs = pairs;
    if (masked != h->masked_tokens)
        return fail(err, errlen, path, -DF_EFORMAT, "masked_tokens %llu, mask says %llu",
                    (unsigned long long)h->masked_tokens, (unsigned long long)masked);
    return 0;
}

void dataset_cut_loss(const struct dataset *ds, uint32_t max_len, uint64_t *masked, uint64_t *pairs)
{
    *masked = *pairs = 0;
    for (uint64_t i = 0; max_len && i < ds->n_samples; i++) {
        uint32_t len = dataset_sample_len(ds, i);
        if (len <= max_len)
            continue;
        const uint8_t *m = dataset_sample_mask(ds, i);
        progress_add(len - max_len);
        for (uint32_t t = max_len - 1; t + 1 < len; t++) {     /* the pairs (t, t + 1) with t + 1 cut */
            *masked += m[t + 1];
            *pairs += m[t] && m[t + 1];
        }
    }
}

uint64_t dataset_sched_lengths(const struct dataset *ds, uint32_t max_len, bool leave_out, uint32_t *lengths)
{
    uint64_t inert = 0;
    for (uint64_t i = 0; i < ds->n_samples; i++) {
        uint32_t len = dataset_sample_len(ds, i), n = max_len && len > max_len ? max_len : len, t = 1;
        const uint8_t *m = dataset_sample_mask(ds, i);
        while (t < n && !(m[t] && m[t - 1]))
            t++;
        lengths[i] = t < n || !leave_out ? len : 0;
        inert += t >= n;
    }
    return inert;
}

int dataset_open(struct dataset *ds, const char *path, unsigned flags, char *err, size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    ds->fd = -1;
    if (!path || !*path)
        return fail(err, errlen, "dataset", -EINVAL, "no path given (data.path is empty)");
    snprintf(ds->path, sizeof ds->path, "%s", path);
    struct stat st;
    ds->fd = fileio_open_regular(path, &st);    /* a FIFO is refused, not waited on */
    if (ds->fd == -EINVAL) {
        ds->fd = -1;
        return fail(err, errlen, path, -DF_EFORMAT, "not a regular file");
    }
    if (ds->fd < 0) {
        int r = ds->fd;
        ds->fd = -1;
        return fail(err, errlen, path, r, "cannot open: %s", strerror(-r));
    }
    ds->map_len = (size_t)st.st_size;
    char head[9] = { 0 };       /* (NUL-ended for strspn) */
    ssize_t got = pread(ds->fd, head, 8, 0);
    if (got > 0 && (got < 8 || memcmp(head, DATASET_MAGIC, 8))) {
        /* (before the size: a short JSONL file is no dataset cut short) */
        size_t k = strspn(head, " \t\r\n\xef\xbb\xbf");     /* (blanks, a UTF-8 BOM) */
        bool json = k < (size_t)got && (head[k] == '{' || head[k] == '[');
        const char *packed = fileio_compressed(head, (size_t)got);
        dataset_close(ds);
        if (packed)
            return fail(err, errlen, path, -DF_EMAGIC, "not a dflash dataset: %s-compressed data (a dataset is "
                        "read uncompressed, mapped in place: decompress it first)", packed);
        return fail(err, errlen, path, -DF_EMAGIC, "not a dflash dataset (bad magic)%s",
                    json ? ": a JSON file? build a dataset of it with `dflash-data build -o OUT FILE`" : "");
    }
    if (ds->map_len < DATASET_HEADER_SIZE) {
        size_t n = ds->map_len;
        dataset_close(ds);
        return fail(err, errlen, path, -DF_ETRUNC, "truncated: %zu bytes, header needs %u", n, DATASET_HEADER_SIZE);
    }
    ds->map = mmap(NULL, ds->map_len, PROT_READ, MAP_SHARED, ds->fd, 0);
    if (ds->map == MAP_FAILED) {
        int r = -errno;
        ds->map = NULL;
        dataset_close(ds);
        return fail(err, errlen, path, r, "mmap: %s", strerror(-r));
    }
    mapname_add(ds->map, ds->map_len, "dataset", path);
    int r = validate(ds, path, flags, err, errlen);
    if (r < 0) {
        dataset_close(ds);
        return r;
    }
    return 0;
}

/* ---- writer ---- */

struct dataset_writer {
    char path[512];             /* as given: what messages name */
    char target[512];           /* the file renamed over: path, or where its symlinks lead */
    char tmp[512 + 32];         /* the temp file's name; empty while it has none (O_TMPFILE) */
    int fd;                     /* the output temp file: header hole + tokens */
    bool anon;                  /* fd made with O_TMPFILE: named only at commit, just before the rename */
    bool flushed;               /* all written and fsync'd: only the rename into place is left */
    FILE *maskf;                /* loss mask, unlinked temp file beside the output, appended at finish */
    struct dataset_index_entry *index;
    uint64_t n_samples, cap, n_tokens, masked, pairs;
    uint32_t vocab, max_id, max_len;
    struct dataset_hash tok_hash;
    int failed;
    mode_t mode;                /* the output's: the replaced file's, or a new file's under the umask */
    bool exists;                /* a file is replaced: its identity, for dataset_writer_is_output */
    dev_t dev;
    ino_t ino;
};

uint64_t dataset_writer_samples(const struct dataset_writer *w) { return w->n_samples; }
uint64_t dataset_writer_masked_tokens(const struct dataset_writer *w) { return w->masked; }
uint64_t dataset_writer_anchor_pairs(const struct dataset_writer *w) { return w->pairs; }
const char *dataset_writer_temp_path(const struct dataset_writer *w) { return w->tmp; }
bool dataset_writer_is_output(const struct dataset_writer *w, const struct stat *st)
{
    return w->exists && st->st_dev == w->dev && st->st_ino == w->ino;
}

void dataset_writer_free(struct dataset_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        if (w->tmp[0])
            unlink(w->tmp);
    }
    if (w->maskf)
        fclose(w->maskf);
    free(w->index);
    free(w);
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : "not a file";
}

/* Where the output goes: path itself, or the file its symlinks lead to (a rename over the link
 * would replace the link with a file). What is there must be a regular file or nothing: a rename
 * over a device or a FIFO replaces it (as root, /dev/null), and over a directory it fails only
 * after all the input was read. */
static int output_target(const char *path, char *target, size_t cap, char *err, size_t errlen)
{
    snprintf(target, cap, "%s", path);
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(target, &st) < 0) {
            int e = errno;
            if (e == ENOENT)        /* a new file, or a dangling link's target */
                return 0;
            return fail(err, errlen, path, -e, "cannot stat %s: %s", target, strerror(e));
        }
        if (S_ISREG(st.st_mode))
            return 0;
        if (!S_ISLNK(st.st_mode)) {
            if (strcmp(target, path))
                return fail(err, errlen, path, -DF_EFORMAT, "exists and is not a regular file (it links to %s, %s)",
                            target, file_kind(st.st_mode));
            return fail(err, errlen, path, -DF_EFORMAT, "exists and is not a regular file (%s)", file_kind(st.st_mode));
        }
        if (hops == 40)
            return fail(err, errlen, path, -ELOOP, "too many levels of symbolic links");
        char link[512], next[512];
        ssize_t n = readlink(target, link, sizeof link);
        if (n < 0) {
            int e = errno;
            return fail(err, errlen, path, -e, "readlink %s: %s", target, strerror(e));
        }
        if ((size_t)n >= sizeof link)
            return fail(err, errlen, path, -ENAMETOOLONG, "%s: symbolic link longer than %zu bytes", target,
                        sizeof link - 1);
        link[n] = 0;
        const char *slash = strrchr(target, '/');  /* a relative link is relative to its own directory */
        int dirlen = link[0] == '/' || !slash ? 0 : (int)(slash - target + 1);
        if (snprintf(next, sizeof next, "%.*s%s", dirlen, target, link) >= (int)sizeof next)
            return fail(err, errlen, path, -ENAMETOOLONG, "its symbolic link leads to a path longer than %zu bytes",
                        sizeof next - 1);
        snprintf(target, cap, "%s", next);
    }
}

/* An O_TMPFILE temp given a name beside the output, for the rename over it (linkat cannot replace
 * a file). A name taken (another build's) is passed over. */
static int link_temp(struct dataset_writer *w)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", w->fd);
    for (unsigned i = 0; i < 1000; i++) {
        snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld.%u", w->target, (long)getpid(), i);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, w->tmp, AT_SYMLINK_FOLLOW) == 0)
            return 0;
        if (errno != EEXIST) {
            int e = errno;
            w->tmp[0] = 0;
            return -e;
        }
    }
    w->tmp[0] = 0;
    return -EEXIST;
}

/* What a temp file is beside, in a message that names path first. */
static const char *beside(const struct dataset_writer *w, const char *path)
{
    return strcmp(w->target, path) ? w->target : "it";
}

int dataset_writer_open(struct dataset_writer **out, const char *path, uint32_t vocab_size, char *err, size_t errlen)
{
    *out = NULL;
    if (!*path) {
        snprintf(err, errlen, "the output path is empty");
        return -ENOENT;
    }
    if (vocab_size > DATASET_MAX_VOCAB)
        return fail(err, errlen, path, -DF_ERANGE, "vocab size %u above %u", vocab_size, DATASET_MAX_VOCAB);
    if (strlen(path) >= sizeof ((struct dataset_writer *)0)->path) {
        snprintf(err, errlen, "output path longer than %zu bytes: %.80s...", sizeof ((struct dataset_writer *)0)->path - 1,
                 path);
        return -ENAMETOOLONG;
    }
    struct dataset_writer *w = calloc(1, sizeof *w);
    if (!w)
        return fail(err, errlen, path, -ENOMEM, "out of memory");
    w->fd = -1;
    w->vocab = vocab_size;
    snprintf(w->path, sizeof w->path, "%s", path);
    int r = output_target(path, w->target, sizeof w->target, err, errlen);
    if (r < 0) {
        dataset_writer_free(w);
        return r;
    }
    struct stat st;
    w->mode = 0666 & ~fileio_umask();
    if (stat(w->target, &st) == 0) {    /* (a regular file: output_target said so) */
        w->exists = true;
        w->dev = st.st_dev;
        w->ino = st.st_ino;
        w->mode = st.st_mode & 07777;   /* rebuilt, not re-permitted: a private dataset stays private */
    }
    /* The tokens' temp file without a name where the file system allows (O_TMPFILE, linked in at
     * finish through /proc): a build killed part way (SIGKILL, the OOM killer) leaves nothing of its
     * many GB. Else a named one, which a stop signal to dflash-data still removes. */
    char dir[512];
    fileio_parent(w->target, dir, sizeof dir);
    w->fd = access("/proc/self/fd", X_OK) == 0 ? open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600) : -1;
    w->anon = w->fd >= 0;
    if (!w->anon) {
        snprintf(w->tmp, sizeof w->tmp, "%s.tmp.XXXXXX", w->target);
        w->fd = mkostemp(w->tmp, O_CLOEXEC);
    }
    if (w->fd < 0) {
        r = -errno;
        fail(err, errlen, path, r, "cannot create a temp file beside %s: %s", beside(w, path), strerror(-r));
        dataset_writer_free(w);
        return r;
    }
    /* The mask temp beside the output too: /tmp is often a small tmpfs, and the mask is a byte a
     * token. Unlinked at once: nothing of it is left whatever stops the writer. */
    char mtmp[sizeof w->tmp];
    snprintf(mtmp, sizeof mtmp, "%s.mask.XXXXXX", w->target);
    int mfd = mkostemp(mtmp, O_CLOEXEC);
    if (mfd < 0 || unlink(mtmp) < 0 || !(w->maskf = fdopen(mfd, "w+"))) {
        r = -errno;
        if (mfd >= 0 && !w->maskf)
            close(mfd);
        fail(err, errlen, path, r, "cannot create the loss-mask temp file beside %s: %s", beside(w, path),
             strerror(-r));
        dataset_writer_free(w);
        return r;
    }
    if (lseek(w->fd, DATASET_HEADER_SIZE, SEEK_SET) < 0) {
        r = -errno;
        dataset_writer_free(w);
        return fail(err, errlen, path, r, "temp file: %s", strerror(-r));
    }
    dataset_hash_init(&w->tok_hash, DATASET_HASH_SEED);
    *out = w;
    return 0;
}

int dataset_writer_add(struct dataset_writer *w, const uint32_t *tokens, const uint8_t *mask, uint32_t n,
                       char *err, size_t errlen)
{
    if (w->failed)
        return fail(err, errlen, w->path, -DF_ESTATE, "writer failed earlier");
    if (n == 0)
        return fail(err, errlen, w->path, -DF_EFORMAT, "sample %llu: empty", (unsigned long long)w->n_samples);
    for (uint32_t i = 0; i < n; i++) {
        if (w->vocab && tokens[i] >= w->vocab)
            return fail(err, errlen, w->path, -DF_ERANGE, "sample %llu: token %u: id %u >= vocab size %u",
                        (unsigned long long)w->n_samples, i, tokens[i], w->vocab);
        if (tokens[i] >= DATASET_MAX_VOCAB)     /* vocab unset: it becomes max id + 1 */
            return fail(err, errlen, w->path, -DF_ERANGE, "sample %llu: token %u: id %u >= %u, no vocabulary is that large",
                        (unsigned long long)w->n_samples, i, tokens[i], DATASET_MAX_VOCAB);
        if (mask[i] > 1)
            return fail(err, errlen, w->path, -DF_EFORMAT, "sample %llu: token %u: loss mask %u is not 0 or 1",
                        (unsigned long long)w->n_samples, i, mask[i]);
    }
    if (w->n_samples == w->cap) {
        uint64_t cap = w->cap ? w->cap * 2 : 1024;
        void *p = realloc(w->index, cap * sizeof *w->index);
        if (!p)
            return fail(err, errlen, w->path, -ENOMEM, "sample %llu: out of memory for an index of %llu samples",
                        (unsigned long long)w->n_samples, (unsigned long long)cap);
        w->index = p;
        w->cap = cap;
    }
    int r = fileio_write_all(w->fd, tokens, 4ull * n);
    if (r < 0) {
        w->failed = 1;
        return fail(err, errlen, w->path, r, "write: %s", strerror(-r));
    }
    errno = 0;
    if (fwrite(mask, 1, n, w->maskf) != n) {
        w->failed = 1;
        r = errno ? -errno : -EIO;
        return fail(err, errlen, w->path, r, "loss-mask temp file: write: %s", strerror(-r));
    }
    dataset_hash_update(&w->tok_hash, tokens, 4ull * n);
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] > w->max_id)
            w->max_id = tokens[i];
        w->masked += mask[i];
        w->pairs += i + 1 < n && mask[i] && mask[i + 1];
    }
    w->index[w->n_samples++] = (struct dataset_index_entry){ w->n_tokens, n, 0 };
    w->n_tokens += n;
    if (n > w->max_len)
        w->max_len = n;
    return 0;
}

int dataset_writer_flush(struct dataset_writer *w, char *err, size_t errlen)
{
    int r;
    if (w->flushed)
        return 0;
    if (w->failed)
        return fail(err, errlen, w->path, -DF_ESTATE, "writer failed earlier");
    if (w->n_samples == 0)
        return fail(err, errlen, w->path, -DF_EFORMAT, "no samples");
    struct dataset_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DATASET_MAGIC, 8);
    h.version = DATASET_VERSION;
    h.header_size = DATASET_HEADER_SIZE;
    h.n_samples = w->n_samples;
    h.n_tokens = w->n_tokens;
    h.vocab_size = w->vocab ? w->vocab : w->max_id + 1;
    h.max_len = w->max_len;
    h.tokens_off = DATASET_HEADER_SIZE;
    h.mask_off = DATASET_HEADER_SIZE + 4 * w->n_tokens;
    h.index_off = (h.mask_off + w->n_tokens + 7) & ~7ull;
    h.file_size = h.index_off + 16 * w->n_samples;
    h.masked_tokens = w->masked;

    struct dataset_hash s = w->tok_hash;
    const char *what = "loss-mask temp file: write";   /* its buffered tail is written here */
    if (fflush(w->maskf) || fseek(w->maskf, 0, SEEK_SET)) {
        r = -errno;
        goto io_fail;
    }
    what = "write";
    static const uint8_t zeros[8];
    uint8_t buf[1 << 16];
    size_t k;
    errno = 0;
    while ((k = fread(buf, 1, sizeof buf, w->maskf)) > 0) {
        if ((r = fileio_write_all(w->fd, buf, k)) < 0)
            goto io_fail;
        dataset_hash_update(&s, buf, k);
        errno = 0;
    }
    if (ferror(w->maskf)) {
        what = "loss-mask temp file: read";
        r = errno ? -errno : -EIO;
        goto io_fail;
    }
    size_t pad = (size_t)(h.index_off - h.mask_off - w->n_tokens);
    if ((r = fileio_write_all(w->fd, zeros, pad)) < 0 || (r = fileio_write_all(w->fd, w->index, 16 * w->n_samples)) < 0)
        goto io_fail;
    dataset_hash_update(&s, zeros, pad);
    dataset_hash_update(&s, w->index, 16 * w->n_samples);
    h.checksum = dataset_hash_final(&s);
    if (pwrite(w->fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        r = errno ? -errno : -EIO;
        goto io_fail;
    }
    if (fsync(w->fd) < 0 || fchmod(w->fd, w->mode) < 0) {
        r = -errno;
        goto io_fail;
    }
    w->flushed = true;
    return 0;
io_fail:
    w->failed = 1;
    return fail(err, errlen, w->path, r, "%s: %s", what, strerror(-r));
}

int dataset_writer_commit(struct dataset_writer *w, char *err, size_t errlen)
{
    if (!w->flushed || w->failed)
        return fail(err, errlen, w->path, -DF_ESTATE, "%s", w->failed ? "writer failed earlier" : "not flushed");
    int r;
    const char *what;
    if (w->anon && (r = link_temp(w)) < 0) {
        what = "cannot give the temp file a name";
        goto io_fail;
    }
    if (rename(w->tmp, w->target) < 0) {
        r = -errno;
        what = "rename";
        if (w->anon) {      /* (its name is no one's to remove but ours: gone now, not at free) */
            unlink(w->tmp);
            w->tmp[0] = 0;
        }
        goto io_fail;
    }
    close(w->fd);
    w->fd = -1;
    /* Make the rename itself durable. */
    char dir[512];
    fileio_parent(w->target, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
io_fail:
    w->failed = 1;
    return fail(err, errlen, w->path, r, "%s: %s", what, strerror(-r));
}

int dataset_writer_finish(struct dataset_writer *w, char *err, size_t errlen)
{
    int r = dataset_writer_flush(w, err, errlen);
    return r < 0 ? r : dataset_writer_commit(w, err, errlen);
}
