/* proto.h: the dflash control protocol between coordinator-d and every other process.
 * Versioned, length-prefixed frames; fixed little-endian payload structs; one pure decoder. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Bump PROTO_VERSION whenever a payload struct, the enum numbering or a rule below
 * changes. Two things are frozen forever so that a mismatched peer still gets a
 * readable answer: the frame header and the REFUSE payload. */
#define PROTO_VERSION 12                   /* 2: AUTH (TCP peers); 3: checkpoint timings in HEARTBEAT;
                                              4: lease numbers, SKIPPED; 5: dataset checksum and operator
                                              resume count in WELCOME, the count in CONTROL; 6: GROUP
                                              lists the batches kept from earlier generations that
                                              were leased more than once, and the run's batch count;
                                              7: the run's id in GROUP; 8: CKPT_BAD, QUERY checkpoints,
                                              the skipped step in ERROR; 9: the drafter's H2D
                                              time in HEARTBEAT; 10: BYE; 11: the target
                                              model's fingerprint in WELCOME; 12: its
                                              config.json's forward settings in WELCOME */
#define PROTO_MAGIC   0x31504644u           /* bytes "DFP1" on the wire */
#define PROTO_MAX_FRAME (4u << 20)          /* header + payload; larger frames are refused */
#define PROTO_NAME_MAX 64
#define PROTO_PATH_MAX 256
#define PROTO_TEXT_MAX 256
#define PROTO_CONFIG_MAX 512                /* = HF_CONFIG_TEXT_MAX (model/hfconfig.h) */
#define PROTO_NCCL_ID_BYTES 128
#define PROTO_AUTH_TOKEN_MIN 16            /* shared-secret bytes of AUTH */
#define PROTO_AUTH_TOKEN_MAX 256
#define PROTO_MAX_SAMPLES 65536             /* samples in one lease grant */
#define PROTO_MAX_LEASE_REQUEST 1024
#define PROTO_MAX_GROUP_IDS 500000          /* batch ids after a GROUP (4 MB: within a frame) */
#define PROTO_NONE32 UINT32_MAX

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is the little-endian layout of the structs below"
#endif

