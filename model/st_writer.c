/* st_writer.c: safetensors writer. The header is built with cJSON (names escaped), padded with
 * spaces to a multiple of 8 bytes as the format recommends, then the data in tensor order. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/err.h"
#include "common/fileio.h"
#include "model/st_writer.h"

int st_write_file(const char *path, const struct st_out *t, size_t n, const char *const *meta,
                  size_t n_meta, char *err, size_t errlen)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return -ENOMEM;
    int r = 0;
    if (n_meta) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (size_t i = 0; m && i < n_meta; i++)
            if (!cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]))
                m = NULL;
        if (!m) {
            cJSON_Delete(root);
            return -ENOMEM;
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t es = st_dtype_size(t[i].dtype);
        if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, "__metadata__") || !es ||
            t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS ||
            cJSON_GetObjectItemCaseSensitive(root, t[i].name)) {
            snprintf(err, errlen, "%s: tensor %zu (%s): bad or duplicate name, dtype or rank", path, i,
                     t[i].name ? t[i].name : "(null)");
            cJSON_Delete(root);
            return -EINVAL;
        }
        uint64_t numel = 1;
        double dims[ST_MAX_DIMS];
        for (int k = 0; k < t[i].ndim; k++) {
            if (t[i].shape[k] < 0) {
                snprintf(err, errlen, "%s: tensor %s: negative dimension", path, t[i].name);
                cJSON_Delete(root);
                return -EINVAL;
            }
            numel *= (uint64_t)t[i].shape[k];
            dims[k] = (double)t[i].shape[k];
        }
        uint64_t bytes = numel * es;
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON *shape = e ? cJSON_CreateDoubleArray(dims, t[i].ndim) : NULL;
        double offs[2] = { (double)off, (double)(off + bytes) };
        cJSON *o = shape ? cJSON_CreateDoubleArray(offs, 2) : NULL;
        if (!o || !cJSON_AddStringToObject(e, "dtype", st_dtype_name(t[i].dtype))) {
            cJSON_Delete(shape);
            cJSON_Delete(o);
            cJSON_Delete(root);
            return -ENOMEM;
        }
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToObject(e, "data_offsets", o);
        off += bytes;
    }
    _cleanup_free_ char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json)
        return -ENOMEM;
    size_t hlen = strlen(json), padded = (hlen + 7) & ~(size_t)7;
    _cleanup_free_ char *hdr = malloc(8 + padded);
    if (!hdr)
        return -ENOMEM;
    uint64_t le = padded;   /* little-endian hosts only (x86-64, aarch64) */
    memcpy(hdr, &le, 8);
    memcpy(hdr + 8, json, hlen);
    memset(hdr + 8 + hlen, ' ', padded - hlen);

    _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = -errno;
        snprintf(err, errlen, "%s: open: %s", path, strerror(-r));
        return r;
    }
    r = fileio_write_all(fd, hdr, 8 + padded);
    for (size_t i = 0; r == 0 && i < n; i++) {
        uint64_t numel = 1;
        for (int k = 0; k < t[i].ndim; k++)
            numel *= (uint64_t)t[i].shape[k];
        r = fileio_write_all(fd, t[i].data, numel * st_dtype_size(t[i].dtype));
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r < 0)
        snprintf(err, errlen, "%s: write: %s", path, strerror(-r));
    return r;
}
