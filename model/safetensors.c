/* safetensors.c: mmap-backed safetensors reader (single file or sharded via the index json).
 * Header: u64 little-endian length, JSON {name: {dtype, shape, data_offsets}}, then the data block. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/dataset.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/jsonutil.h"
#include "common/mapname.h"
#include "common/progress.h"
#include "model/cpu_ops.h"
#include "model/safetensors.h"

#define ST_HEADER_MAX  (100u << 20)   /* the format's own limit on the JSON header */
#define ST_INDEX_MAX   (64u << 20)
#define ST_EXACT_MAX   9007199254740992.0   /* 2^53: larger JSON numbers are not exact */

struct st_file {
    char *path;
    void *map;
    size_t size;
};

struct st_set {
    char *source;
    struct st_file *files;
    int nfiles;
    struct st_tensor *tensors;  /* sorted by name once open */
    size_t n, cap;
};

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_BOOL] = { "BOOL", 1 }, [ST_U8] = { "U8", 1 },   [ST_I8] = { "I8", 1 },
    [ST_I16] = { "I16", 2 },   [ST_U16] = { "U16", 2 }, [ST_F16] = { "F16", 2 },
    [ST_BF16] = { "BF16", 2 }, [ST_I32] = { "I32", 4 }, [ST_U32] = { "U32", 4 },
    [ST_F32] = { "F32", 4 },   [ST_I64] = { "I64", 8 }, [ST_U64] = { "U64", 8 },
    [ST_F64] = { "F64", 8 },   [ST_F8_E4M3] = { "F8_E4M3", 1 }, [ST_F8_E5M2] = { "F8_E5M2", 1 },
};

const char *st_dtype_name(enum st_dtype d)
{
    return (unsigned)d < ST_NDTYPES ? dtypes[d].name : "?";
}

size_t st_dtype_size(enum st_dtype d)
{
    return (unsigned)d < ST_NDTYPES ? dtypes[d].size : 0;
}

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > ST_EXACT_MAX ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

static int push_tensor(struct st_set *s, const struct st_tensor *t)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct st_tensor *nt = realloc(s->tensors, cap * sizeof *nt);
        if (!nt)
            return -ENOMEM;
        s->tensors = nt;
        s->cap = cap;
    }
    s->tensors[s->n++] = *t;
    return 0;
}

/* One header entry -> tensor; data block of `data_len` bytes at `data`. */
static int parse_entry(const cJSON *e, const char *path, const unsigned char *data, uint64_t data_len,
                       struct st_tensor *t, uint64_t *begin, uint64_t *end, char *err, size_t errlen)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': dtype missing or not a string", path, name);
    int d;
    for (d = 0; d < ST_NDTYPES; d++)
        if (!strcmp(dt->valuestring, dtypes[d].name))
            break;
    if (d == ST_NDTYPES)
        return df_fail(err, errlen, -DF_EUNSUPPORTED, "%s: tensor '%s': unknown dtype '%.32s'", path, name,
                    dt->valuestring);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > ST_MAX_DIMS)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': shape missing, not a list or over %d dims",
                    path, name, ST_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = (enum st_dtype)d;
    t->numel = 1;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, sh) {
        uint64_t v;
        if (json_u64(dim, &v) < 0 || v > (uint64_t)INT64_MAX)
            return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': shape has a bad dimension", path, name);
        if (v && (uint64_t)t->numel > (uint64_t)INT64_MAX / 8 / v)
            return df_fail(err, errlen, -DF_ERANGE, "%s: tensor '%s': shape too large", path, name);
        t->shape[t->ndim++] = (int64_t)v;
        t->numel *= (int64_t)v;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        json_u64(cJSON_GetArrayItem(off, 0), begin) < 0 || json_u64(cJSON_GetArrayItem(off, 1), end) < 0)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers",
                    path, name);
    if (*begin > *end)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] are reversed", path, name,
                    (unsigned long long)*begin, (unsigned long long)*end);
    if (*end > data_len)
        return df_fail(err, errlen, -DF_ETRUNC,
                    "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data block (%llu bytes)",
                    path, name, (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)data_len);
    uint64_t need = (uint64_t)t->numel * dtypes[d].size;
    if (need != *end - *begin) {
        char s[160];
        shape_str(s, sizeof s, t->ndim, t->shape);
        return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s': shape %s of %s needs %llu bytes, data_offsets span %llu",
                    path, name, s, dtypes[d].name, (unsigned long long)need, (unsigned long long)(*end - *begin));
    }
    t->data = data + *begin;
    t->nbytes = (size_t)need;
    t->file = path;
    return 0;
}