/*
 * Conversation (c = client library ipc/client.h, s = coordinator-d):
 *
 *  0. Over TCP (cluster.tcp_listen) there is no SO_PEERCRED: the first frame is AUTH
 *     (the shared secret of cluster.tcp_token_file), sent together with the HELLO. A
 *     missing or wrong AUTH is answered with REFUSE and the connection closed; only role
 *     CTL may say HELLO over TCP (targets and drafters need the local ring). Over the
 *     unix socket AUTH is refused.
 *  1. c->s HELLO (first frame, always). The header version must equal PROTO_VERSION,
 *     else s answers REFUSE (frozen layout) and closes. SO_PEERCRED is checked before.
 *     s->c WELCOME: member id, heartbeat period, dead-after, ring (shm) name, dataset
 *     path, cluster state; then WELCOME.n_regrants LEASE_GRANT frames (flag REGRANT):
 *     the leases this process (same owner token = pid + start time) still holds after
 *     a reconnect. Leases the client held that are not re-granted are gone.
 *  2. Targets: LEASE_REQUEST(n) asks for n more leases; grants arrive whenever batches
 *     are pending (a request is remembered, not answered with "none"). The target runs
 *     the forward, writes a ring slot, marks it READY, then sends PUBLISHED(batch, slot).
 *     A target that will not do a lease sends LEASE_RETURN. s may push LEASE_REVOKE.
 *     Leases of a dead target go back to the queue and its WRITING slots are reclaimed;
 *     a READY slot it published stays and is trained.
 *  3. Drafters: JOIN_GROUP; s answers GROUP once drafter.world_size drafters joined
 *     (rank, world size, generation, 128 group-id bytes, collective shm name, latest
 *     durable checkpoint, the run's batch count fixed when the first generation formed:
 *     every rank's learning-rate schedule spans the same steps), followed by the ids of the batches checkpointed by earlier
 *     generations that were leased more than once: a copy of one of those may still reach
 *     the ring from a target that held an older lease (cut off while the batch was leased
 *     again), and the group leaves it out of its steps like a batch it trained itself. The
 *     list is the same for every rank of a generation (no earlier generation changes while
 *     it runs). After each step every rank sends TRAINED(batch, step, rank,
 *     generation); one for the running generation from a drafter that holds no rank in it
 *     is refused (ACK status -DF_EPEER, nothing changes). Rank 0 sends CHECKPOINTED(step, dir, generation) once the checkpoint
 *     is durable: every batch trained at step <= that step in that generation becomes
 *     checkpointed. When a drafter dies s bumps the generation, pushes RESTART to the
 *     survivors (abort the step, reload the checkpoint in RESTART, JOIN_GROUP again),
 *     returns every batch trained after the checkpoint to pending (targets publish it
 *     again), and a slot READING by the dead drafter goes back to READY. A drafter that
 *     consumed a slot but will not train it (a non-finite step it skipped) sends
 *     SKIPPED(batch, lease): the batch goes back to pending. A drafter that cannot load the
 *     GROUP's checkpoint (damaged, removed) sends CKPT_BAD(generation, step, dir, code,
 *     reason) and waits (sending it again after a reconnect until the RESTART comes): s drops that checkpoint and every batch trained after the one
 *     before it in the lineage, and pushes RESTART from that one (FAILED when none is left).
 *     A CKPT_BAD about a checkpoint that is not the lineage's head any more is ignored.
 *     Lease numbers: every grant of a batch carries the batch's count of leases so far
 *     (LEASE_GRANT.lease, 1 for the first; a REGRANT repeats it). The target writes it into
 *     the slot (ring_payload.lease); the drafter names it in TRAINED and SKIPPED. So s tells
 *     the copy a report is about: a SKIPPED, or a TRAINED of a rolled-back generation, about
 *     an earlier copy of a batch that has been queued again since never queues the current
 *     copy again. A TRAINED that counts (its generation kept) about an earlier copy makes the
 *     batch trained: the current copy's lease is revoked, or its READY slot taken back
 *     (ring_retract); a copy a drafter has taken already is trained twice (counted).
 *     A SKIPPED (or a rolled-back TRAINED) that arrives before the target's PUBLISHED is
 *     recorded in the ledger (table untrained) before its ACK: the PUBLISHED, also after a
 *     restart of s in between, then queues the batch again.
 *  4. PUBLISHED, TRAINED, SKIPPED and CHECKPOINTED carry a sequence number; s answers each with
 *     ACK(seq) after the ledger transaction holding it is durable. The client keeps
 *     un-acked events and sends them again after a reconnect; s handles repeats
 *     idempotently (state only moves forward, except by a generation rollback).
 *  5. Any daemon: HEARTBEAT(stats) every heartbeat period; ERROR(fatal, code, message).
 *     s acts: non-fatal = logged and counted; code DF_ENAN = cluster paused (PAUSE
 *     pushed), and until the operator's resume a CHECKPOINTED of ERROR.step or later is
 *     refused (-DF_ESTATE); fatal = drain, then FAILED with the reason (the coordinator
 *     exits 78).
 *     A daemon about to exit says BYE(exit status, reason) last. A target or drafter whose
 *     connection ends without one and whose process is then gone (looked for up to 10 min;
 *     a HELLO from the process ends the look) died unannounced (a signal, a crash, the OOM
 *     killer): s records a non-fatal error naming it.
 *  6. s pushes CONTROL(PAUSE|RESUME|DRAIN|STOP, reason) to daemons. On DRAIN targets
 *     finish/return their leases and drafters write a final checkpoint; STOP = exit.
 *  7. dflashctl (role CTL): QUERY(what) -> REPLY(status, JSON text); CONTROL(cmd) ->
 *     REPLY. Daemons may send QUERY too; a CONTROL from a daemon (and an ERROR from a ctl
 *     client) closes its connection.
 *
 * Frames: proto_hdr then `len` payload bytes. Every payload below is a fixed struct
 * (string fields NUL-terminated inside their arrays, padding zero) except LEASE_GRANT
 * (struct + n_samples u32), GROUP (struct + n_done u64 batch ids) and REPLY (struct +
 * json_len bytes of JSON, no NUL).
 */

