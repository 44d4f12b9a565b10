/* target_main.c: target-d: leases batches from the coordinator, runs the frozen target's
 * forward with capture straight into a ring slot, publishes it; one per device index. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/daemon.h"
#include "common/dataset.h"
#include "common/err.h"
#include "daemons/coordinator/sched.h"
#include "common/log.h"
#include "common/rate.h"
#include "common/timeutil.h"
#include "ipc/client.h"
#include "ipc/peer.h"
#include "ipc/proto.h"
#include "ipc/ring.h"
#include "model/cpu_ops.h"
#include "model/hfconfig.h"
#include "model/target.h"
#ifdef DFLASH_HAVE_TARGET_CUDA
#include "model/target_cuda.h"
#endif

#define QUEUE_MAX 128   /* > target.prefetch max (64) + regrants */

struct tgt {
    struct daemon d;
    const struct dflash_cfg *cfg;
    struct hf_config hf;
    uint64_t model_fp;              /* target_fingerprint of the loaded model */
    char model_config[HF_CONFIG_TEXT_MAX];  /* its config.json's forward settings */
    int ids[TARGET_MAX_CAPTURE];
    int n_ids;
    enum target_backend backend;

    struct target *model;
    struct client *cl;
    int reported;                   /* an error naming why this daemon fails went out already */
    struct peer_ring_watch ring_watch;  /* a reconnect naming another ring object ends the client */
    struct ring *ring;
    struct dataset ds;
    char sock[108];
    int ring_pinned;                /* CUDA: the ring mapping is registered for DMA */
#ifdef DFLASH_HAVE_TARGET_CUDA
    /* CUDA: the double-buffered pipeline; a batch is published from its completion callback. */
    struct target_pipe *pipe;
    struct inflight {
        struct tgt *t;
        int used;
        unsigned slot;
        uint64_t batch_id;
        uint32_t lease;                     /* the lease number it was packed under */
        uint32_t n_tokens;
        uint64_t t_claimed, t_submitted;   /* mono_ns */
        double wait_ms;
    } inflight[TARGET_PIPE_DEPTH + 1];
    int pipe_error;                 /* a batch failed on the GPU: leave, systemd restarts */
#endif

    int state;                      /* cluster state as last pushed (enum proto_cluster_state) */
    int draining;                   /* DRAIN received or stop signal: finish, return, leave */
    int stop_now;                   /* STOP received: leave at once */
    uint64_t queue[QUEUE_MAX];      /* granted leases in grant order */
    int qlen;

    /* statistics for heartbeats */
    uint64_t batches, tokens;
    double forward_ms, wait_ms, write_ms, tokens_per_s;   /* tokens_per_s: over the last ~10 s */
    struct rate_window rate;
    uint64_t claim_since_ns;        /* waiting for a free slot since then (0: not waiting) */
    uint64_t start_ms;
};

/* ---- configuration ------------------------------------------------------------------- */

/* Capture ids: model.capture_layers, else the DFlash default for model.draft_layers. */
static int capture_ids(const struct daemon *d, const struct hf_config *hf, int *ids, char *err, size_t errlen)
{
    const char *key;
    char why[600];
    int n = target_capture_ids(&d->cfg.model, hf->num_layers, ids, &key, why, sizeof why);
    return n < 0 ? daemon_key_error(d, "model", key, err, errlen, "%s", why) : n;
}

