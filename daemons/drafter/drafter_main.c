/* drafter_main.c: drafter-d: joins the drafter group, takes READY ring slots, trains the DFlash
 * drafter data-parallel over the group, reports every step, rank 0 writes the checkpoints. */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/daemon.h"
#include "common/err.h"
#include "common/fileio.h"
#include "daemons/coordinator/sched.h"
#include "common/log.h"
#include "common/id_set.h"
#include "common/rate.h"
#include "common/timeutil.h"
#include "ipc/client.h"
#include "ipc/collective.h"
#include "ipc/nccl_coll.h"
#include "ipc/peer.h"
#include "ipc/proto.h"
#include "ipc/ring.h"
#include "model/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/ckpt_writer.h"
#include "model/drafter.h"
#include "model/hfconfig.h"
#include "model/objective.h"
#include "model/safetensors.h"
#include "model/target.h"
#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "daemons/drafter/slot_feed.h"
#include "model/drafter_cuda.h"
#endif

/* The small per-step all-reduce: who had a batch, who wants to stop, the metric sums. On the
 * CUDA backend only the first three go through it (the metrics are summed on the GPUs). */
enum { SM_HAVE, SM_STOP, SM_SEQS, SM_NAN, SM_METRICS, SM_N = SM_METRICS + DRAFTER_METRICS_N };

/* CUDA: a step enqueued but whose result (read a step later) is not applied yet. */
/* A batch taken from the ring: its id and the lease number of that copy (ring_payload.lease),
 * which every report about it names. */
struct batch_ref {
    uint64_t id;
    uint32_t lease, pad;
};

/* One rank's batch in a step, as the group's all-gather hands it to every rank. */
struct peer_batch {
    uint64_t have;
    struct batch_ref b;
};

struct step_rec {
    struct batch_ref b;
    uint32_t epoch;
    int have;                   /* this rank's batch is in the step */
    int ghave;                  /* batches in the step over the group */
    uint32_t gseqs;             /* sequences in the step over the group */
    struct peer_batch *peers;   /* world > 1: every rank's batch of the step */
};
#define STEPS_IN_FLIGHT 4       /* drafter_cuda keeps up to 4 unread results */

struct dft {
    struct daemon d;
    const struct dflash_cfg *cfg;
    struct hf_config hf;
    int ids[DRAFTER_MAX_CTX_LAYERS];
    int n_ids;
    struct drafter_config dc;
    struct drafter_train_opts topt;
    struct ring_pick pick;
    char sock[108];
    char ckpt_root[CFG_STR_MAX + 32];

    float *embed, *lm_head;
    uint64_t model_fp;              /* the fingerprint of model.path's weights (st_fingerprint) */
    char model_config[HF_CONFIG_TEXT_MAX];  /* its config.json's forward settings */
    struct drafter *dr;
    struct ckpt_writer *writer; /* rank 0's checkpoints, written beside training */
    struct obj_block *blocks;
    int32_t *work;
    int max_blocks;

    struct client *cl;
    int reported;                   /* an error naming why this daemon fails went out already */
    struct peer_ring_watch ring_watch;  /* a reconnect naming another ring object ends the client */
    struct ring *ring;
    struct coll *coll;
    int cuda;                   /* drafter.backend = cuda: device = the instance index */
#ifdef DFLASH_HAVE_CUDA
    struct drafter_cuda *gpu;   /* the training state; f->dr is its host twin for checkpoints */
    struct feed *feed;
    struct nccl_coll *nccl;     /* world > 1: gradients and metrics summed over NCCL */
    cudaEvent_t gpu_done;       /* recorded after each enqueued step: the GPU has caught up */
    struct step_rec fl[STEPS_IN_FLIGHT];
    struct peer_batch *fl_peers;    /* [STEPS_IN_FLIGHT][world]: the group's batches of each */
    int fl_head, fl_n;
    uint64_t last_result_ns;
    int ring_pinned;
#endif
    FILE *metrics;
    int metrics_rank;
    int metrics_failing;        /* the last line could not be written (said once until one is) */
    char metrics_path[CFG_STR_MAX + 64];

    /* group */
    int joined;                 /* JOIN_GROUP sent, waiting for GROUP */
    int have_group;             /* a GROUP message is waiting to be applied */
    struct proto_group grp;
    uint64_t *grp_done;         /* [PROTO_MAX_GROUP_IDS]: its batch ids (grp.n_done), copied out of the frame */
    int in_group;
    int await_restart;          /* left the group's collective: wait for RESTART before joining */
    uint64_t generation;
    int rank, world;
    char loaded[PROTO_PATH_MAX];/* checkpoint the weights came from ("" = fresh init) */
    struct stat loaded_st;      /* its optimizer.bin as loaded: a path the lineage wrote again (after
                                   a fall back) holds another checkpoint */
    int dirty;                  /* stepped since `loaded` */

    /* cluster */
    int state;
    int draining;
    int stop_now;               /* STOP pushed */
    int stop_vote;              /* stop signal: leave after this step, with a checkpoint */
    int ckpt_unloadable;        /* the GROUP's checkpoint did not load: damaged or gone (ckpt_damaged) */
    int ckpt_bad_code;          /* ... reported (CKPT_BAD) with this code and reason, 0 = none: sent */
    char ckpt_bad_reason[PROTO_TEXT_MAX];   /* again at a reconnect until the RESTART comes */
    int poisoned;               /* a non-finite loss was seen: never checkpoint from here */
    const char *poison_told;    /* the checkpoint last refused for it (said once, not each try) */
    uint32_t resumes;           /* the operator's resumes as the coordinator last said (WELCOME, RESUME) */
    uint32_t poisoned_at;       /* `resumes` when the non-finite loss was seen */
    int poisoned_away;          /* ... while disconnected: the next WELCOME's count is the one */
    char nan_report[PROTO_TEXT_MAX]; /* the report of it: this rank's, or on a rank that did not send
                                        it one to send if the rank that did leaves it unread */
    int64_t nan_step;           /* ... and the step it skipped */
    int nan_answered;           /* the coordinator paused or stopped since: its report arrived */
    int voted_out;              /* CUDA: this rank's stop vote went through: leave */

    /* training position */
    struct ckpt_train_state ts;
    uint64_t unsaved;           /* batches (group-wide) trained since the last checkpoint */
    struct peer_batch *peers;   /* [world]: the group's batches of the current step */
    int peers_cap;
    int64_t saved_step;
    unsigned ckpt_fails;        /* writes failed in a row (rank 0) */
    uint64_t ckpt_retry_ms;     /* no checkpoint (periodic or a drain's) is tried before this (mono) */
    uint64_t ckpt_refusals_seen;    /* the client's count of refused CHECKPOINTEDs, as last seen */
    int64_t ckpt_head;          /* the checkpoint the lineage stands on (never pruned), -1 none */
    uint64_t stop_wait_t0;      /* a stop's first wait for a checkpoint write (mono ms), 0 before */

    /* statistics */
    uint64_t batches;           /* trained by this rank */
    double loss, accuracy, accept_len, grad_norm, lr, tokens_per_s, idle_frac, step_ms; /* tokens_per_s: the
                                       group's, over its last steps (the metrics lines) */
    double group_tokens;        /* the group's tokens trained in the steps this process took */
    struct rate_window rate;    /* ... and their rate over the last ~10 s (heartbeats, status) */
    double hb_tokens_per_s;
    double ckpt_pause_ms, ckpt_write_ms;    /* rank 0's last checkpoint */
    double h2d_ms;              /* CUDA: the copy of the last batch taken into a step, into the GPU */
    double idle_s;              /* total time waiting for slots with nothing to compute */
    uint64_t last_step_end_ns;

    /* Batches the group must not train again: those it trained in this generation, the CUDA
     * backend's steps in flight included, and those the GROUP named (kept from earlier
     * generations after more than one lease). The same on every rank: filled on entering a
     * generation from the GROUP, then from the gathered batches of each step as it is taken
     * (a skipped step's batches are taken out again). */
    struct id_set trained;
};

static double now_s(void) { return (double)wall_ms() / 1000.0; }

/* ---- configuration --------------------------------------------------------------------- */

/* A drafter shape refused ("drafter config: <field> ... [<field> ...]"): blamed on the key the
 * first field it names that a [drafter] or [model] key set came from ("num_attention_heads 4 must
 * be a multiple of num_key_value_heads 3" with only drafter.num_kv_heads set: that key), else on
 * the target's config.json. */
static int shape_error(struct daemon *d, const char *why, char *err, size_t errlen)
{
    const struct dflash_cfg *c = &d->cfg;
    const struct { const char *field, *section, *key; bool set; } from[] = {
        { "num_attention_heads", "drafter", "num_heads", c->drafter.num_heads != 0 },
        { "num_key_value_heads", "drafter", "num_kv_heads", c->drafter.num_kv_heads != 0 },
        { "head_dim", "drafter", "head_dim", c->drafter.head_dim != 0 },
        { "intermediate_size", "drafter", "intermediate_size", c->drafter.intermediate_size != 0 },
        { "block_size", "drafter", "block_size", true },
        { "mask_token_id", "drafter", "mask_token_id", c->drafter.mask_token_id >= 0 },
        { "num_hidden_layers", "model", "draft_layers", true },
        { "target_layer_ids", "model", c->model.capture_layers[0] ? "capture_layers" : "draft_layers", true },
    };
    const char *field = strstr(why, "drafter config: ");
    field = field ? field + strlen("drafter config: ") : why;
    const char *first = NULL;
    size_t blame = 0;
    for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
        const char *at = from[i].set ? strstr(field, from[i].field) : NULL;
        if (at && (!first || at < first)) {
            first = at;
            blame = i;
        }
    }
    if (first)
        return daemon_key_error(d, from[blame].section, from[blame].key, err, errlen, "drafter shape: %s", why);
    return daemon_key_error(d, "model", "path", err, errlen, "%s/config.json: drafter shape: %s", c->model.path, why);
}