enum proto_type {
    PROTO_HELLO = 1,
    PROTO_WELCOME = 2,
    PROTO_REFUSE = 3,
    PROTO_HEARTBEAT = 4,
    PROTO_LEASE_REQUEST = 5,
    PROTO_LEASE_GRANT = 6,
    PROTO_LEASE_REVOKE = 7,
    PROTO_LEASE_RETURN = 8,
    PROTO_PUBLISHED = 9,
    PROTO_JOIN_GROUP = 10,
    PROTO_GROUP = 11,
    PROTO_TRAINED = 12,
    PROTO_CHECKPOINTED = 13,
    PROTO_ACK = 14,
    PROTO_ERROR = 15,
    PROTO_CONTROL = 16,
    PROTO_RESTART = 17,
    PROTO_QUERY = 18,
    PROTO_REPLY = 19,
    PROTO_AUTH = 20,
    PROTO_SKIPPED = 21,
    PROTO_CKPT_BAD = 22,
    PROTO_BYE = 23,
    PROTO_TYPE_MAX
};

enum proto_role { PROTO_ROLE_TARGET = 1, PROTO_ROLE_DRAFTER = 2, PROTO_ROLE_CTL = 3 };

enum proto_cluster_state {
    PROTO_STATE_STARTING = 0,
    PROTO_STATE_RUNNING,
    PROTO_STATE_PAUSED,
    PROTO_STATE_DRAINING,
    PROTO_STATE_STOPPED,
    PROTO_STATE_FAILED,
    PROTO_STATE_MAX
};

enum proto_control_cmd { PROTO_CTL_PAUSE = 1, PROTO_CTL_RESUME, PROTO_CTL_DRAIN, PROTO_CTL_STOP, PROTO_CTL_MAX };

enum proto_query_what {
    PROTO_Q_STATUS = 1, PROTO_Q_RING, PROTO_Q_DAEMONS, PROTO_Q_BATCHES, PROTO_Q_ERRORS, PROTO_Q_CHECKPOINTS, PROTO_Q_MAX
};

#define PROTO_GRANT_REGRANT 1u      /* LEASE_GRANT.flags: re-issued after a reconnect */

struct proto_hdr {
    uint32_t magic;
    uint32_t len;                   /* payload bytes after this header */
    uint16_t version;
    uint16_t type;
};
_Static_assert(sizeof(struct proto_hdr) == 12, "frozen: frame header");

struct proto_hello {
    uint32_t role;                  /* enum proto_role */
    int32_t device;                 /* GPU / worker index; -1 for ctl */
    uint32_t pid;
    uint32_t group_rank;            /* drafters after a reconnect: rank held, else NONE32 */
    uint64_t start_ticks;           /* /proc/<pid>/stat field 22 */
    uint64_t token;                 /* owner token (common/proc.h) used in the ring */
    uint64_t group_generation;      /* drafters after a reconnect: generation held, else 0 */
    char name[PROTO_NAME_MAX];      /* free text shown by dflashctl (host, unit, ...) */
};
_Static_assert(sizeof(struct proto_hello) == 104, "wire size");

struct proto_welcome {
    uint64_t member_id;
    uint32_t heartbeat_ms;
    uint32_t dead_after_ms;
    uint32_t cluster_state;         /* enum proto_cluster_state */
    uint32_t n_regrants;            /* LEASE_GRANT frames that follow */
    uint32_t ring_slots;
    uint32_t world_size;            /* drafter group size */
    uint32_t max_seq_len;           /* samples are truncated to this */
    uint32_t epochs;
    uint64_t dataset_checksum;      /* the header checksum of the dataset the coordinator schedules */
    uint64_t model_fingerprint;     /* the run's target weights (st_fingerprint); 0: not known */
    uint32_t resumes;               /* the operator's resumes of the run so far (see proto_control) */
    uint32_t pad;
    char ring_name[PROTO_NAME_MAX]; /* POSIX shm name of the ring */
    char dataset_path[PROTO_PATH_MAX];
    char model_config[PROTO_CONFIG_MAX];    /* the run's target config.json, as hf_config_forward_text
                                               writes it; "": not known */
};
_Static_assert(sizeof(struct proto_welcome) == 896, "wire size");

