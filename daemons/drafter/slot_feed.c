/* slot_feed.c: the CUDA drafter's input side: READY ring slots copied (H2D on a copy stream) into
 * one of two device buffers while the current step runs; a slot is released once its copy is done. */
#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/err.h"
#include "daemons/drafter/slot_feed.h"

struct feed_entry {
    struct feed_batch fb;
    int lost;                   /* its slot was reclaimed before the copy was known complete */
};

struct feed {
    struct ring *ring;
    int device, pinned;
    cudaStream_t copy;
    void *dev[FEED_DEPTH];
    cudaEvent_t copied[FEED_DEPTH];     /* per buffer: its last H2D has completed */
    cudaEvent_t started[FEED_DEPTH];    /* ... and has begun (after the waits ordering it) */
    double copy_ms;                     /* the last copy known complete: its time on the copy stream */
    uint32_t *tokens[FEED_DEPTH];       /* per buffer: host copies of the slot's small arrays */
    uint8_t *mask[FEED_DEPTH];
    int32_t *cu[FEED_DEPTH];
    struct feed_entry q[FEED_DEPTH];    /* staged, oldest first from head */
    int head, n;
    int next_buf;
};

static int fail(char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "slot feed: %s: %s", what, cudaGetErrorString(cudaGetLastError()));
    return -DF_ECUDA;
}

int feed_create(struct feed **out, struct ring *ring, int device, int *pinned, char *err, size_t errlen)
{
    *out = NULL;
    *pinned = 0;
    struct feed *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->ring = ring;
    f->device = device;
    const struct ring_layout *l = ring_layout(ring);
    int r = 0;
    if (cudaSetDevice(device) != cudaSuccess) {
        r = fail(err, errlen, "cudaSetDevice");
        goto fail;
    }
    /* Pinned: the H2D out of the slot runs asynchronously at PCIe speed. */
    if (cudaHostRegister(ring_base(ring), ring_map_size(ring), cudaHostRegisterPortable) == cudaSuccess)
        f->pinned = *pinned = 1;
    else
        (void)cudaGetLastError();   /* pageable copies still work, slower and synchronous */
    if (cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking) != cudaSuccess) {
        f->copy = NULL;
        r = fail(err, errlen, "copy stream");
        goto fail;
    }
    for (int i = 0; i < FEED_DEPTH; i++) {
        if (cudaMalloc(&f->dev[i], ring_hidden_bytes(ring)) != cudaSuccess) {
            f->dev[i] = NULL;
            r = fail(err, errlen, "device buffer for one slot's hidden states");
            goto fail;
        }
        if (cudaEventCreate(&f->copied[i]) != cudaSuccess) {
            f->copied[i] = NULL;
            r = fail(err, errlen, "event");
            goto fail;
        }
        if (cudaEventCreate(&f->started[i]) != cudaSuccess) {
            f->started[i] = NULL;
            r = fail(err, errlen, "event");
            goto fail;
        }
        f->tokens[i] = malloc((size_t)l->max_tokens * sizeof *f->tokens[i]);
        f->mask[i] = malloc(l->max_tokens);
        f->cu[i] = malloc(((size_t)l->max_seqs + 1) * sizeof *f->cu[i]);
        if (!f->tokens[i] || !f->mask[i] || !f->cu[i]) {
            r = -ENOMEM;
            snprintf(err, errlen, "slot feed: out of memory");
            goto fail;
        }
    }
    *out = f;
    return 0;
fail:
    feed_free(f);
    *pinned = 0;
    return r;
}

void feed_free(struct feed *f)
{
    if (!f)
        return;
    cudaSetDevice(f->device);
    feed_drop_all(f, NULL, NULL);
    for (int i = 0; i < FEED_DEPTH; i++) {
        if (f->dev[i])
            cudaFree(f->dev[i]);
        if (f->copied[i])
            cudaEventDestroy(f->copied[i]);
        if (f->started[i])
            cudaEventDestroy(f->started[i]);
        free(f->tokens[i]);
        free(f->mask[i]);
        free(f->cu[i]);
    }
    if (f->copy)
        cudaStreamDestroy(f->copy);
    if (f->pinned)
        cudaHostUnregister(ring_base(f->ring));
    free(f);
}

int feed_count(const struct feed *f)
{
    return f->n;
}

double feed_last_copy_ms(const struct feed *f)
{
    return f->copy_ms;
}

static struct feed_entry *at(struct feed *f, int i)
{
    return &f->q[(f->head + i) % FEED_DEPTH];
}

