/* sqlite_ro.c: opening an SQLite file to read only, leaving nothing beside it (sqlite_ro.h). */
#include "common/sqlite_ro.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/err.h"

int sqlite_ro_check(const char *path, int *wal, char *err, size_t errlen)
{
    /* (O_NONBLOCK: a FIFO under the name must not hang the open) */
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        return df_fail(err, errlen, -e, "%s", strerror(e));
    }
    if (S_ISDIR(st.st_mode))
        return df_fail(err, errlen, -EISDIR, "a folder, not a ledger file");
    if (!S_ISREG(st.st_mode))
        return df_fail(err, errlen, -DF_EFORMAT, "not a regular file, so not a ledger");
    if (st.st_size == 0)
        return df_fail(err, errlen, -DF_EFORMAT, "an empty file, not a ledger");
    unsigned char h[100];
    ssize_t n = pread(fd, h, sizeof h, 0);
    if (n < 0) {
        int e = errno;
        return df_fail(err, errlen, -e, "%s", strerror(e));
    }
    if (n < (ssize_t)sizeof h || memcmp(h, "SQLite format 3", 16))
        return df_fail(err, errlen, -DF_EFORMAT, "not an SQLite database (no SQLite header), so not a ledger");
    *wal = h[18] == 2 && h[19] == 2;
    return 0;
}

int sqlite_ro_wal_present(const char *path)
{
    char real[PATH_MAX], wal[PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", realpath(path, real) ? real : path);
    struct stat st;
    return lstat(wal, &st) == 0 || errno != ENOENT;
}

int sqlite_ro_uri(char *uri, size_t cap, const char *path, int immutable)
{
    size_t n = (size_t)snprintf(uri, cap, "%s", path[0] == '/' ? "file://" : "file:");
    for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
        if (n + 4 > cap)
            return -ENAMETOOLONG;
        if (isalnum(*c) || strchr("/._-~", *c))
            uri[n++] = (char)*c;
        else
            n += (size_t)snprintf(uri + n, cap - n, "%%%02X", *c);
    }
    int k = snprintf(uri + n, cap - n, "?mode=ro%s", immutable ? "&immutable=1" : "");
    return k < 0 || (size_t)k >= cap - n ? -ENAMETOOLONG : 0;
}