/* Everything that can be checked before touching the cluster; errors are config errors. */
static int check_config(struct tgt *t, char *err, size_t errlen)
{
    const struct dflash_cfg *cfg = t->cfg;
    struct daemon *d = &t->d;
    t->backend = TARGET_BACKEND_CPU;     /* (the loader took only cpu or cuda) */
    if (!strcmp(cfg->target.backend, "cuda")) {
#ifdef DFLASH_HAVE_TARGET_CUDA
        t->backend = TARGET_BACKEND_CUDA;
#else
        return daemon_key_error(d, "target", "backend", err, errlen, "cuda: this build has no CUDA target backend");
#endif
    }
    if (!cfg->model.path[0])
        return daemon_key_error(d, "model", "path", err, errlen, "empty: the target model dir is required");
    struct stat st;
    if (stat(cfg->model.path, &st) < 0)
        return daemon_key_error(d, "model", "path", err, errlen, "%s: %s", cfg->model.path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return daemon_key_error(d, "model", "path", err, errlen, "%s: not a directory", cfg->model.path);
    char why[512];
    int r = hf_config_load(cfg->model.path, &t->hf, why, sizeof why);
    if (r < 0) {
        daemon_key_error(d, "model", "path", err, errlen, "%s", why);
        return r;       /* (the exit code: a read that may pass, or the operator's) */
    }
    if (hf_config_forward_text(&t->hf, t->model_config, sizeof t->model_config) < 0)
        return daemon_key_error(d, "model", "path", err, errlen, "%s/config.json: its settings do not fit in %d bytes "
                                "(an architecture name that long?)", cfg->model.path, HF_CONFIG_TEXT_MAX);
    int n = capture_ids(d, &t->hf, t->ids, err, errlen);
    if (n < 0)
        return n;
    t->n_ids = n;
    daemon_print_capture_ids(d, t->ids, n, t->hf.num_layers);
    daemon_print_from_coordinator("data.path, data.max_seq_len, coordinator.heartbeat_ms");
    if (daemon_socket_path(d, t->sock, sizeof t->sock) < 0)
        return daemon_key_error(d, "cluster", cfg->cluster.socket[0] ? "socket" : "runtime_dir", err, errlen,
                                "the control socket path is longer than a unix socket address allows");
    return 0;
}

/* ---- cluster ------------------------------------------------------------------------- */

/* The ring must carry exactly what this model captures (a mismatch there is the cluster's: the
 * coordinator's model or capture_layers differ from the targets'), in slots this target's buffers
 * hold (*this_only: its own ring.max_tokens is short, the others may run). */
static int check_ring_layout(struct tgt *t, bool *this_only, char *err, size_t errlen)
{
    const struct ring_layout *l = ring_layout(t->ring);
    if (l->hidden != (uint32_t)t->hf.hidden_size || l->n_layers != (uint32_t)t->n_ids || l->dtype != RING_DTYPE_BF16) {
        snprintf(err, errlen, "ring %s holds hidden %u x %u layers, this target captures hidden %d x %d layers (%s)",
                 ring_name(t->ring), l->hidden, l->n_layers, t->hf.hidden_size, t->n_ids, t->cfg->model.path);
        return -DF_ELAYOUT;
    }
    if (l->max_tokens > (uint32_t)t->cfg->ring.max_tokens) {
        /* its forward buffers are sized by its own ring.max_tokens: a full slot would not fit */
        snprintf(err, errlen, "ring %s carries %u tokens a slot, this target's ring.max_tokens is %lld: the "
                 "coordinator's and the targets' configs must agree", ring_name(t->ring), l->max_tokens,
                 (long long)t->cfg->ring.max_tokens);
        *this_only = true;
        return -DF_ELAYOUT;
    }
    for (int i = 0; i < t->n_ids; i++)
        if (l->layer_ids[i] != (uint32_t)t->ids[i]) {
            snprintf(err, errlen, "ring %s captured layer %d is %u, this target's is %d", ring_name(t->ring), i,
                     l->layer_ids[i], t->ids[i]);
            return -DF_ELAYOUT;
        }
    return 0;
}

static void queue_remove(struct tgt *t, uint64_t id)
{
    for (int i = 0; i < t->qlen; i++)
        if (t->queue[i] == id) {
            memmove(&t->queue[i], &t->queue[i + 1], (size_t)(t->qlen - i - 1) * sizeof t->queue[0]);
            t->qlen--;
            return;
        }
}

static void queue_add(struct tgt *t, uint64_t id)
{
    for (int i = 0; i < t->qlen; i++)
        if (t->queue[i] == id)
            return;
    if (t->qlen < QUEUE_MAX)
        t->queue[t->qlen++] = id;
    else
        client_lease_return(t->cl, id);
}

/* Give back every lease not started yet (drain, stop). */
static void return_leases(struct tgt *t)
{
    for (int i = 0; i < t->qlen; i++)
        client_lease_return(t->cl, t->queue[i]);
    if (t->qlen)
        log_info("returned %d unstarted lease%s", t->qlen, t->qlen == 1 ? "" : "s");
    t->qlen = 0;
}

static void set_heartbeat(struct tgt *t)
{
    uint64_t now = mono_ns();
    t->tokens_per_s = rate_window_note(&t->rate, now / 1000000, (double)t->tokens);
    /* a wait for a free slot still going on counts as it grows (a full ring shows) */
    double wait_ms = t->claim_since_ns ? (double)(now - t->claim_since_ns) / 1e6 : 0;
    struct proto_heartbeat hb = {
        .state = (uint32_t)t->state,
        .leases_held = client_leases_held(t->cl),
        .batches_done = t->batches,
        .forward_ms = t->forward_ms,
        .wait_ms = wait_ms > t->wait_ms ? wait_ms : t->wait_ms,
        .write_ms = t->write_ms,
        .tokens_per_s = t->tokens_per_s,
    };
    client_set_heartbeat(t->cl, &hb);
}

static void handle_msg(struct tgt *t, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_LEASE_GRANT:
        if (t->draining)
            client_lease_return(t->cl, m->grant.batch_id);
        else
            queue_add(t, m->grant.batch_id);
        break;
    case PROTO_LEASE_REVOKE:
        queue_remove(t, m->batch.batch_id);
        log_info("lease of batch " SCHED_BID " revoked", SCHED_BARGS(m->batch.batch_id));
        break;
    case PROTO_WELCOME:
        /* Reconnected (coordinator restart): leases not re-granted were revoked already. */
        t->state = (int)m->welcome.cluster_state;
        log_notice("reconnected to the coordinator (member %" PRIu64 ", cluster %s)", m->welcome.member_id,
                   proto_state_name(m->welcome.cluster_state));
        break;
    case PROTO_CONTROL:
        log_notice("%s%s%s", proto_control_name(m->control.cmd), m->control.reason[0] ? ": " : "", m->control.reason);
        switch (m->control.cmd) {
        case PROTO_CTL_PAUSE:
            t->state = PROTO_STATE_PAUSED;
            daemon_notify_status(&t->d, "paused: %s", m->control.reason);
            break;
        case PROTO_CTL_RESUME:
            t->state = PROTO_STATE_RUNNING;
            daemon_notify_status(&t->d, "running");
            break;
        case PROTO_CTL_DRAIN:
            t->state = PROTO_STATE_DRAINING;
            t->draining = 1;
            break;
        case PROTO_CTL_STOP:
            t->state = PROTO_STATE_STOPPED;
            t->stop_now = 1;
            break;
        }
        break;
    default:
        break;
    }
}