struct span { uint64_t begin, end; const char *name; };

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Map one file and add its tensors to the set. */
static int add_file(struct st_set *s, const char *path, char *err, size_t errlen)
{
    struct st_file *nf = realloc(s->files, (s->nfiles + 1) * sizeof *nf);
    if (!nf)
        return -ENOMEM;
    s->files = nf;
    struct st_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path)))
        return -ENOMEM;
    s->nfiles++;            /* from here st_close releases it */
    path = f->path;

    struct stat stt;
    _cleanup_close_ int fd = fileio_open_regular(path, &stt);     /* a FIFO: refused, not waited on */
    if (fd == -EINVAL)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: not a regular file", path);
    if (fd < 0)
        return df_fail(err, errlen, fd, "%s: %s", path, strerror(-fd));
    if (stt.st_size < 8)
        return df_fail(err, errlen, -DF_ETRUNC, "%s: %lld bytes, shorter than the 8-byte header length", path,
                    (long long)stt.st_size);
    f->size = (size_t)stt.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return df_fail(err, errlen, -errno, "%s: mmap: %s", path, strerror(errno));
    f->map = map;
    mapname_add(map, f->size, "file", path);

    const unsigned char *base = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    if (hlen > f->size - 8)
        return df_fail(err, errlen, -DF_ETRUNC, "%s: header length %llu runs past the end of the file (%zu bytes)",
                    path, (unsigned long long)hlen, f->size);
    if (hlen > ST_HEADER_MAX)
        return df_fail(err, errlen, -DF_ERANGE, "%s: header length %llu is over the %u-byte limit", path,
                    (unsigned long long)hlen, ST_HEADER_MAX);
    if (hlen < 2 || base[8] != '{')
        return df_fail(err, errlen, -DF_EFORMAT, "%s: header is not a JSON object", path);

    const char *json = (const char *)base + 8, *json_end = NULL;
    /* A name with a NUL in it would be read as the part before it (C strings), so two tensors
     * could answer to one name: a NUL anywhere in the header, raw or escaped, is refused. */
    const char *raw = memchr(json, 0, (size_t)hlen);
    if (raw)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: header has a NUL byte, at byte %zu", path, (size_t)(raw - json));
    for (const char *p = json; (p = memchr(p, 'u', (size_t)(json + hlen - p))) && json + hlen - p >= 5; p++) {
        size_t bs = 0;
        while (p - bs > json && p[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (bs % 2 && !memcmp(p + 1, "0000", 4))
            return df_fail(err, errlen, -DF_EFORMAT, "%s: header has a NUL character (\\u0000) in a string, at byte %zu",
                           path, (size_t)(p - 1 - json));
    }
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &json_end, 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return df_fail(err, errlen, -DF_EFORMAT, "%s: header is not valid JSON", path);
    }
    /* Writers pad the header with spaces. Anything else after the object (a second one, junk)
     * is a damaged header whose tensors would be dropped unseen; other readers refuse it. */
    for (const char *p = json_end; p < json + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return df_fail(err, errlen, -DF_EFORMAT, "%s: header has bytes after its JSON object (at byte %zu of %llu)",
                           path, (size_t)(p - json), (unsigned long long)hlen);
        }
    const unsigned char *data = base + 8 + hlen;
    const uint64_t data_len = f->size - 8 - hlen;
    int count = cJSON_GetArraySize(root), nspan = 0, r = 0;
    struct span *spans = calloc(count ? count : 1, sizeof *spans);
    if (!spans) {
        cJSON_Delete(root);
        return -ENOMEM;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        /* A field twice in one entry ("shape" twice) is read as the first here and as the last
         * by other readers: the same file, two tensors. (A name twice: finish says so.) */
        char dup[128];
        if (json_duplicate_key(e, dup, sizeof dup)) {
            r = df_fail(err, errlen, -DF_EFORMAT, "%s: %s%s%s: %s appears twice in its entry", path,
                        strcmp(e->string, "__metadata__") ? "tensor '" : "", e->string,
                        strcmp(e->string, "__metadata__") ? "'" : "", dup);
            break;
        }
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                r = df_fail(err, errlen, -DF_EFORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            continue;
        }
        struct st_tensor t;
        uint64_t b = 0, en = 0;
        if ((r = parse_entry(e, path, data, data_len, &t, &b, &en, err, errlen)) < 0)
            break;
        if (!(t.name = strdup(e->string)) || (r = push_tensor(s, &t)) < 0) {
            free((char *)t.name);
            r = -ENOMEM;
            break;
        }
        if (b != en)
            spans[nspan++] = (struct span){ b, en, t.name };
    }
    cJSON_Delete(root);
    if (r == 0) {
        /* Tensors must not share bytes: a write-once format with overlap is corrupt or hostile. */
        qsort(spans, nspan, sizeof *spans, cmp_span);
        for (int i = 1; i < nspan; i++)
            if (spans[i].begin < spans[i - 1].end && !strcmp(spans[i].name, spans[i - 1].name)) {
                r = df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s' appears twice in the header", path,
                            spans[i].name);
                break;
            } else if (spans[i].begin < spans[i - 1].end) {
                r = df_fail(err, errlen, -DF_EFORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                         path, spans[i - 1].name, (unsigned long long)spans[i - 1].begin,
                         (unsigned long long)spans[i - 1].end, spans[i].name,
                         (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
                break;
            }
    }
    /* ... nor leave bytes to no tensor (the format's own readers refuse a hole, as a sign of a
     * header that lost entries): the data block is the tensors, end to end. */
    for (int i = 0; r == 0 && i <= nspan; i++) {
        uint64_t from = i ? spans[i - 1].end : 0, to = i < nspan ? spans[i].begin : data_len;
        if (to > from)
            r = df_fail(err, errlen, -DF_EFORMAT, "%s: data bytes [%llu, %llu) belong to no tensor (%s%s%s%s)", path,
                        (unsigned long long)from, (unsigned long long)to, i ? "after '" : "before the first tensor",
                        i ? spans[i - 1].name : "", i ? "'" : "", i == nspan ? ", at the end of the file" : "");
    }
    free(spans);
    return r;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int finish(struct st_set *s, char *err, size_t errlen)
{
    if (!s->n)
        return 0;   /* a header with no tensors: nothing to sort (and tensors is NULL) */
    qsort(s->tensors, s->n, sizeof *s->tensors, cmp_tensor);
    for (size_t i = 1; i < s->n; i++)
        if (!strcmp(s->tensors[i].name, s->tensors[i - 1].name))
            return df_fail(err, errlen, -DF_EFORMAT, "%s: tensor '%s' appears twice (also in %s)", s->tensors[i].file,
                        s->tensors[i].name, s->tensors[i - 1].file);
    return 0;
}

static struct st_set *set_new(const char *source)
{
    struct st_set *s = calloc(1, sizeof *s);
    if (s && !(s->source = strdup(source))) {
        free(s);
        return NULL;
    }
    return s;
}

void st_close(struct st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free((char *)s->tensors[i].name);
    for (int i = 0; i < s->nfiles; i++) {
        if (s->files[i].map) {
            mapname_remove(s->files[i].map);
            munmap(s->files[i].map, s->files[i].size);
        }
        free(s->files[i].path);
    }
    free(s->tensors);
    free(s->files);
    free(s->source);
    free(s);
}

int st_open_file(struct st_set **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct st_set *s = set_new(path);
    if (!s)
        return -ENOMEM;
    int r = add_file(s, path, err, errlen);
    if (r == 0)
        r = finish(s, err, errlen);
    if (r < 0) {
        st_close(s);
        return r;
    }
    *out = s;
    return 0;
}

static bool plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* Sharded checkpoint: open every file named in weight_map, then check each mapping. */
static int open_index(struct st_set *s, const char *dir, const char *index, char *err, size_t errlen)
{
    cJSON *root;
    int r = json_read_object(index, ST_INDEX_MAX, &root, err, errlen);
    if (r < 0)
        return r;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return df_fail(err, errlen, -DF_EFORMAT, "%s: weight_map missing or not an object", index);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            r = df_fail(err, errlen, -DF_EFORMAT, "%s: weight_map: tensor '%s': file must be a plain file name", index,
                     e->string);
            goto out;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        bool seen = false;
        for (int i = 0; i < s->nfiles && !seen; i++)
            seen = !strcmp(s->files[i].path, path);
        if (!seen && (r = add_file(s, path, err, errlen)) == -ENOENT) {
            r = df_fail(err, errlen, -DF_EMISSING, "%s: weight_map: tensor '%s': shard %s does not exist", index,
                        e->string, e->valuestring);
            goto out;
        }
        if (r < 0)
            goto out;
    }
    if ((r = finish(s, err, errlen)) < 0)
        goto out;
    cJSON_ArrayForEach(e, map) {
        const struct st_tensor *t = st_find(s, e->string);
        const char *slash = t ? strrchr(t->file, '/') : NULL;
        if (!t || strcmp(slash ? slash + 1 : t->file, e->valuestring)) {
            r = df_fail(err, errlen, -DF_EMISSING, "%s: weight_map: tensor '%s' is not in %s", index, e->string,
                     e->valuestring);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return r;
}

int st_open_dir(struct st_set **out, const char *dir, char *err, size_t errlen)
{
    char index[4096], single[4096];
    *out = NULL;
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    /* model.safetensors first, as transformers' from_pretrained takes it: a folder saved again in
     * the other layout keeps both (save_pretrained removes only the old shards), and the hidden
     * states must be of the weights transformers would load */
    if (access(single, F_OK) == 0)
        return st_open_file(out, single, err, errlen);
    if (access(index, F_OK) != 0)
        return df_fail(err, errlen, -DF_EMISSING, "%s: neither model.safetensors nor model.safetensors.index.json",
                       dir);
    struct st_set *s = set_new(index);
    if (!s)
        return -ENOMEM;
    int r = open_index(s, dir, index, err, errlen);
    if (r < 0) {
        st_close(s);
        return r;
    }
    *out = s;
    return 0;
}

const struct st_tensor *st_find(const struct st_set *s, const char *name)
{
    struct st_tensor key = { .name = name };
    return s->n ? bsearch(&key, s->tensors, s->n, sizeof key, cmp_tensor) : NULL;
}

size_t st_count(const struct st_set *s)
{
    return s->n;
}

const struct st_tensor *st_at(const struct st_set *s, size_t i)
{
    return i < s->n ? &s->tensors[i] : NULL;
}

const char *st_source(const struct st_set *s)
{
    return s->source;
}

#define ST_FP_SAMPLES 16
#define ST_FP_SAMPLE_BYTES 64
#define ST_FP_SEED 0x6466666d6f64656cull      /* "dffmodel" */

uint64_t st_fingerprint(const struct st_set *s)
{
    struct dataset_hash h;
    dataset_hash_init(&h, ST_FP_SEED);
    for (size_t i = 0; i < s->n; i++) {
        const struct st_tensor *t = &s->tensors[i];
        uint64_t desc[1 + ST_MAX_DIMS] = { (uint64_t)t->ndim };
        for (int k = 0; k < t->ndim; k++)
            desc[1 + k] = (uint64_t)t->shape[k];
        const char *dtype = st_dtype_name(t->dtype);    /* (the name: the enum's numbering may change) */
        dataset_hash_update(&h, t->name, strlen(t->name) + 1);
        dataset_hash_update(&h, dtype, strlen(dtype) + 1);
        dataset_hash_update(&h, desc, sizeof desc);
        const uint8_t *data = t->data;
        if (t->nbytes <= ST_FP_SAMPLES * ST_FP_SAMPLE_BYTES) {
            dataset_hash_update(&h, data, t->nbytes);
            continue;
        }
        size_t span = t->nbytes - ST_FP_SAMPLE_BYTES;     /* (< 2^48: no overflow below) */
        for (size_t k = 0; k < ST_FP_SAMPLES; k++)
            dataset_hash_update(&h, data + span * k / (ST_FP_SAMPLES - 1), ST_FP_SAMPLE_BYTES);
        progress_tick();        /* (a page fault each, on a slow or cold storage) */
    }
    uint64_t fp = dataset_hash_final(&h);
    return fp ? fp : 1;
}

int st_dir_fingerprint(const char *dir, uint64_t *fp, char *err, size_t errlen)
{
    struct st_set *s;
    int r = st_open_dir(&s, dir, err, errlen);
    if (r < 0)
        return r;
    for (int i = 0; i < s->nfiles; i++)    /* a page read per sample, not the kernel's read-ahead */
        madvise(s->files[i].map, s->files[i].size, MADV_RANDOM);
    *fp = st_fingerprint(s);
    st_close(s);
    return 0;
}

/* The first element of t that is NaN or infinite (all exponent bits set), -1 when none. One
 * pass over 16-bit words, a block of 4096 elements at a time copied out of the mapping
 * (unaligned there) and tested without a branch per element, so it runs at memory speed; the
 * element is looked up only in a block that has one. An F32's exponent sits in its high word
 * (little-endian: the second) exactly where a BF16's does. */
static int64_t first_nonfinite(const struct st_tensor *t)
{
    enum { B = 4096 };
    const unsigned words = t->dtype == ST_F32 ? 2 : 1, hi = words - 1;
    const uint16_t exp = t->dtype == ST_F16 ? 0x7c00u : 0x7f80u;
    const unsigned char *p = t->data;
    uint16_t blk[2 * B];
    for (int64_t b = 0; b < t->numel; b += B) {
        int64_t n = t->numel - b < B ? t->numel - b : B;
        progress_add(2 * words * (size_t)n);
        memcpy(blk, p + 2 * words * (size_t)b, 2 * words * (size_t)n);
        unsigned bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad |= (blk[words * i + hi] & exp) == exp;
        for (int64_t i = 0; bad && i < n; i++)
            if ((blk[words * i + hi] & exp) == exp)
                return b + i;
    }
    return -1;
}

int st_expect(const struct st_set *s, const char *name, int ndim, const int64_t *shape,
              const struct st_tensor **out, char *err, size_t errlen)
{
    const struct st_tensor *t = st_find(s, name);
    if (!t)
        return df_fail(err, errlen, -DF_EMISSING, "%s: tensor '%s' not found", s->source, name);
    if (t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
        return df_fail(err, errlen, -DF_EUNSUPPORTED, "%s: tensor '%s': dtype %s is not supported (BF16, F16, F32)",
                    t->file, name, st_dtype_name(t->dtype));
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, ndim, shape);
        return df_fail(err, errlen, -DF_ESHAPE, "%s: tensor '%s': shape %s does not match config.json (expected %s)",
                    t->file, name, got, want);
    }
    int64_t bad = first_nonfinite(t);
    if (bad >= 0)
        return df_fail(err, errlen, -DF_ENAN, "%s: tensor '%s': element %lld is NaN or infinite", t->file, name,
                       (long long)bad);
    if (out)
        *out = t;
    return 0;
}

static void read_f32(const struct st_tensor *t, const unsigned char *src, int64_t n, void *out)
{
    float *dst = out;
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case ST_BF16:
        cpu_bf16_to_f32(dst, src, (size_t)n);
        break;
    default:
        cpu_f16_to_f32(dst, src, (size_t)n);
        break;
    }
}

static void read_bf16(const struct st_tensor *t, const unsigned char *src, int64_t n, void *out)
{
    uint16_t *dst = out;
    if (t->dtype == ST_BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v;
        if (t->dtype == ST_F32) {
            memcpy(&v, src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            v = cpu_f16_to_f32_one(h);
        }
        dst[i] = cpu_f32_to_bf16_one(v);
    }
}

/* Elements [first, first + n) converted by `convert` into dst (out_size bytes each), a piece of
 * PROGRESS_CHUNK_BYTES of the file at a time, each counted as progress: the pages of a mapping
 * are read from disk here, minutes for a large model. */
static int read_as(const struct st_tensor *t, int64_t first, int64_t n, void *dst, size_t out_size,
                   void (*convert)(const struct st_tensor *, const unsigned char *, int64_t, void *))
{
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first)
        return -DF_ERANGE;
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        return -DF_EUNSUPPORTED;
    const size_t es = st_dtype_size(t->dtype);
    const unsigned char *src = (const unsigned char *)t->data + (size_t)first * es;
    const int64_t piece = (int64_t)(PROGRESS_CHUNK_BYTES / es);
    for (int64_t done = 0; done < n; done += piece) {
        int64_t k = n - done < piece ? n - done : piece;
        convert(t, src + (size_t)done * es, k, (char *)dst + (size_t)done * out_size);
        progress_add((size_t)k * es);
    }
    return 0;
}

int st_read_f32(const struct st_tensor *t, int64_t first, int64_t n, float *dst)
{
    return read_as(t, first, n, dst, sizeof *dst, read_f32);
}

int st_read_bf16(const struct st_tensor *t, int64_t first, int64_t n, uint16_t *dst)
{
    return read_as(t, first, n, dst, sizeof *dst, read_bf16);
}

int st_load_f32(const struct st_tensor *t, float **out)
{
    *out = NULL;
    if (t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
        return -DF_EUNSUPPORTED;
    float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *buf);
    if (!buf)
        return -ENOMEM;
    st_read_f32(t, 0, t->numel, buf);
    *out = buf;
    return 0;
}