/* Frozen across versions (see top). */
struct proto_refuse {
    int32_t code;                   /* negative DF_E* / -errno */
    uint32_t server_version;
    char message[PROTO_TEXT_MAX];
};
_Static_assert(sizeof(struct proto_refuse) == 264, "frozen: refuse");

/* One struct for every role; fields a role does not have stay 0. */
struct proto_heartbeat {
    uint32_t state;                 /* the daemon's view: enum proto_cluster_state */
    uint32_t leases_held;           /* targets */
    uint64_t batches_done;          /* targets: published; drafters: trained */
    uint64_t step;                  /* drafters */
    double forward_ms, wait_ms, write_ms; /* targets, last batch */
    double tokens_per_s;
    double loss, accuracy, accept_len, grad_norm, lr, idle_frac, step_ms; /* drafters */
    double ckpt_pause_ms, ckpt_write_ms;  /* drafter rank 0, last checkpoint: training stalled / written beside */
    double h2d_ms;                  /* CUDA drafters: the last slot's copy to the GPU (0 on the CPU: read in place) */
};
_Static_assert(sizeof(struct proto_heartbeat) == 136, "wire size");

struct proto_lease_request { uint32_t n; uint32_t pad; };
_Static_assert(sizeof(struct proto_lease_request) == 8, "wire size");

/* Followed on the wire by n_samples little-endian u32 dataset sample indices. */
struct proto_lease_grant {
    uint64_t batch_id;
    uint32_t epoch;
    uint32_t flags;                 /* PROTO_GRANT_* */
    uint32_t n_samples;
    uint32_t n_tokens;              /* sum of the samples' lengths after truncation */
    uint32_t max_seq_len;           /* truncation applied to each sample */
    uint32_t lease;                 /* the batch's lease number (>= 1; see rule 3) */
};
_Static_assert(sizeof(struct proto_lease_grant) == 32, "wire size");

struct proto_batch_ref { uint64_t batch_id; };      /* LEASE_REVOKE, LEASE_RETURN */
_Static_assert(sizeof(struct proto_batch_ref) == 8, "wire size");

struct proto_published {
    uint64_t seq;
    uint64_t batch_id;
    uint32_t slot;
    uint32_t n_tokens;
};
_Static_assert(sizeof(struct proto_published) == 24, "wire size");

struct proto_group {
    uint64_t generation;
    uint32_t rank;
    uint32_t world_size;
    uint64_t ckpt_step;             /* valid when ckpt_dir is not empty */
    uint8_t group_id[PROTO_NCCL_ID_BYTES]; /* the generation's id bytes (unused: on the CUDA path rank 0
                                              makes the NCCL id and sends it over coll_name) */
    char coll_name[PROTO_NAME_MAX]; /* shm name of the CPU collective of this generation */
    char ckpt_dir[PROTO_PATH_MAX];  /* latest durable checkpoint; empty = none yet */
    uint64_t run_batches;           /* the run's batches as fixed at its first generation (the
                                       learning-rate horizon of drafter.total_steps = 0) */
    uint32_t n_done;                /* batch ids that follow (rule 3), <= PROTO_MAX_GROUP_IDS */
    uint32_t pad;
    uint64_t run_id;                /* the run (its ledger): a checkpoint folder holds one run's */
};
_Static_assert(sizeof(struct proto_group) == 496, "wire size");

struct proto_trained {
    uint64_t seq;
    uint64_t batch_id;
    uint64_t step;
    uint64_t generation;
    uint32_t rank;
    uint32_t lease;                 /* lease number of the copy trained (its slot's ring_payload.lease) */
};
_Static_assert(sizeof(struct proto_trained) == 40, "wire size");