/* Between the layers of a CPU forward (seconds on a large batch): the coordinator would take a
 * target silent for coordinator.dead_after_ms for dead, systemd one silent for WatchdogSec. */
static void forward_progress(void *arg)
{
    struct tgt *t = arg;
    daemon_watchdog(&t->d);
    client_heartbeat_due(t->cl);
}

/* Handle every message already there, or wait up to timeout_ms for the first one. */
static int pump(struct tgt *t, int timeout_ms)
{
    char err[512];
    struct proto_msg m;
    int r;
    daemon_watchdog(&t->d);
    set_heartbeat(t);
    while ((r = client_poll(t->cl, timeout_ms, &m, err, sizeof err)) > 0) {
        handle_msg(t, &m);
        timeout_ms = 0;
    }
    daemon_watchdog(&t->d);
    if (r < 0) {
        log_error(r, "coordinator: %s", err);
        return r;
    }
    if (daemon_stop_requested() && !t->draining) {
        log_notice("%s: finishing the batch in flight, returning the others", strsignal(daemon_last_signal()));
        t->draining = 1;
    }
    return 0;
}

/* Pack the lease's samples (truncated to the grant's max_seq_len) into the slot. */
static int pack(struct tgt *t, const struct client_lease *l, unsigned slot, char *err, size_t errlen)
{
    const struct ring_layout *lay = ring_layout(t->ring);
    if (l->n_samples > lay->max_seqs || l->n_tokens > lay->max_tokens) {
        snprintf(err, errlen, "batch " SCHED_BID ": %u samples / %u tokens exceed the ring slot (%u / %u): "
                 "data.token_budget must not exceed ring.max_tokens", SCHED_BARGS(l->batch_id), l->n_samples,
                 l->n_tokens,
                 lay->max_seqs, lay->max_tokens);
        return -DF_ERANGE;
    }
    int32_t *cu = ring_slot_cu_seqlens(t->ring, slot);
    uint32_t *tok = ring_slot_tokens(t->ring, slot);
    uint8_t *mask = ring_slot_loss_mask(t->ring, slot);
    uint32_t n = 0;
    cu[0] = 0;
    for (uint32_t i = 0; i < l->n_samples; i++) {
        uint64_t s = l->samples[i];
        if (s >= t->ds.n_samples) {
            snprintf(err, errlen, "batch " SCHED_BID ": sample %" PRIu64 " is beyond the dataset (%" PRIu64 " samples)",
                     SCHED_BARGS(l->batch_id), s, t->ds.n_samples);
            return -DF_ERANGE;
        }
        if (!dataset_sample_in_bounds(&t->ds, s)) {
            snprintf(err, errlen, "batch " SCHED_BID ": %s changed while in use (sample %" PRIu64 " points outside its "
                     "tokens): replace a dataset by renaming a new file over it, never in place",
                     SCHED_BARGS(l->batch_id),
                     t->ds.path, s);
            return -DF_EFORMAT;
        }
        uint32_t len = dataset_sample_len(&t->ds, s);
        if (l->max_seq_len && len > l->max_seq_len)
            len = l->max_seq_len;
        if (len > l->n_tokens - n) {        /* n <= n_tokens <= max_tokens: no wrap */
            n = UINT32_MAX;                 /* more than the grant: told below */
            break;
        }
        memcpy(tok + n, dataset_sample_tokens(&t->ds, s), (size_t)len * 4);
        memcpy(mask + n, dataset_sample_mask(&t->ds, s), len);
        n += len;
        cu[i + 1] = (int32_t)n;
    }
    if (n != l->n_tokens) {
        snprintf(err, errlen, "batch " SCHED_BID ": %s holds %s tokens for its samples than the coordinator's "
                 "grant (%u): "
                 "this target's dataset is not the coordinator's (data.path)", SCHED_BARGS(l->batch_id), t->ds.path,
                 n > l->n_tokens ? "more" : "fewer", l->n_tokens);
        return -DF_EPEER;
    }
    struct ring_payload *p = ring_slot_header(t->ring, slot);
    p->batch_id = l->batch_id;
    p->epoch = l->epoch;
    p->lease = l->lease;
    p->n_seqs = l->n_samples;
    p->n_tokens = n;
    p->flags = 0;
    p->checksum = 0;
    p->reserved32 = 0;
    memset(p->reserved, 0, sizeof p->reserved);
    return 0;
}

/* NaN in the captured states of one batch (target.debug_nan_batch), to test detection. */
static void poison(struct tgt *t, unsigned slot, uint32_t n_tokens)
{
    uint16_t *h = ring_slot_hidden(t->ring, slot);
    size_t row = ring_hidden_pitch(t->ring) / 2;
    for (uint32_t i = 0; i < n_tokens; i += 7)
        h[(size_t)i * row + i % row] = 0x7fc0;  /* bf16 quiet NaN */
}

#ifdef DFLASH_HAVE_TARGET_CUDA
/* Run the completion callbacks of the batches whose copies have landed (never blocks). */
/* A batch on the GPU for target.gpu_timeout_ms: the GPU hangs, and nothing else would notice
 * (the loop goes on: heartbeats, the watchdog). Reported, then this process leaves at once (a
 * clean exit would wait for the GPU for ever): the coordinator takes its leases back, systemd
 * starts it again. */
