/* nccl_coll.c: NCCL communicator of the drafter group in non-blocking mode, so that joining and
 * waiting are bounded by a timeout and a stalled peer ends in an abort rather than a hang. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/nccl_coll.h"

#ifdef DFLASH_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == NCCL_COLL_ID_BYTES, "ncclUniqueId size");

#define POLL_NS 20000       /* first gap between polls of a pending NCCL operation or CUDA event; */
#define POLL_MAX_NS 500000  /* it doubles up to this during one wait (a step's result is read a
                               step late, so waking 0.5 ms late costs the GPU nothing) */
#define IDLE_NS 50000000ull /* between calls of the idle hook while waiting */

struct nccl_coll {
    ncclComm_t comm;        /* NULL once aborted */
    int rank, world, device;
    int timeout_ms;
    int abort_code;         /* 0 while healthy */
    int (*idle)(void *);
    void *idle_arg;
    uint64_t next_idle_ns;
};

static uint64_t deadline_of(int timeout_ms)
{
    return timeout_ms < 0 ? UINT64_MAX : mono_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* One poll interval of a wait (*gap ns, then doubled up to POLL_MAX_NS); the idle hook every
 * IDLE_NS. 0, or non-zero when the hook gave the wait up (the group is aborted then). */
static int nap(struct nccl_coll *c, long *gap)
{
    struct timespec ts = { 0, *gap };
    nanosleep(&ts, NULL);
    *gap = *gap * 2 < POLL_MAX_NS ? *gap * 2 : POLL_MAX_NS;
    if (!c->idle)
        return 0;
    uint64_t now = mono_ns();
    if (!c->next_idle_ns) {
        c->next_idle_ns = now + IDLE_NS;
    } else if (now >= c->next_idle_ns) {
        if (c->idle(c->idle_arg)) {
            nccl_coll_abort(c, -ECANCELED);
            return 1;
        }
        c->next_idle_ns = mono_ns() + IDLE_NS;
    }
    return 0;
}

int nccl_coll_available(void) { return 1; }

int nccl_coll_make_id(uint8_t id[NCCL_COLL_ID_BYTES], char *err, size_t errlen)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return df_fail(err, errlen, -DF_ECUDA, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

void nccl_coll_abort(struct nccl_coll *c, int code)
{
    if (!c)
        return;
    if (!c->abort_code)
        c->abort_code = code < 0 ? code : -DF_ECUDA;
    if (c->comm) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
}

/* Until the communicator's pending operation (init, enqueue, finalize) is no longer in progress:
 * 0, or an error with the communicator aborted. */
static int settle(struct nccl_coll *c, uint64_t deadline, const char *what, char *err, size_t errlen)
{
    long gap = POLL_NS;
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess)
            st = r;
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress) {
            /* A remote error is a peer's failure or exit (during the join, say): the group is
             * broken, not this GPU; the caller waits for the coordinator's next generation. */
            int code = df_fail(err, errlen, st == ncclRemoteError ? -DF_EPEER : -DF_ECUDA, "nccl rank %d/%d: %s: %s (%s)",
                               c->rank, c->world, what, ncclGetErrorString(st), ncclGetLastError(c->comm));
            nccl_coll_abort(c, code);
            return code;
        }
        if (mono_ns() >= deadline) {
            int code = df_fail(err, errlen, -DF_ETIMEOUT, "nccl rank %d/%d: %s: not done after %d ms", c->rank,
                            c->world, what, c->timeout_ms);
            nccl_coll_abort(c, code);
            return code;
        }
        if (nap(c, &gap))
            return df_fail(err, errlen, c->abort_code, "nccl rank %d/%d: %s: given up", c->rank, c->world, what);
    }
}

int nccl_coll_open(struct nccl_coll **out, const uint8_t id[NCCL_COLL_ID_BYTES], int rank, int world,
                   int device, int timeout_ms, int (*idle)(void *), void *idle_arg, char *err, size_t errlen)
{
    *out = NULL;
    if (!id || world < 1 || rank < 0 || rank >= world || device < 0)
        return df_fail(err, errlen, -EINVAL, "nccl_coll_open: rank %d of world %d on device %d", rank, world, device);
    /* NVLink multicast can take the host's GPUs out of service: off unless asked for */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return df_fail(err, errlen, -DF_ECUDA, "nccl_coll_open: cudaSetDevice(%d): %s", device, cudaGetErrorString(ce));
    struct nccl_coll *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->rank = rank;
    c->world = world;
    c->device = device;
    c->timeout_ms = timeout_ms;
    c->idle = idle;
    c->idle_arg = idle_arg;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        int code = df_fail(err, errlen, -DF_ECUDA, "ncclCommInitRankConfig rank %d/%d device %d: %s", rank, world,
                        device, ncclGetErrorString(r));
        if (c->comm)
            ncclCommAbort(c->comm);
        free(c);
        return code;
    }
    int rc = settle(c, deadline_of(timeout_ms), "joining the group", err, errlen);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* After a group call: NCCL may still be enqueuing; nothing else may touch the stream or the
 * communicator before it is done. */