int feed_stage(struct feed *f, unsigned slot)
{
    if (f->n >= FEED_DEPTH)
        return -DF_ESTATE;
    const struct ring_layout *l = ring_layout(f->ring);
    /* shared memory another process wrote: each field read once, then checked */
    const volatile struct ring_payload *p = ring_slot_header(f->ring, slot);
    uint32_t n_tokens = p->n_tokens, n_seqs = p->n_seqs;
    if (n_tokens < 1 || n_tokens > l->max_tokens || n_seqs < 1 || n_seqs > l->max_seqs) {
        ring_release(f->ring, slot);
        return -DF_ERANGE;
    }
    /* The buffer no staged batch uses (alternating when both are free). */
    int buf = f->next_buf;
    for (int i = 0; i < f->n; i++)
        if (at(f, i)->fb.buf == buf)
            buf ^= 1;
    f->next_buf = buf ^ 1;
    memcpy(f->tokens[buf], ring_slot_tokens(f->ring, slot), (size_t)n_tokens * sizeof *f->tokens[buf]);
    memcpy(f->mask[buf], ring_slot_loss_mask(f->ring, slot), n_tokens);
    memcpy(f->cu[buf], ring_slot_cu_seqlens(f->ring, slot), ((size_t)n_seqs + 1) * sizeof *f->cu[buf]);
    size_t pitch = ring_hidden_pitch(f->ring);
    if (cudaSetDevice(f->device) != cudaSuccess || cudaEventRecord(f->started[buf], f->copy) != cudaSuccess ||
        cudaMemcpyAsync(f->dev[buf], ring_slot_hidden(f->ring, slot), (size_t)n_tokens * pitch,
                        cudaMemcpyHostToDevice, f->copy) != cudaSuccess ||
        cudaEventRecord(f->copied[buf], f->copy) != cudaSuccess) {
        cudaStreamSynchronize(f->copy);
        ring_requeue(f->ring, slot);
        return -DF_ECUDA;
    }
    struct feed_entry *e = at(f, f->n);
    *e = (struct feed_entry){ .fb = { .b = { .tokens = f->tokens[buf], .loss_mask = f->mask[buf],
                                             .cu_seqlens = f->cu[buf], .n_seqs = (int)n_seqs,
                                             .n_tokens = (int)n_tokens, .hidden_bf16 = f->dev[buf],
                                             .hidden_pitch = pitch / 2 },
                                      .batch_id = p->batch_id, .lease = p->lease, .epoch = p->epoch, .slot = slot,
                                      .held = 1, .buf = buf } };
    f->n++;
    return 0;
}

/* The staged entry's copy is done (wait: block until it is): release its slot. 0, 1 lost, <0. */
static int release(struct feed *f, struct feed_entry *e, int wait)
{
    if (!e->fb.held || e->lost)
        return 0;
    cudaError_t st = wait ? cudaEventSynchronize(f->copied[e->fb.buf]) : cudaEventQuery(f->copied[e->fb.buf]);
    if (st == cudaErrorNotReady)
        return 0;
    if (st != cudaSuccess)
        return -DF_ECUDA;
    float ms;   /* both events are complete: no wait */
    if (cudaEventElapsedTime(&ms, f->started[e->fb.buf], f->copied[e->fb.buf]) == cudaSuccess)
        f->copy_ms = ms;
    else
        (void)cudaGetLastError();
    e->fb.held = 0;
    if (ring_release(f->ring, e->fb.slot) == -DF_ESTATE) {
        /* Reclaimed while we copied it (we were taken for dead): another writer may have
         * overwritten it, so what we have is not that batch. It is delivered again. */
        e->lost = 1;
        return 1;
    }
    return 0;
}

int feed_release_done(struct feed *f, int wait)
{
    int lost = 0;
    for (int i = 0; i < f->n; i++) {
        int r = release(f, at(f, i), wait);
        if (r < 0)
            return r;
        lost += r;
    }
    return lost;
}

static void pop(struct feed *f)
{
    f->head = (f->head + 1) % FEED_DEPTH;
    f->n--;
}

struct feed_batch *feed_front(struct feed *f, int *lost, int *rc)
{
    *lost = 0;
    *rc = 0;
    while (f->n > 0) {
        struct feed_entry *e = at(f, 0);
        int r = release(f, e, 1);
        if (r < 0) {
            *rc = r;
            return NULL;
        }
        if (!e->lost)
            return &e->fb;
        *lost += r;     /* found lost here; one feed_release_done found is counted (and logged) there */
        pop(f);
    }
    return NULL;
}

int feed_consumed(struct feed *f, void *input_event)
{
    if (f->n > 0)
        pop(f);
    if (!input_event)   /* the buffer was not read (batch rejected): nothing to wait for */
        return 0;
    return cudaStreamWaitEvent(f->copy, (cudaEvent_t)input_event, 0) == cudaSuccess ? 0 : -DF_ECUDA;
}

void feed_drop_all(struct feed *f, void (*released)(uint64_t batch_id, uint32_t lease, void *arg), void *arg)
{
    if (f->copy)
        cudaStreamSynchronize(f->copy);
    for (int i = 0; i < f->n; i++) {
        struct feed_entry *e = at(f, i);
        if (e->fb.held && !e->lost)
            ring_requeue(f->ring, e->fb.slot);
        else if (!e->fb.held && !e->lost && released)
            released(e->fb.batch_id, e->fb.lease, arg);
    }
    f->n = 0;
    f->head = 0;
}
#endif