struct proto_skipped {
    uint64_t seq;
    uint64_t batch_id;
    uint32_t lease;                 /* lease number of the copy taken from the ring and not trained */
    uint32_t pad;
};
_Static_assert(sizeof(struct proto_skipped) == 24, "wire size");

struct proto_ckpt_bad {
    uint64_t generation;            /* the GROUP whose checkpoint would not load */
    uint64_t step;                  /* that checkpoint, as the GROUP named it */
    int32_t code;                   /* negative DF_E* / -errno of the load */
    uint32_t pad;
    char dir[PROTO_PATH_MAX];
    char reason[PROTO_TEXT_MAX];
};
_Static_assert(sizeof(struct proto_ckpt_bad) == 536, "wire size");

struct proto_checkpointed {
    uint64_t seq;
    uint64_t step;
    uint64_t generation;
    char dir[PROTO_PATH_MAX];
};
_Static_assert(sizeof(struct proto_checkpointed) == 280, "wire size");

struct proto_ack { uint64_t seq; int32_t status; uint32_t pad; };
_Static_assert(sizeof(struct proto_ack) == 16, "wire size");

struct proto_error {
    uint32_t fatal;
    int32_t code;                   /* negative DF_E* / -errno; -DF_ENAN pauses the cluster */
    uint64_t step;                  /* -DF_ENAN from a drafter: the step it skipped (the first step
                                       number not trained from before the non-finite value), so no
                                       checkpoint of it or later is taken until the operator's
                                       resume; 0 otherwise */
    char message[PROTO_TEXT_MAX];
};
_Static_assert(sizeof(struct proto_error) == 272, "wire size");

struct proto_bye {
    uint32_t exit_status;           /* the process's exit status (0 done, 1 failed, 78 configuration) */
    uint32_t pad;
    char reason[PROTO_TEXT_MAX];    /* "target-d@0 exits 0", "drafter-d@1 exits 1: <error>" */
};
_Static_assert(sizeof(struct proto_bye) == 264, "wire size");

/* The most of an operator's reason a control keeps whole: the coordinator keeps it after who sent
 * it ("pause by dflashctl (pid N, uid M): "), all within PROTO_TEXT_MAX. */
#define PROTO_REASON_MAX 160

struct proto_control {
    uint32_t cmd;                   /* enum proto_control_cmd */
    uint32_t resumes;               /* s->c: the operator's resumes so far, counted by the coordinator
                                       (kept in its ledger): a daemon away during one learns of it
                                       from the next WELCOME */
    char reason[PROTO_TEXT_MAX];
};
_Static_assert(sizeof(struct proto_control) == 264, "wire size");

struct proto_restart {
    uint64_t generation;            /* the new generation to join */
    uint64_t ckpt_step;
    char ckpt_dir[PROTO_PATH_MAX];  /* reload this; empty = start from scratch */
};
_Static_assert(sizeof(struct proto_restart) == 272, "wire size");

struct proto_query {
    uint32_t what;                  /* enum proto_query_what */
    uint32_t limit;                 /* rows for list queries; 0 = default */
};
_Static_assert(sizeof(struct proto_query) == 8, "wire size");

/* Followed on the wire by json_len bytes of JSON. */
struct proto_reply {
    int32_t status;                 /* 0 or a negative code; JSON then has "error" */
    uint32_t json_len;
};
_Static_assert(sizeof(struct proto_reply) == 8, "wire size");

/* TCP peers only, first frame. */
struct proto_auth {
    uint32_t len;                   /* token bytes: [PROTO_AUTH_TOKEN_MIN, PROTO_AUTH_TOKEN_MAX] */
    uint32_t pad;
    uint8_t token[PROTO_AUTH_TOKEN_MAX]; /* the shared secret; bytes past len are zero */
};
_Static_assert(sizeof(struct proto_auth) == 264, "wire size");

