/* coord.h: coordinator-d internals shared by its modules: the cluster state (batches,
 * members, drafter group), the libuv server, the ring and the ledger. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>
#include "common/config.h"
#include "common/daemon.h"
#include "common/dataset.h"
#include "common/timeutil.h"
#include "daemons/coordinator/ledger.h"
#include "daemons/coordinator/sched.h"
#include "ipc/proto.h"
#include "ipc/ring.h"

struct ring;
struct member;

/* A timed piece of the coordinator's own work: the last duration and the largest. */
struct coord_timer { double last_ms, max_ms; };

static inline void coord_timer_note(struct coord_timer *t, uint64_t t0_ns)
{
    t->last_ms = (double)(mono_ns() - t0_ns) / 1e6;
    if (t->last_ms > t->max_ms)
        t->max_ms = t->last_ms;
}

struct batch {
    struct ledger_batch row;        /* the durable part; written through on every change */
    struct member *holder;          /* LEASED to this live connection; NULL = detached */
    uint64_t detached_until_ms;     /* LEASED + detached: warn once after this (mono) that its live
                                       target has not come back */
    struct batch *lnext, *lprev;    /* LEASED / PUBLISHED / TRAINED: its place in that state's list
                                       (coord_state_list) */
    bool consumed_early;            /* LEASED: a drafter took it from the ring before its target's
                                       PUBLISHED arrived, and that training does not count (a skipped
                                       step, or a generation rolled back); settled on PUBLISHED */
    uint64_t orphan_since_ms;       /* PUBLISHED: no slot has held it since (mono; 0 = in a slot) */
};

struct epoch_state {
    int built;
    uint32_t loaded;                /* rows read back from the ledger */
    struct sched_epoch s;
    struct batch *b;                /* [s.n_batches] */
    uint32_t done;                  /* of them CHECKPOINTED (batch_set keeps it) */
};

struct member {
    union {                         /* first: the handle's address is the member's */
        uv_handle_t handle;
        uv_stream_t stream;         /* what the server code uses for either kind */
        uv_pipe_t pipe;             /* the unix control socket */
        uv_tcp_t tcp;               /* cluster.tcp_listen */
    };
    struct coord *co;
    bool is_tcp;                    /* no SO_PEERCRED: pid/uid/gid unknown, AUTH required */
    bool authed;                    /* TCP: the AUTH token matched */
    char peer[64];                  /* TCP: the remote address, "a.b.c.d:port" / "[v6]:port" */
    struct member *prev, *next;
    uint64_t id;
    int role;                       /* enum proto_role, 0 before HELLO */
    int device;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    uint64_t token;                 /* owner token (pid + start time) checked against the kernel */
    char name[PROTO_NAME_MAX];
    bool closing;
    uint64_t connected_ms, last_seen_ms;    /* mono */
    uint64_t last_request_ms;       /* ctl: its last HELLO, QUERY or CONTROL (heartbeats do not count) */
    struct proto_heartbeat hb;
    bool have_hb;
    uint32_t want;                  /* targets: leases asked for, not yet granted */
    uint32_t leases;                /* targets: leases held */
    uint64_t published, trained;    /* events counted for status */
    bool joined;                    /* drafters: JOIN_GROUP received, waiting or in the group */
    uint64_t err_window_ms;         /* ERRORs recorded in the current window (COORD_ERRORS_PER_WINDOW) */
    uint32_t err_n, err_unrecorded;
    int rank;                       /* in the active group, else -1 */
    uint8_t *rx;
    size_t rx_len, rx_cap;
    uint8_t *tx;                    /* encoded frames held until the ledger commit */
    size_t tx_len, tx_cap;
    const char *tx_closed;          /* why frames are no longer queued (more than COORD_TX_MAX not yet
                                     * read by the peer, or out of memory): closed at the flush */
    bool write_failed;              /* closed by the next flush */
    uint64_t close_deadline_ms;     /* closing: handle closed now, pending writes cancelled */
    bool said_bye;                  /* targets, drafters: BYE received (leaving on purpose) */
    bool hung_up;                   /* its connection ended from its side (EOF, reset) */
    char bye[96];                   /* its reason (cut to fit) */
};

