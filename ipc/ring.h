/* ring.h: the crash-safe shared-memory slot ring between target-d and drafter-d.
 * One POSIX shm object per cluster; per-slot 64-bit control words changed only by CAS. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Layout of the shared object (all offsets from the start of the mapping):
 *   [0, 4096)              struct ring_hdr: magic, version, layout, creator, counters, the
 *                          futex words and the table of parked waiters
 *   [4096, ctl_end)        nslots x 64-byte slot control blocks (state word, seq, times)
 *   slot i at slot_off + i * slot_stride (4096-aligned):
 *     struct ring_payload, cu_seqlens[max_seqs+1] i32, token_ids[max_tokens] u32,
 *     loss_mask[max_tokens] u8, padding to 4096, then hidden [max_tokens, L*H] bf16.
 * Bump RING_VERSION whenever anything in this layout or the state encoding changes. */
#define RING_MAGIC        0x474e495248534c46ull /* "FLSHRING" little-endian */
#define RING_VERSION      4u   /* 2: ring_payload.lease; 3: the waiter table; 4: the creator's tag */
#define RING_MAX_LAYERS   64
#define RING_ALIGN        4096u   /* tensor area and slot stride alignment (DMA, cudaHostRegister) */

enum ring_dtype { RING_DTYPE_BF16 = 1 };

/* What a slot holds. The creator sets it; an attacher states what it expects. */
struct ring_layout {
    uint32_t nslots;
    uint32_t hidden;                      /* H: target hidden size */
    uint32_t n_layers;                    /* L: captured layers */
    uint32_t layer_ids[RING_MAX_LAYERS];  /* captured layer ids (first n_layers used) */
    uint32_t dtype;                       /* enum ring_dtype */
    uint32_t max_tokens;                  /* tokens per slot */
    uint32_t max_seqs;                    /* sequences per slot */
};

/* Slot states; the control word is (value << 2) | state, value = owner token
 * (WRITING/READING), ready sequence number (READY) or 0 (FREE). */
enum ring_state { RING_FREE = 0, RING_WRITING = 1, RING_READY = 2, RING_READING = 3 };

/* Header of each slot's payload, written by the producer between claim and publish. */
struct ring_payload {
    uint64_t batch_id;
    uint32_t epoch;
    uint32_t n_seqs;        /* sequences packed in this slot (<= max_seqs) */
    uint32_t n_tokens;      /* tokens packed (<= max_tokens) = cu_seqlens[n_seqs] */
    uint32_t flags;         /* producer-defined */
    uint64_t checksum;      /* producer-defined (0 = none) */
    uint64_t producer;      /* owner token of the writer, set by ring_publish */
    uint32_t lease;         /* producer-defined: dflash targets write the coordinator's lease number */
    uint32_t reserved32;
    uint64_t reserved[2];
};
_Static_assert(sizeof(struct ring_payload) == 64, "ring_payload is part of the shm layout");

struct ring;  /* one process's handle: the mapping + its owner token */

/* ---- create / attach ---------------------------------------------------------- */

struct ring_create_opts {
    unsigned mode;              /* permission bits of the shm object, e.g. 0660 (0 = 0600) */
    int gid;                    /* group for the object (fchown), -1 = leave as is */
    uint32_t stuck_writing_ms;  /* WRITING longer than this with a live owner is flagged in stats (0 = 600000) */
    unsigned flags;             /* RING_CREATE_* */
    uint64_t tag;               /* the creator's name for what the ring holds (the coordinator: its
                                   run id), read back in ring_stats.tag; never changed */
};
#define RING_CREATE_REPLACE 1u  /* unlink an existing object of that name first (else -EEXIST) */

/* Create the shm object `name` ("/dflash-x"), reserve all its memory with posix_fallocate
 * (a full /dev/shm fails here with -ENOSPC, never SIGBUS later), initialise every slot
 * FREE. The caller's process becomes the creator. On error *out is NULL, the object is
 * removed again and err names the object and the reason. */
