/* fileio.c: whole-buffer read/write on a file descriptor.
 * Loops over short transfers and EINTR so callers see one result per buffer. */
#include <errno.h>
#include <unistd.h>
#include "common/err.h"
#include "common/fileio.h"

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