/* A member that left, kept for `dflashctl daemons` (alive = false). */
struct departed {
    int role, device;
    pid_t pid;
    char name[PROTO_NAME_MAX];
    char reason[96];
    uint64_t left_wall_ms;
    struct proto_heartbeat hb;
    uint64_t token;                 /* the process (pid + start time) */
};
#define COORD_DEPARTED_MAX 32

/* A target or drafter whose connection ended without its BYE: looked for (coord_watch_departed)
 * until its process is gone, then recorded as an error; or until it connects again, or for at
 * most COORD_DEATH_WATCH_MS (alive all along: a frozen process, cut off for good). */
struct death_watch {
    uint64_t token;                 /* 0 = a free entry */
    uint64_t until_ms;              /* mono */
    int role, device;
    pid_t pid;
    bool hung_up;                   /* it hung up; else the coordinator closed its connection */
    char name[PROTO_NAME_MAX];
    char reason[96];                /* why its connection ended */
};
#define COORD_WATCH_MAX 64              /* when full, the one watched longest is given up */
#define COORD_DEATH_WATCH_MS 600000

struct error_rec {
    uint64_t wall_ms;
    int role, device, fatal, code;
    pid_t pid;
    char message[PROTO_TEXT_MAX];
};
#define COORD_ERRORS_KEPT 64
/* dflashctl connections: at most this many open at once; one that asks nothing for this long
 * (heartbeats do not count) is closed (each holds a descriptor of the coordinator's). */
#define COORD_CTL_MAX 64
#define COORD_CTL_IDLE_MS 60000
/* After the cluster ends, a dflashctl connected from before the end (a `--wait` polling) gets
 * this long to ask once more and see how it ended before the coordinator leaves. */
#define COORD_CTL_LAST_LOOK_MS 1000
/* Bytes a peer may leave unread (queued in libuv plus held for the next flush) before it is
 * closed; a closed peer's last writes get COORD_CLOSE_GRACE_MS, then its handle is closed. */
#define COORD_TX_MAX (32u << 20)
#define COORD_CLOSE_GRACE_MS 5000
/* A daemon's ERRORs recorded (log, error log, ledger) per 10 s window; more are counted and
 * said with its first error after the window: one stuck in a loop cannot fill the disk. A fatal
 * one, or a non-finite one that pauses the cluster, always counts; each still acts. */
#define COORD_ERRORS_PER_WINDOW 50
#define COORD_ERRORS_WINDOW_MS 10000

struct dgroup {
    uint64_t gen;                   /* latest generation formed (0 = none yet) */
    bool active;
    uint32_t world;
    uint32_t world_was;             /* the running generation's ranks, when drafter.world_size changed
                                       across a restart (0: not changed): it ends once the ring is open */
    struct member **rank_member;    /* [world]: NULL when that rank is detached */
    uint64_t *rank_token;           /* [world] */
    uint64_t *rank_deadline_ms;     /* [world]: a detached rank's own: the group fails after it (0: none) */
    uint8_t id[PROTO_NCCL_ID_BYTES];
    char coll_name[PROTO_NAME_MAX];
    /* latest durable checkpoint (the lineage head) */
    uint64_t ckpt_gen, ckpt_step;
    char ckpt_dir[PROTO_PATH_MAX];
    /* kept steps of ended generations: step <= limit is in the lineage (-1: none) */
    uint64_t *lim_gen;
    int64_t *lim_step;
    size_t n_lim;
    /* the batch ids every GROUP of generation done_gen names (see done_by_earlier) */
    uint64_t *done;
    uint32_t n_done;
    uint64_t done_gen;              /* 0: not made yet */
};