static void gpu_hang_check(struct tgt *t)
{
    const struct inflight *old = NULL;
    for (size_t i = 0; i < sizeof t->inflight / sizeof t->inflight[0]; i++)
        if (t->inflight[i].used && (!old || t->inflight[i].t_submitted < old->t_submitted))
            old = &t->inflight[i];
    if (!old)
        return;
    double ms = (double)(mono_ns() - old->t_submitted) / 1e6;
    if (ms < (double)t->cfg->target.gpu_timeout_ms)
        return;
    log_error(-DF_ECUDA, "batch " SCHED_BID " on the GPU for %.0f s (target.gpu_timeout_ms %lld): the GPU hangs; "
              "exiting to be restarted", SCHED_BARGS(old->batch_id), ms / 1e3,
              (long long)t->cfg->target.gpu_timeout_ms);
    client_error(t->cl, 0, -DF_ECUDA, "batch " SCHED_BID " on the GPU for %.0f s: the GPU hangs; target-d exits to be "
                 "restarted", SCHED_BARGS(old->batch_id), ms / 1e3);
    peer_abandon(&t->d, t->cl, DAEMON_EX_FAILURE, "the GPU hangs");
}

static int poll_pipe(struct tgt *t)
{
    if (!t->pipe)
        return 0;
    gpu_hang_check(t);
    int r = target_pipe_poll(t->pipe);
    if (r < 0 && !t->pipe_error) {
        log_error(r, "the CUDA pipeline failed");
        t->pipe_error = r;
    }
    return t->pipe_error;
}

/* Waits for the batches still in the pipeline by polling, as the loop does, never in a blocking
 * event wait: a GPU that hangs now is caught by gpu_hang_check (a stop must not wait for it for
 * ever). Every batch is waited for, also after an error (a failed event completes at once; a
 * batch whose callback cannot publish aborts its slot). serve: the socket is served meanwhile
 * (heartbeats, revokes) until it fails; else only the watchdog is fed. */
static int finish_pipe(struct tgt *t, bool serve)
{
    int r = 0;
    while (t->pipe && target_pipe_pending(t->pipe) > 0) {
        poll_pipe(t);
        if (target_pipe_pending(t->pipe) == 0)
            break;
        if (serve && r == 0) {
            r = pump(t, 1);
        } else {
            daemon_watchdog(&t->d);
            usleep(1000);
        }
    }
    return r < 0 ? r : t->pipe_error;
}
#endif

static int pipe_pending(const struct tgt *t)
{
#ifdef DFLASH_HAVE_TARGET_CUDA
    if (t->pipe)
        return target_pipe_pending(t->pipe);
#endif
    return 0;
}

/* Whether a batch can go to the GPU now without the host waiting for it: while it cannot, the
 * loop keeps serving the socket (heartbeats, revokes) and publishing finished batches. */
static int pipe_ready(const struct tgt *t)
{
#ifdef DFLASH_HAVE_TARGET_CUDA
    if (t->pipe)
        return target_pipe_ready(t->pipe);
#endif
    (void)t;
    return 1;
}

/* Wait for a FREE slot for the lease, in short slices: heartbeats, the watchdog and (CUDA) the
 * publishing of finished batches go on meanwhile. 1 and *slot, 0 (lease gone, stop, drain, pause), <0. */
static int claim_slot_wait(struct tgt *t, uint64_t batch_id, unsigned *slot)
{
    int r;
    for (;;) {
        /* With batches in the pipeline, come back often to publish them as they complete. */
        int ms = pipe_pending(t) ? 1 : (int)daemon_wait_slice_ms(&t->d, 100);
        r = ring_claim_write(t->ring, ms, slot);
        if (r == 0)
            return 1;
        if (r != -DF_ETIMEOUT && r != -EINTR) {
            log_error(r, "ring_claim_write");
            return r;
        }
#ifdef DFLASH_HAVE_TARGET_CUDA
        if ((r = poll_pipe(t)) < 0)
            return r;
#endif
        if ((r = pump(t, 0)) < 0)
            return r;
        if (t->stop_now || !client_lease_held(t->cl, batch_id))
            return 0;
        if (t->state == PROTO_STATE_PAUSED)
            return 0;   /* still queued: its forward starts after RESUME */
        if (t->draining) {
            /* Not started: nothing is lost by handing it back. */
            return_leases(t);
            return 0;
        }
    }
}

static int claim_slot(struct tgt *t, uint64_t batch_id, unsigned *slot)
{
    t->claim_since_ns = mono_ns();      /* the heartbeats show the wait as it grows */
    int r = claim_slot_wait(t, batch_id, slot);
    t->claim_since_ns = 0;
    return r;
}

/* The claimed slot's lease and packed inputs. 1 packed, 0 lease gone (slot aborted), <0 fatal.
 * Packed, the batch leaves the queue: a grant of it read from now on (revoked, queued again and
 * granted anew while this forward runs) is a new lease's, for a forward of its own. */
static int pack_lease(struct tgt *t, uint64_t batch_id, unsigned slot, uint32_t *lease)
{
    char err[512];
    const struct client_lease *l = client_lease_find(t->cl, batch_id);
    if (!l) {
        ring_abort_write(t->ring, slot);
        queue_remove(t, batch_id);
        return 0;
    }
    int r = pack(t, l, slot, err, sizeof err);
    if (r < 0) {
        ring_abort_write(t->ring, slot);
        log_error(r, "%s", err);
        client_error(t->cl, 1, r, "%s", err);
        t->reported = 1;
        return r;
    }
    queue_remove(t, batch_id);
    *lease = l->lease;
    return 1;
}