/* What the automatic keys came to (comments under the printed configuration). */
static void print_resolved(const struct dft *f)
{
    const struct cfg_drafter *c = &f->cfg->drafter;
    daemon_print_capture_ids(&f->d, f->ids, f->n_ids, f->hf.num_layers);
    const struct { const char *key; int64_t set; int value; } shape[] = {
        { "drafter.num_heads", c->num_heads, f->dc.num_heads },
        { "drafter.num_kv_heads", c->num_kv_heads, f->dc.num_kv_heads },
        { "drafter.head_dim", c->head_dim, f->dc.head_dim },
        { "drafter.intermediate_size", c->intermediate_size, f->dc.intermediate_size },
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (!shape[i].set)
            daemon_print_resolved(shape[i].key, "%d (the target's)", shape[i].value);
    if (c->mask_token_id < 0)
        daemon_print_resolved("drafter.mask_token_id", "%d (the last vocabulary id)", f->dc.mask_token_id);
    if (!c->total_steps)
        daemon_print_resolved("drafter.total_steps", "the run's batches / the group's size, rounded up (known when "
                              "the group forms)");
    daemon_print_from_coordinator("coordinator.heartbeat_ms, drafter.world_size (the group's size)");
}

static int check_config(struct dft *f, char *err, size_t errlen)
{
    const struct dflash_cfg *cfg = f->cfg;
    struct daemon *d = &f->d;
    char why[512];
    if (!strcmp(cfg->drafter.backend, "cuda")) {
#ifdef DFLASH_HAVE_CUDA
        f->cuda = 1;
        if (cfg->drafter.world_size > 1 && !nccl_coll_available())
            return daemon_key_error(d, "drafter", "backend", err, errlen,
                                    "cuda with world_size %lld: this build has no NCCL",
                                    (long long)cfg->drafter.world_size);
#else
        return daemon_key_error(d, "drafter", "backend", err, errlen, "cuda: this build has no CUDA drafter backend");
#endif
    }
    /* (the loader took only the words: cpu or cuda, oldest or random) */
    f->pick.policy = strcmp(cfg->drafter.pick, "random") ? RING_PICK_OLDEST : RING_PICK_RANDOM;
    f->pick.min_ready = (uint32_t)cfg->drafter.min_ready;
    f->pick.ready_timeout_ms = (int)cfg->drafter.ready_timeout_ms;
    if (!cfg->model.path[0])
        return daemon_key_error(d, "model", "path", err, errlen, "empty: the target model dir is required");
    struct stat st;
    if (stat(cfg->model.path, &st) < 0)
        return daemon_key_error(d, "model", "path", err, errlen, "%s: %s", cfg->model.path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return daemon_key_error(d, "model", "path", err, errlen, "%s: not a directory", cfg->model.path);
    int rc = hf_config_load(cfg->model.path, &f->hf, why, sizeof why);
    if (rc < 0) {
        daemon_key_error(d, "model", "path", err, errlen, "%s", why);
        return rc;      /* (the exit code: a read that may pass, or the operator's) */
    }
    if (hf_config_forward_text(&f->hf, f->model_config, sizeof f->model_config) < 0)
        return daemon_key_error(d, "model", "path", err, errlen, "%s/config.json: its settings do not fit in %d bytes "
                                "(an architecture name that long?)", cfg->model.path, HF_CONFIG_TEXT_MAX);
    _Static_assert(DRAFTER_MAX_CTX_LAYERS == TARGET_MAX_CAPTURE, "f->ids holds every capture id");
    const char *key;
    int n = target_capture_ids(&cfg->model, f->hf.num_layers, f->ids, &key, why, sizeof why);
    if (n < 0)
        return daemon_key_error(d, "model", key, err, errlen, "%s", why);
    f->n_ids = n;
    int r = drafter_config_from_cfg(&f->dc, &f->hf, cfg, f->ids, n, why, sizeof why);
    if (r >= 0)
        r = drafter_config_validate(&f->dc, why, sizeof why);
    if (r < 0)
        return shape_error(d, why, err, errlen);
    print_resolved(f);
    if (daemon_socket_path(d, f->sock, sizeof f->sock) < 0)
        return daemon_key_error(d, "cluster", cfg->cluster.socket[0] ? "socket" : "runtime_dir", err, errlen,
                                "the control socket path is longer than a unix socket address allows");
    cfg_checkpoint_dir(cfg, f->ckpt_root, sizeof f->ckpt_root);    /* (cut to fit: refused below) */
    /* A checkpoint's path travels in CHECKPOINTED and GROUP. */
    if (strlen(f->ckpt_root) + sizeof "/step-0000000000" > PROTO_PATH_MAX)
        return daemon_key_error(d, cfg->drafter.checkpoint_dir[0] ? "drafter" : "cluster",
                                cfg->drafter.checkpoint_dir[0] ? "checkpoint_dir" : "state_dir", err, errlen,
                                "its checkpoint folders (%s/step-N) would be longer than the %d bytes a path "
                                "may have in the protocol", f->ckpt_root, PROTO_PATH_MAX - 1);
    /* (made at the first checkpoint when missing; something else there is the operator's to mend) */
    if (stat(f->ckpt_root, &st) == 0 && !S_ISDIR(st.st_mode))
        return daemon_key_error(d, cfg->drafter.checkpoint_dir[0] ? "drafter" : "cluster",
                                cfg->drafter.checkpoint_dir[0] ? "checkpoint_dir" : "state_dir", err, errlen,
                                "%s is not a folder (%s is there)", f->ckpt_root,
                                S_ISREG(st.st_mode) ? "a file" : "no folder");
    f->topt = drafter_train_opts_from_cfg(cfg);
    return 0;
}

/* ---- model ------------------------------------------------------------------------------ */

/* A checkpoint write (or its report) failed: the next is not tried for 1, 2, 4 ... 64 s (a drain,
 * which has nothing else to do, tried on each wait slice: on a full disk a write begun, failed
 * and recorded several times a second, the run never ending). A drain's first try is not held
 * back by failures before it. The delay in s. */
static unsigned ckpt_failed(struct dft *f)
{
    unsigned s = 1u << (f->ckpt_fails < 6 ? f->ckpt_fails : 6);
    f->ckpt_fails++;
    f->ckpt_retry_ms = mono_ms() + 1000ull * s;
    return s;
}

static int ckpt_collect(struct dft *f, int wait);
static void set_heartbeat(struct dft *f);

/* Between the layers of a step on the CPU (seconds at realistic sizes): a drafter silent for
 * coordinator.dead_after_ms would be taken for dead (its group failed), and for WatchdogSec
 * killed. Only sends: the step's own state is not touched. */
static void step_progress(void *arg)
{
    struct dft *f = arg;
    daemon_watchdog(&f->d);
    if (f->cl)
        client_heartbeat_due(f->cl);
}

/* The host drafter: the model itself on the CPU backend; on CUDA the twin that checkpoints are
 * loaded into and saved from (it never runs a batch, so its activations are minimal). */
static int make_drafter(struct dft *f, char *err, size_t errlen)
{
    ckpt_collect(f, 1);         /* a write in flight reads f->dr */
    drafter_free(f->dr);
    f->dr = NULL;
    const struct ring_layout *l = ring_layout(f->ring);
    int max_tokens = f->cuda ? 2 : (int)l->max_tokens, max_blocks = f->cuda ? 1 : f->max_blocks;
    int r = drafter_create(&f->dr, &f->dc, f->embed, f->lm_head, max_tokens, max_blocks,
                           (uint64_t)f->cfg->drafter.seed, err, errlen);
    if (r == 0)
        drafter_set_progress(f->dr, step_progress, f);
    /* CPU: checkpoints copy the state into the writer's snapshot: make it before training */
    if (r == 0 && !f->cuda && (r = ckpt_writer_reserve(f->writer, f->dr->n_params)) < 0)
        snprintf(err, errlen, "drafter: checkpoint snapshot of %zu parameters: %s", f->dr->n_params, err_str(r));
    return r;
}

static int64_t step_count(const struct dft *f)
{
#ifdef DFLASH_HAVE_CUDA
    if (f->gpu)
        return drafter_cuda_step_count(f->gpu);
#endif
    return f->dr ? drafter_step_count(f->dr) : 0;
}

#ifdef DFLASH_HAVE_CUDA
/* The device state from the host drafter (created on first use). */
static int gpu_load(struct dft *f, char *err, size_t errlen)
{
    if (f->gpu) {
        int r = drafter_cuda_load_from_host(f->gpu, f->dr);
        if (r < 0)
            snprintf(err, errlen, "loading the drafter onto GPU %d: %s", f->d.index, err_str(r));
        return r;
    }
    const struct ring_layout *l = ring_layout(f->ring);
    struct drafter_cuda_opts o = { .device = f->d.index };
    int r = drafter_cuda_create(&f->gpu, f->dr, (int)l->max_tokens, f->max_blocks, &o, err, errlen);
    if (r < 0)
        return r;
    if (cudaEventCreateWithFlags(&f->gpu_done, cudaEventDisableTiming) != cudaSuccess) {
        f->gpu_done = NULL;
        snprintf(err, errlen, "cudaEventCreate on GPU %d: %s", f->d.index, cudaGetErrorString(cudaGetLastError()));
        return -DF_ECUDA;
    }
    return 0;
}
#endif

static int keep_alive(void *arg);

/* A load of many GB: the heartbeat and the watchdog go on between its reads. */
static void load_progress(void *f)
{
    keep_alive(f);
}

/* Weights for a new group: the group's checkpoint, or a fresh init (same seed on every rank). */
static int load_weights(struct dft *f, const char *dir, char *err, size_t errlen)
{
    struct stat st = { 0 };
    if (dir[0] && lstat(dir, &st) < 0 && errno == ENOENT) {
        /* A replacement of it by two renames (a file system that cannot exchange) cut between
         * them set it aside as .old-step-N-<pid>: put back (with the other leftovers of
         * interrupted writes cleared) before it counts as gone. */
        char root[PROTO_PATH_MAX];
        fileio_parent(dir, root, sizeof root);
        if (!strcmp(root, f->ckpt_root))    /* (a folder not this run's own is left as it is) */
            ckpt_remove_stale(root);
        if (lstat(dir, &st) == 0)
            log_notice("checkpoint %s put back from where an interrupted replacement had set it aside", dir);
    }
    char opt[PROTO_PATH_MAX + 32];
    snprintf(opt, sizeof opt, "%s/%s", dir, CKPT_OPTIMIZER);
    if (dir[0] && stat(opt, &st) < 0)
        memset(&st, 0, sizeof st);
    if (!f->dirty && f->dr && !strcmp(dir, f->loaded) &&
        (!dir[0] || (st.st_ino && st.st_dev == f->loaded_st.st_dev && st.st_ino == f->loaded_st.st_ino &&
                     st.st_size == f->loaded_st.st_size && st.st_mtim.tv_sec == f->loaded_st.st_mtim.tv_sec &&
                     st.st_mtim.tv_nsec == f->loaded_st.st_mtim.tv_nsec))) {
#ifdef DFLASH_HAVE_CUDA
        if (f->cuda && !f->gpu)
            return gpu_load(f, err, errlen);
#endif
        return 0;
    }
    f->dirty = 1;       /* until this load completes: a failed one may leave the weights half set */
    int r = make_drafter(f, err, errlen);
    if (r < 0)
        return r;
    memset(&f->ts, 0, sizeof f->ts);
    f->ts.seed = (uint64_t)f->cfg->drafter.seed;
    if (dir[0]) {
        struct ckpt_load_opts lo = { .progress = load_progress, .progress_arg = f };
        r = ckpt_load(dir, f->dr, &f->ts, &lo, err, errlen);
        if (r < 0)
            return r;
        log_notice("loaded checkpoint %s (step %" PRId64 ", epoch %" PRIu64 ")", dir, f->ts.step, f->ts.epoch);
        if (f->ts.seed != (uint64_t)f->cfg->drafter.seed) {
            /* the anchors are drawn from the configured seed: the checkpoints say which one */
            log_warn(0, "checkpoint %s was trained with drafter.seed %" PRIu64 ", the config says %lld: the anchors"
                     " follow the config from here", dir, f->ts.seed, (long long)f->cfg->drafter.seed);
            f->ts.seed = (uint64_t)f->cfg->drafter.seed;
        }
    } else {
        log_notice("starting from a fresh drafter (seed %lld)", (long long)f->cfg->drafter.seed);
    }
#ifdef DFLASH_HAVE_CUDA
    if (f->cuda && (r = gpu_load(f, err, errlen)) < 0)
        return r;
#endif
    snprintf(f->loaded, sizeof f->loaded, "%s", dir);
    f->loaded_st = st;      /* (stat before the load: a file replaced during it does not match later) */
    f->dirty = 0;
    f->saved_step = drafter_step_count(f->dr);
    f->unsaved = 0;
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

#ifdef DFLASH_HAVE_CUDA
static int gpu_settle(struct dft *f);
#endif

/* Waiting for something slow (a peer, a checkpoint write): the heartbeat and the watchdog go
 * on; pushed messages stay queued for the loop. Non-zero when a collective's wait is to be given
 * up: a RESTART is queued (the generation is over), or a STOP while joining (in a group a STOP
 * waits for the step, so that rank 0 still writes the stop checkpoint). */
static int keep_alive(void *arg)
{
    struct dft *f = arg;
    daemon_watchdog(&f->d);
    if (!f->cl)
        return 0;
    char err[256];
    set_heartbeat(f);
    client_idle(f->cl, 0, err, sizeof err);
    int q = client_interrupt_queued(f->cl);
    return q == PROTO_RESTART || (q == PROTO_CONTROL && !f->in_group);
}

/* A finished background write: report it. The state it holds stays the lineage head's successor
 * only if the coordinator still knows that generation (it answers the others "not in the lineage"). */
static int ckpt_collect(struct dft *f, int wait)
{
    struct ckpt_result res;
    int got, waited = 0;
    uint64_t t0 = mono_ms();
    while (!(got = ckpt_writer_collect(f->writer, 0, &res)) && wait && ckpt_writer_busy(f->writer)) {
        /* Once a stop is seen, the waits count from then on together: the write in flight and
         * the stop checkpoint after it share one drafter.checkpoint_timeout_ms (the unit's
         * TimeoutStopSec is that and a minute), else systemd's SIGKILL would cut the stop short. */
        if (daemon_stop_requested() && !f->stop_wait_t0)
            f->stop_wait_t0 = mono_ms();
        if (f->stop_wait_t0 && f->stop_wait_t0 < t0)
            t0 = f->stop_wait_t0;
        /* A write that never ends (an fsync on a dead network mount) must not hold this process
         * here for ever, feeding its watchdog and heartbeat for a thread that does not move, deaf
         * to a stop: past drafter.checkpoint_timeout_ms, or on a second stop signal, it leaves
         * (the write's temp folder is removed as stale later). */
        double ms = (double)(mono_ms() - t0);
        int hurry = daemon_stop_requested() > 1;
        if (hurry || ms > (double)f->cfg->drafter.checkpoint_timeout_ms) {
            log_error(0, "a checkpoint write still running after %.0f s%s: abandoned, leaving", ms / 1e3,
                      hurry ? " and a second stop signal" : " (drafter.checkpoint_timeout_ms): the storage hangs");
            if (!hurry)
                client_error(f->cl, 0, -ETIMEDOUT, "a checkpoint write still running after %.0f s "
                             "(drafter.checkpoint_timeout_ms): the storage hangs; drafter-d exits", ms / 1e3);
            peer_abandon(&f->d, f->cl, hurry ? DAEMON_EX_OK : DAEMON_EX_FAILURE, "a checkpoint write hangs");
        }
        /* The other ranks may wait for this one at their next collective meanwhile (rank 0 at a
         * drain's or a stop's checkpoint, or behind a slow periodic one): busy, not stalled, so
         * a write slower than drafter.collective_timeout_ms does not fail the group. */
        coll_busy(f->coll, 1000);
        waited = 1;
        keep_alive(f);
        usleep(50000);
    }
    if (waited)
        coll_busy(f->coll, 0);
    if (!got)
        return 0;
    if (res.rc == -DF_ESTATE) {
        /* Fenced out: a later generation has formed (this process may not know yet), so this one
         * has ended and nobody wants its write. */
        log_notice("checkpoint of step %" PRId64 " not written: %s", res.step, res.err);
        if (res.tag == f->generation && f->saved_step == res.step)
            f->saved_step = -1;
        return 0;
    }
    if (res.rc < 0) {
        /* The previous checkpoint stays the lineage head; the next due one writes again. */
        unsigned s = ckpt_failed(f);
        char again[64] = "";
        if (f->draining)
            snprintf(again, sizeof again, "; the drain's checkpoint is tried again in %u s", s);
        log_error(res.rc, "checkpoint of step %" PRId64 ": %s (%u failed in a row%s)", res.step, res.err,
                  f->ckpt_fails, again);
        client_error(f->cl, 0, res.rc, "checkpoint of step %" PRId64 ": %s", res.step, res.err);
        if (res.tag == f->generation && f->saved_step == res.step)
            f->saved_step = -1;
        return res.rc;
    }
    int sent = client_checkpointed(f->cl, (uint64_t)res.step, res.tag, res.dir);
    if (sent < 0) {
        /* Unreported, it is in no lineage: the next due one is written again. */
        ckpt_failed(f);
        log_error(sent, "checkpoint %s cannot be reported to the coordinator", res.dir);
        if (res.tag == f->generation && f->saved_step == res.step)
            f->saved_step = -1;
        return sent;
    }
    f->ckpt_fails = 0;
    f->ckpt_retry_ms = 0;
    f->ckpt_write_ms = res.write_ms;
    log_notice("checkpoint %s (%s, written in %.0f ms%s)", res.dir, res.why, res.write_ms,
               strcmp(res.why, "periodic") ? "" : " beside training");
    if (res.pruned)
        log_info("removed %d old checkpoint(s) under %s", res.pruned, f->ckpt_root);
    return 0;
}

/* Rank 0: snapshot the current step and write it as a checkpoint in the background (wait: and
 * report it before returning). Every rank: reset the count. */
static int checkpoint(struct dft *f, const char *why, int wait)
{
    uint64_t t0 = mono_ns();
#ifdef DFLASH_HAVE_CUDA
    /* Every step's result first: a non-finite one must stop this checkpoint, and the steps
     * count exactly. */
    if (f->gpu) {
        int r = gpu_settle(f);
        if (r < 0) {
            log_error(r, "no checkpoint (%s): the steps in flight did not complete", why);
            return r;
        }
    }
#endif
    if (f->poisoned) {
        if (f->poison_told != why)      /* (a drain's is tried each slice: said once) */
            log_warn(0, "no checkpoint (%s): a non-finite loss was seen in this state", why);
        f->poison_told = why;
        return 0;
    }
    int64_t step = step_count(f);
    int started = 0;
    if (f->rank == 0 && (step != f->saved_step || f->unsaved)) {
        if (ckpt_writer_busy(f->writer)) {
            /* one write at a time (on CUDA it reads the host twin): a write slower than
             * checkpoint_every steps shows as a long pause here */
            daemon_notify_status(&f->d, "step %" PRId64 ": waiting for the previous checkpoint write", step);
            ckpt_collect(f, 1);
        }
        daemon_notify_status(&f->d, "writing checkpoint of step %" PRId64, step);
        int copy = 1;           /* CPU: the drafter trains on, the writer gets a copy */
#ifdef DFLASH_HAVE_CUDA
        if (f->gpu) {
            int r = drafter_cuda_sync_to_host(f->gpu, f->dr);
            if (r < 0) {
                ckpt_failed(f);
                log_error(r, "checkpoint: copying the state from the GPU");
                client_error(f->cl, 0, r, "checkpoint of step %" PRId64 ": copying the state from the GPU: %s", step,
                             err_str(r));
                return r;
            }
            copy = 0;           /* the twin stays still until the write is collected */
        }
#endif
        f->ts.step = step;
        int r = ckpt_writer_start(f->writer, f->ckpt_root, f->dr, copy, &f->ts, f->generation, why);
        if (r < 0) {
            ckpt_failed(f);
            log_error(r, "checkpoint of step %" PRId64 ": starting the write", step);
            client_error(f->cl, 0, r, "checkpoint of step %" PRId64 ": starting the write: %s", step, err_str(r));
            return r;
        }
        f->ckpt_pause_ms = (double)(mono_ns() - t0) / 1e6;
        log_info("checkpoint of step %" PRId64 " (%s): training paused %.0f ms for the snapshot", step, why,
                 f->ckpt_pause_ms);
        started = 1;
    }
    f->saved_step = step;
    f->unsaved = 0;
    /* wait: the state is recorded before this returns, whether this call wrote it or an earlier
     * (periodic) write still in flight does: a rank stopping right after would end the generation
     * before the coordinator had it, and roll back to the one before. */
    return wait && (started || ckpt_writer_busy(f->writer)) ? ckpt_collect(f, 1) : 0;
}

/* After a group step: a rank voting to stop, the periodic step, or a drain with nothing left. */
static void checkpoint_if_due(struct dft *f, int ghave, int gstop)
{
    int64_t step = step_count(f);
    if (gstop) {
        /* The group's checkpoint first, then every rank waits until the coordinator has it:
         * a rank leaving earlier ends the generation, which would roll back to the one before.
         * (None after a STOP read from the stop note: no coordinator is left to record it.) */
        if (!client_ended(f->cl))
            checkpoint(f, "a rank is stopping", 1);
        if (f->rank == 0)
            peer_flush_events(&f->d, f->cl, 10000);     /* CHECKPOINTED acknowledged */
        if (f->coll && coll_barrier(f->coll) < 0)
            log_warn(0, "a peer left before the stop checkpoint was recorded");
    } else if (mono_ms() < f->ckpt_retry_ms) {
        /* a write failed a moment ago (ckpt_failed): the periodic test holds on each wait slice
         * of a drain whose last step is a multiple of checkpoint_every */
    } else if (step != f->saved_step && step % f->cfg->drafter.checkpoint_every == 0) {
        checkpoint(f, "periodic", 0);
    } else if (f->draining && ghave == 0 && (f->unsaved || step != f->saved_step)) {
        checkpoint(f, "draining", 1);
    }
}

/* ---- coordinator ----------------------------------------------------------------------- */

static void set_heartbeat(struct dft *f)
{
    f->hb_tokens_per_s = rate_window_note(&f->rate, mono_ms(), f->group_tokens);
    struct proto_heartbeat hb = {
        .state = (uint32_t)f->state,
        .batches_done = f->batches,
        .step = (uint64_t)step_count(f),
        .tokens_per_s = f->hb_tokens_per_s,
        .loss = f->loss,
        .accuracy = f->accuracy,
        .accept_len = f->accept_len,
        .grad_norm = f->grad_norm,
        .lr = f->lr,
        .idle_frac = f->idle_frac,
        .step_ms = f->step_ms,
        .ckpt_pause_ms = f->ckpt_pause_ms,
        .ckpt_write_ms = f->ckpt_write_ms,
        .h2d_ms = f->h2d_ms,
    };
    client_set_heartbeat(f->cl, &hb);
}

#ifdef DFLASH_HAVE_CUDA
static void hand_back(uint64_t batch_id, uint32_t lease, void *cl)
{
    client_batch_skipped(cl, batch_id, lease);
}
#endif

#ifdef DFLASH_HAVE_CUDA
/* Batches this rank consumed and will not train: staged slots not yet released go back to READY;
 * staged batches whose slot was released, and the batches of steps whose results were never read
 * (consumed, not reported), are handed back (the coordinator re-queues those it has not re-queued
 * already). */
static void hand_back_untrained(struct dft *f)
{
    if (f->feed)
        feed_drop_all(f->feed, hand_back, f->cl);
    for (int i = 0; i < f->fl_n; i++) {
        const struct step_rec *rec = &f->fl[(f->fl_head + i) % STEPS_IN_FLIGHT];
        if (rec->have)
            client_batch_skipped(f->cl, rec->b.id, rec->b.lease);
    }
    f->fl_n = 0;
    f->fl_head = 0;
}
#endif

/* broken: the group failed, so a collective may never complete: abort rather than finish it. */
static void leave_group_how(struct dft *f, int broken)
{
#ifdef DFLASH_HAVE_CUDA
    if (f->nccl && broken)
        nccl_coll_abort(f->nccl, -DF_EDEAD);
    nccl_coll_close(f->nccl);
    f->nccl = NULL;
    /* (the next GROUP reloads the weights) */
    hand_back_untrained(f);
    if (f->gpu && !broken)
        cudaStreamSynchronize((cudaStream_t)drafter_cuda_stream(f->gpu));
#endif
    coll_close(f->coll);
    f->coll = NULL;
    f->in_group = 0;
    f->joined = 0;
}

static void leave_group(struct dft *f)
{
    leave_group_how(f, 0);
}

/* A non-finite loss or norm (called after its report is sent): no checkpoint until the operator
 * resumes the cluster (it paused on this rank's report, or rank 0's) after this, i.e. until the
 * coordinator's count of resumes moves past the one of the NaN. Disconnected (or the report's
 * send just failed), the count this drafter knows may be stale (resumes while it was away): the
 * report goes out at the reconnect, before the WELCOME is read, so that WELCOME's count is the one
 * of the NaN. */
static void poison(struct dft *f, int64_t step)
{
    if (!f->poisoned) {
        f->poisoned_at = f->resumes;
        f->poisoned_away = !client_connected(f->cl);
        f->nan_answered = 0;
    }
    if (!f->nan_report[0]) {
        /* Another rank reported it: kept in case that rank dies with its report unread. */
        snprintf(f->nan_report, sizeof f->nan_report, "%s: a loss or gradient norm of drafter group generation %"
                 PRIu64 " was not finite at step %" PRId64 " (on a peer, whose report may be lost)", f->d.ident,
                 f->generation, step);
        f->nan_step = step;
    }
    f->poisoned = 1;
    f->poison_told = NULL;
    /* The coordinator answers the report with a PAUSE (or a stop): the group, whose every rank
     * gets here in the same step, waits for it now instead of training on until it arrives. A
     * RESUME, a STOP or a reconnect's WELCOME sets the state again. */
    if (f->state == PROTO_STATE_RUNNING || f->state == PROTO_STATE_STARTING || f->state == PROTO_STATE_DRAINING) {
        f->state = PROTO_STATE_PAUSED;
        log_notice("training held until the coordinator answers the report");
    }
}

/* The NaN report (an ERROR the cluster pauses on), kept to be sent again if it was lost. */
static void report_nan(struct dft *f, int64_t step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report_nan(struct dft *f, int64_t step, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->nan_report, sizeof f->nan_report, fmt, ap);
    va_end(ap);
    f->nan_step = step;
    client_error_nan(f->cl, (uint64_t)step, f->nan_report);
}

/* The coordinator's count of resumes, from a WELCOME or a CONTROL. */
static void resumes_seen(struct dft *f, uint32_t resumes, int welcome)
{
    f->resumes = resumes;
    if (!f->poisoned)
        return;
    if (welcome && f->poisoned_away) {
        f->poisoned_at = resumes;
        f->poisoned_away = 0;
    } else if (resumes != f->poisoned_at) {
        log_notice("the cluster was resumed after the non-finite loss: checkpoints again");
        f->poisoned = 0;
        f->nan_report[0] = 0;
    } else if (welcome && (f->state == PROTO_STATE_RUNNING || f->state == PROTO_STATE_STARTING ||
                           f->state == PROTO_STATE_DRAINING) && f->nan_report[0]) {
        /* Running (or starting: a restarted coordinator's recovery; or draining, which a report
         * read would have ended), not resumed since: the report never reached it (a coordinator
         * that died with it unread; errors are not acknowledged). */
        log_warn(-DF_ENAN, "the cluster runs as if this drafter had not reported its non-finite loss: reported again");
        client_error_nan(f->cl, (uint64_t)f->nan_step, f->nan_report);
    }
}

static void handle_msg(struct dft *f, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_GROUP:
        for (uint32_t i = 0; i < m->group.n_done; i++)
            f->grp_done[i] = proto_group_id(m, i);
        f->grp = m->group;
        f->have_group = 1;
        break;
    case PROTO_RESTART:
        log_notice("drafter group restarts as generation %" PRIu64 " from %s", m->restart.generation,
                   m->restart.ckpt_dir[0] ? m->restart.ckpt_dir : "scratch");
        leave_group_how(f, 1);     /* a peer is gone: its collectives will not complete */
        if (f->poisoned && !f->nan_answered && f->resumes == f->poisoned_at && f->nan_report[0]) {
            /* The peer that reported it may be the one gone, its report unsent: the cluster
             * would run on while this rank waits for an answer that never comes. */
            log_warn(-DF_ENAN, "the group restarts with the non-finite step unanswered: reported again");
            client_error_nan(f->cl, (uint64_t)f->nan_step, f->nan_report);
        }
        f->have_group = 0;
        f->await_restart = 0;
        f->ckpt_bad_code = 0;
        break;
    case PROTO_WELCOME:
        f->state = (int)m->welcome.cluster_state;
        f->nan_answered |= f->state == PROTO_STATE_PAUSED || f->state >= PROTO_STATE_STOPPED;
        /* A drain in force is pushed again (DRAIN) to a daemon that reconnects; none is in force
         * otherwise (one on a stop signal cut short by a coordinator restart is not resumed). */
        if (f->state != PROTO_STATE_DRAINING)
            f->draining = 0;
        log_notice("reconnected to the coordinator (cluster %s)", proto_state_name(m->welcome.cluster_state));
        if (f->ckpt_bad_code)       /* the report may have died with the coordinator that read it */
            client_ckpt_bad(f->cl, f->grp.generation, f->grp.ckpt_step, f->grp.ckpt_dir, f->ckpt_bad_code,
                            f->ckpt_bad_reason);
        resumes_seen(f, m->welcome.resumes, 1);     /* a RESUME may have gone out while it was away */
        break;
    case PROTO_CONTROL:
        log_notice("%s%s%s", proto_control_name(m->control.cmd), m->control.reason[0] ? ": " : "", m->control.reason);
        resumes_seen(f, m->control.resumes, 0);     /* moved: the operator resumed (it removed the cause) */
        switch (m->control.cmd) {
        case PROTO_CTL_PAUSE:
            f->nan_answered = 1;
            f->state = PROTO_STATE_PAUSED;
            f->draining = 0;    /* a drain a pause ends is off (a non-finite value): drained again after a resume */
            f->pick.since_ns = 0;   /* a wait for min_ready slots starts again after the pause */
            daemon_notify_status(&f->d, "paused: %s", m->control.reason);
            break;
        case PROTO_CTL_RESUME:
            f->state = PROTO_STATE_RUNNING;
            f->draining = 0;    /* e.g. a final drain undone: a peer was lost before its checkpoint */
            break;
        case PROTO_CTL_DRAIN:
            f->state = PROTO_STATE_DRAINING;
            if (!f->draining) {     /* its checkpoint is tried at once, whatever failed before */
                f->ckpt_fails = 0;
                f->ckpt_retry_ms = 0;
            }
            f->draining = 1;
            break;
        case PROTO_CTL_STOP:
            f->nan_answered = 1;
            f->state = PROTO_STATE_STOPPED;
            f->stop_now = 1;
            break;
        }
        break;
    default:
        break;
    }
}

static int pump(struct dft *f, int timeout_ms)
{
    char err[512];
    struct proto_msg m;
    int r;
    daemon_watchdog(&f->d);
    ckpt_collect(f, 0);
    set_heartbeat(f);
    while ((r = client_poll(f->cl, timeout_ms, &m, err, sizeof err)) > 0) {
        handle_msg(f, &m);
        timeout_ms = 0;
    }
    /* A checkpoint of this generation the coordinator accepted is the one a restart would load:
     * from now on the prunes keep it (and what is newer). */
    struct client_stats cs;
    client_get_stats(f->cl, &cs);
    if (cs.ckpt_accepted_gen == f->generation && cs.ckpt_accepted_step > f->ckpt_head) {
        f->ckpt_head = cs.ckpt_accepted_step;
        ckpt_writer_set_head(f->writer, f->ckpt_head);
    }
    if (cs.ckpt_refusals != f->ckpt_refusals_seen) {
        /* Refused (e.g. a NaN waiting for the operator's resume): not in the lineage, so the
         * next due checkpoint (a drain's included) is written again. */
        f->ckpt_refusals_seen = cs.ckpt_refusals;
        if (cs.ckpt_refused_gen == f->generation && cs.ckpt_refused_step == f->saved_step) {
            /* (after a RESTART, before the new GROUP: the generation is over, nothing is due) */
            log_warn(cs.last_nack_status, "the coordinator refused the checkpoint of step %" PRId64 ": %s",
                     f->saved_step, f->have_group ? "it is written again when due"
                                                  : "the group restarts from the checkpoint before it");
            f->saved_step = -1;
        }
    }
    daemon_watchdog(&f->d);
    if (r < 0) {
        log_error(r, "coordinator: %s", err);
        return r;
    }
    if (daemon_stop_requested() && !f->stop_vote) {
        log_notice("%s: finishing this step, then a final checkpoint (none if that step is saved)",
                   strsignal(daemon_last_signal()));
        f->stop_vote = 1;
    }
    if (f->stop_now && f->in_group && !f->stop_vote) {
        /* The coordinator's STOP in a group goes through the step's vote, as a stop signal does:
         * a rank that left on its own ended the collective under rank 0, which then lost its
         * stop checkpoint (the group's checkpoint, then a barrier, then every rank leaves). */
        log_notice("STOP: finishing this step with the group, then a stop checkpoint (none if that step is saved)");
        f->stop_vote = 1;
    }
    return 0;
}

#ifdef DFLASH_HAVE_CUDA
/* The NCCL group of this generation. ncclGetUniqueId's rendezvous lives in the process that
 * makes the id, so rank 0 makes it (the coordinator, which has no CUDA, cannot: the id bytes in
 * GROUP are not used) and hands it to the others over the generation's shm collective. */
static int open_nccl(struct dft *f, int timeout_ms, char *err, size_t errlen)
{
    uint8_t id[NCCL_COLL_ID_BYTES] = { 0 };
    int r = 0;
    if (f->rank == 0 && (r = nccl_coll_make_id(id, err, errlen)) < 0)
        return r;
    if ((r = coll_broadcast(f->coll, id, sizeof id, 0)) < 0) {
        snprintf(err, errlen, "handing the NCCL id to the group: %s", err_str(r));
        return r;
    }
    daemon_notify_status(&f->d, "joining the NCCL group of generation %" PRIu64, f->generation);
    daemon_watchdog(&f->d);
    r = nccl_coll_open(&f->nccl, id, f->rank, f->world, f->d.index, timeout_ms, keep_alive, f, err, errlen);
    daemon_watchdog(&f->d);
    return r;
}
#endif

/* Every rank's batch of this step into pb[world] on every rank (world > 1). */
static int gather_batches(struct dft *f, int have, struct batch_ref b, struct peer_batch *pb)
{
    struct peer_batch mine = { (uint64_t)have, b };
    return coll_allgather(f->coll, &mine, sizeof mine, pb);
}

/* A step's batches, *n of them: every rank's (peers, world > 1), else this rank's alone, put in *one. */
static struct peer_batch *step_batches(const struct dft *f, int have, struct batch_ref b, struct peer_batch *peers,
                                       struct peer_batch *one, int *n)
{
    *one = (struct peer_batch){ (uint64_t)have, b };
    *n = peers ? f->world : 1;
    return peers ? peers : one;
}

/* A batch queued again while its first copy was being trained reaches the ring twice, and the
 * coordinator can take only a READY copy back out: a drafter may hold the other. Such a repeat
 * (its batch trained already, or held by a lower rank in the same step) is left out of the step:
 * no gradients, no report; the report of the first training stands. Every rank decides the same
 * from the step's gathered batches (f->peers, whose entries it clears). Returns 1 when this
 * rank's own batch is left out. */
static int leave_out_repeats(struct dft *f, int have, struct batch_ref b)
{
    struct peer_batch one;
    int n, mine = 0, self = f->coll ? f->rank : 0;
    struct peer_batch *pb = step_batches(f, have, b, f->coll ? f->peers : NULL, &one, &n);
    for (int r = 0; r < n; r++) {
        int repeat = pb[r].have && id_set_has(&f->trained, pb[r].b.id);
        for (int q = 0; q < r && pb[r].have && !repeat; q++)
            repeat = pb[q].have && pb[q].b.id == pb[r].b.id;
        if (!repeat)
            continue;
        pb[r].have = 0;
        if (r == self) {
            mine = 1;
            log_warn(0, "batch " SCHED_BID ": its copy with lease %u is a repeat (the group trained the batch in"
                     " generation %" PRIu64 " already, or trains it in this step, or an earlier generation's"
                     " checkpoint holds it): left out", SCHED_BARGS(b.id), b.lease, f->generation);
        }
    }
    return mine;
}

/* A step's batches (peers: world > 1, else this rank's b when have), remembered for
 * leave_out_repeats() as the step is taken (on every rank at the same point), or forgotten again
 * when the step was skipped: its batches are handed back and come again. */
static void remember_step(struct dft *f, int have, struct batch_ref b, struct peer_batch *peers, int forget)
{
    struct peer_batch one;
    int n;
    const struct peer_batch *pb = step_batches(f, have, b, peers, &one, &n);
    for (int r = 0; r < n; r++) {
        if (!pb[r].have)
            continue;
        if (forget)
            id_set_forget(&f->trained, pb[r].b.id);
        else if (id_set_add(&f->trained, pb[r].b.id) < 0) {
            /* past the reserve and out of memory: this rank would tell repeats unlike its peers.
             * It leaves as if killed; the group restarts from its checkpoint. */
            log_error(-ENOMEM, "batch " SCHED_BID " cannot be remembered as trained: leaving", SCHED_BARGS(pb[r].b.id));
            if (client_connected(f->cl)) {
                client_error(f->cl, 0, -ENOMEM, "%s exits: out of memory remembering batch " SCHED_BID " as trained",
                             f->d.ident, SCHED_BARGS(pb[r].b.id));
                peer_bye(&f->d, f->cl, DAEMON_EX_FAILURE, -ENOMEM);
            }
            exit(DAEMON_EX_FAILURE);
        }
    }
}

/* Rank 0 reports its peers' batches of a trained step too, ahead of any checkpoint on the same
 * connection: the coordinator never holds a checkpoint without knowing every batch in it, even
 * when a peer dies with its own TRAINED unsent (e.g. while the coordinator was down). The
 * coordinator takes the second report of a batch (same generation and step) as a replay. */
static void report_peers(struct dft *f, const struct peer_batch *pb, uint64_t step)
{
    if (f->rank != 0 || f->world < 2 || !pb)
        return;
    for (int r = 1; r < f->world; r++)
        if (pb[r].have)
            client_trained(f->cl, pb[r].b.id, pb[r].b.lease, step, (uint32_t)r, f->generation);
}

/* Apply a GROUP: weights from its checkpoint, the collective of its generation. */
/* Waiting on the checkpoint folder's fence (a write of another process in it does not end): the
 * heartbeat and the watchdog go on, up to drafter.checkpoint_timeout_ms; a second stop leaves. */
struct fence_wait {
    struct dft *f;
    uint64_t t0;    /* ms */
};

static int fence_tick(void *arg)
{
    struct fence_wait *w = arg;
    keep_alive(w->f);
    if (daemon_stop_requested() > 1)
        peer_abandon(&w->f->d, w->f->cl, DAEMON_EX_OK, "the checkpoint folder's fence is held");
    return mono_ms() - w->t0 > (uint64_t)w->f->cfg->drafter.checkpoint_timeout_ms ? -ETIMEDOUT : 0;
}

static int enter_group(struct dft *f, char *err, size_t errlen)
{
    const struct proto_group *g = &f->grp;
    f->have_group = 0;
    f->pick.since_ns = 0;
    int r;
    id_set_clear(&f->trained);
    /* Sized for the whole run: no allocation in the steps. run_batches counts the epochs not yet
     * scheduled at epoch 0's size; a later epoch's packing can differ by a few batches, so 1/8 more. */
    uint64_t want = g->run_batches + g->run_batches / 8 + g->n_done;
    if (id_set_reserve(&f->trained, (size_t)want) < 0) {
        snprintf(err, errlen, "out of memory for the ids of %" PRIu64 " batches", want);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < g->n_done; i++)
        if ((r = id_set_add(&f->trained, f->grp_done[i])) < 0) {
            snprintf(err, errlen, "GROUP: batch " SCHED_BID " cannot be remembered", SCHED_BARGS(f->grp_done[i]));
            return r;
        }
    if (g->n_done)
        log_notice("generation %" PRIu64 ": %u batches kept from earlier generations were leased more than once:"
                   " a copy of one is left out", g->generation, g->n_done);
    /* Every rank: any of them may write as rank 0 of a later generation. */
    if ((r = ckpt_claim_root(f->ckpt_root, g->run_id, g->ckpt_dir, err, errlen)) < 0)
        return r;
    /* This process's own write in flight first (its wait is bounded), then the fence: a write
     * of an ended generation landing from now on would take the new lineage's checkpoints. */
    ckpt_collect(f, 1);
    struct fence_wait fw = { f, mono_ms() };
    if ((r = ckpt_fence_raise(f->ckpt_root, g->generation, fence_tick, &fw, err, errlen)) == -DF_ESTATE) {
        /* A later generation raised the fence. Either this one ended while this rank was busy on
         * its way in (a spare drafter took the place of a rank that died meanwhile): its RESTART
         * was sent before that generation's GROUP, and comes within the time a dead rank takes.
         * Or none comes: the ledger went back (err says so), which no restart mends. */
        uint64_t t0 = mono_ms();
        int q = 0;
        while (!(q = keep_alive(f)) && mono_ms() - t0 < (uint64_t)f->cfg->coordinator.dead_after_ms) {
            if (daemon_stop_requested()) {
                snprintf(err, errlen, "stopped while joining generation %" PRIu64, g->generation);
                return -ECANCELED;
            }
            if (client_fd(f->cl) < 0)
                t0 = mono_ms();     /* (the time counts while connected: a coordinator away sends nothing) */
            usleep(20000);
        }
        if (q && client_interrupt_queued(f->cl) == PROTO_RESTART) {   /* (keep_alive says only whether) */
            snprintf(err, errlen, "generation %" PRIu64 " ended while this rank joined it (a later one has raised the "
                     "checkpoint folder's fence)", g->generation);
            return -ECANCELED;
        }
        if (q) {
            snprintf(err, errlen, "a stop came while this rank joined generation %" PRIu64, g->generation);
            return -ECANCELED;
        }
        return -DF_ELAYOUT;
    }
    if (r < 0)
        return r;
    r = load_weights(f, g->ckpt_dir, err, errlen);
    if (r < 0 && g->ckpt_dir[0] && ckpt_in_root(f->ckpt_root, g->ckpt_dir) == 0) {
        /* The folder moved (drafter.checkpoint_dir set to its new place): the ledger keeps the
         * lineage's paths. Not a damaged checkpoint to fall back from, nor one a restart finds. */
        snprintf(err, errlen, "the lineage head %s (the ledger's) is not in drafter.checkpoint_dir %s: the ledger keeps "
                 "the checkpoints' paths: put the folder back where it was (or a link to it there)", g->ckpt_dir,
                 f->ckpt_root);
        return -DF_ELAYOUT;
    }
    if (r < 0 && g->ckpt_dir[0] && ckpt_damaged(g->ckpt_dir, r)) {
        /* Before the lineage gives it up: once more (a read that met a file being replaced) */
        log_warn(r, "%s: reading it once more", err);
        daemon_watchdog(&f->d);
        r = load_weights(f, g->ckpt_dir, err, errlen);
        f->ckpt_unloadable = r < 0 && ckpt_damaged(g->ckpt_dir, r);
    }
    if (r < 0)
        return r;
    f->generation = g->generation;
    f->ckpt_head = g->ckpt_dir[0] ? (int64_t)g->ckpt_step : -1;
    ckpt_writer_set_head(f->writer, f->ckpt_head);
    f->rank = (int)g->rank;
    f->world = (int)g->world_size;
    if (f->world > 1 && f->peers_cap < f->world) {   /* sized once per group, never in a step */
        free(f->peers);
        f->peers = malloc((size_t)f->world * sizeof *f->peers);
        int ok = f->peers != NULL;
#ifdef DFLASH_HAVE_CUDA
        free(f->fl_peers);
        f->fl_peers = malloc((size_t)f->world * STEPS_IN_FLIGHT * sizeof *f->fl_peers);
        ok = ok && f->fl_peers;
#endif
        if (!ok) {
            f->peers_cap = 0;
            snprintf(err, errlen, "out of memory for %d ranks", f->world);
            return -ENOMEM;
        }
        f->peers_cap = f->world;
    }
    if (f->world > 1) {
        /* While a rank waits for a slow peer (rank 0 writing a checkpoint, loading one), its
         * heartbeat and watchdog go on; collective_timeout_ms bounds the wait. */
        int64_t to = f->cfg->drafter.collective_timeout_ms;
        struct coll_opts o = { .generation = g->generation, .mode = 0600, .idle = keep_alive, .idle_arg = f };
        char obj[PROTO_NAME_MAX + 24];
        if (coll_object_name(g->coll_name, g->generation, obj, sizeof obj) < 0)
            snprintf(obj, sizeof obj, "%s", g->coll_name);      /* (coll_open refuses it, saying why) */
        log_info("generation %" PRIu64 ": rank %d of %d, meeting the other ranks in collective %s (up to %" PRId64
                 " ms)", g->generation, f->rank, f->world, obj, to);
        daemon_watchdog(&f->d);
        r = coll_open(&f->coll, g->coll_name, f->rank, f->world, (int)to, &o, err, errlen);
        daemon_watchdog(&f->d);
        if (r < 0)
            return r;
#ifdef DFLASH_HAVE_CUDA
        if (f->cuda && (r = open_nccl(f, (int)to, err, errlen)) < 0) {
            coll_abort(f->coll, r);
            coll_close(f->coll);
            f->coll = NULL;
            return r;
        }
#endif
    }
    f->voted_out = 0;
    if (!f->cfg->drafter.total_steps)   /* the run's batches over the group, the same on every rank */
        f->topt.total_steps = (int64_t)((g->run_batches + (uint64_t)f->world - 1) / (uint64_t)f->world);
    f->in_group = 1;
    if (!f->metrics || f->metrics_rank != f->rank) {
        char *path = f->metrics_path;
        if (f->cfg->drafter.metrics_path[0])
            snprintf(path, sizeof f->metrics_path, "%s", f->cfg->drafter.metrics_path);
        else
            snprintf(path, sizeof f->metrics_path, "%s/metrics-rank%d.jsonl", f->cfg->cluster.state_dir, f->rank);
        if (f->metrics)
            fclose(f->metrics);
        f->metrics_failing = 0;
        f->metrics = fopen(path, "ae");
        if (!f->metrics)
            log_warn(-errno, "metrics file %s", path);
        else
            log_info("metrics: one line per step appended to %s", path);
        f->metrics_rank = f->rank;
    }
    log_notice("in drafter group generation %" PRIu64 ": rank %d of %d, step %" PRId64 ", lr horizon %" PRId64
               " steps", f->generation, f->rank, f->world, step_count(f), f->topt.total_steps);
    daemon_notify_status(&f->d, "training: rank %d of %d, generation %" PRIu64, f->rank, f->world, f->generation);
    return 0;
}

/* ---- one step ---------------------------------------------------------------------------- */

/* A claim with drafter.min_ready > 1 waits for that many READY slots, or drafter.ready_timeout_ms,
 * across the short slices the daemon waits in (its heartbeat and watchdog go on between them):
 * the wait's clock starts at the first claim after a slot was taken. */
static int claim_slot(struct dft *f, int timeout_ms, unsigned *slot)
{
    if (f->pick.min_ready > 1 && !f->pick.since_ns)
        f->pick.since_ns = mono_ns();
    int r = ring_claim_read(f->ring, &f->pick, timeout_ms, slot);
    if (r == 0)
        f->pick.since_ns = 0;
    return r;
}

/* A batch whose payload cannot be trained (a header out of the ring's bounds, tokens out of the
 * vocabulary, ...): reported, and handed back so its target publishes it again. A header without
 * a lease number names no copy: the coordinator's orphan sweep queues that batch again. */
static void reject_batch(struct dft *f, unsigned slot, struct batch_ref b, int code, const char *why)
{
    log_error(code, "slot %u, batch " SCHED_BID ": %s", slot, SCHED_BARGS(b.id), why);
    client_error(f->cl, 0, code, "slot %u batch " SCHED_BID ": %s", slot, SCHED_BARGS(b.id), why);
    if (b.lease)
        client_batch_skipped(f->cl, b.id, b.lease);
}

/* The batch and copy a claimed slot holds. A header without a lease number was not written by a
 * dflash target: the slot is released and the batch rejected (0); else 1. */
static int slot_ref(struct dft *f, unsigned slot, const volatile struct ring_payload *p, struct batch_ref *ref)
{
    *ref = (struct batch_ref){ p->batch_id, p->lease, 0 };
    if (ref->lease)
        return 1;
    ring_release(f->ring, slot);
    reject_batch(f, slot, *ref, -DF_EFORMAT, "lease number 0: not written by a dflash target");
    return 0;
}

/* Train on the slot's batch: gradients into dr->grads, metric sums into *m. The slot is
 * released as soon as its data has been read. Returns 1 trained, 0 nothing usable, <0 fatal. */
static int consume_slot(struct dft *f, unsigned slot, struct drafter_metrics *m, struct batch_ref *ref,
                        uint32_t *n_seqs, uint32_t *epoch_out)
{
    /* The header is read once, and bounded by the ring's layout before anything is indexed
     * with it: a slot is shared memory, written by another process. */
    const volatile struct ring_payload *p = ring_slot_header(f->ring, slot);
    const struct ring_layout *lay = ring_layout(f->ring);
    if (!slot_ref(f, slot, p, ref))
        return 0;
    uint64_t batch_id = ref->id;
    uint32_t seqs = p->n_seqs, epoch = p->epoch, n_tokens = p->n_tokens;
    if (seqs > lay->max_seqs || n_tokens > lay->max_tokens || n_tokens > (uint32_t)f->dr->max_tokens) {
        char why[128];
        snprintf(why, sizeof why, "%u sequences / %u tokens: beyond the ring's slots (%u / %u) or the drafter (%d)",
                 seqs, n_tokens, lay->max_seqs, lay->max_tokens, f->dr->max_tokens);
        ring_release(f->ring, slot);
        reject_batch(f, slot, *ref, -DF_ERANGE, why);
        return 0;
    }
    struct obj_batch b = {
        .tokens = ring_slot_tokens(f->ring, slot),
        .loss_mask = ring_slot_loss_mask(f->ring, slot),
        .cu_seqlens = ring_slot_cu_seqlens(f->ring, slot),
        .n_seqs = (int)seqs,
        .n_tokens = (int)n_tokens,
        .hidden_bf16 = ring_slot_hidden(f->ring, slot),
        .hidden_pitch = ring_hidden_pitch(f->ring) / 2,
    };
    char err[512];
    int r = obj_batch_check(&b, f->dc.vocab_size, err, sizeof err);
    if (r < 0) {
        ring_release(f->ring, slot);
        reject_batch(f, slot, *ref, r, err);
        return 0;
    }
    struct obj_rng_key key = { .seed = (uint64_t)f->cfg->drafter.seed, .epoch = epoch, .batch_id = batch_id,
                               .rank = (uint32_t)f->rank };
    int nb = obj_sample_anchors(&b, (int)f->cfg->drafter.num_anchors, &key, f->blocks, f->max_blocks, f->work);
    if (nb < 0) {
        ring_release(f->ring, slot);
        log_error(nb, "anchors of batch " SCHED_BID, SCHED_BARGS(batch_id));
        return nb;
    }
    if (nb > 0) {
        r = drafter_forward_backward(f->dr, &b, f->blocks, nb, f->cfg->drafter.gamma, m);
    } else {
        memset(f->dr->grads, 0, f->dr->n_params * sizeof(float));
        memset(m, 0, sizeof *m);
        m->tokens = b.n_tokens;
        r = 0;
    }
    int rel = ring_release(f->ring, slot);
    if (r < 0) {
        log_error(r, "forward/backward of batch " SCHED_BID, SCHED_BARGS(batch_id));
        return r;
    }
    if (rel == -DF_ESTATE) {
        /* Reclaimed while we read it (we were taken for dead): it is delivered again. Its
         * gradients (zeroed by the caller) and metric sums do not go into the step. */
        log_warn(rel, "slot %u of batch " SCHED_BID " was reclaimed during the step: not counted", slot,
                 SCHED_BARGS(batch_id));
        memset(m, 0, sizeof *m);
        return 0;
    }
    *n_seqs = seqs;     /* only a trained batch's sequences count */
    *epoch_out = epoch;
    return 1;
}

/* Out of the group after `what` (generation gen): wait for the coordinator's RESTART (or a stop),
 * as long as it takes the coordinator to notice a dead peer and a little more; without either
 * the group cannot continue and this process exits to be restarted. */
static int await_restart(struct dft *f, int code, const char *what, uint64_t gen)
{
    leave_group_how(f, 1);
    f->await_restart = 1;
    uint64_t deadline = mono_ms() + 2ull * (uint64_t)f->cfg->coordinator.dead_after_ms + 2000;
    while (mono_ms() < deadline) {
        int r = pump(f, (int)daemon_wait_slice_ms(&f->d, 200));
        if (r < 0)
            return r;
        if (!f->await_restart || f->stop_now || f->stop_vote)
            return 0;   /* (a stop signal meanwhile: out of the group, the main loop leaves, exit 0) */
    }
    client_error(f->cl, 0, code, "drafter group generation %" PRIu64 ": %s, and no restart came", gen, what);
    f->reported = 1;
    return code;
}

/* Group failure seen in a collective: a peer died (RESTART) or the cluster stops. */
static int group_broken(struct dft *f, int code)
{
    log_warn(code, "drafter group generation %" PRIu64 ": collective failed", f->generation);
    return await_restart(f, code, "collective failed", f->generation);
}

/* The group broke while this rank held a consumed, untrained batch: hand it back (its slot is
 * gone, so only a new publication delivers it; the coordinator may have re-queued it already). */
static int broken_with(struct dft *f, int have, struct batch_ref b, int code)
{
    if (have)
        client_batch_skipped(f->cl, b.id, b.lease);
    return group_broken(f, code);
}

/* A fatal error with this rank's consumed batch untrained: handed back before the exit, so it is
 * queued again at once rather than by the coordinator's sweep for lost batches. */
static int fatal_with(struct dft *f, int have, struct batch_ref b, int code)
{
    if (have)
        client_batch_skipped(f->cl, b.id, b.lease);
    return code;
}

/* FNV-1a over the parameters' 64-bit words (a trailing odd float on its own): equal on every
 * rank of a generation after the same steps, the replicas being bit for bit the same. */
static uint64_t params_hash(const struct drafter *dr)
{
    const unsigned char *p = (const unsigned char *)dr->params;
    size_t n = dr->n_params * sizeof(float), i = 0;
    uint64_t h = 0xcbf29ce484222325ull, w;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    if (i < n) {
        uint32_t t;
        memcpy(&t, p + i, 4);
        h = (h ^ t) * 0x100000001b3ull;
    }
    return h;
}

/* One JSON line per step. Rank 0's line of a group step also lists every rank's batch
 * ("group_batches"): a peer killed between the step and its own line leaves that batch trained
 * (rank 0 reports it, and may checkpoint it) without a line of its own. On the CPU backend the
 * line of a step a periodic checkpoint is due at (checkpoint_if_due's test, on every rank) has
 * "params_hash": the parameters after that step, the same on every rank of the generation. */
static void write_metrics(struct dft *f, const struct drafter_metrics *gm, const struct drafter_step_info *info,
                          uint64_t batch_id, int have, const struct peer_batch *peers)
{
    if (!f->metrics)
        return;
    char hash[40] = "";
    int64_t step = drafter_step_count(f->dr);
    if (!f->cuda && step != f->saved_step && step % f->cfg->drafter.checkpoint_every == 0)
        snprintf(hash, sizeof hash, ",\"params_hash\":\"%016" PRIx64 "\"", params_hash(f->dr));
    char group[1024] = "";
    if (f->rank == 0 && f->world > 1 && peers) {
        size_t n = (size_t)snprintf(group, sizeof group, ",\"group_batches\":[");
        for (int r = 0, first = 1; r < f->world && n < sizeof group; r++)
            if (peers[r].have) {
                n += (size_t)snprintf(group + n, sizeof group - n, "%s%" PRIu64, first ? "" : ",", peers[r].b.id);
                first = 0;
            }
        if (n + 2 < sizeof group)
            memcpy(group + n, "]", 2);
        else
            group[0] = 0;   /* a group too large for the line: no list rather than a cut one */
    }
    /* Two calls of few conversions each, one flush (one write): glibc formats a call of 16 or more
     * conversions through a heap buffer once printf hooks are registered (libquadmath, loaded with
     * OpenBLAS, registers them), and this runs every step. */
    fprintf(f->metrics,
            "{\"time\":%.3f,\"rank\":%d,\"generation\":%" PRIu64 ",\"step\":%" PRId64 ",\"epoch\":%" PRIu64
            ",\"batch\":%" PRId64 "%s%s",
            now_s(), f->rank, f->generation, info->step, f->ts.epoch, have ? (int64_t)batch_id : (int64_t)-1, group,
            hash);
    fprintf(f->metrics,
            ",\"loss\":%.6g,\"accuracy\":%.6g,\"accept_len\":%.6g,\"grad_norm\":%.6g"
            ",\"lr\":%.6g,\"tokens\":%.0f,\"tokens_per_s\":%.1f,\"step_ms\":%.2f,\"idle_frac\":%.3f"
            ",\"h2d_ms\":%.3f,\"samples\":%" PRIu64 ",\"idle_s\":%.3f}\n",
            drafter_metrics_loss(gm), drafter_metrics_accuracy(gm), drafter_metrics_accept_len(gm), info->grad_norm,
            info->lr, gm->tokens, f->tokens_per_s, f->step_ms, f->idle_frac, f->h2d_ms, f->ts.samples, f->idle_s);
    if (fflush(f->metrics) != 0 || ferror(f->metrics)) {
        if (!f->metrics_failing)
            log_warn(-errno, "metrics file %s: the line of step %" PRId64 " not written; lines are lost until one can "
                     "be (training goes on)", f->metrics_path, info->step);
        f->metrics_failing = 1;
        clearerr(f->metrics);
    } else if (f->metrics_failing) {
        log_notice("metrics file %s: written again from step %" PRId64, f->metrics_path, info->step);
        f->metrics_failing = 0;
    }
}

/* A trained step's bookkeeping, the same on both backends: counters, the TRAINED reports, the
 * latest metrics and the JSONL row. step_ms: what the step took; rate_s: the time its tokens/s
 * is over (0: no figure yet). */
static void step_done(struct dft *f, int have, struct batch_ref b, const struct peer_batch *peers, int ghave,
                      uint64_t gseqs, uint64_t step, int rc, const struct drafter_metrics *gm,
                      const struct drafter_step_info *info, double step_ms, double rate_s)
{
    f->unsaved += (uint64_t)ghave;
    f->ts.batch_in_epoch += (uint64_t)ghave;
    f->ts.samples += gseqs;
    f->ts.tokens += (uint64_t)gm->tokens;
    f->group_tokens += gm->tokens;
    f->loss = drafter_metrics_loss(gm);
    f->accuracy = drafter_metrics_accuracy(gm);
    f->accept_len = drafter_metrics_accept_len(gm);
    if (rc == 0) {
        f->grad_norm = info->grad_norm;
        f->lr = info->lr;
    }
    if (rate_s > 0) {
        f->step_ms = step_ms;
        double rate = gm->tokens / rate_s;
        f->tokens_per_s = f->tokens_per_s ? 0.8 * f->tokens_per_s + 0.2 * rate : rate;
    }
    /* The metrics row before the reports: a rank killed in between leaves no trained batch
     * without its row (rank 0 reports every rank's batch). */
    write_metrics(f, gm, info, b.id, have, peers);
    if (have) {
        f->batches++;
        client_trained(f->cl, b.id, b.lease, step, (uint32_t)f->rank, f->generation);
    }
    report_peers(f, peers, step);
}

/* One iteration of the group: maybe a batch, the small all-reduce, maybe a step. */
static int iterate(struct dft *f)
{
    uint64_t t0 = mono_ns();
    int consuming = f->state == PROTO_STATE_RUNNING || f->state == PROTO_STATE_DRAINING ||
                    f->state == PROTO_STATE_STARTING;
    unsigned slot;
    int have = 0, r;
    struct batch_ref b = { 0 };
    uint32_t n_seqs = 0, epoch = 0;
    struct drafter_metrics m = { 0 };
    int slice = (int)daemon_wait_slice_ms(&f->d, 200);
    uint64_t t_wait = t0;       /* end of the wait for a slot: then the batch's forward/backward */
    if (consuming && !f->stop_vote) {
        r = claim_slot(f, slice, &slot);
        t_wait = mono_ns();
        if (r == 0) {
            have = consume_slot(f, slot, &m, &b, &n_seqs, &epoch);
            if (have < 0)
                return fatal_with(f, 1, b, have);   /* (no memory ...: its slot is released) */
        } else if (r != -DF_ETIMEOUT && r != -EINTR) {
            log_error(r, "ring_claim_read");
            return r;
        }
    } else if (!f->stop_vote) {
        usleep((useconds_t)slice * 1000);   /* paused: keep the group in step, slowly */
        t_wait = mono_ns();
    }
    if (have && f->cfg->drafter.debug_nan_step >= 0 && drafter_step_count(f->dr) + 1 == f->cfg->drafter.debug_nan_step) {
        log_warn(0, "debug: making the loss of step %" PRId64 " NaN (drafter.debug_nan_step)",
                 drafter_step_count(f->dr) + 1);
        m.loss_sum = NAN;
    }
    if (f->coll && (r = gather_batches(f, have, b, f->peers)) < 0)
        return broken_with(f, have, b, r);
    if (leave_out_repeats(f, have, b)) {
        have = 0;
        n_seqs = 0;
        memset(&m, 0, sizeof m);
    }
    if (have)
        f->dirty = 1;   /* the state moved from the loaded one, even if the step is skipped */
    if (!have)
        memset(f->dr->grads, 0, f->dr->n_params * sizeof(float));
    float sm[SM_N] = { 0 };
    sm[SM_HAVE] = (float)have;
    sm[SM_STOP] = (float)f->stop_vote;
    sm[SM_SEQS] = (float)n_seqs;
    sm[SM_NAN] = have && !(isfinite(m.loss_sum) && isfinite(m.weight_sum)) ? 1.0f : 0.0f;
    drafter_metrics_to_floats(&m, sm + SM_METRICS);
    if (f->coll && (r = coll_allreduce_sum(f->coll, sm, SM_N)) < 0)
        return broken_with(f, have, b, r);
    struct drafter_metrics gm;
    drafter_metrics_from_floats(sm + SM_METRICS, &gm);
    int ghave = (int)sm[SM_HAVE], gstop = sm[SM_STOP] > 0;
    struct drafter_step_info info = { .step = drafter_step_count(f->dr) };
    if (ghave > 0 && sm[SM_NAN] > 0) {
        /* Every rank skips the same step; the weights stay as they were. Its batches were
         * consumed untrained: each rank hands its own back to be published again. */
        if (have)
            client_batch_skipped(f->cl, b.id, b.lease);
        if (have && !(isfinite(m.loss_sum) && isfinite(m.weight_sum))) {
            log_error(-DF_ENAN, "batch " SCHED_BID ": the loss is not finite: step skipped, cluster pausing",
                      SCHED_BARGS(b.id));
            report_nan(f, drafter_step_count(f->dr) + 1, "%s: batch " SCHED_BID " at step %" PRId64
                       ": loss is not finite",
                       f->d.ident, SCHED_BARGS(b.id), drafter_step_count(f->dr) + 1);
        }
        poison(f, drafter_step_count(f->dr) + 1);   /* after the report: a failed send holds it for the reconnect */
    } else if (ghave > 0) {
        if (f->coll && (r = coll_allreduce_sum(f->coll, f->dr->grads, f->dr->n_params)) < 0)
            return broken_with(f, have, b, r);
        r = drafter_optimizer_step(f->dr, gm.weight_sum, &f->topt, &info);
        if (r == -DF_ENAN) {
            if (have)
                client_batch_skipped(f->cl, b.id, b.lease);
            log_error(r, "gradient norm is not finite at step %" PRId64 ": step skipped", info.step + 1);
            if (f->rank == 0)
                report_nan(f, info.step + 1, "%s: gradient norm not finite at step %" PRId64, f->d.ident, info.step + 1);
            poison(f, info.step + 1);
        } else if (r < 0 && r != -DF_ERANGE) {
            log_error(r, "optimizer step");
            return fatal_with(f, have, b, r);
        } else {
            /* -DF_ERANGE: nothing supervised in the whole step; the batches still count. */
            uint64_t t2 = mono_ns();
            f->dirty = 1;
            if (have)       /* the training position moves with a step taken only */
                ckpt_epoch_seen(&f->ts, epoch);
            step_done(f, have, b, f->coll ? f->peers : NULL, ghave, (uint64_t)sm[SM_SEQS],
                      (uint64_t)drafter_step_count(f->dr), r, &gm, &info, (double)(t2 - t_wait) / 1e6,
                      (double)(t2 - t0) / 1e9 + 1e-9);
            remember_step(f, have, b, f->coll ? f->peers : NULL, 0);
        }
    }
    uint64_t t3 = mono_ns();
    if (f->last_step_end_ns) {
        double idle = ghave > 0 ? (double)(t_wait - t0) / (double)(t3 - t0 + 1) : 1.0;
        f->idle_frac = 0.9 * f->idle_frac + 0.1 * idle;
        f->idle_s += ghave > 0 ? (double)(t_wait - t0) / 1e9 : (double)(t3 - t0) / 1e9;
    }
    f->last_step_end_ns = t3;

    checkpoint_if_due(f, ghave, gstop);
    if (gstop && !f->stop_vote) {
        /* A peer leaves: the coordinator will restart the group from that checkpoint. */
        log_notice("a peer of generation %" PRIu64 " is stopping: waiting for the group to restart", f->generation);
        leave_group(f);
        f->await_restart = 1;
    }
    return 0;
}

#ifdef DFLASH_HAVE_CUDA
/* ---- one step on the CUDA backend ----------------------------------------------------------
 *
 * Per iteration: release the slots whose H2D has completed; stage up to FEED_DEPTH READY slots
 * (H2D on the feed's copy stream, overlapping the step in flight); enqueue the step of the oldest
 * staged batch; the small host all-reduce (who has a batch, who stops); gradients and metric
 * sums summed over NCCL on the drafter's stream; AdamW; then read the result of the step before
 * (metrics and norm were copied back behind an event): no per-step host sync on the step itself. */

/* A step's result, read a step after it was enqueued: count its batches, report TRAINED. */
static void apply_result(struct dft *f, const struct step_rec *rec, int rc, const struct drafter_metrics *gm,
                         const struct drafter_step_info *info)
{
    if (rc == -DF_ENAN) {
        /* Skipped on every rank (all see the same summed metrics); the weights are untouched.
         * Its batches were consumed untrained: each rank hands its own back. */
        remember_step(f, rec->have, rec->b, rec->peers, 1);
        if (rec->have)
            client_batch_skipped(f->cl, rec->b.id, rec->b.lease);
        log_error(rc, "step %" PRId64 ": loss sum %g / gradient norm %g not finite: step skipped, cluster pausing",
                  info->step + 1, gm->loss_sum, info->grad_norm);
        if (f->rank == 0) {
            char bt[48] = "no batch";
            if (rec->have)
                snprintf(bt, sizeof bt, "batch " SCHED_BID, SCHED_BARGS(rec->b.id));
            report_nan(f, info->step + 1, "%s: loss or gradient norm not finite at step %" PRId64 " (%s of rank 0)",
                       f->d.ident, info->step + 1, bt);
        }
        poison(f, info->step + 1);
        return;
    }
    /* 0, or -DF_ERANGE: nothing supervised in the whole step; the batches still count. */
    uint64_t now = mono_ns();
    if (rec->have)
        ckpt_epoch_seen(&f->ts, rec->epoch);
    /* Steps are pipelined: their rate is from result to result; step time is the GPU's, as the
     * CPU backend's is its compute (slot waits in neither). */
    double dt = f->last_result_ns ? (double)(now - f->last_result_ns) / 1e9 : 0;
    f->last_result_ns = now;
    step_done(f, rec->have, rec->b, rec->peers, rec->ghave, rec->gseqs, (uint64_t)info->step, rc, gm, info,
              info->device_ms > 0 ? info->device_ms : dt * 1e3, dt);
}

/* Release the staged slots whose H2D is done (wait: first wait for those copies). */
static int release_slots(struct dft *f, int wait)
{
    int r = feed_release_done(f->feed, wait);
    if (r < 0)
        log_error(r, "copy of a slot to GPU %d", f->d.index);
    else if (r > 0)
        log_warn(-DF_ESTATE, "%d staged batch%s lost: the slot was reclaimed during its copy (redelivered)", r,
                 r == 1 ? "" : "es");
    return r < 0 ? r : 0;
}

/* Read results until at most `keep` steps are in flight. 0; the NCCL wait's codes of a failed
 * group (*group_failed set); -DF_ECUDA: this GPU failed (the process must go). */
static int gpu_results(struct dft *f, int keep, int *group_failed)
{
    *group_failed = 0;
    while (f->fl_n > keep) {
        int r;
        /* The staged copies finish long before the step: their slots go back to the targets
         * now rather than after the wait (unbounded host waits only without a group to hang on). */
        if ((r = release_slots(f, !f->nccl)) < 0)
            return r;
        if (f->nccl && (r = nccl_coll_wait(f->nccl, drafter_cuda_result_event(f->gpu))) < 0) {
            *group_failed = r != -DF_ECUDA;
            if (r == -DF_ECUDA)
                log_error(r, "waiting for a step on GPU %d", f->d.index);
            return r;
        }
        struct drafter_metrics gm;
        struct drafter_step_info info;
        r = drafter_cuda_step_result(f->gpu, 1, &gm, &info);
        if (r < 0 && r != -DF_ENAN && r != -DF_ERANGE) {
            log_error(r, "reading the result of a step");
            return r;
        }
        struct step_rec rec = f->fl[f->fl_head];
        f->fl_head = (f->fl_head + 1) % STEPS_IN_FLIGHT;
        f->fl_n--;
        apply_result(f, &rec, r, &gm, &info);
    }
    return 0;
}

/* Every step's result read (before a checkpoint). */
static int gpu_settle(struct dft *f)
{
    int failed;
    return gpu_results(f, 0, &failed);
}

/* Wait up to slice_ms for a READY slot. The part of the wait during which the GPU had nothing
 * left to do is the drafter's idle time (*idle_ns). */
static int wait_slot(struct dft *f, int slice_ms, unsigned *slot, uint64_t *idle_ns)
{
    uint64_t end = mono_ns() + (uint64_t)slice_ms * 1000000ull;
    for (;;) {
        uint64_t now = mono_ns();
        if (now >= end)
            return -DF_ETIMEOUT;
        int busy = f->fl_n > 0 && cudaEventQuery(f->gpu_done) == cudaErrorNotReady;
        int ms = busy ? 1 : (int)((end - now + 999999) / 1000000);
        int r = claim_slot(f, ms, slot);
        if (!busy)
            *idle_ns += mono_ns() - now;
        if (r != -DF_ETIMEOUT)
            return r;
    }
}

/* Claim READY slots into the feed until it is full; waits (a slice) only when nothing is staged. */
static int fill_feed(struct dft *f, uint64_t *idle_ns)
{
    while (feed_count(f->feed) < FEED_DEPTH) {
        unsigned slot;
        int r = feed_count(f->feed) ? claim_slot(f, 0, &slot)
                                    : wait_slot(f, (int)daemon_wait_slice_ms(&f->d, 200), &slot, idle_ns);
        if (r == -DF_ETIMEOUT || r == -EINTR)
            return 0;
        if (r < 0) {
            log_error(r, "ring_claim_read");
            return r;
        }
        struct batch_ref b;
        if (!slot_ref(f, slot, ring_slot_header(f->ring, slot), &b))
            continue;
        r = feed_stage(f->feed, slot);
        if (r == -DF_ERANGE) {
            reject_batch(f, slot, b, r, "header out of the ring's bounds");
            continue;
        }
        if (r < 0) {
            log_error(r, "copy of slot %u to GPU %d", slot, f->d.index);
            return r;
        }
    }
    return 0;
}

/* Enqueue the forward/backward of the oldest staged batch. 1 enqueued, 0 nothing usable, <0. */
static int enqueue_batch(struct dft *f, struct batch_ref *b, uint32_t *epoch, uint32_t *n_seqs)
{
    int lost, rc;
    struct feed_batch *fb;
    while ((fb = feed_front(f->feed, &lost, &rc)) || lost) {
        if (lost)
            log_warn(-DF_ESTATE, "%d staged batch%s lost: the slot was reclaimed during its copy (redelivered)", lost,
                     lost == 1 ? "" : "es");
        if (!fb)
            break;
        f->h2d_ms = feed_last_copy_ms(f->feed);     /* its copy, or a later one, is complete */
        char err[512];
        int r = obj_batch_check(&fb->b, f->dc.vocab_size, err, sizeof err);
        if (r < 0) {
            reject_batch(f, fb->slot, (struct batch_ref){ fb->batch_id, fb->lease, 0 }, r, err);
            feed_consumed(f->feed, NULL);
            continue;
        }
        struct obj_rng_key key = { .seed = (uint64_t)f->cfg->drafter.seed, .epoch = fb->epoch,
                                   .batch_id = fb->batch_id, .rank = (uint32_t)f->rank };
        int nb = obj_sample_anchors(&fb->b, (int)f->cfg->drafter.num_anchors, &key, f->blocks, f->max_blocks, f->work);
        if (nb < 0) {
            log_error(nb, "anchors of batch " SCHED_BID, SCHED_BARGS(fb->batch_id));
            return nb;
        }
        r = drafter_cuda_forward_backward_async(f->gpu, &fb->b, f->blocks, nb, f->cfg->drafter.gamma);
        if (r < 0) {
            log_error(r, "forward/backward of batch " SCHED_BID, SCHED_BARGS(fb->batch_id));
            return r;
        }
        if (f->cfg->drafter.debug_nan_step >= 0 && step_count(f) + 1 == f->cfg->drafter.debug_nan_step) {
            static const double nan_loss = NAN;
            log_warn(0, "debug: making the loss of step %" PRId64 " NaN (drafter.debug_nan_step)", step_count(f) + 1);
            if (cudaMemcpyAsync(drafter_cuda_metrics_dev(f->gpu), &nan_loss, sizeof nan_loss, cudaMemcpyHostToDevice,
                                (cudaStream_t)drafter_cuda_stream(f->gpu)) != cudaSuccess)
                return -DF_ECUDA;
        }
        *b = (struct batch_ref){ fb->batch_id, fb->lease, 0 };
        *epoch = fb->epoch;
        *n_seqs = (uint32_t)fb->b.n_seqs;
        if ((r = feed_consumed(f->feed, drafter_cuda_input_event(f->gpu))) < 0)
            return r;
        return 1;
    }
    return rc;
}

static int iterate_cuda(struct dft *f)
{
    uint64_t t0 = mono_ns(), idle_ns = 0;
    int consuming = f->state == PROTO_STATE_RUNNING || f->state == PROTO_STATE_DRAINING ||
                    f->state == PROTO_STATE_STARTING;
    int r, failed;
    if ((r = release_slots(f, 0)) < 0)
        return r;
    if (consuming && !f->stop_vote) {
        if ((r = fill_feed(f, &idle_ns)) < 0)
            return r;
    } else if (!f->stop_vote || !feed_count(f->feed)) {
        /* paused (or stopping with nothing staged): keep the group in step, slowly */
        if ((r = gpu_results(f, 0, &failed)) < 0)
            return failed ? group_broken(f, r) : r;
        if (!f->stop_vote && feed_count(f->feed)) {
            /* Staged batches would sit out the pause, however long: the coordinator would take
             * those whose slots are released for lost and queue them again. Handed back now. */
            log_info("paused: %d staged batch%s handed back", feed_count(f->feed), feed_count(f->feed) == 1 ? "" : "es");
            feed_drop_all(f->feed, hand_back, f->cl);
        }
        if (!f->stop_vote) {
            uint64_t w = mono_ns();
            usleep((useconds_t)daemon_wait_slice_ms(&f->d, 200) * 1000);
            idle_ns += mono_ns() - w;
        }
    }
    struct batch_ref b = { 0 };
    uint32_t epoch = 0, n_seqs = 0;
    int have = 0;
    /* Staged batches are trained even after a stop vote: their slots are already released. */
    if ((consuming || f->stop_vote) && (have = enqueue_batch(f, &b, &epoch, &n_seqs)) < 0)
        return have;
    if (f->coll && (r = gather_batches(f, have, b, f->peers)) < 0)
        return broken_with(f, have, b, r);
    if (leave_out_repeats(f, have, b)) {
        have = 0;       /* its pass was enqueued: the sums below get zeros instead */
        n_seqs = 0;
    }
    float sm[3] = { (float)have, f->stop_vote && !feed_count(f->feed) ? 1.0f : 0.0f, (float)n_seqs };
    if (f->coll && (r = coll_allreduce_sum(f->coll, sm, 3)) < 0)
        return broken_with(f, have, b, r);
    int ghave = (int)sm[SM_HAVE], gstop = sm[SM_STOP] > 0;
    if (ghave > 0) {
        cudaStream_t s = (cudaStream_t)drafter_cuda_stream(f->gpu);
        size_t n;
        float *g = drafter_cuda_grads(f->gpu, &n);
        double *mv = drafter_cuda_metrics_dev(f->gpu);
        if (!have && (drafter_cuda_mark_start(f->gpu) < 0 ||      /* its step's device time from here */
                      cudaMemsetAsync(g, 0, n * sizeof *g, s) != cudaSuccess ||
                      cudaMemsetAsync(mv, 0, DRAFTER_METRICS_N * sizeof *mv, s) != cudaSuccess))
            return -DF_ECUDA;   /* this rank adds nothing to the sums */
        if (f->nccl && (r = nccl_coll_allreduce_sum(f->nccl, g, n, mv, DRAFTER_METRICS_N, s)) < 0)
            return broken_with(f, have, b, r);
        if (f->fl_n == STEPS_IN_FLIGHT && (r = gpu_results(f, STEPS_IN_FLIGHT - 1, &failed)) < 0)
            return failed ? broken_with(f, have, b, r) : fatal_with(f, have, b, r);
        if ((r = drafter_cuda_optimizer_step_async(f->gpu, &f->topt)) < 0) {
            log_error(r, "optimizer step");
            return fatal_with(f, have, b, r);
        }
        if (cudaEventRecord(f->gpu_done, s) != cudaSuccess)
            return fatal_with(f, have, b, -DF_ECUDA);
        int at = (f->fl_head + f->fl_n) % STEPS_IN_FLIGHT;
        struct peer_batch *pb = NULL;
        if (f->coll) {
            pb = f->fl_peers + (size_t)at * (size_t)f->world;
            memcpy(pb, f->peers, (size_t)f->world * sizeof *pb);
        }
        f->fl[at] = (struct step_rec){ .b = b, .epoch = epoch, .have = have, .ghave = ghave,
                                       .gseqs = (uint32_t)sm[SM_SEQS], .peers = pb };
        f->fl_n++;
        remember_step(f, have, b, pb, 0);
        f->dirty = 1;
    }
    /* One step stays in flight while the group keeps stepping; none when it stops. */
    if ((r = gpu_results(f, ghave > 0 ? 1 : 0, &failed)) < 0)
        return failed ? group_broken(f, r) : r;
    uint64_t t3 = mono_ns();
    if (f->last_step_end_ns) {
        f->idle_frac = 0.9 * f->idle_frac + 0.1 * (double)idle_ns / (double)(t3 - t0 + 1);
        f->idle_s += (double)idle_ns / 1e9;
    }
    f->last_step_end_ns = t3;

    checkpoint_if_due(f, ghave, gstop);
    if (gstop && f->stop_vote) {
        /* The stop checkpoint settles every step in flight; when it could not (the group broke),
         * their batches were consumed and never reported: handed back with the staged ones. */
        if (f->fl_n) {
            log_warn(0, "stopping: the %d step%s in flight did not complete: their batches handed back", f->fl_n,
                     f->fl_n == 1 ? "" : "s");
            leave_group_how(f, 1);
        }
        /* A peer's vote ended the group before this rank's staged batches were trained (each
         * rank votes once its own feed is empty): they go back to be published again. */
        if (feed_count(f->feed)) {
            log_info("stopping: %d staged batch%s handed back", feed_count(f->feed),
                     feed_count(f->feed) == 1 ? "" : "es");
            feed_drop_all(f->feed, hand_back, f->cl);
        }
        f->voted_out = 1;
    } else if (gstop) {
        log_notice("a peer of generation %" PRIu64 " is stopping: waiting for the group to restart", f->generation);
        leave_group(f);
        f->await_restart = 1;
    }
    return 0;
}
#endif

/* ---- start ------------------------------------------------------------------------------ */

static int attach_ring(struct dft *f, char *err, size_t errlen)
{
    const struct proto_welcome *w = client_welcome(f->cl);
    int r = peer_attach_ring(f->cl, f->sock, &f->ring, err, errlen);
    if (r < 0)
        return r;
    peer_watch_ring(f->cl, &f->ring_watch, &f->d, f->ring, NULL, f->model_fp, f->model_config);
    if ((r = peer_check_model_config(w, f->cfg->model.path, f->model_config, err, errlen)) < 0)
        return r;
    if (w->model_fingerprint && w->model_fingerprint != f->model_fp) {
        snprintf(err, errlen, "%s (model.path): weights of fingerprint %016" PRIx64 ", the run's target has %016" PRIx64
                 " (other weights): point model.path at the run's model", f->cfg->model.path,
                 f->model_fp, w->model_fingerprint);
        return -DF_ELAYOUT;
    }
    const struct ring_layout *l = ring_layout(f->ring);
    if (l->hidden != (uint32_t)f->dc.hidden_size || l->n_layers != (uint32_t)f->n_ids || l->dtype != RING_DTYPE_BF16) {
        snprintf(err, errlen, "ring %s holds hidden %u x %u layers, this drafter expects hidden %d x %d layers",
                 w->ring_name, l->hidden, l->n_layers, f->dc.hidden_size, f->n_ids);
        return -DF_ELAYOUT;
    }
    for (int i = 0; i < f->n_ids; i++)
        if (l->layer_ids[i] != (uint32_t)f->ids[i]) {
            snprintf(err, errlen, "ring %s captured layer %d is %u, the drafter's is %d", w->ring_name, i,
                     l->layer_ids[i], f->ids[i]);
            return -DF_ELAYOUT;
        }
    f->max_blocks = drafter_max_blocks_for((int)l->max_tokens, (int)l->max_seqs, (int)f->cfg->drafter.num_anchors);
    f->blocks = calloc((size_t)f->max_blocks, sizeof *f->blocks);
    f->work = calloc(l->max_tokens, sizeof *f->work);
    f->grp_done = calloc(PROTO_MAX_GROUP_IDS, sizeof *f->grp_done);  /* pages touched only as filled */
    if (!f->blocks || !f->work || !f->grp_done) {
        snprintf(err, errlen, "out of memory for %d blocks", f->max_blocks);
        return -ENOMEM;
    }
    f->state = (int)w->cluster_state;
    f->resumes = w->resumes;
    return 0;
}

int main(int argc, char **argv)
{
    static struct dft df;
    struct dft *f = &df;
    f->ckpt_head = -1;
    char err[1024];
    cpu_blas_pick_kernels(argv);     /* (an exec, once, before anything else is set up) */
    int r = daemon_start(&f->d, "drafter-d", "drafter", 1, argc, argv, err, sizeof err);
    if (r >= 0) {
        if (err[0])
            log_error(0, "%s", err);
        return r;
    }
    if (cpu_blas_note())
        log_notice("%s", cpu_blas_note());
    f->cfg = &f->d.cfg;
    if ((r = check_config(f, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        return err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
    }
    if (f->d.check_only)
        return DAEMON_EX_OK;

    int code = DAEMON_EX_FAILURE;
    daemon_signals_init();
    daemon_notify_init(&f->d);
    f->rank = -1;
    f->metrics_rank = -1;
    openblas_set_num_threads((int)f->cfg->drafter.threads);
    if ((r = daemon_lock(&f->d, err, sizeof err)) < 0) {
        log_error(0, "%s", err);   /* (it says why) */
        if (r == -ENOTDIR)
            code = DAEMON_EX_CONFIG;    /* a file where cluster.runtime_dir should be */
        goto out;
    }
    if ((r = ckpt_writer_create(&f->writer, (int)f->cfg->drafter.keep_checkpoints)) < 0) {
        log_error(r, "checkpoint writer");
        goto out;
    }
    ckpt_writer_debug_delay(f->writer, (int)f->cfg->drafter.debug_ckpt_delay_ms);
    daemon_notify_status(&f->d, "loading the target's embedding and LM head from %s", f->cfg->model.path);
    daemon_watchdog(&f->d);     /* start time; reading the weights ticks for more as it goes (progress.h) */
    int vocab = 0, hidden = 0;
    daemon_leave_on_stop(&f->d, "loading the embedding and LM head");
    r = target_load_head(f->cfg->model.path, &f->embed, &f->lm_head, &vocab, &hidden, err, sizeof err);
    if (r == 0)
        r = st_dir_fingerprint(f->cfg->model.path, &f->model_fp, err, sizeof err);
    daemon_leave_on_stop(&f->d, NULL);
    if (r < 0) {
        log_error(r, "%s", err);
        code = err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;   /* (a read error may pass, as the target's) */
        goto out;
    }
    log_info("embedding and LM head from %s, weights fingerprint %016" PRIx64, f->cfg->model.path, f->model_fp);
    daemon_notify_status(&f->d, "connecting to the coordinator at %s", f->sock);
    if ((r = peer_connect_coordinator(&f->d, f->sock, PROTO_ROLE_DRAFTER, &f->cl, err, sizeof err)) < 0) {
        code = peer_connect_failed(&f->d, f->sock, r, err);
        goto out;
    }
    if ((r = attach_ring(f, err, sizeof err)) == -ESHUTDOWN) {
        code = peer_connect_failed(&f->d, f->sock, r, err);
        goto out;
    }
    if (r < 0) {
        /* A mismatch with the cluster (layout, dataset) ends it; anything else (the ring's object
         * gone: the coordinator makes it anew) is this daemon's, restarted by systemd. */
        bool config = r == -DF_ELAYOUT;
        log_error(r, "%s", err);
        client_error(f->cl, config, r, "%s: %s", f->d.ident, err);
        f->reported = 1;
        peer_flush_events(&f->d, f->cl, 2000);
        code = config ? DAEMON_EX_CONFIG : DAEMON_EX_FAILURE;
        goto out;
    }
    daemon_watchdog(&f->d);     /* start time for each phase that follows */
    if ((r = make_drafter(f, err, sizeof err)) < 0) {
        log_error(r, "%s", err);    /* (it names the drafter) */
        goto out;
    }
    f->ts.seed = (uint64_t)f->cfg->drafter.seed;   /* a fresh drafter's, kept by the first GROUP */
#ifdef DFLASH_HAVE_CUDA
    if (f->cuda) {
        daemon_notify_status(&f->d, "setting up the drafter on GPU %d", f->d.index);
        daemon_watchdog(&f->d);
        if ((r = gpu_load(f, err, sizeof err)) < 0 ||
            (r = feed_create(&f->feed, f->ring, f->d.index, &f->ring_pinned, err, sizeof err)) < 0) {
            log_error(r, "GPU %d: %s", f->d.index, err);
            if (r == -DF_ERANGE || r == -DF_EUNSUPPORTED) {
                /* sizes the GPU cannot take (buffers larger than it) or shapes its kernels do not
                 * handle: a configuration error for the whole cluster, which a restart would only
                 * repeat (a shortage of memory only is restarted) */
                client_error(f->cl, 1, r, "%s: GPU %d: %s", f->d.ident, f->d.index, err);
                f->reported = 1;
                peer_flush_events(&f->d, f->cl, 2000);
                code = DAEMON_EX_CONFIG;
            } else if (r == -ENODEV) {
                /* this daemon names a GPU the host lacks: it cannot run (no restart), the others
                 * can; the coordinator keeps why (a non-fatal error) */
                peer_report_exit(&f->d, f->cl, r, &f->reported);
                code = DAEMON_EX_CONFIG;
            }
            goto out;
        }
        if (!f->ring_pinned)
            log_warn(0, "cudaHostRegister of ring %s failed: copies out of it stay pageable (slower)",
                     ring_name(f->ring));
    }
#endif
    log_notice("ready: drafter %d layers, %zu parameters, block %d, ring %s, cluster %s, backend %s", f->dc.num_layers,
               f->dr->n_params, f->dc.block_size, ring_name(f->ring), proto_state_name((unsigned)f->state),
               f->cuda ? "cuda" : "cpu");
    /* the values the config's 0 / -1 / empty keys came to */
    log_info("drafter shape: hidden %d, heads %d / %d kv x %d, intermediate %d, vocab %d, mask token %d; "
             "checkpoints in %s", f->dc.hidden_size, f->dc.num_heads, f->dc.num_kv_heads, f->dc.head_dim,
             f->dc.intermediate_size, f->dc.vocab_size, f->dc.mask_token_id, f->ckpt_root);
    daemon_notify_ready(&f->d, "waiting for the drafter group");

    uint64_t last_status = 0;
    for (;;) {
        if ((r = pump(f, 0)) < 0)
            goto out;
        if (f->stop_now && !f->in_group)
            break;      /* (in a group the stop vote of the next step ends it) */
        if (f->have_group) {
            if ((r = enter_group(f, err, sizeof err)) < 0) {
                if (r == -ECANCELED)    /* (the generation ended, or a stop came: the usual way on) */
                    log_notice("joining generation %" PRIu64 ": %s", f->grp.generation, err);
                else
                    log_error(r, "joining generation %" PRIu64 ": %s", f->grp.generation, err);
                if (r == -ECANCELED || r == -DF_ETIMEOUT || r == -DF_EDEAD || r == -DF_EPEER) {
                    /* a peer did not come, or the coordinator ended the generation: the next */
                    if ((r = group_broken(f, r)) < 0)
                        goto out;
                    continue;
                }
                if (f->ckpt_unloadable) {
                    /* Damaged or gone: the coordinator falls back to the checkpoint before it
                     * (every rank of the generation may say so; it acts on the first). */
                    f->ckpt_unloadable = 0;
                    f->ckpt_bad_code = r;
                    proto_textset(f->ckpt_bad_reason, sizeof f->ckpt_bad_reason, err);
                    client_ckpt_bad(f->cl, f->grp.generation, f->grp.ckpt_step, f->grp.ckpt_dir, r, err);
                    log_notice("asked the coordinator to fall back from checkpoint %s", f->grp.ckpt_dir);
                    if ((r = await_restart(f, r, "its checkpoint does not load", f->grp.generation)) < 0)
                        goto out;
                    continue;
                }
                /* A checkpoint made for another drafter (its config or optimizer layout differs
                 * from this one's: the config changed under a state_dir) loads no better after a
                 * restart: a configuration error that ends the cluster, not a restart loop. */
                int config = r == -DF_ELAYOUT || r == -DF_EVERSION;
                client_error(f->cl, config, r, "%s: joining generation %" PRIu64 ": %s", f->d.ident,
                             f->grp.generation, err);
                f->reported = 1;
                peer_flush_events(&f->d, f->cl, 2000);
                if (config)
                    code = DAEMON_EX_CONFIG;
                goto out;
            }
        }
        if (!f->in_group) {
            if (f->stop_vote)
                break;  /* between generations: the lineage head is the last checkpoint */
            if (!f->joined && !f->await_restart) {
                client_join_group(f->cl);
                f->joined = 1;
                daemon_notify_status(&f->d, "waiting for the drafter group (%u ranks)",
                                     client_welcome(f->cl)->world_size);
            }
            if ((r = pump(f, (int)daemon_wait_slice_ms(&f->d, 250))) < 0)
                goto out;
            continue;
        }
        int stopping = f->stop_vote;
#ifdef DFLASH_HAVE_CUDA
        if (f->gpu) {
            /* A stop vote goes through once the staged batches are trained. */
            if ((r = iterate_cuda(f)) < 0)
                goto out;
            stopping = f->voted_out;
        } else
#endif
        if ((r = iterate(f)) < 0)
            goto out;
        if (stopping)
            break;
        if (mono_ms() - last_status > 2000) {
            last_status = mono_ms();
            daemon_notify_status(&f->d, "%s: step %" PRId64 ", loss %.4f, accept %.2f, %.0f tok/s, rank %d/%d",
                                 proto_state_name((unsigned)f->state), step_count(f), f->loss,
                                 f->accept_len, f->hb_tokens_per_s, f->rank, f->world);
        }
    }
    /* After a STOP read from the stop note no coordinator is left to record a checkpoint, and
     * one outside the ledger's lineage is never loaded: none is written. */
    if (f->stop_now && f->in_group && !client_ended(f->cl))
        checkpoint(f, "stop", 1);
    ckpt_collect(f, 1);
    daemon_notify_stopping(&f->d, "leaving at step %" PRId64, step_count(f));
    peer_flush_events(&f->d, f->cl, 5000);
    log_notice("leaving at step %" PRId64 " after %" PRIu64 " batches, %.1f s idle waiting for slots", step_count(f),
               f->batches, f->idle_s);
    code = DAEMON_EX_OK;
out:
    /* A complete checkpoint is worth finishing, even on an error: before the GPU state goes, which
     * the heartbeats sent while it is waited for still read (the write itself reads the host twin). */
    ckpt_collect(f, 1);
    ckpt_writer_free(f->writer);
#ifdef DFLASH_HAVE_CUDA
    if (code != DAEMON_EX_OK && f->nccl)
        nccl_coll_abort(f->nccl, -DF_EDEAD);
    nccl_coll_close(f->nccl);
    f->nccl = NULL;
    hand_back_untrained(f);    /* (queued again at once, not by the coordinator's sweep for lost ones) */
    feed_free(f->feed);
    f->feed = NULL;
    if (f->gpu_done)
        cudaEventDestroy(f->gpu_done);
    drafter_cuda_free(f->gpu);
    f->gpu = NULL;
#endif
    if (code == DAEMON_EX_FAILURE)
        peer_report_exit(&f->d, f->cl, r, &f->reported);
    peer_bye(&f->d, f->cl, code, code == DAEMON_EX_OK ? 0 : r);
    coll_close(f->coll);
    if (f->metrics)
        fclose(f->metrics);
    client_free(f->cl);
    ring_detach(f->ring);
    drafter_free(f->dr);
    free(f->blocks);
    free(f->work);
    free(f->peers);
    free(f->grp_done);
    id_set_free(&f->trained);
#ifdef DFLASH_HAVE_CUDA
    free(f->fl_peers);
#endif
    if (f->embed)
        target_free_head(f->embed, f->lm_head);
    daemon_done(&f->d);
    return code;
}