struct coord {
    struct daemon d;
    const struct dflash_cfg *cfg;
    uv_loop_t *loop;
    uv_pipe_t server;
    uv_tcp_t tcp_server;            /* cluster.tcp_listen; tcp_on says it is in use */
    bool tcp_on;
    char tcp_addr[64];              /* the bound address, port 0 resolved */
    struct sockaddr_storage tcp_sa; /* cluster.tcp_listen, resolved once at start */
    uint8_t tcp_token[PROTO_AUTH_TOKEN_MAX]; /* cluster.tcp_token_file, zero-padded */
    uint32_t tcp_token_len;
    uv_signal_t sigterm, sigint;
    uv_timer_t tick;
    uv_check_t flush_check;
    char socket_path[108];
    bool socket_bound;              /* ours to remove at the end */
    bool accept_held[2];            /* a connection on the socket [0] / TCP [1] listener waits for memory */
    uint64_t fd_limit;              /* RLIMIT_NOFILE's soft limit, raised to the hard one at start */
    uint64_t fd_warned_ms;          /* when the last "descriptors nearly all in use" was logged */
    char ring_name[PROTO_NAME_MAX];
    char ledger_path[CFG_STR_MAX + 64];
    gid_t allowed_gid;              /* cluster.group, or (gid_t)-1 */
    uid_t self_uid;

    struct dataset ds;
    uint32_t *lengths;              /* per sample, before truncation */
    struct sched_params sp;
    uint32_t epochs;
    struct epoch_state *ep;         /* [epochs] */
    uint64_t counts[BATCH_NSTATES];
    uint64_t commits;               /* ledger transactions */
    struct coord_timer commit, check;   /* its own timings (a commit; the periodic checks), in the status */
    struct batch *leased;           /* every LEASED batch (the periodic checks walk these, not all) */
    struct batch *published;        /* every PUBLISHED batch (the orphan sweep walks these) */
    struct batch *trained;          /* every TRAINED batch (a checkpoint or a rollback walks these) */
    uint64_t total_batches;         /* over built epochs */
    uint64_t run_id;                /* the run's name (ledger meta "run_id", made with the ledger) */
    uint64_t run_batches;           /* the run's batches as estimated when the first generation
                                       formed (ledger meta "run_batches"; 0 = none formed yet) */
    /* pending batch ids: a min-heap with lazy deletion (state checked on pop) */
    uint64_t *heap;
    size_t heap_len, heap_cap;

    struct ring *ring;
    struct ledger *ledger;

    struct member *members;         /* connected peers (any role, after accept) */
    struct member *closing;         /* closed, waiting for their last writes (or the deadline) */
    uint64_t next_member_id;
    struct departed departed[COORD_DEPARTED_MAX];
    size_t n_departed, departed_next;
    struct death_watch watch[COORD_WATCH_MAX];
    bool server_closing;            /* coord_server_close: members closed at the coordinator's exit */

    struct dgroup grp;