/* The forward is done and the states are in the slot: deliver it unless the lease it was packed
 * under (`lease`, kept by the caller: the slot is shared memory) was revoked meanwhile, or the slot
 * reclaimed. 1 published, 0 dropped, <0 fatal. */
static int publish(struct tgt *t, uint64_t batch_id, uint32_t lease, unsigned slot, uint32_t n_tokens)
{
    if (t->cfg->target.debug_nan_batch >= 0 && batch_id == (uint64_t)t->cfg->target.debug_nan_batch) {
        log_warn(0, "debug: poisoning batch " SCHED_BID " with NaN (target.debug_nan_batch)", SCHED_BARGS(batch_id));
        poison(t, slot, n_tokens);
    }
    /* Held under the same lease number: revoked and granted again meanwhile (queued again after
     * another target's copy went untrained), this copy is an earlier lease's; the new grant's
     * forward publishes the batch. */
    const struct client_lease *l = client_lease_find(t->cl, batch_id);
    if (!l || l->lease != lease) {
        ring_abort_write(t->ring, slot);
        log_info("batch " SCHED_BID " was revoked during its forward: dropped", SCHED_BARGS(batch_id));
        return 0;
    }
    int r = ring_publish(t->ring, slot);
    if (r == -DF_ESTATE) {
        /* The coordinator reclaimed the slot (it thought this process dead): hand back. */
        log_warn(r, "slot %u of batch " SCHED_BID " was reclaimed before publish", slot, SCHED_BARGS(batch_id));
        client_lease_return(t->cl, batch_id);
        return 0;
    }
    if (r < 0) {
        ring_abort_write(t->ring, slot);
        log_error(r, "ring_publish of batch " SCHED_BID, SCHED_BARGS(batch_id));
        return r;
    }
    client_published(t->cl, batch_id, slot, n_tokens);
    return 1;
}

/* One lease on the CPU backend: slot, pack, forward into the slot, publish. 0 done (or
 * dropped), <0 fatal. */
static int run_batch(struct tgt *t, uint64_t batch_id)
{
    uint64_t t0 = mono_ns();
    unsigned slot;
    int r = claim_slot(t, batch_id, &slot);
    if (r <= 0)
        return r;
    uint64_t t1 = mono_ns();
    uint32_t lease;
    if ((r = pack_lease(t, batch_id, slot, &lease)) <= 0)
        return r;
    struct ring_payload *p = ring_slot_header(t->ring, slot);
    uint64_t t2 = mono_ns();
    r = target_forward(t->model, ring_slot_tokens(t->ring, slot), ring_slot_cu_seqlens(t->ring, slot), (int)p->n_seqs,
                       (int)p->n_tokens, ring_slot_hidden(t->ring, slot), OUT_BF16, ring_hidden_pitch(t->ring));
    uint64_t t3 = mono_ns();
    if (r < 0) {
        ring_abort_write(t->ring, slot);
        log_error(r, "target_forward of batch " SCHED_BID, SCHED_BARGS(batch_id));
        client_error(t->cl, 0, r, "target_forward of batch " SCHED_BID ": %s", SCHED_BARGS(batch_id), err_str(r));
        t->reported = 1;
        return r;
    }
    uint32_t n_tokens = p->n_tokens;
    /* A revoke that came during the forward (seconds on the CPU) must be read before publishing:
     * the coordinator may have had the batch trained meanwhile. */
    if ((r = pump(t, 0)) < 0) {
        ring_abort_write(t->ring, slot);
        return r;
    }
    if ((r = publish(t, batch_id, lease, slot, n_tokens)) <= 0)
        return r;
    uint64_t t4 = mono_ns();
    t->batches++;
    t->tokens += n_tokens;
    t->wait_ms = (double)(t1 - t0) / 1e6;
    t->forward_ms = (double)(t3 - t2) / 1e6;
    t->write_ms = (double)((t2 - t1) + (t4 - t3)) / 1e6;
    log_debug("batch " SCHED_BID ": %u tokens in slot %u: wait %.1f ms, forward %.1f ms, write %.2f ms",
              SCHED_BARGS(batch_id),
              n_tokens, slot, t->wait_ms, t->forward_ms, t->write_ms);
    return 0;
}

#ifdef DFLASH_HAVE_TARGET_CUDA
/* Completion of one pipelined batch (from target_pipe_poll/_drain/_submit on this thread): its
 * capture copies have landed in the slot, publish it. */