int ring_create(struct ring **out, const char *name, const struct ring_layout *layout,
                const struct ring_create_opts *opts, char *err, size_t errlen);

#define RING_ATTACH_ANY    1u   /* accept whatever layout is there (ring_layout() tells) */
#define RING_ATTACH_RDONLY 2u   /* map read-only: stats and payload reads only (dflashctl) */
#define RING_ATTACH_POPULATE 4u /* prefault the whole mapping now (MAP_POPULATE), not on first touch */

/* Attach to an existing ring. Checks, in order: the object exists, is large enough to hold
 * a header, magic (-DF_EMAGIC: not a dflash ring), version (-DF_EVERSION), header
 * consistency (-DF_EFORMAT), object size (-DF_ETRUNC), then unless RING_ATTACH_ANY the
 * slot count and payload layout against *expect (-DF_ELAYOUT, err names the field).
 * A header still being initialised gives -EAGAIN (its creator names itself in the header before
 * the object is sized and filled). Never maps beyond the object's size. */
int ring_attach(struct ring **out, const char *name, const struct ring_layout *expect,
                unsigned flags, char *err, size_t errlen);

/* Attaches refuse an object every user may write, or one owned by neither this user nor root;
 * objects of `uid` are taken too from now on (a daemon: the user owning the coordinator's socket,
 * which made the ring). (uid_t)-1 takes that back. Process-wide. */
void ring_trust_user(uid_t uid);

/* Whether the object under `name` is a ring (its magic) or one a ring_create left unfinished, read
 * without the trust checks of ring_attach (for the coordinator's choice to replace an untrusted
 * object only if it is dflash's): 1, 0 (something else), or -errno (cannot be read). */
int ring_is_dflash_object(const char *name);

/* Hold the shm object now called `name` for this process: an exclusive flock on it, let go when the
 * returned fd (O_CLOEXEC) is closed or the process ends. The coordinator holds its ring so that a
 * second coordinator under the same ring name (another cluster of that name) takes over, remakes
 * or replaces nothing in use. The fd, or -EBUSY (another process holds it), -ENOENT, -errno;
 * err says which object and why. */
int ring_hold(const char *name, char *err, size_t errlen);

/* Unmap and free the handle (NULL is fine). Slots this handle still holds stay claimed
 * until reclaimed: detaching is not releasing. */
void ring_detach(struct ring *r);
/* Remove the shm object name; mappings stay valid. 0, or -errno (-ENOENT if absent). */
int ring_unlink(const char *name);
/* 1 when the shm object now called name is the one r maps; 0 when it is another (re-created
 * meanwhile, or anything else put under the name: a link, a FIFO), none, or the same one cut
 * short below r's mapping; -errno when that cannot be told (looked up by name in /dev/shm, not
 * opened: no permission on the object is needed). */
int ring_same_object(const struct ring *r, const char *name);

const struct ring_layout *ring_layout(const struct ring *r);
const char *ring_name(const struct ring *r);
/* The whole mapping, e.g. for cudaHostRegister. */
void *ring_base(const struct ring *r);
size_t ring_map_size(const struct ring *r);

/* Owner token used by this handle's claims: by default the process's pid+start-time token
 * (proc_self_token); a daemon holding a coordinator lease may set a lease token instead. */
uint64_t ring_owner(const struct ring *r);
int ring_set_owner(struct ring *r, uint64_t token);

/* ---- slot transitions (hot path: no syscalls unless a futex wait/wake is needed) ---- */

/* timeout_ms: -1 waits forever, 0 only tries. Waits park on a futex, never spin. */

/* FREE -> WRITING(owner). Picks any FREE slot; a full ring blocks (back-pressure).
 * 0 and *slot, -DF_ETIMEOUT, -EROFS on a read-only handle. */