/* A decoded message. Pointers (grant samples, reply json) point into the decoded
 * buffer: valid while that buffer is. */
struct proto_msg {
    uint16_t type;
    uint16_t version;
    union {
        struct proto_hello hello;
        struct proto_welcome welcome;
        struct proto_refuse refuse;
        struct proto_heartbeat heartbeat;
        struct proto_lease_request lease_request;
        struct proto_lease_grant grant;
        struct proto_batch_ref batch;           /* LEASE_REVOKE, LEASE_RETURN */
        struct proto_published published;
        struct proto_group group;
        struct proto_trained trained;
        struct proto_skipped skipped;
        struct proto_ckpt_bad ckpt_bad;
        struct proto_checkpointed checkpointed;
        struct proto_ack ack;
        struct proto_error error;
        struct proto_bye bye;
        struct proto_control control;
        struct proto_restart restart;
        struct proto_query query;
        struct proto_reply reply;
        struct proto_auth auth;
    };
    const void *samples;            /* LEASE_GRANT: n_samples LE u32 (maybe unaligned) */
    const void *ids;                /* GROUP: n_done LE u64 batch ids (maybe unaligned) */
    const char *json;               /* REPLY: json_len bytes, not NUL-terminated */
};

/* Bytes needed to encode m (header included), or <0 if m is invalid. */
int64_t proto_encoded_size(const struct proto_msg *m);
/* Encode m into buf (header + payload, version PROTO_VERSION). Returns the frame size,
 * -ENOSPC if cap is too small, -DF_ERANGE/-DF_EFORMAT if m is invalid (err filled). */
int64_t proto_encode(const struct proto_msg *m, void *buf, size_t cap, char *err, size_t errlen);

/* Stream framing: look at the first `len` received bytes. Returns the full frame size
 * when a complete, plausible header is there (the frame itself may still be partial),
 * 0 if fewer than a header's bytes are there, or <0 (bad magic, oversized; in this
 * version's frames an unknown type or a length its type cannot have) with the reason in err.
 * Another version is not refused here: proto_decode names it. */
int64_t proto_frame_size(const void *buf, size_t len, char *err, size_t errlen);

/* Decode exactly one frame of `len` bytes. Pure: no allocation, no global state.
 * Rejects with a reason: truncated (-DF_ETRUNC), oversized (-E2BIG), trailing bytes,
 * bad magic (-DF_EMAGIC), wrong version (-DF_EVERSION; REFUSE is decoded from any
 * version), unknown type, wrong payload size, bad enum values, strings without NUL,
 * non-zero padding (-DF_EFORMAT). */
int proto_decode(const void *buf, size_t len, struct proto_msg *m, char *err, size_t errlen);

/* Sample i of a decoded (or to-be-encoded) grant. */
static inline uint32_t proto_grant_sample(const struct proto_msg *m, uint32_t i)
{
    uint32_t v;
    __builtin_memcpy(&v, (const uint8_t *)m->samples + (size_t)i * 4, 4);
    return v;
}

/* Batch id i of a decoded (or to-be-encoded) GROUP. */
static inline uint64_t proto_group_id(const struct proto_msg *m, uint32_t i)
{
    uint64_t v;
    __builtin_memcpy(&v, (const uint8_t *)m->ids + (size_t)i * 8, 8);
    return v;
}

const char *proto_type_name(unsigned type);
const char *proto_role_name(unsigned role);
const char *proto_state_name(unsigned state);
const char *proto_control_name(unsigned cmd);
const char *proto_query_name(unsigned what);
/* Parse names back (dflashctl); return the value or -EINVAL. */
int proto_control_parse(const char *s);
int proto_query_parse(const char *s);

/* Copy a C string into a fixed field, truncating; the rest is zeroed. */
void proto_strset(char *dst, size_t cap, const char *src);
/* proto_strset for text people read (an error, a reason): one too long ends in "..." (cut on a
 * UTF-8 character's boundary), so a reader knows the end is missing. */
void proto_textset(char *dst, size_t cap, const char *src);