static void on_copied(void *ctx, int status)
{
    struct inflight *f = ctx;
    struct tgt *t = f->t;
    f->used = 0;
    if (status < 0) {
        ring_abort_write(t->ring, f->slot);
        log_error(status, "batch " SCHED_BID " failed on the GPU", SCHED_BARGS(f->batch_id));
        if (!t->pipe_error)
            t->pipe_error = status;
        return;
    }
    /* A revoke that came while the batch was on the GPU is read first (pump never touches the
     * pipe; a refusal by the coordinator ends the main loop through pipe_error). */
    int r = pump(t, 0);
    if (r < 0) {
        /* Refused by the coordinator, or its ring made anew: a revoke may be unread, so the
         * batch is not published (as on the CPU path); the main loop ends. */
        ring_abort_write(t->ring, f->slot);
        if (!t->pipe_error)
            t->pipe_error = r;
        return;
    }
    r = publish(t, f->batch_id, f->lease, f->slot, f->n_tokens);
    if (r < 0 && !t->pipe_error)
        t->pipe_error = r;
    if (r <= 0)
        return;
    uint64_t now = mono_ns();
    t->batches++;
    t->tokens += f->n_tokens;
    t->wait_ms = f->wait_ms;
    t->forward_ms = target_pipe_last_forward_ms(t->pipe);
    /* as on the CPU path: what putting the batch into its slot took beside the forward (packing
     * on the host, the copies on the GPU's copy stream) */
    t->write_ms = (double)(f->t_submitted - f->t_claimed) / 1e6 + target_pipe_last_copy_ms(t->pipe);
    log_debug("batch " SCHED_BID ": %u tokens in slot %u: wait %.1f ms, GPU forward %.1f ms, pack + copy %.1f ms,"
              " submit to publish %.1f ms", SCHED_BARGS(f->batch_id), f->n_tokens, f->slot, t->wait_ms, t->forward_ms,
              t->write_ms,
              (double)(now - f->t_submitted) / 1e6);
}

/* One lease on the CUDA backend: slot, pack, enqueue forward + pitched copies straight into
 * the slot; the slot is published by on_copied when the copies are done, while the next
 * batch's forward already runs. 0 enqueued (or dropped), <0 fatal. */
static int submit_batch(struct tgt *t, uint64_t batch_id)
{
    uint64_t t0 = mono_ns();
    unsigned slot;
    int r = claim_slot(t, batch_id, &slot);
    if (r <= 0)
        return r;
    uint64_t t1 = mono_ns();
    uint32_t lease;
    if ((r = pack_lease(t, batch_id, slot, &lease)) <= 0)
        return r;
    struct inflight *f = NULL;
    for (size_t i = 0; i < sizeof t->inflight / sizeof t->inflight[0] && !f; i++)
        if (!t->inflight[i].used)
            f = &t->inflight[i];
    if (!f) {   /* cannot happen: the pipeline holds at most TARGET_PIPE_DEPTH batches */
        ring_abort_write(t->ring, slot);
        return -DF_ESTATE;
    }
    const struct ring_payload *p = ring_slot_header(t->ring, slot);
    *f = (struct inflight){ .t = t, .used = 1, .slot = slot, .batch_id = batch_id, .lease = lease,
                            .n_tokens = p->n_tokens, .t_claimed = t1, .t_submitted = mono_ns(),
                            .wait_ms = (double)(t1 - t0) / 1e6 };
    if (t->cfg->target.debug_stall_batch >= 0 && batch_id == (uint64_t)t->cfg->target.debug_stall_batch) {
        log_warn(0, "debug: the GPU hangs from batch " SCHED_BID " on (target.debug_stall_batch)",
                 SCHED_BARGS(batch_id));
        target_pipe_debug_stall(t->pipe);
    }
    r = target_pipe_submit(t->pipe, ring_slot_tokens(t->ring, slot), ring_slot_cu_seqlens(t->ring, slot),
                           (int)p->n_seqs, (int)p->n_tokens, ring_slot_hidden(t->ring, slot),
                           ring_hidden_pitch(t->ring), on_copied, f);
    if (r < 0) {
        f->used = 0;
        ring_abort_write(t->ring, slot);
        log_error(r, "target_pipe_submit of batch " SCHED_BID, SCHED_BARGS(batch_id));
        client_error(t->cl, 0, r, "forward of batch " SCHED_BID ": %s", SCHED_BARGS(batch_id), err_str(r));
        t->reported = 1;
        return r;
    }
    return poll_pipe(t);
}
#endif

/* Whether a failure to open the model or the coordinator's dataset lasts: the file is not there
 * for this daemon or not readable by its user (a unit's user or mount namespace unlike the
 * coordinator's), or not a valid model or dataset. Short of memory or descriptors, or a read
 * error, may pass with a restart. */
static bool failure_lasts(int r)
{
    return !err_may_pass(r);
}

/* Maps the ring and opens the dataset the WELCOME names. Fails with -DF_ELAYOUT where this
 * daemon and the cluster do not agree (nobody's restart mends that), sets *this_only where
 * only this daemon cannot run as set up (the others can: its ring.max_tokens is short, its
 * data.path cannot be opened), else the failure is one a restart may mend. */