int ring_claim_write(struct ring *r, int timeout_ms, unsigned *slot);
/* WRITING(owner) -> READY(next seq). Fill the payload (header fields n_seqs, n_tokens,
 * cu_seqlens, tokens, mask, hidden) first. -DF_ESTATE when the slot is not WRITING by this
 * owner any more (it was reclaimed: the payload is not delivered). -DF_ERANGE when the
 * payload header exceeds the layout (n_tokens > max_tokens, n_seqs > max_seqs). */
int ring_publish(struct ring *r, unsigned slot);
/* WRITING(owner) -> FREE without delivering. -DF_ESTATE as above. */
int ring_abort_write(struct ring *r, unsigned slot);

enum ring_pick_policy { RING_PICK_OLDEST = 0, RING_PICK_RANDOM = 1 };
struct ring_pick {
    enum ring_pick_policy policy;   /* OLDEST: lowest ready seq; RANDOM: uniform among READY */
    uint32_t min_ready;             /* wait until this many slots are READY (0/1 = any) ... */
    int ready_timeout_ms;           /* ... or until this long has passed, then take what there is */
    uint64_t since_ns;              /* 0: that wait starts in this call (when a slot is READY) and its
                                       timeout also ends it; else the mono_ns() at which the caller
                                       began a wait that spans calls (short slices between
                                       heartbeats): the ready timeout counts from then, and a call
                                       that times out sooner takes nothing below min_ready */
};
/* READY -> READING(owner), chosen by *pick (NULL = oldest, min_ready 1). Empty ring parks
 * the caller. 0 and *slot, -DF_ETIMEOUT (nothing READY before timeout_ms), -EROFS. */
int ring_claim_read(struct ring *r, const struct ring_pick *pick, int timeout_ms, unsigned *slot);
/* READING(owner) -> FREE. -DF_ESTATE when the slot was reclaimed from this owner
 * meanwhile: another writer may have overwritten it, so discard what was read. */
int ring_release(struct ring *r, unsigned slot);
/* READING(owner) -> READY with its original seq (give it back undelivered). */
int ring_requeue(struct ring *r, unsigned slot);

/* READY -> FREE without delivering: for the coordinator, a published copy of a batch that must
 * not be trained (trained already, or a second copy of a batch published elsewhere). Only while
 * the slot is READY with batch_id, and (keep_lease != 0) its payload's lease is not keep_lease:
 * 0, or -DF_ESTATE (taken by a reader meanwhile, another batch, or the copy to keep), -EROFS,
 * -EINVAL (no such slot). */
int ring_retract(struct ring *r, unsigned slot, uint64_t batch_id, uint32_t keep_lease);

/* Wake every process waiting in claim_write/claim_read so it re-checks (e.g. on shutdown
 * paired with a short timeout loop in the caller). */
void ring_wake_all(struct ring *r);

/* ---- slot payload access --------------------------------------------------------- */

struct ring_payload *ring_slot_header(const struct ring *r, unsigned slot);
int32_t  *ring_slot_cu_seqlens(const struct ring *r, unsigned slot);  /* [max_seqs + 1] */
uint32_t *ring_slot_tokens(const struct ring *r, unsigned slot);      /* [max_tokens] */
uint8_t  *ring_slot_loss_mask(const struct ring *r, unsigned slot);   /* [max_tokens] */
/* Hidden states [max_tokens, L*H] bf16, 4096-aligned; row t starts at t * pitch bytes;
 * captured layer l occupies bytes [l*H*2, (l+1)*H*2) of a row (one pitched copy per layer). */
void    *ring_slot_hidden(const struct ring *r, unsigned slot);
size_t   ring_hidden_pitch(const struct ring *r);   /* bytes per token row = L*H*2 */
size_t   ring_hidden_bytes(const struct ring *r);   /* max_tokens * pitch */
size_t   ring_slot_stride(const struct ring *r);

