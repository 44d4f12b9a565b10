/* st_writer.h: write one safetensors file (JSON header + raw little-endian data), fsync'd.
 * The reader is model/safetensors.h. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/safetensors.h"

struct st_out {
    const char *name;
    enum st_dtype dtype;
    int ndim;                       /* 0..ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const void *data;               /* numel * dtype size bytes */
};

/* Write `n` tensors (in this order) to `path` (created or truncated, mode 0644) and fsync it.
 * meta: n_meta key/value string pairs for "__metadata__" (meta[2i] = key, meta[2i+1] = value).
 * Duplicate or empty names, bad dtypes/shapes: -EINVAL with a message naming the tensor. */
int st_write_file(const char *path, const struct st_out *t, size_t n, const char *const *meta,
                  size_t n_meta, char *err, size_t errlen);