    int state;                      /* enum proto_cluster_state */
    char reason[PROTO_TEXT_MAX];    /* why paused / draining / failed */
    bool fatal;                     /* draining because of a fatal error: end FAILED */
    bool finishing;                 /* draining for the run's final checkpoint: drafters only */
    bool nan_pending;               /* a non-finite value was reported and the operator has not
                                       resumed since: its drafters write no checkpoint, so no drain
                                       could end (a DRAIN is refused until the resume) */
    uint64_t nan_step;              /* with nan_pending: the earliest step a drafter skipped for it
                                       (0: not said); a CHECKPOINTED of it or later is refused */
    int signal_drain_from;          /* draining on a stop signal: the state before it, else -1 */
    uint32_t resumes;               /* the operator's resumes (dflashctl resume) of this run */
    bool recovering;                /* restarted from a ledger: waiting for peers */
    uint64_t recovery_until_ms;
    uint64_t stopped_ms;            /* when STOPPED/FAILED was entered */
    bool stop_hurry;                /* a stop signal once stopped: leave without the daemons */
    bool stop_wait_logged;          /* "waiting for N daemons" said */
    uint64_t ended_ms;              /* ... and no target or drafter was left (0: not yet): what
                                       they wrote at the stop (a stop checkpoint) is in by then */
    uint64_t last_tick_ms;          /* coord_tick: when it last ran (mono) */
    bool tick_skipped_hb;           /* ... and it judged no heartbeat then (it came late) */
    uint64_t stalls, stall_ms_max;  /* ticks later than heartbeat_ms (the loop was held up), the longest gap */
    uint64_t stall_logged_ms;       /* when a stall was last logged (mono) */
    int exit_code;
    bool ring_created;
    int ring_lock;                  /* coord_ring_open: the ring's object held (ring_hold) for the process's life */
    struct ring_layout lay;         /* the ring's, from the config (coord_ring_layout) */
    int model_vocab;                /* the model's config.json vocab_size (0: no model.path) */
    uint64_t model_fp;              /* the run's target weights (st_fingerprint; the ledger keeps it); 0: unknown */
    char model_config[PROTO_CONFIG_MAX];    /* its config.json (hf_config_forward_text; the ledger keeps
                                               it); "": unknown */
    uint64_t ring_checked_ms;       /* coord_ring_check: when the name was last looked up (mono) */
    /* coordinator.min_free_mb: the free space of the ledger's and the checkpoints' filesystems,
     * looked at once a second (check_space); three looks in a row below it pause the cluster,
     * three at twice it resume a pause of its own. */
    struct {
        bool paused;                /* the cluster is PAUSED for want of space (saved in the ledger) */
        uint64_t free_mb;           /* the lesser free space at the last look (UINT64_MAX: none read) */
        const char *where;          /* ... the folder it is for */
        unsigned low, high;         /* looks in a row below min_free_mb / at twice it or more */
        bool warned;                /* a folder could not be looked at (logged once) */
        char ckpt_dir[CFG_STR_MAX + 16], ledger_dir[CFG_STR_MAX + 64];
        /* statvfs runs on a thread of its own, once a second (a network mount that hangs must
         * not hold the loop; the thread is left behind at exit): per folder (ledger,
         * checkpoints), the free MiB or -errno, and a count of looks done. */
        _Atomic int64_t look[2];
        _Atomic uint64_t looks;
        uint64_t looks_seen, seen_ms;   /* the count at the last verdict, and when it moved (mono) */
        bool hang_warned, thread_on;
    } space;
    uint64_t refusals_window_ms, refusals_logged, refusals_unlogged;   /* coord_refuse's log limit */
    bool ring_check_warned;         /* ... and could not be (logged once) */

    struct error_rec errors[COORD_ERRORS_KEPT];
    uint64_t n_errors, n_fatal;
    uint64_t duplicates;            /* duplicate publications / trainings seen */
    uint64_t retracted;             /* copies of trained batches taken out of the ring */
    uint64_t requeues;              /* leases that went back to the queue */
    uint64_t start_wall_ms, start_mono_ms;
    uint64_t last_status_ms;
};