static int attach(struct tgt *t, bool *this_only, char *err, size_t errlen)
{
    const struct proto_welcome *w = client_welcome(t->cl);
    *this_only = false;
    int r = peer_attach_ring(t->cl, t->sock, &t->ring, err, errlen);
    if (r < 0)
        return r;
    if ((r = check_ring_layout(t, this_only, err, errlen)) < 0)
        return r;
    r = dataset_open(&t->ds, w->dataset_path, DATASET_OPEN_NO_CHECKSUM, err, errlen);
    if (r == -DF_EMAGIC || r == -DF_EVERSION || r == -DF_ETRUNC || r == -DF_EFORMAT || r == -DF_ERANGE) {
        size_t n = strlen(err);
        snprintf(err + n, errlen - n, " (data.path: replaced after the coordinator opened it: put the old file back)");
        return -DF_ELAYOUT;
    }
    if (r < 0) {
        *this_only = failure_lasts(r);
        return r;
    }
    if (t->ds.checksum != w->dataset_checksum) {
        snprintf(err, errlen, "%s: checksum %016" PRIx64 ", but the coordinator schedules a dataset of checksum %016" PRIx64
                 ": the file was replaced after the coordinator opened it: put the old file back (the run's ledger is "
                 "of it), or move the ledger away to start a new run on this one", w->dataset_path, t->ds.checksum,
                 w->dataset_checksum);
        return -DF_ELAYOUT;
    }
    peer_watch_ring(t->cl, &t->ring_watch, &t->d, t->ring, &t->ds, t->model_fp, t->model_config);
    if ((r = peer_check_model_config(w, t->cfg->model.path, t->model_config, err, errlen)) < 0) {
        *this_only = true;      /* the same weights under other settings: other hidden states */
        return r;
    }
    if (w->model_fingerprint && w->model_fingerprint != t->model_fp) {
        /* its hidden states would be another model's: this target's model.path is wrong, the
         * others may go on */
        snprintf(err, errlen, "%s (model.path): weights of fingerprint %016" PRIx64 ", the run's target has %016" PRIx64
                 " (other weights): point model.path at the run's model", t->cfg->model.path,
                 t->model_fp, w->model_fingerprint);
        *this_only = true;
        return -DF_ELAYOUT;
    }
    if (t->ds.vocab_size > (uint32_t)t->hf.vocab_size) {
        snprintf(err, errlen, "%s: vocabulary %u is larger than the target's (%d, %s)", w->dataset_path,
                 t->ds.vocab_size, t->hf.vocab_size, t->cfg->model.path);
        return -DF_ELAYOUT;
    }
    t->state = (int)w->cluster_state;
    return 0;
}

static int want_leases(struct tgt *t)
{
    struct client_stats st;
    client_get_stats(t->cl, &st);
    int64_t need = t->cfg->target.prefetch - (int64_t)st.leases_held - (int64_t)st.leases_wanted;
    if (need > 0)
        return client_lease_request(t->cl, (uint32_t)need);
    return 0;
}

