/* fileio.h: whole-buffer read/write on a file descriptor, retried across EINTR and short
 * transfers; the one copy the dataset writer, safetensors writer and checkpoints share. */
#pragma once
#include <stddef.h>

/* Write all n bytes: 0 or -errno. */
int fileio_write_all(int fd, const void *buf, size_t n);
/* Read exactly n bytes: 0, -DF_ETRUNC when the file ends first, or -errno. */
int fileio_read_all(int fd, void *buf, size_t n);
