/* collective.h: a small shared-memory collective (all-reduce, broadcast, barrier) for the
 * ranks of one host, e.g. CPU drafters; a NCCL backend can sit behind the same calls. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Bump COLL_VERSION whenever the shared layout in collective.c changes. */
#define COLL_MAGIC   0x4c4c4f43484c4644ull  /* "DFLHCOLL" little-endian */
#define COLL_VERSION 3u
#define COLL_MAX_CHUNK (1ull << 28)         /* floats per rank and round (1 GiB) */

struct coll;

struct coll_opts {
    uint64_t generation;   /* group incarnation (e.g. from the coordinator); all ranks must pass the
                              same non-zero value. A restarted group uses a new one, so it never
                              mixes with a stale object or stale peers. */
    size_t chunk_floats;   /* floats exchanged per round (0 = 1M = 4 MiB per rank; at most
                              COLL_MAX_CHUNK); bigger buffers go in several rounds. Rank 0's
                              value wins. */
    unsigned mode;         /* permission bits of the shm object (0 = 0600) */
    /* Optional: called about every 50 ms while this rank waits (for rank 0's object, for its
     * peers in any collective), so a daemon can keep its heartbeat and watchdog going while a
     * peer is slow (e.g. writing a checkpoint). It must not call this group's collectives. A
     * non-zero return gives the wait up (the group is over, e.g. the coordinator restarts it):
     * the call returns -ECANCELED, and so does every later one (coll_abort). */
    int (*idle)(void *arg);
    void *idle_arg;
};

/* Join group `name` ("/dflash-x-coll") as `rank` of `world`. The shm object of a generation
 * has a name of its own, `name`-<generation> (coll_object_name): a rank 0 late for its
 * generation never touches a newer one's. Rank 0 (re)creates it (it is unlinked once every
 * rank has it mapped); other ranks wait for it (up to timeout_ms) and refuse an object of
 * another generation, world size or version. Returns when every rank has
 * joined: 0, -DF_ETIMEOUT (not all joined in time), -EBUSY (rank already taken by a live
 * process), -DF_EVERSION / -DF_ELAYOUT / -DF_EMAGIC (err says why), or -errno.
 * timeout_ms also bounds every later wait of this handle (-1 = no limit). */
int coll_open(struct coll **out, const char *name, int rank, int world, int timeout_ms,
              const struct coll_opts *opts, char *err, size_t errlen);
/* The shm name of generation gen's object of group `name`: 0, or -ENAMETOOLONG. */
int coll_object_name(const char *name, uint64_t gen, char *out, size_t len);

/* In-place float32 sum over all ranks. Every rank gets the bitwise-identical result: each
 * element is summed in rank order 0..world-1 by exactly one rank, and all ranks copy it.
 * Errors: -DF_EDEAD (a peer died), -DF_ETIMEOUT (a peer stalled past the timeout), or the
 * error that aborted the group earlier. After any error the group is aborted for every
 * rank: close it and re-open with a new generation. */
int coll_allreduce_sum(struct coll *c, float *buf, size_t n);
/* Every rank's `bytes` at `mine` into all[rank * bytes], on every rank (all holds world *
 * bytes). bytes is at most 4 * chunk_floats; -E2BIG beyond. Errors as for the all-reduce. */
int coll_allgather(struct coll *c, const void *mine, size_t bytes, void *all);
/* Copy `bytes` from root's buf into every other rank's buf. */
int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root);
int coll_barrier(struct coll *c);
/* Mark the group failed with `code` (negative) so every peer's next or current wait
 * returns it instead of hanging; used when this rank must stop mid-step. */
void coll_abort(struct coll *c, int code);
/* This rank is busy outside the group for the next `ms` (0: no longer, from now) with a wait
 * bounded on its own (rank 0 writing a checkpoint): a peer waiting for it in a collective does not
 * time out meanwhile, its timeout counting from when the mark lapses. Renewed while the wait lasts;
 * a rank that dies is still seen as gone. */
void coll_busy(struct coll *c, unsigned ms);

int coll_rank(const struct coll *c);
int coll_world(const struct coll *c);

/* Leave the group and unmap (NULL is fine); rank 0 also removes the name. Peers still in
 * a collective will see this rank as gone. */
void coll_close(struct coll *c);
