/* safetensors.h: read-only, mmap-backed reader of safetensors checkpoints.
 * One file or a sharded dir (model.safetensors.index.json); every offset, size and shape is validated. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS 8

enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_I64, ST_U64, ST_F64, ST_F8_E4M3, ST_F8_E5M2,
    ST_NDTYPES
};

struct st_tensor {
    const char *name;
    const char *file;           /* path of the file holding it (for messages) */
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data;           /* into the read-only mapping; NOT aligned in general */
    size_t nbytes;
};

struct st_set;

/* Open <dir>/model.safetensors if present, else <dir>/model.safetensors.index.json (all its shards):
 * the order of transformers' from_pretrained. */
int st_open_dir(struct st_set **out, const char *dir, char *err, size_t errlen);
/* Open one safetensors file. */
int st_open_file(struct st_set **out, const char *path, char *err, size_t errlen);
/* Accepts NULL. Invalidates every st_tensor pointer and data pointer from this set. */
void st_close(struct st_set *s);

/* NULL when absent. */
const struct st_tensor *st_find(const struct st_set *s, const char *name);
size_t st_count(const struct st_set *s);
const struct st_tensor *st_at(const struct st_set *s, size_t i);   /* sorted by name */
const char *st_source(const struct st_set *s);  /* the dir or file it was opened from */

/* The weights' fingerprint (never 0): every tensor's name, dtype and shape, and 16 samples of 64
 * bytes spread over its data (the first and the last among them; all of a tensor of 1 KiB or
 * less): about 1 KiB read per tensor. Models of the same shapes with other weights (fine-tuned,
 * another initialisation) differ; one changed in a few elements only may not. How the tensors
 * are split into shards does not count. */
uint64_t st_fingerprint(const struct st_set *s);
/* st_open_dir + st_fingerprint + st_close. */
int st_dir_fingerprint(const char *dir, uint64_t *fp, char *err, size_t errlen);

/* Find a float tensor (BF16/F16/F32) of exactly this shape, every element finite; errors name
 * the file and tensor: -DF_EMISSING, -DF_EUNSUPPORTED (dtype), -DF_ESHAPE ("... does not match
 * config.json"), -DF_ENAN (the first element that is NaN or infinite). One pass over its data. */
int st_expect(const struct st_set *s, const char *name, int ndim, const int64_t *shape,
              const struct st_tensor **out, char *err, size_t errlen);

const char *st_dtype_name(enum st_dtype d);   /* "BF16", ... */
size_t st_dtype_size(enum st_dtype d);
/* Convert elements [first, first+n) of a BF16/F16/F32 tensor; -DF_EUNSUPPORTED for others,
 * -DF_ERANGE when the range is outside the tensor. */
int st_read_f32(const struct st_tensor *t, int64_t first, int64_t n, float *dst);
int st_read_bf16(const struct st_tensor *t, int64_t first, int64_t n, uint16_t *dst);
/* Whole tensor into a new malloc'd f32 array. */
int st_load_f32(const struct st_tensor *t, float **out);

#ifdef __cplusplus
}
#endif
