/* mapname.h: names for this process's file and shm mappings, so that a SIGBUS (a page of a
 * mapping gone: its file or shm object was cut short in place) can say which one it was.
 * Registration takes a lock; the lookup is async-signal-safe (atomic loads, no lock). */
#pragma once
#include <stddef.h>

#define MAPNAME_MAX 1024    /* mappings named at once (a model of hundreds of shards); more go unnamed */

/* Name [base, base+len) "kind name" (e.g. "ring" "/dflash-x", "dataset" "/data/train.bin"); a long
 * name keeps its end (the file's own name). With the table full: logged once, left unnamed. */
void mapname_add(const void *base, size_t len, const char *kind, const char *name);
/* Forget the mapping at base (before its munmap). Unknown bases are ignored. */
void mapname_remove(const void *base);
/* The name of the mapping holding addr, copied NUL-terminated into buf (len > 0): its length,
 * or 0 (buf "") when no named mapping holds addr. Safe in a signal handler. */
size_t mapname_find(const void *addr, char *buf, size_t len);
