/* err.c: messages for dflash error codes.
 * -errno values map to glibc's descriptions, DF_E* to the table below. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "common/err.h"

static const char *const df_msgs[] = {
    [DF_EMAGIC - DF_EBASE]       = "not a dflash object (bad magic)",
    [DF_EVERSION - DF_EBASE]     = "version mismatch",
    [DF_ELAYOUT - DF_EBASE]      = "layout mismatch",
    [DF_ETRUNC - DF_EBASE]       = "truncated",
    [DF_EFORMAT - DF_EBASE]      = "malformed",
    [DF_ECHECKSUM - DF_EBASE]    = "checksum mismatch",
    [DF_ERANGE - DF_EBASE]       = "value out of range",
    [DF_EUNSUPPORTED - DF_EBASE] = "unsupported",
    [DF_EMISSING - DF_EBASE]     = "missing",
    [DF_ESHAPE - DF_EBASE]       = "shape mismatch",
    [DF_ETIMEOUT - DF_EBASE]     = "timed out",
    [DF_ENAN - DF_EBASE]         = "non-finite value",
    [DF_EPEER - DF_EBASE]        = "peer refused",
    [DF_ESTATE - DF_EBASE]       = "not allowed in this state",
    [DF_EDEAD - DF_EBASE]        = "owner is dead",
    [DF_ECUDA - DF_EBASE]        = "CUDA error",
};

int err_may_pass(int r)
{
    return r == -ENOMEM || r == -ENOBUFS || r == -EMFILE || r == -ENFILE || r == -EIO || r == -EINTR || r == -EAGAIN;
}

const char *err_str(int r)
{
    if (r == INT_MIN)
        return "unknown error";
    if (r < 0)
        r = -r;
    if (r > DF_EBASE && r < DF_ELAST)
        return df_msgs[r - DF_EBASE];
    const char *s = strerrordesc_np(r);
    return s ? s : "unknown error";
}

int df_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
