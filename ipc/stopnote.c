/* stopnote.c: see stopnote.h. */
#include "ipc/stopnote.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "common/fileio.h"

static int note_path(char *path, size_t n, const char *sock, const char *suffix)
{
    return snprintf(path, n, "%s.stopped%s", sock, suffix) < (int)n ? 0 : -ENAMETOOLONG;
}

int stop_note_write(const char *sock, const char *reason, gid_t gid)
{
    char path[4096], tmp[4096];
    if (note_path(path, sizeof path, sock, "") < 0 || note_path(tmp, sizeof tmp, sock, ".tmp") < 0)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    char line[STOP_NOTE_MAX + 2];
    int len = snprintf(line, sizeof line, "%s\n", reason && reason[0] ? reason : "stopped");
    if (len >= (int)sizeof line) {
        line[sizeof line - 2] = '\n';
        len = (int)sizeof line - 1;
    }
    int r = write(fd, line, (size_t)len) == len ? 0 : -EIO;
    if (r == 0 && gid != (gid_t)-1 && fchown(fd, (uid_t)-1, gid) < 0)    /* readable as the socket is */
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0)
        unlink(tmp);
    return r;
}

void stop_note_clear(const char *sock)
{
    char path[4096];
    if (note_path(path, sizeof path, sock, "") == 0)
        unlink(path);
}

int stop_note_read(const char *sock, char *why, size_t n)
{
    char path[4096];
    if (n == 0 || note_path(path, sizeof path, sock, "") < 0)
        return 0;
    /* Anything but a file there (a folder, a FIFO that would wait for a writer) is no note: an
     * empty read of it was "stopped", and every daemon left. */
    int fd = fileio_open_regular(path, NULL);
    if (fd < 0)
        return 0;
    ssize_t k = read(fd, why, n - 1);
    close(fd);
    why[k > 0 ? k : 0] = 0;
    why[strcspn(why, "\n")] = 0;
    if (!why[0])
        snprintf(why, n, "stopped");
    return 1;
}