/* ---- reclaim ------------------------------------------------------------------- */

struct ring_reclaim {
    uint32_t writing_freed;     /* WRITING -> FREE (half-written, never delivered) */
    uint32_t reading_requeued;  /* READING -> READY (redelivered) */
    uint32_t stuck_writing;     /* WRITING past stuck_writing_ms with a live owner (left alone) */
    uint32_t waiters_cleared;   /* ring_reclaim_dead: parked waiters of dead processes forgotten */
};
/* Reclaim every slot held by `owner` (one CAS each): for an owner the caller knows is dead,
 * e.g. the coordinator on a closed daemon socket or an expired lease. out may be NULL. */
int ring_reclaim_owner(struct ring *r, uint64_t owner, struct ring_reclaim *out);
/* Scan all slots; reclaim those whose pid-form owner is gone (checked by pid + start time,
 * zombies count as gone). Lease-form owners are left to ring_reclaim_owner. Also forgets the
 * parked waiters of dead processes (killed in a wait), so the waiting counts in the stats come
 * back down and a state change stops waking nobody. out may be NULL. */
int ring_reclaim_dead(struct ring *r, struct ring_reclaim *out);

/* ---- inspection ---------------------------------------------------------------- */

struct ring_slot_stat {
    uint8_t state;              /* enum ring_state */
    bool stuck;                 /* WRITING longer than stuck_writing_ms */
    pid_t pid;                  /* owner pid (WRITING/READING, pid-form token), else 0 */
    uint64_t owner;             /* owner token (WRITING/READING), else 0 */
    uint64_t seq;               /* ready seq (READY/READING: the one it was published with) */
    uint64_t batch_id;          /* of the last published payload in this slot */
    uint32_t n_tokens;          /* of the last published payload */
    uint64_t age_ms;            /* since the last transition */
};
struct ring_stats {
    uint32_t nslots;
    uint32_t count[4];          /* slots per enum ring_state */
    uint32_t stuck_writing;
    uint64_t published, consumed, aborted, retracted;
    uint64_t reclaimed_writing, reclaimed_reading;
    uint32_t writers_waiting, readers_waiting;  /* parked now (at most the 64 the waiter table holds;
                                                   more wait uncounted); one killed while parked counts
                                                   until ring_reclaim_dead (lease-form owner: for good) */
    pid_t creator_pid;
    uint64_t creator_token;
    uint64_t created_wall_ms;
    uint32_t stuck_writing_ms;
    uint64_t tag;               /* ring_create_opts.tag */
};
/* Snapshot (not atomic across slots). slots: array of nslots entries, or NULL. */
int ring_stats(const struct ring *r, struct ring_stats *st, struct ring_slot_stat *slots);
const char *ring_state_name(unsigned state);  /* "FREE", "WRITING", "READY", "READING" */

/* ---- test hooks ------------------------------------------------------------------ */

enum ring_hook_point {
    RING_HOOK_CLAIMED_WRITE = 1,  /* slot just became WRITING(owner) */
    RING_HOOK_BEFORE_PUBLISH,     /* about to CAS WRITING -> READY */
    RING_HOOK_CLAIMED_READ,       /* slot just became READING(owner) */
    RING_HOOK_BEFORE_RELEASE,     /* about to CAS READING -> FREE */
};
/* Called (when set) at each point above, in the calling thread. Tests use it to stop a
 * process at a chosen point, e.g. raise(SIGSTOP), so a SIGKILL lands there. Also:
 * env DFLASH_RING_STOP_AT=<claimed_write|before_publish|claimed_read|before_release>[:N]
 * makes the process raise(SIGSTOP) the N-th time (default 1st) it reaches that point,
 * so a test can stop an unmodified daemon there (waitpid(WUNTRACED) sees it stop). */
typedef void (*ring_hook_fn)(enum ring_hook_point point, unsigned slot);
void ring_set_test_hook(ring_hook_fn fn);
