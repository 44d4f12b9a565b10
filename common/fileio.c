/* fileio.c: whole-buffer read/write on a file descriptor.
 * Loops over short transfers and EINTR so callers see one result per buffer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/fileio.h"

mode_t fileio_umask(void)
{
    mode_t m = 022;
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return m;
    char line[128];
    unsigned v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &v) == 1) {
            m = (mode_t)(v & 0777);
            break;
        }
    fclose(f);
    return m;
}

int fileio_reserve(int fd, unsigned long long size)
{
    int e;
    do
        e = posix_fallocate(fd, 0, (off_t)size);
    while (e == EINTR);
    return -e;
}

int fileio_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int fileio_read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -DF_ETRUNC;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

long fileio_read_upto(int fd, void *buf, size_t cap)
{
    char *p = buf;
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        n += (size_t)r;
    }
    return (long)n;
}

/* fd, opened with O_NONBLOCK: kept (blocking again) if it is a regular file, else closed. */
static int keep_regular(int fd, struct stat *st_out)
{
    struct stat st;
    int r = fstat(fd, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
    if (r < 0) {
        close(fd);
        return r;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (st_out)
        *st_out = st;
    return fd;
}

int fileio_open_regular(const char *path, struct stat *st_out)
{
    return fileio_open_regular_as(path, O_RDONLY, 0, st_out);
}

int fileio_open_regular_as(const char *path, int flags, unsigned mode, struct stat *st_out)
{
    struct stat st;
    int fd = open(path, flags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, (mode_t)mode);
    if (fd < 0) {
        int r = -errno;     /* ENXIO: a socket */
        return r == -ENXIO && stat(path, &st) == 0 && !S_ISREG(st.st_mode) ? -EINVAL : r;
    }
    return keep_regular(fd, st_out);
}

int fileio_shm_open(const char *name, int oflag, struct stat *st_out)
{
    int fd = shm_open(name, oflag | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
    if (fd < 0)
        return errno == ENXIO ? -EINVAL : -errno;    /* ENXIO: a socket */
    return keep_regular(fd, st_out);
}

const char *fileio_compressed(const void *head, size_t n)
{
    static const struct { const char *name; unsigned char magic[6]; size_t len; } kinds[] = {
        { "gzip", { 0x1f, 0x8b }, 2 },
        { "zstd", { 0x28, 0xb5, 0x2f, 0xfd }, 4 },
        { "xz", { 0xfd, '7', 'z', 'X', 'Z', 0x00 }, 6 },
        { "bzip2", { 'B', 'Z', 'h' }, 3 },
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (n >= kinds[i].len && !memcmp(head, kinds[i].magic, kinds[i].len))
            return kinds[i].name;
    return NULL;
}

const char *fileio_parent(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    snprintf(dir, cap, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (!dir[0])
        snprintf(dir, cap, "/");
    return slash ? slash + 1 : path;
}