int main(int argc, char **argv)
{
    static struct tgt tg;
    struct tgt *t = &tg;
    char err[1024];
    cpu_blas_pick_kernels(argv);     /* (an exec, once, before anything else is set up) */
    int r = daemon_start(&t->d, "target-d", "target", 1, argc, argv, err, sizeof err);
    if (r >= 0) {
        if (err[0])
            log_error(0, "%s", err);
        return r;
    }
    if (cpu_blas_note())
        log_notice("%s", cpu_blas_note());
    t->cfg = &t->d.cfg;
    if ((r = check_config(t, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        return err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
    }
    if (t->d.check_only)
        return DAEMON_EX_OK;

    int code = DAEMON_EX_FAILURE;
    daemon_signals_init();
    daemon_notify_init(&t->d);
    t->start_ms = mono_ms();
    if ((r = daemon_lock(&t->d, err, sizeof err)) < 0) {
        log_error(0, "%s", err);   /* (it says why) */
        if (r == -ENOTDIR)
            code = DAEMON_EX_CONFIG;    /* a file where cluster.runtime_dir should be */
        goto out;
    }
    daemon_notify_status(&t->d, "loading %s", t->cfg->model.path);
    daemon_watchdog(&t->d);     /* start time; reading the weights ticks for more as it goes (progress.h) */
    if (t->backend == TARGET_BACKEND_CPU)
        target_cpu_set_threads((int)t->cfg->target.threads);
    daemon_leave_on_stop(&t->d, "loading the model");
    r = target_open(&t->model, t->cfg->model.path, t->ids, t->n_ids, t->backend, t->d.index,
                    (int)t->cfg->ring.max_tokens, err, sizeof err);
    daemon_leave_on_stop(&t->d, NULL);
    if (r < 0) {
        log_error(r, "%s", err);
        /* A model that does not load will not load after a restart either (a read error, or no
         * memory or descriptors now, may pass). */
        code = r == -DF_ECUDA || !failure_lasts(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
        goto out;
    }
    char ids[TARGET_MAX_CAPTURE * 12] = "";
    for (int i = 0, n = 0; i < t->n_ids && n >= 0 && (size_t)n < sizeof ids; i++)
        n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", i ? ", " : "", t->ids[i]);
    t->model_fp = target_fingerprint(t->model);
    log_info("model %s: %s, %d layers, hidden %d, capturing layer%s %s (output_hidden_states[id + 1]), weights "
             "fingerprint %016" PRIx64, t->cfg->model.path, t->hf.arch_name, t->hf.num_layers, t->hf.hidden_size,
             t->n_ids == 1 ? "" : "s", ids, t->model_fp);
    daemon_notify_status(&t->d, "connecting to the coordinator at %s", t->sock);
    if ((r = peer_connect_coordinator(&t->d, t->sock, PROTO_ROLE_TARGET, &t->cl, err, sizeof err)) < 0) {
        code = peer_connect_failed(&t->d, t->sock, r, err);
        goto out;
    }
    target_set_progress(t->model, forward_progress, t);
    bool this_only;
    if ((r = attach(t, &this_only, err, sizeof err)) == -ESHUTDOWN) {
        code = peer_connect_failed(&t->d, t->sock, r, err);
        goto out;
    }
    if (r < 0 && this_only) {
        /* the coordinator keeps why (a non-fatal error); no restart */
        log_error(r, "%s", err);
        peer_report_exit(&t->d, t->cl, r, &t->reported);
        code = DAEMON_EX_CONFIG;
        goto out;
    }
    if (r < 0) {
        /* A mismatch with the cluster (layout, dataset) ends it; anything else (the ring's object
         * gone: the coordinator makes it anew) is this daemon's, restarted by systemd. */
        bool config = r == -DF_ELAYOUT;
        log_error(r, "%s", err);
        client_error(t->cl, config, r, "%s: %s", t->d.ident, err);
        t->reported = 1;
        peer_flush_events(&t->d, t->cl, 2000);
        code = config ? DAEMON_EX_CONFIG : DAEMON_EX_FAILURE;
        goto out;
    }
    daemon_watchdog(&t->d);     /* start time for what follows (pinning a large ring takes a while) */
#ifdef DFLASH_HAVE_TARGET_CUDA
    if (t->backend == TARGET_BACKEND_CUDA) {
        /* Pinned: the capture copies go straight into the slot at PCIe speed. */
        if ((r = target_cuda_host_register(ring_base(t->ring), ring_map_size(t->ring), err, sizeof err)) < 0)
            log_warn(r, "%s: copies into the ring stay pageable (slower, and synchronous: a GPU that hangs holds the "
                     "loop in the copy, past target.gpu_timeout_ms; the watchdog ends it)", err);
        else
            t->ring_pinned = 1;
        /* Forward of batch k+1 overlapping the copies of batch k into its slot. */
        if ((r = target_pipe_create(&t->pipe, t->model, err, sizeof err)) < 0) {
            log_error(r, "%s", err);
            goto out;
        }
    }
#endif
    log_notice("ready: ring %s (%u slots), dataset %s (%" PRIu64 " samples), cluster %s", ring_name(t->ring),
               ring_layout(t->ring)->nslots, t->ds.path, t->ds.n_samples, proto_state_name((unsigned)t->state));
    daemon_notify_ready(&t->d, "%s: ring %s", proto_state_name((unsigned)t->state), ring_name(t->ring));

    uint64_t last_status = 0;
    while (!t->stop_now) {
#ifdef DFLASH_HAVE_TARGET_CUDA
        if ((r = poll_pipe(t)) < 0)
            goto out;
#endif
        if ((r = pump(t, 0)) < 0)
            goto out;
        if (t->draining) {
            return_leases(t);
            break;
        }
        int running = t->state == PROTO_STATE_RUNNING || t->state == PROTO_STATE_STARTING;
        if (running && (r = want_leases(t)) < 0) {
            log_error(r, "lease request");
            goto out;
        }
        if (running && t->qlen && pipe_ready(t)) {
#ifdef DFLASH_HAVE_TARGET_CUDA
            if (t->pipe) {
                if ((r = submit_batch(t, t->queue[0])) < 0)
                    goto out;
            } else
#endif
            if ((r = run_batch(t, t->queue[0])) < 0)
                goto out;
        } else if ((r = pump(t, pipe_pending(t) ? 1 : (int)daemon_wait_slice_ms(&t->d, 250))) < 0) {
            goto out;
        }
        if (mono_ms() - last_status > 2000) {
            last_status = mono_ms();
            daemon_notify_status(&t->d, "%s: %" PRIu64 " batches, %.0f tok/s, forward %.1f ms, slot wait %.1f ms",
                                 proto_state_name((unsigned)t->state), t->batches, t->tokens_per_s, t->forward_ms,
                                 t->wait_ms);
        }
    }
#ifdef DFLASH_HAVE_TARGET_CUDA
    /* The batches still in the pipeline are finished and published (or dropped if revoked). */
    if ((r = finish_pipe(t, true)) < 0)
        goto out;
#endif
    daemon_notify_stopping(&t->d, "%s after %" PRIu64 " batches", t->stop_now ? "stopped" : "drained", t->batches);
    /* Nothing is in a forward now: leases still held (granted while the pipeline drained, or
     * queued when a STOP came) and those granted while the events flush go back at once. */
    int back = client_return_leases(t->cl);
    if (back)
        log_info("returned %d lease%s granted while finishing", back, back == 1 ? "" : "s");
    t->qlen = 0;
    peer_flush_events(&t->d, t->cl, 3000);
    log_notice("%s after %" PRIu64 " batches (%" PRIu64 " tokens)", t->stop_now ? "stopped" : "drained", t->batches,
               t->tokens);
    code = DAEMON_EX_OK;
out:
#ifdef DFLASH_HAVE_TARGET_CUDA
    finish_pipe(t, false);
    target_pipe_free(t->pipe);      /* its last callbacks still talk to the coordinator */
#endif
    if (code == DAEMON_EX_FAILURE)
        peer_report_exit(&t->d, t->cl, r, &t->reported);
    peer_bye(&t->d, t->cl, code, code == DAEMON_EX_OK ? 0 : r);
    client_free(t->cl);
#ifdef DFLASH_HAVE_TARGET_CUDA
    if (t->ring_pinned)
        target_cuda_host_unregister(ring_base(t->ring));
#endif
    ring_detach(t->ring);
    dataset_close(&t->ds);
    target_close(t->model);
    daemon_done(&t->d);
    return code;
}
