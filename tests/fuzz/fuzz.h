/* fuzz.h: the fuzz entry points (one per input parser) and their shared helpers.
 * libFuzzer builds (tools/fuzz.sh) and tests/test_fuzz_regress.c call the same functions. */
#pragma once
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Each returns 0 (libFuzzer's "keep going"); a broken promise of the parser under test
 * (e.g. it accepted something its header says it rejects) aborts via FUZZ_ASSERT. */
int fuzz_config(const uint8_t *data, size_t size);
int fuzz_dataset(const uint8_t *data, size_t size);
int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_st_index(const uint8_t *data, size_t size);
int fuzz_hfconfig(const uint8_t *data, size_t size);
int fuzz_ring(const uint8_t *data, size_t size);
int fuzz_proto(const uint8_t *data, size_t size);
int fuzz_ckpt(const uint8_t *data, size_t size);
int fuzz_ctl(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n", __FILE__, __LINE__, #cond); abort(); } } while (0)

/* An anonymous in-memory file holding exactly `size` bytes, reachable by path as
 * /proc/self/fd/N, so the file-based loaders read fuzz input without touching a disk.
 * One per caller (a static fd), rewritten for each input. Returns the path or NULL. */
static inline const char *fuzz_memfile(int *fdp, char *path, size_t cap, const uint8_t *data, size_t size)
{
    if (*fdp < 0 && (*fdp = memfd_create("dflash-fuzz", MFD_CLOEXEC)) < 0)
        return NULL;
    if (ftruncate(*fdp, 0) < 0 || (size && pwrite(*fdp, data, size, 0) != (ssize_t)size))
        return NULL;
    snprintf(path, cap, "/proc/self/fd/%d", *fdp);
    return path;
}

/* A failed call must say why: a non-empty, terminated message in the caller's buffer. */
static inline int fuzz_err_ok(const char *err, size_t cap)
{
    return err[0] && strnlen(err, cap) < cap;
}

/* The shards fuzz_st_index puts beside the fuzzed index (its seeds name them). */
#define ST_INDEX_SHARD1 "model-00001-of-00002.safetensors"
#define ST_INDEX_SHARD2 "model-00002-of-00002.safetensors"

#ifdef FUZZ_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return FUZZ_ENTRY(data, size); }
#endif