/* coord_server.c */
int coord_server_start(struct coord *co, char *err, size_t errlen);
void coord_server_close(struct coord *co);
/* Close any handle of the loop at exit; member pipes with a pending shutdown included. */
void coord_close_handle(uv_handle_t *h);
/* Queue a message to m; it is written after the next ledger commit. */
int coord_send(struct member *m, const struct proto_msg *msg);
/* Refuse (REFUSE frame, then close) with a logged reason. */
void coord_refuse(struct member *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void coord_close_member(struct member *m, const char *reason);
/* From the tick: drop TCP peers that did not authenticate and say HELLO in time. */
void coord_server_tick(struct coord *co);
/* Commit the ledger, then write every queued frame. Exits the process if the commit fails. */
void coord_flush(struct coord *co);

/* coord_cluster.c */
int coord_cluster_init(struct coord *co, char *err, size_t errlen);   /* dataset, schedule, ledger recovery */
int coord_space_start(struct coord *co);    /* the free-space thread of coordinator.min_free_mb */
void coord_cluster_done(struct coord *co);
void coord_handle(struct member *m, const struct proto_msg *msg);
void coord_member_gone(struct member *m, const char *reason);
/* Watch m (a target or drafter whose connection ends now without its BYE; hung_up: it hung up,
 * else the coordinator closes it for `reason`); a process that connects again ends its watch. */
void coord_watch_start(struct coord *co, const struct member *m, bool hung_up, const char *reason);
void coord_watch_end(struct coord *co, uint64_t token);
/* Each watched process that is gone now is recorded as a non-fatal error (-DF_EDEAD), once: it
 * died without a word (a signal, a crash, the OOM killer) or, closed by the coordinator, it is
 * gone without one. */
void coord_watch_departed(struct coord *co);
void coord_tick(struct coord *co);                  /* timeouts, recovery, completion */
void coord_signal_stop(struct coord *co, int hard);
void coord_set_state(struct coord *co, int state, const char *reason);
/* The run's batches: those of the scheduled epochs, the others counted at epoch 0's size. */
uint64_t coord_est_batches(const struct coord *co);
struct batch *coord_batch(struct coord *co, uint64_t id);

/* The list of the batches in `state`: LEASED, PUBLISHED and TRAINED ones are few (those in
 * flight and those since the last checkpoint), and the periodic checks, a checkpoint and a
 * rollback walk these rather than every batch (NULL for PENDING and CHECKPOINTED). A batch is
 * linked when it enters the state and unlinked when it leaves it (batch_set). */
static inline struct batch **coord_state_list(struct coord *co, int state)
{
    return state == BATCH_LEASED ? &co->leased : state == BATCH_PUBLISHED ? &co->published
         : state == BATCH_TRAINED ? &co->trained : NULL;
}

/* Targets and drafters connected (closing ones too: their last frames are still read). */
static inline int coord_daemons_left(const struct coord *co)
{
    int n = 0;
    for (const struct member *m = co->members; m; m = m->next)
        n += m->role == PROTO_ROLE_TARGET || m->role == PROTO_ROLE_DRAFTER;
    return n;
}

/* STOPPED or FAILED with no target or drafter left: the run's end as it will be in the ledger. */
static inline bool coord_ended(const struct coord *co)
{
    return (co->state == PROTO_STATE_STOPPED || co->state == PROTO_STATE_FAILED) && !coord_daemons_left(co);
}

static inline void coord_list_link(struct batch **head, struct batch *b)
{
    b->lprev = NULL;
    b->lnext = *head;
    if (*head)
        (*head)->lprev = b;
    *head = b;
}

static inline void coord_list_unlink(struct batch **head, struct batch *b)
{
    if (b->lprev)
        b->lprev->lnext = b->lnext;
    else
        *head = b->lnext;
    if (b->lnext)
        b->lnext->lprev = b->lprev;
    b->lnext = b->lprev = NULL;
}
/* data.path opened (dataset_open flags), an error naming the key (file:line: data.path: ...). */
int coord_dataset_open(struct coord *co, struct dataset *ds, unsigned flags, char *err, size_t errlen);
int coord_ring_layout(struct coord *co, char *err, size_t errlen);     /* coord_ring.c: co->lay */
int coord_ring_open(struct coord *co, char *err, size_t errlen);
void coord_ring_reconcile(struct coord *co);        /* after (re)attach: adopt READY slots */
void coord_ring_settle(struct coord *co);           /* clean exit: dead owners' slots, trained copies */
int coord_ring_check(struct coord *co, char *why, size_t len);  /* 0: the name still names our ring */
void coord_group_close(struct coord *co);           /* the group ends with the run */

/* coord_json.c: the answer to QUERY (malloc'd JSON text). */
char *coord_json(struct coord *co, int what, uint32_t limit);
char *coord_json_result(struct coord *co, int ok, const char *error);