static int after_call(struct nccl_coll *c, ncclResult_t r, const char *what)
{
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_coll_abort(c, -DF_ECUDA);
        return -DF_ECUDA;
    }
    return settle(c, deadline_of(c->timeout_ms), what, NULL, 0);
}

int nccl_coll_allreduce_sum(struct nccl_coll *c, float *f32, size_t n, double *f64, size_t n64, void *stream)
{
    if (c->abort_code)
        return c->abort_code;
    if ((n && !f32) || (n64 && !f64))
        return -EINVAL;
    if (!n && !n64)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess && n)
        r = ncclAllReduce(f32, f32, n, ncclFloat32, ncclSum, c->comm, s);
    if (r == ncclSuccess && n64)
        r = ncclAllReduce(f64, f64, n64, ncclFloat64, ncclSum, c->comm, s);
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress)
        r = e;
    return after_call(c, r, "all-reduce");
}

int nccl_coll_broadcast(struct nccl_coll *c, void *buf, size_t bytes, int root, void *stream)
{
    if (c->abort_code)
        return c->abort_code;
    if ((bytes && !buf) || root < 0 || root >= c->world)
        return -EINVAL;
    if (!bytes)
        return 0;
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->comm, (cudaStream_t)stream);
    return after_call(c, r, "broadcast");
}

int nccl_coll_wait(struct nccl_coll *c, void *event)
{
    if (c->abort_code)
        return c->abort_code;
    uint64_t deadline = deadline_of(c->timeout_ms);
    long gap = POLL_NS;
    for (;;) {
        cudaError_t ce = cudaEventQuery((cudaEvent_t)event);
        if (ce == cudaSuccess)
            return 0;
        if (ce != cudaErrorNotReady) {
            nccl_coll_abort(c, -DF_ECUDA);
            return -DF_ECUDA;
        }
        ncclResult_t st;
        if (ncclCommGetAsyncError(c->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            nccl_coll_abort(c, -DF_EPEER);
            return -DF_EPEER;
        }
        if (mono_ns() >= deadline) {
            nccl_coll_abort(c, -DF_ETIMEOUT);
            return -DF_ETIMEOUT;
        }
        if (nap(c, &gap))
            return c->abort_code;
    }
}

int nccl_coll_rank(const struct nccl_coll *c) { return c->rank; }
int nccl_coll_world(const struct nccl_coll *c) { return c->world; }

void nccl_coll_close(struct nccl_coll *c)
{
    if (!c)
        return;
    if (c->comm && !c->abort_code) {
        cudaSetDevice(c->device);
        ncclResult_t r = ncclCommFinalize(c->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            settle(c, deadline_of(c->timeout_ms), "finalize", NULL, 0) == 0) {
            ncclCommDestroy(c->comm);
            c->comm = NULL;
        }
    }
    nccl_coll_abort(c, -DF_ESTATE);
    free(c);
}

#else /* !DFLASH_HAVE_NCCL */

struct nccl_coll {
    int rank, world;
};

int nccl_coll_available(void) { return 0; }

int nccl_coll_make_id(uint8_t id[NCCL_COLL_ID_BYTES], char *err, size_t errlen)
{
    (void)id;
    return df_fail(err, errlen, -DF_EUNSUPPORTED, "nccl_coll: built without NCCL");
}

int nccl_coll_open(struct nccl_coll **out, const uint8_t id[NCCL_COLL_ID_BYTES], int rank, int world,
                   int device, int timeout_ms, int (*idle)(void *), void *idle_arg, char *err, size_t errlen)
{
    (void)id; (void)rank; (void)world; (void)device; (void)timeout_ms; (void)idle; (void)idle_arg;
    *out = NULL;
    return df_fail(err, errlen, -DF_EUNSUPPORTED, "nccl_coll: built without NCCL");
}

int nccl_coll_allreduce_sum(struct nccl_coll *c, float *f32, size_t n, double *f64, size_t n64, void *stream)
{
    (void)c; (void)f32; (void)n; (void)f64; (void)n64; (void)stream;
    return -DF_EUNSUPPORTED;
}

int nccl_coll_broadcast(struct nccl_coll *c, void *buf, size_t bytes, int root, void *stream)
{
    (void)c; (void)buf; (void)bytes; (void)root; (void)stream;
    return -DF_EUNSUPPORTED;
}

int nccl_coll_wait(struct nccl_coll *c, void *event)
{
    (void)c; (void)event;
    return -DF_EUNSUPPORTED;
}

void nccl_coll_abort(struct nccl_coll *c, int code) { (void)c; (void)code; }
int nccl_coll_rank(const struct nccl_coll *c) { return c ? c->rank : -1; }
int nccl_coll_world(const struct nccl_coll *c) { return c ? c->world : 0; }
void nccl_coll_close(struct nccl_coll *c) { (void)c; }

#endif
