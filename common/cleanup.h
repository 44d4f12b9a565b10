/* cleanup.h: scope-bound release of small locals via __attribute__((cleanup)).
 * Use for fds, FILE*, heap buffers that must be released on every return path. */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void cleanup_freep(void *p) { free(*(void **)p); }
static inline void cleanup_closep(int *fd) { if (*fd >= 0) close(*fd); }
static inline void cleanup_fclosep(FILE **f) { if (*f) fclose(*f); }

#define _cleanup_free_   __attribute__((cleanup(cleanup_freep)))
#define _cleanup_close_  __attribute__((cleanup(cleanup_closep)))
#define _cleanup_fclose_ __attribute__((cleanup(cleanup_fclosep)))

/* Hand ownership out of a cleanup-scoped variable: `return TAKE_PTR(buf);` */
#define TAKE_PTR(p) ({ __typeof__(p) _t = (p); (p) = NULL; _t; })
#define TAKE_FD(fd) ({ int _t = (fd); (fd) = -1; _t; })
