/* err.h: error codes used across dflash libraries.
 * Library calls return 0 or a negative code: -errno, or one of DF_E* below. */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DF_EBASE = 10000,
    DF_EMAGIC,      /* object is not a dflash object (bad magic) */
    DF_EVERSION,    /* layout/protocol version mismatch */
    DF_ELAYOUT,     /* layout parameters differ from what was expected */
    DF_ETRUNC,      /* file or object shorter than its header says */
    DF_EFORMAT,     /* malformed content (parse error, bad field) */
    DF_ECHECKSUM,   /* checksum mismatch */
    DF_ERANGE,      /* value out of its allowed range */
    DF_EUNSUPPORTED,/* valid but unsupported (architecture, dtype, ...) */
    DF_EMISSING,    /* required item absent (tensor, key, file) */
    DF_ESHAPE,      /* tensor shape does not match the config */
    DF_ETIMEOUT,    /* wait timed out */
    DF_ENAN,        /* non-finite number where a finite one is required */
    DF_EPEER,       /* peer misbehaved or was refused */
    DF_ESTATE,      /* operation not allowed in the current state */
    DF_EDEAD,       /* owner or peer is dead */
    DF_ECUDA,       /* CUDA/cuBLAS/NCCL failure */
    DF_ELAST
};

/* Message for a negative (or positive) error code; never NULL, thread-safe. */
const char *err_str(int r);

/* Whether a failure may pass with a restart (exit 1, not 78): short of memory, descriptors or
 * buffers, an I/O error, an interrupted or would-block call. Anything else (missing, refused,
 * malformed) stays as it is until the operator acts. */
int err_may_pass(int r);

/* Fill err (when err && errlen) with the printf-style message and return code: the
 * `return df_fail(err, errlen, -DF_EFORMAT, "%s: ...", path, ...)` of library errors. */
int df_fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
