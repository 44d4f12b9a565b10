/* nccl_coll.h: the drafter group's data-parallel collective over NCCL: in-place sums of device
 * buffers enqueued on a CUDA stream, behind the same shape of calls as ipc/collective.h. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define NCCL_COLL_ID_BYTES 128      /* sizeof(ncclUniqueId) */

struct nccl_coll;

/* Whether this build has NCCL; without it every call below returns -DF_EUNSUPPORTED. */
int nccl_coll_available(void);

/* A fresh group id (ncclGetUniqueId). The calling process hosts the rendezvous, so it must stay
 * alive until every rank has joined: e.g. rank 0 makes it and hands it to the other ranks (over
 * the shm collective of the same generation, or a pipe). */
int nccl_coll_make_id(uint8_t id[NCCL_COLL_ID_BYTES], char *err, size_t errlen);

/* Join the group of `id` as `rank` of `world` on CUDA device `device` (made current). Returns
 * when every rank has joined: 0, -DF_ETIMEOUT (not all joined within timeout_ms; the attempt is
 * aborted), -DF_EPEER (NCCL reported a remote error: a peer failed or left), -DF_ECUDA (NCCL or
 * CUDA failed here; err says which call and why), -EINVAL.
 * timeout_ms also bounds every later nccl_coll_wait (-1 = no limit). idle(idle_arg) (may be NULL)
 * is called about every 50 ms while this rank waits, in the join and in nccl_coll_wait, so a
 * daemon keeps its heartbeat and watchdog going while a peer is slow; it must not call this
 * group. A non-zero return gives the wait up: the group is aborted with -ECANCELED.
 * NCCL_NVLS_ENABLE=0 is put in the environment unless it is already set (NVLink multicast
 * stays off). */
int nccl_coll_open(struct nccl_coll **out, const uint8_t id[NCCL_COLL_ID_BYTES], int rank, int world,
                   int device, int timeout_ms, int (*idle)(void *), void *idle_arg, char *err, size_t errlen);

/* Enqueue on `stream` (a cudaStream_t of the group's device) the in-place sums over all ranks of
 * f32 (n floats) and f64 (n64 doubles; may be NULL with n64 = 0), as one NCCL group: gradients and
 * metric sums in one call. Returns once enqueued; the host does not wait for the GPU. Every rank
 * gets the same bits. After any error the group is aborted: close it and join a new one. */
int nccl_coll_allreduce_sum(struct nccl_coll *c, float *f32, size_t n, double *f64, size_t n64, void *stream);
/* Enqueue a copy of `bytes` from root's device buf into every other rank's buf. */
int nccl_coll_broadcast(struct nccl_coll *c, void *buf, size_t bytes, int root, void *stream);

/* Wait on the host for `event` (a cudaEvent_t recorded after collectives of this group), at most
 * the open timeout, watching NCCL's asynchronous errors: 0, or with the group aborted (a stalled
 * or dead peer can no longer hang the caller) -DF_ETIMEOUT, -DF_EPEER (NCCL reported an error of
 * the communicator: the group failed) or -DF_ECUDA (this GPU failed: the event cannot be read). */
int nccl_coll_wait(struct nccl_coll *c, void *event);

/* Abort the communicator (kernels of this group stop); later calls return `code` (negative). */
void nccl_coll_abort(struct nccl_coll *c, int code);

int nccl_coll_rank(const struct nccl_coll *c);
int nccl_coll_world(const struct nccl_coll *c);

/* Leave the group (NULL is fine): finalize + destroy when healthy, else abort. Waits for this
 * rank's enqueued collectives, bounded by the timeout. */
void nccl_coll_close(struct nccl_coll *c);
