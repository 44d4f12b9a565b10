/* fileio.h: whole-buffer read/write on a file descriptor, retried across EINTR and short
 * transfers; the one copy the dataset writer, safetensors writer and checkpoints share. */
#pragma once
#include <stddef.h>

/* Write all n bytes: 0 or -errno. */
int fileio_write_all(int fd, const void *buf, size_t n);
/* Read exactly n bytes: 0, -DF_ETRUNC when the file ends first, or -errno. */
int fileio_read_all(int fd, void *buf, size_t n);
/* Read until the file ends or cap bytes are in: the count, or -errno. */
long fileio_read_upto(int fd, void *buf, size_t cap);

#include <sys/types.h>
/* The process's umask, read without changing it (umask(2) can only set it, and a set-and-restore
 * races other threads creating files): from /proc/self/status, 022 where that says nothing. */
mode_t fileio_umask(void);

/* posix_fallocate of [0, size), retried while a signal cuts it short (tmpfs gives EINTR for a
 * large reservation when one is pending: a stop during a start is no failure): 0 or -errno. */
int fileio_reserve(int fd, unsigned long long size);

struct stat;
/* Open path for reading if it is a regular file (config, JSON, token files): a FIFO in its place
 * opens without waiting for a writer and is refused like a folder, a socket or a device. The fd
 * (blocking again), or -EINVAL for not a regular file, or -errno; *st filled when not NULL. */
int fileio_open_regular(const char *path, struct stat *st);
/* The same with open(2)'s flags and mode (O_RDWR | O_CREAT, O_NOFOLLOW, ...; O_CLOEXEC, O_NOCTTY and
 * O_NONBLOCK are added): a FIFO, socket or device under the name is -EINVAL at once. */
int fileio_open_regular_as(const char *path, int flags, unsigned mode, struct stat *st);
/* shm_open of an existing object (O_RDONLY or O_RDWR) that refuses a FIFO, socket or device
 * under the name at once (/dev/shm is writable by every user; an O_RDONLY open of a FIFO would
 * wait for a writer forever): the fd (blocking, close-on-exec), -EINVAL for an object that is
 * not a regular file, or -errno; *st filled when not NULL. */
int fileio_shm_open(const char *name, int oflag, struct stat *st);

/* The compressor whose magic number a file starts with ("gzip", "zstd", "xz", "bzip2"), or NULL:
 * for a message that says what a file read as plain data is. */
const char *fileio_compressed(const void *head, size_t n);

/* The folder `path` is in ("/" for one at the top, "." for a bare name) into dir (cap bytes,
 * cut to fit); returns its last part. */
const char *fileio_parent(const char *path, char *dir, size_t cap);
