/* ring.c: the shared-memory slot ring: layout, create/attach validation, CAS transitions,
 * futex waits, reclaim of dead owners and the stats snapshot. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "common/err.h"
#include "common/fileio.h"
#include "common/mapname.h"
#include "common/proc.h"
#include "common/timeutil.h"
#include "ipc/futex.h"
#include "ipc/ring.h"

#define HDR_SIZE 4096u

/* Threads parked on one futex word. The waker reads `parked` and `overflow` to skip the
 * FUTEX_WAKE syscall when nobody sleeps. Each parked thread holds an entry of the header's
 * waiter table and sets its bit; the table names the entry's process, so the bit of one killed
 * while parked is cleared (a plain count would stay raised for good, and every later state
 * change would make the syscall). Threads with a lease-form owner are counted in `overflow`;
 * those beyond the table wait uncounted, in slices (park). */
#define RING_WAITERS 64
#define WAITER_CLEARING (1ull << 63) /* | the clearer's token: an entry being freed by
                                         ring_reclaim_dead (no token has bit 63) */
struct wait_q {
    _Atomic uint32_t word;          /* futex: bumped on every change of interest */
    _Atomic uint32_t overflow;
    _Atomic uint64_t parked;        /* bit i: waiter entry i sleeps on `word` */
};

/* The first page of the object. Fields up to `layout` are written once by the creator
 * before `magic`; the counters live on their own cache lines. */
struct ring_hdr {
    _Atomic uint64_t magic;         /* stored last, with release, when the header is complete */
    uint32_t version;
    uint32_t hdr_size;
    uint64_t total_size;
    uint64_t ctl_off;               /* slot control blocks */
    uint64_t slot_off;              /* first slot */
    uint64_t slot_stride;
    uint64_t hidden_off;            /* tensor area inside a slot */
    uint64_t hidden_pitch;
    struct ring_layout layout;
    int32_t creator_pid;
    uint32_t stuck_writing_ms;
    uint64_t creator_token;
    uint64_t created_wall_ms;
    uint64_t tag;                   /* ring_create_opts.tag */

    alignas(64) struct wait_q ready;            /* woken when a slot becomes READY */
    alignas(64) struct wait_q free;             /* woken when a slot becomes FREE */
    alignas(64) _Atomic uint64_t next_seq;
    alignas(64) _Atomic uint64_t published;
    _Atomic uint64_t consumed;
    _Atomic uint64_t aborted;
    _Atomic uint64_t reclaimed_writing;
    _Atomic uint64_t reclaimed_reading;
    _Atomic uint64_t retracted;
    /* Entry i: the pid-form owner token of the process whose thread parks as bit i of a wait_q's
     * `parked`, 0 = free. A waiter SIGKILLed while parked is found by ring_reclaim_dead. */
    alignas(64) _Atomic uint64_t waiter[RING_WAITERS];
};
_Static_assert(sizeof(struct ring_hdr) <= HDR_SIZE, "ring header must fit its page");

/* Per-slot control block. `word` is the only field whose changes mean anything for
 * ownership; the rest is bookkeeping written by whoever holds the slot. */
struct ring_ctl {
    _Atomic uint64_t word;          /* (value << 2) | state */
    _Atomic uint64_t seq;           /* ready seq of the payload in the slot (for requeue) */
    _Atomic uint64_t t_ns;          /* CLOCK_MONOTONIC of the last transition */
    _Atomic uint64_t batch_id;      /* copy of the published payload's batch id (stats) */
    _Atomic uint32_t n_tokens;
    uint32_t pad0;
    uint64_t pad[3];
};
_Static_assert(sizeof(struct ring_ctl) == 64, "one control block per cache line");

struct ring {
    struct ring_hdr *h;
    struct ring_ctl *ctl;
    unsigned char *base;
    size_t size;
    uint32_t nslots;
    /* The layout and geometry checked at create/attach. Every address and bound is computed from
     * this private copy, never from the shared header, which any process mapping the ring
     * writable could overwrite later. */
    struct ring_layout layout;
    uint64_t slot_off, slot_stride, hidden_off, hidden_pitch;
    dev_t dev;                      /* the shm object mapped (ring_same_object) */
    ino_t ino;
    bool rdonly;
    bool owner_set;                 /* owner given explicitly (lease): keep across fork */
    uint64_t owner;
    unsigned fork_gen;              /* g_fork_gen when owner was computed */
    char name[NAME_MAX + 1];
};

#define W_STATE(w)   ((unsigned)((w) & 3u))
#define W_VALUE(w)   ((w) >> 2)
#define W_MAKE(s, v) (((uint64_t)(v) << 2) | (uint64_t)(s))

/* ---- fork awareness: a child must not claim with its parent's token --------------- */

static _Atomic unsigned g_fork_gen;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) { atomic_fetch_add(&g_fork_gen, 1); }

/* ---- test hooks ---------------------------------------------------------------- */

static _Atomic(ring_hook_fn) g_hook;
static _Atomic int g_stop_point;    /* from DFLASH_RING_STOP_AT, read at each create/attach */
static _Atomic long g_stop_left;

static const char *const hook_names[] = {
    [RING_HOOK_CLAIMED_WRITE] = "claimed_write", [RING_HOOK_BEFORE_PUBLISH] = "before_publish",
    [RING_HOOK_CLAIMED_READ] = "claimed_read", [RING_HOOK_BEFORE_RELEASE] = "before_release",
};

static void once_init(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

static void read_stop_env(void)
{
    const char *s = getenv("DFLASH_RING_STOP_AT");
    if (!s || !*s)
        return;
    for (int p = RING_HOOK_CLAIMED_WRITE; p <= RING_HOOK_BEFORE_RELEASE; p++) {
        size_t n = strlen(hook_names[p]);
        if (!strncmp(s, hook_names[p], n) && (s[n] == 0 || s[n] == ':')) {
            long left = s[n] == ':' ? atol(s + n + 1) : 1;
            atomic_store(&g_stop_left, left < 1 ? 1 : left);
            atomic_store(&g_stop_point, p);
        }
    }
}

void ring_set_test_hook(ring_hook_fn fn) { atomic_store(&g_hook, fn); }

static inline void hook(enum ring_hook_point p, unsigned slot)
{
    ring_hook_fn fn = atomic_load_explicit(&g_hook, memory_order_relaxed);
    if (fn)
        fn(p, slot);
    if (atomic_load_explicit(&g_stop_point, memory_order_relaxed) == (int)p &&
        atomic_fetch_sub(&g_stop_left, 1) == 1)
        raise(SIGSTOP);
}

/* ---- geometry ---------------------------------------------------------------- */

struct geo {
    uint64_t ctl_off, slot_off, slot_stride, hidden_off, hidden_pitch, total;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int layout_check(const struct ring_layout *l, char *why, size_t n)
{
    if (l->nslots < 1 || l->nslots > 65536)
        return snprintf(why, n, "slots %u out of range [1, 65536]", l->nslots), -DF_ERANGE;
    if (l->hidden < 1 || l->hidden > (1u << 20))
        return snprintf(why, n, "hidden size %u out of range [1, 1048576]", l->hidden), -DF_ERANGE;
    if (l->n_layers < 1 || l->n_layers > RING_MAX_LAYERS)
        return snprintf(why, n, "captured layers %u out of range [1, %d]", l->n_layers, RING_MAX_LAYERS), -DF_ERANGE;
    if (l->dtype != RING_DTYPE_BF16)
        return snprintf(why, n, "dtype %u unsupported (only bf16)", l->dtype), -DF_EUNSUPPORTED;
    if (l->max_tokens < 1 || l->max_tokens > (1u << 26))
        return snprintf(why, n, "max tokens %u out of range [1, 2^26]", l->max_tokens), -DF_ERANGE;
    if (l->max_seqs < 1 || l->max_seqs > l->max_tokens)
        return snprintf(why, n, "max seqs %u out of range [1, max tokens %u]", l->max_seqs, l->max_tokens), -DF_ERANGE;
    return 0;
}

static int geometry(const struct ring_layout *l, struct geo *g)
{
    uint64_t meta = sizeof(struct ring_payload) + 4ull * (l->max_seqs + 1) + 4ull * l->max_tokens + l->max_tokens;
    g->ctl_off = HDR_SIZE;
    g->slot_off = align_up(HDR_SIZE + (uint64_t)l->nslots * sizeof(struct ring_ctl), RING_ALIGN);
    g->hidden_off = align_up(meta, RING_ALIGN);
    g->hidden_pitch = 2ull * l->hidden * l->n_layers;
    uint64_t tensor, stride, all;
    if (__builtin_mul_overflow(g->hidden_pitch, (uint64_t)l->max_tokens, &tensor) ||
        __builtin_add_overflow(g->hidden_off, tensor, &stride))
        return -EOVERFLOW;
    g->slot_stride = align_up(stride, RING_ALIGN);
    if (__builtin_mul_overflow(g->slot_stride, (uint64_t)l->nslots, &all) ||
        __builtin_add_overflow(all, g->slot_off, &g->total) || g->total > (uint64_t)SSIZE_MAX)
        return -EOVERFLOW;
    return 0;
}

/* The handle's private copy of a checked layout and its geometry. */
static void handle_geometry(struct ring *r, const struct ring_layout *l, const struct geo *g)
{
    r->layout = *l;
    r->nslots = l->nslots;
    r->slot_off = g->slot_off;
    r->slot_stride = g->slot_stride;
    r->hidden_off = g->hidden_off;
    r->hidden_pitch = g->hidden_pitch;
}

static int name_check(const char *name, char *err, size_t errlen)
{
    if (!name || name[0] != '/' || !name[1] || strchr(name + 1, '/') || strlen(name) > NAME_MAX) {
        snprintf(err, errlen, "ring '%s': shm name must be '/' followed by 1..%d characters without '/'",
                 name ? name : "(null)", NAME_MAX - 1);
        return -EINVAL;
    }
    return 0;
}

static struct ring *handle_new(const char *name)
{
    pthread_once(&g_once, once_init);
    read_stop_env();
    struct ring *r = calloc(1, sizeof *r);
    if (r)
        snprintf(r->name, sizeof r->name, "%s", name);
    return r;
}

static int handle_map(struct ring *r, int fd, size_t size, bool rdonly, bool populate)
{
    void *p = mmap(NULL, size, rdonly ? PROT_READ : PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    r->base = p;
    r->size = size;
    r->h = p;
    r->rdonly = rdonly;
    mapname_add(p, size, "ring", r->name);
    return 0;
}

static int owner_refresh(struct ring *r)
{
    unsigned gen = atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
    if (r->owner && (r->owner_set || r->fork_gen == gen))
        return 0;
    int rc = proc_self_token(&r->owner);
    r->fork_gen = gen;
    return rc;
}

void ring_detach(struct ring *r)
{
    if (!r)
        return;
    if (r->base) {
        mapname_remove(r->base);
        munmap(r->base, r->size);
    }
    free(r);
}

int ring_unlink(const char *name)
{
    return shm_unlink(name) < 0 ? -errno : 0;
}

/* ---- create ----------------------------------------------------------------- */

int ring_create(struct ring **out, const char *name, const struct ring_layout *layout,
                const struct ring_create_opts *opts, char *err, size_t errlen)
{
    static const struct ring_create_opts defaults = { .mode = 0600, .gid = -1 };
    char why[160];
    struct geo g;
    int rc, fd = -1;
    *out = NULL;
    if (!opts)
        opts = &defaults;
    if ((rc = name_check(name, err, errlen)) < 0)
        return rc;
    if ((rc = layout_check(layout, why, sizeof why)) < 0) {
        snprintf(err, errlen, "ring %s: %s", name, why);
        return rc;
    }
    if ((rc = geometry(layout, &g)) < 0) {
        snprintf(err, errlen, "ring %s: layout too large to address", name);
        return rc;
    }
    struct ring *r = handle_new(name);
    if (!r)
        return -ENOMEM;
    mode_t mode = opts->mode ? (mode_t)opts->mode : 0600;

    /* Made the owner's alone (0600): the group's bits come once the object is the group's (an
     * fd opened meanwhile by the primary group's users would keep its access). */
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST && (opts->flags & RING_CREATE_REPLACE)) {
        if (shm_unlink(name) < 0 && (errno == EPERM || errno == EACCES)) {
            rc = -errno;    /* (/dev/shm is sticky: another user's object stays its own) */
            snprintf(err, errlen, "ring %s: cannot replace the object there: %s (another user's? its owner or root "
                     "must remove /dev/shm%s)", name, strerror(-rc), name);
            goto fail_free;
        }
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "ring %s: cannot create shm object: %s%s", name, strerror(-rc),
                 rc == -EEXIST ? " (another ring of that name exists)" : "");
        goto fail_free;
    }
    struct stat made;
    if (fstat(fd, &made) == 0) {
        r->dev = made.st_dev;
        r->ino = made.st_ino;
    }
    if (opts->gid >= 0 && fchown(fd, (uid_t)-1, (gid_t)opts->gid) < 0) {
        rc = -errno;
        snprintf(err, errlen, "ring %s: chown to group %d: %s", name, opts->gid, strerror(-rc));
        goto fail_unlink;
    }
    /* (the mode asked for, which the umask may also have cut) */
    if (fchmod(fd, mode) < 0) {
        rc = -errno;
        snprintf(err, errlen, "ring %s: chmod %o: %s", name, (unsigned)mode, strerror(-rc));
        goto fail_unlink;
    }
    /* Creator identity first, before the reservation (seconds for a large ring): an attacher
     * that sees it without the magic knows creation is in progress (-EAGAIN). */
    if ((rc = owner_refresh(r)) < 0) {
        snprintf(err, errlen, "ring %s: cannot read own process start time: %s", name, strerror(-rc));
        goto fail_unlink;
    }
    struct ring_hdr ident;
    memset(&ident, 0, sizeof ident);
    ident.creator_pid = (int32_t)getpid();
    ident.creator_token = r->owner;
    ssize_t put = pwrite(fd, &ident, sizeof ident, 0);
    if (put != (ssize_t)sizeof ident) {
        rc = put < 0 ? -errno : -ENOSPC;
        snprintf(err, errlen, "ring %s: cannot write its header in /dev/shm: %s", name, strerror(-rc));
        goto fail_unlink;
    }
    /* Reserve every page now: on a full /dev/shm this fails here instead of a SIGBUS
     * in whichever process first touches an unbacked page. */
    int e = -fileio_reserve(fd, g.total);
    if (e) {
        struct statvfs vfs;
        unsigned long long avail = fstatvfs(fd, &vfs) == 0 ? (unsigned long long)vfs.f_bavail * vfs.f_frsize : 0;
        rc = -e;
        snprintf(err, errlen, "ring %s: cannot reserve %llu bytes in /dev/shm (%llu bytes free): %s",
                 name, (unsigned long long)g.total, avail, strerror(e));
        goto fail_unlink;
    }
    if ((rc = handle_map(r, fd, g.total, false, false)) < 0) {
        snprintf(err, errlen, "ring %s: mmap %llu bytes: %s", name, (unsigned long long)g.total, strerror(-rc));
        goto fail_unlink;
    }
    close(fd);
    fd = -1;

    struct ring_hdr *h = r->h;
    /* (creator_pid and creator_token are there already) */
    h->version = RING_VERSION;
    h->hdr_size = HDR_SIZE;
    h->total_size = g.total;
    h->ctl_off = g.ctl_off;
    h->slot_off = g.slot_off;
    h->slot_stride = g.slot_stride;
    h->hidden_off = g.hidden_off;
    h->hidden_pitch = g.hidden_pitch;
    h->layout = *layout;
    memset(h->layout.layer_ids + layout->n_layers, 0, sizeof(uint32_t) * (RING_MAX_LAYERS - layout->n_layers));
    h->stuck_writing_ms = opts->stuck_writing_ms ? opts->stuck_writing_ms : 600000;
    h->created_wall_ms = wall_ms();
    h->tag = opts->tag;
    atomic_store(&h->next_seq, 1);
    r->ctl = (struct ring_ctl *)(r->base + g.ctl_off);
    handle_geometry(r, &h->layout, &g);
    uint64_t now = mono_ns();
    for (uint32_t i = 0; i < r->nslots; i++)
        atomic_store_explicit(&r->ctl[i].t_ns, now, memory_order_relaxed);
    atomic_store_explicit(&h->magic, RING_MAGIC, memory_order_release);
    *out = r;
    return 0;

fail_unlink:
    if (fd >= 0)
        close(fd);
    shm_unlink(name);
fail_free:
    free(r);
    return rc;
}

/* ---- attach ----------------------------------------------------------------- */

/* An object without the magic that a ring_create left unfinished: empty (cut short before the
 * creator named itself), or a header holding only the creator's identity. -EAGAIN while the
 * creation may still go on, -DF_EDEAD when it never will (the creator died: the object is
 * dflash's own to replace), 0 when the object is something else (not a dflash ring). */
#define HALF_MADE_GRACE_S 10
static int half_made(const char *name, const struct ring_hdr *hdr, ssize_t got, const struct stat *st,
                     char *err, size_t errlen)
{
    if (got == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        long long age = (long long)now.tv_sec - (long long)st->st_mtim.tv_sec;
        if (age >= -1 && age < HALF_MADE_GRACE_S)   /* (a clock stepped back: not young for ever) */
            return df_fail(err, errlen, -EAGAIN, "ring %s: an empty object, maybe being created", name);
        return df_fail(err, errlen, -DF_EDEAD, "ring %s: an empty object left by a creation cut short", name);
    }
    uint64_t t = hdr->creator_token;
    if (got != (ssize_t)sizeof *hdr || atomic_load(&hdr->magic) != 0 || !t || proc_token_is_lease(t) ||
        hdr->creator_pid <= 0 || proc_token_pid(t) != hdr->creator_pid)
        return 0;
    if (proc_token_alive(t) == 0)
        return df_fail(err, errlen, -DF_EDEAD, "ring %s: left half-made by pid %d, which died", name,
                       hdr->creator_pid);
    return df_fail(err, errlen, -EAGAIN, "ring %s: still being initialised by pid %d", name, hdr->creator_pid);
}

static int layout_diff(const struct ring_layout *have, const struct ring_layout *want, char *why, size_t n)
{
#define DIFF(field, label) \
    if (have->field != want->field) \
        return snprintf(why, n, label " %u, expected %u", have->field, want->field), -DF_ELAYOUT
    DIFF(nslots, "slots");
    DIFF(hidden, "hidden size");
    DIFF(n_layers, "captured layers");
    DIFF(dtype, "dtype");
    DIFF(max_tokens, "max tokens per slot");
    DIFF(max_seqs, "max seqs per slot");
#undef DIFF
    for (uint32_t i = 0; i < want->n_layers; i++)
        if (have->layer_ids[i] != want->layer_ids[i])
            return snprintf(why, n, "captured layer #%u is %u, expected %u", i, have->layer_ids[i],
                            want->layer_ids[i]), -DF_ELAYOUT;
    return 0;
}

/* The header of an opened object, read with pread, never through a mapping: a short object
 * cannot SIGBUS us. 1: it has the ring magic; 0: no magic and not a ring a creation left
 * unfinished (another program's object); -EAGAIN / -DF_EDEAD from half_made; another -errno. */
static int read_head(int fd, const char *name, struct ring_hdr *hdr, const struct stat *st,
                     char *err, size_t errlen)
{
    memset(hdr, 0, sizeof *hdr);
    ssize_t got = pread(fd, hdr, sizeof *hdr, 0);
    if (got < 0)
        return df_fail(err, errlen, -errno, "ring %s: read header: %s", name, strerror(errno));
    if (got >= (ssize_t)sizeof hdr->magic && atomic_load(&hdr->magic) == RING_MAGIC)
        return 1;
    return half_made(name, hdr, got, st, err, errlen);
}

static _Atomic uid_t g_trust_uid = (uid_t)-1;     /* ring_trust_user */

int ring_attach(struct ring **out, const char *name, const struct ring_layout *expect,
                unsigned flags, char *err, size_t errlen)
{
    char why[160];
    struct ring_hdr hdr;
    struct stat st;
    struct geo g;
    int rc;
    bool rdonly = flags & RING_ATTACH_RDONLY;
    *out = NULL;
    if ((rc = name_check(name, err, errlen)) < 0)
        return rc;
    if (!expect && !(flags & RING_ATTACH_ANY)) {
        snprintf(err, errlen, "ring %s: no expected layout given (pass RING_ATTACH_ANY to accept any)", name);
        return -EINVAL;
    }
    int fd = fileio_shm_open(name, rdonly ? O_RDONLY : O_RDWR, &st);
    char shm_path[NAME_MAX + 16];
    struct stat lst;
    if ((fd == -EINVAL || fd == -EISDIR || fd == -ELOOP) &&
        snprintf(shm_path, sizeof shm_path, "/dev/shm%s", name) < (int)sizeof shm_path && lstat(shm_path, &lst) == 0 &&
        (S_ISDIR(lst.st_mode) || S_ISLNK(lst.st_mode))) {
        /* nothing a coordinator may replace (shm_unlink takes no folder; a link is never followed) */
        snprintf(err, errlen, "ring %s: %s is a %s, not a ring", name, shm_path,
                 S_ISDIR(lst.st_mode) ? "folder" : "symbolic link");
        return -DF_EMAGIC;
    }
    if (fd < 0) {
        rc = fd;
        snprintf(err, errlen, "ring %s: %s", name,
                 rc == -ENOENT ? "no such shm object (the coordinator makes it at its start: is it running, or was the object removed?)"
                 : rc == -EINVAL ? "not a dflash ring (a FIFO, socket or device under its name in /dev/shm)" : strerror(-rc));
        return rc;
    }
    if (!proc_trusts_object(&st, atomic_load(&g_trust_uid), why, sizeof why)) {
        snprintf(err, errlen, "ring %s: refused: %s", name, why);
        rc = -EPERM;
        goto fail_close;
    }
    if ((rc = read_head(fd, name, &hdr, &st, err, errlen)) < 0)
        goto fail_close;
    if (!rc) {
        snprintf(err, errlen, "ring %s: not a dflash ring (bad magic %016llx, object of %lld bytes)",
                 name, (unsigned long long)atomic_load(&hdr.magic), (long long)st.st_size);
        rc = -DF_EMAGIC;
        goto fail_close;
    }
    /* The size again, now that the magic is seen: the creator sizes the object before it stores
     * the magic, so this one is final (the first fstat may predate the sizing). */
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        snprintf(err, errlen, "ring %s: fstat: %s", name, strerror(-rc));
        goto fail_close;
    }
    if (st.st_size < (off_t)HDR_SIZE) {
        snprintf(err, errlen, "ring %s: truncated: object is %lld bytes, the header alone needs %u",
                 name, (long long)st.st_size, HDR_SIZE);
        rc = -DF_ETRUNC;
        goto fail_close;
    }
    if (hdr.version != RING_VERSION) {
        snprintf(err, errlen, "ring %s: layout version %u, this build speaks version %u",
                 name, hdr.version, RING_VERSION);
        rc = -DF_EVERSION;
        goto fail_close;
    }
    if (layout_check(&hdr.layout, why, sizeof why) < 0) {
        snprintf(err, errlen, "ring %s: corrupt header: %s", name, why);
        rc = -DF_EFORMAT;
        goto fail_close;
    }
    if (geometry(&hdr.layout, &g) < 0) {
        snprintf(err, errlen, "ring %s: corrupt header: the size its layout gives overflows", name);
        rc = -DF_EFORMAT;
        goto fail_close;
    }
    const char *bad = hdr.hdr_size != HDR_SIZE ? "header size"
                      : hdr.total_size != g.total ? "total size"
                      : hdr.slot_stride != g.slot_stride ? "slot stride"
                      : hdr.slot_off != g.slot_off ? "slot offset"
                      : hdr.ctl_off != g.ctl_off ? "control offset"
                      : hdr.hidden_off != g.hidden_off ? "hidden offset"
                      : hdr.hidden_pitch != g.hidden_pitch ? "hidden pitch" : NULL;
    if (bad) {
        snprintf(err, errlen, "ring %s: corrupt header: its %s does not follow from its layout", name, bad);
        rc = -DF_EFORMAT;
        goto fail_close;
    }
    if ((uint64_t)st.st_size < hdr.total_size) {
        snprintf(err, errlen, "ring %s: truncated: object is %lld bytes, header says %llu",
                 name, (long long)st.st_size, (unsigned long long)hdr.total_size);
        rc = -DF_ETRUNC;
        goto fail_close;
    }
    if (!(flags & RING_ATTACH_ANY) && (rc = layout_diff(&hdr.layout, expect, why, sizeof why)) < 0) {
        snprintf(err, errlen, "ring %s: layout mismatch: %s", name, why);
        goto fail_close;
    }
    struct ring *r = handle_new(name);
    if (!r) {
        rc = -ENOMEM;
        goto fail_close;
    }
    if ((rc = handle_map(r, fd, hdr.total_size, rdonly, flags & RING_ATTACH_POPULATE)) < 0) {
        snprintf(err, errlen, "ring %s: mmap %llu bytes: %s", name, (unsigned long long)hdr.total_size, strerror(-rc));
        free(r);
        goto fail_close;
    }
    close(fd);
    r->ctl = (struct ring_ctl *)(r->base + hdr.ctl_off);
    handle_geometry(r, &hdr.layout, &g);
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    if (!rdonly && (rc = owner_refresh(r)) < 0) {
        snprintf(err, errlen, "ring %s: cannot read own process start time: %s", name, strerror(-rc));
        ring_detach(r);
        return rc;
    }
    *out = r;
    return 0;

fail_close:
    close(fd);
    return rc;
}

void ring_trust_user(uid_t uid) { atomic_store(&g_trust_uid, uid); }

int ring_is_dflash_object(const char *name)
{
    struct stat st;
    int fd = fileio_shm_open(name, O_RDONLY, &st);
    if (fd < 0)
        return fd;
    struct ring_hdr hdr;
    char why[8];
    int rc = read_head(fd, name, &hdr, &st, why, sizeof why);
    close(fd);
    return rc == -EAGAIN || rc == -DF_EDEAD ? 1 : rc;
}

int ring_hold(const char *name, char *err, size_t errlen)
{
    int rc = name_check(name, err, errlen);
    if (rc < 0)
        return rc;
    int fd = fileio_shm_open(name, O_RDONLY, NULL);
    if (fd < 0) {
        snprintf(err, errlen, "ring %s: %s", name, strerror(-fd));
        return fd;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        close(fd);
        snprintf(err, errlen, "ring %s: %s", name, rc == -EBUSY ? "held by another process" : strerror(-rc));
        return rc;
    }
    return fd;
}

int ring_same_object(const struct ring *r, const char *name)
{
    /* The name itself, not opened: what another user put there (a link, an object of theirs this
     * process may not open) is told apart as well, and a FIFO is never waited on. */
    char path[PATH_MAX];
    struct stat st;
    if (snprintf(path, sizeof path, "/dev/shm%s", name) >= (int)sizeof path)
        return -ENAMETOOLONG;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;    /* gone: another object, if one comes */
    if (!S_ISREG(st.st_mode))
        return 0;
    /* cut short in place (truncate(1) on /dev/shm): the next access past its end is a SIGBUS */
    return st.st_dev == r->dev && st.st_ino == r->ino && (uint64_t)st.st_size >= (uint64_t)r->size;
}

/* ---- accessors ---------------------------------------------------------------- */

const struct ring_layout *ring_layout(const struct ring *r) { return &r->layout; }
const char *ring_name(const struct ring *r) { return r->name; }
void *ring_base(const struct ring *r) { return r->base; }
size_t ring_map_size(const struct ring *r) { return r->size; }
size_t ring_slot_stride(const struct ring *r) { return r->slot_stride; }
size_t ring_hidden_pitch(const struct ring *r) { return r->hidden_pitch; }
size_t ring_hidden_bytes(const struct ring *r) { return r->hidden_pitch * r->layout.max_tokens; }

static inline unsigned char *slot_base(const struct ring *r, unsigned slot)
{
    return r->base + r->slot_off + (uint64_t)slot * r->slot_stride;
}

struct ring_payload *ring_slot_header(const struct ring *r, unsigned slot)
{
    return (struct ring_payload *)slot_base(r, slot);
}

int32_t *ring_slot_cu_seqlens(const struct ring *r, unsigned slot)
{
    return (int32_t *)(slot_base(r, slot) + sizeof(struct ring_payload));
}

uint32_t *ring_slot_tokens(const struct ring *r, unsigned slot)
{
    return (uint32_t *)(ring_slot_cu_seqlens(r, slot) + r->layout.max_seqs + 1);
}

uint8_t *ring_slot_loss_mask(const struct ring *r, unsigned slot)
{
    return (uint8_t *)(ring_slot_tokens(r, slot) + r->layout.max_tokens);
}

void *ring_slot_hidden(const struct ring *r, unsigned slot)
{
    return slot_base(r, slot) + r->hidden_off;
}

uint64_t ring_owner(const struct ring *r) { return r->owner; }

int ring_set_owner(struct ring *r, uint64_t token)
{
    if (!token || (token & ~PROC_TOKEN_MASK))
        return -EINVAL;
    r->owner = token;
    r->owner_set = true;
    return 0;
}

/* ---- waiting ---------------------------------------------------------------- */

/* Wake sleepers after a state change. A waiter registers (its bit, or the overflow count)
 * before its futex compare; we bump `word` before reading the registrations (all seq_cst), so
 * either we see the waiter or its FUTEX_WAIT sees the new word value: no lost wakeup. */
static void signal_word(struct wait_q *q)
{
    atomic_fetch_add(&q->word, 1);
    if (atomic_load(&q->parked) || atomic_load(&q->overflow))
        futex_wake((uint32_t *)&q->word, INT_MAX);
}

/* A free entry of the waiter table for a thread of process `tok`, or -1 (table full). */
static int waiter_take(struct ring_hdr *h, uint64_t tok)
{
    static _Thread_local uint32_t hint;     /* where this thread found one last time */
    for (uint32_t k = 0; k < RING_WAITERS; k++) {
        uint32_t i = (hint + k) % RING_WAITERS;
        uint64_t none = 0;
        if (!atomic_load_explicit(&h->waiter[i], memory_order_relaxed) &&
            atomic_compare_exchange_strong(&h->waiter[i], &none, tok)) {
            hint = i;
            return (int)i;
        }
    }
    return -1;
}

#define OVERFLOW_SLICE_NS 10000000ull   /* 10 ms: a waiter beyond the waiter table looks this often */

/* Sleep until `q->word` moves from `seen` or the absolute deadline (ns, 0 = none) passes.
 * Returns 0 or -DF_ETIMEOUT. */
static int park(struct ring *r, struct wait_q *q, uint32_t seen, uint64_t deadline_ns)
{
    struct timespec ts, *tp = NULL;
    if (deadline_ns) {
        ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
        ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
        tp = &ts;
    }
    bool lease = proc_token_is_lease(r->owner);
    int e = lease ? -1 : waiter_take(r->h, r->owner);
    uint64_t bit = e >= 0 ? 1ull << e : 0;
    if (!bit && !lease) {
        /* The table is full (as many waiters as it has entries): this one waits uncounted, in
         * short slices (a wake no waker sends for it costs a slice at most), so one killed here
         * leaves no count behind to cost every later publish and release a futex syscall. A
         * slice that ends early is a spurious wake to the caller, which looks and parks again. */
        uint64_t slice = mono_ns() + OVERFLOW_SLICE_NS;
        bool last = deadline_ns && deadline_ns <= slice;
        struct timespec sts = { (time_t)((last ? deadline_ns : slice) / 1000000000ull),
                                (long)((last ? deadline_ns : slice) % 1000000000ull) };
        int rc = futex_wait_until((uint32_t *)&q->word, seen, &sts);
        return rc == -ETIMEDOUT && last ? -DF_ETIMEOUT : 0;
    }
    if (bit)
        atomic_fetch_or(&q->parked, bit);
    else
        atomic_fetch_add(&q->overflow, 1);
    int rc = futex_wait_until((uint32_t *)&q->word, seen, tp);
    if (bit) {
        atomic_fetch_and(&q->parked, ~bit);
        atomic_store(&r->h->waiter[e], 0);  /* after the bit: a new holder's bit is its own */
    } else {
        atomic_fetch_sub(&q->overflow, 1);
    }
    return rc == -ETIMEDOUT ? -DF_ETIMEOUT : 0;
}

void ring_wake_all(struct ring *r)
{
    if (r->rdonly)
        return;
    atomic_fetch_add(&r->h->ready.word, 1);
    atomic_fetch_add(&r->h->free.word, 1);
    futex_wake((uint32_t *)&r->h->ready.word, INT_MAX);
    futex_wake((uint32_t *)&r->h->free.word, INT_MAX);
}

static inline void touch(struct ring_ctl *c)
{
    atomic_store_explicit(&c->t_ns, mono_ns(), memory_order_relaxed);
}

static inline bool cas(struct ring_ctl *c, uint64_t *expect, uint64_t desired)
{
    return atomic_compare_exchange_strong_explicit(&c->word, expect, desired,
                                                   memory_order_acq_rel, memory_order_acquire);
}

static uint64_t deadline_from(int timeout_ms)
{
    return timeout_ms < 0 ? 0 : mono_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Per-thread start point and random state: spreads claims, needs no shared state. */
static _Thread_local uint32_t t_cursor;
static _Thread_local uint64_t t_rng;

static uint64_t rng_next(void)
{
    if (!t_rng)
        t_rng = (mono_ns() ^ ((uint64_t)(uintptr_t)&t_rng << 17) ^ (uint64_t)getpid()) | 1;
    t_rng ^= t_rng << 13;
    t_rng ^= t_rng >> 7;
    t_rng ^= t_rng << 17;
    return t_rng;
}

/* ---- write side -------------------------------------------------------------- */

int ring_claim_write(struct ring *r, int timeout_ms, unsigned *slot)
{
    if (r->rdonly)
        return -EROFS;
    int rc = owner_refresh(r);
    if (rc < 0)
        return rc;
    const uint64_t mine = W_MAKE(RING_WRITING, r->owner);
    uint64_t deadline = 0;
    bool last = timeout_ms == 0;
    struct ring_hdr *h = r->h;
    for (;;) {
        uint32_t seen = atomic_load(&h->free.word);
        uint32_t start = t_cursor++;
        for (uint32_t k = 0; k < r->nslots; k++) {
            uint32_t i = (start + k) % r->nslots;
            struct ring_ctl *c = &r->ctl[i];
            uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
            if (W_STATE(w) == RING_FREE && cas(c, &w, mine)) {
                touch(c);
                *slot = i;
                hook(RING_HOOK_CLAIMED_WRITE, i);
                return 0;
            }
        }
        if (last)
            return -DF_ETIMEOUT;
        if (!deadline && timeout_ms > 0)
            deadline = deadline_from(timeout_ms);
        if (park(r, &h->free, seen, deadline) < 0)
            last = true;   /* one more look, then give up */
    }
}

static int check_slot(const struct ring *r, unsigned slot)
{
    if (r->rdonly)
        return -EROFS;
    return slot < r->nslots ? 0 : -EINVAL;
}

int ring_publish(struct ring *r, unsigned slot)
{
    int rc = check_slot(r, slot);
    if (rc < 0)
        return rc;
    struct ring_ctl *c = &r->ctl[slot];
    struct ring_payload *p = ring_slot_header(r, slot);
    uint64_t w = W_MAKE(RING_WRITING, r->owner);
    if (atomic_load(&c->word) != w)
        return -DF_ESTATE;
    if (p->n_tokens > r->layout.max_tokens || p->n_seqs > r->layout.max_seqs)
        return -DF_ERANGE;
    hook(RING_HOOK_BEFORE_PUBLISH, slot);
    uint64_t seq = atomic_fetch_add(&r->h->next_seq, 1);
    p->producer = r->owner;
    atomic_store_explicit(&c->seq, seq, memory_order_relaxed);
    atomic_store_explicit(&c->batch_id, p->batch_id, memory_order_relaxed);
    atomic_store_explicit(&c->n_tokens, p->n_tokens, memory_order_relaxed);
    if (!cas(c, &w, W_MAKE(RING_READY, seq)))
        return -DF_ESTATE;
    touch(c);
    atomic_fetch_add_explicit(&r->h->published, 1, memory_order_relaxed);
    signal_word(&r->h->ready);
    return 0;
}

int ring_abort_write(struct ring *r, unsigned slot)
{
    int rc = check_slot(r, slot);
    if (rc < 0)
        return rc;
    struct ring_ctl *c = &r->ctl[slot];
    uint64_t w = W_MAKE(RING_WRITING, r->owner);
    if (!cas(c, &w, W_MAKE(RING_FREE, 0)))
        return -DF_ESTATE;
    touch(c);
    atomic_fetch_add_explicit(&r->h->aborted, 1, memory_order_relaxed);
    signal_word(&r->h->free);
    return 0;
}

/* ---- read side --------------------------------------------------------------- */

int ring_claim_read(struct ring *r, const struct ring_pick *pick, int timeout_ms, unsigned *slot)
{
    if (r->rdonly)
        return -EROFS;
    int rc = owner_refresh(r);
    if (rc < 0)
        return rc;
    const uint64_t mine = W_MAKE(RING_READING, r->owner);
    const bool random = pick && pick->policy == RING_PICK_RANDOM;
    uint32_t min_ready = pick && pick->min_ready > 1 ? pick->min_ready : 1;
    if (min_ready > r->nslots)
        min_ready = r->nslots;
    struct ring_hdr *h = r->h;
    const bool carried = pick && pick->since_ns;    /* a wait begun before this call */
    uint64_t ready_ns = (uint64_t)(pick && pick->ready_timeout_ms > 0 ? pick->ready_timeout_ms : 0) * 1000000ull;
    uint64_t t0 = carried ? pick->since_ns : 0, deadline = 0, ready_deadline = carried ? t0 + ready_ns : 0;
    bool last = timeout_ms == 0, mix_expired = min_ready <= 1;

    for (;;) {
        uint32_t seen = atomic_load(&h->ready.word);
        uint32_t count = 0, best = UINT32_MAX;
        uint64_t best_w = 0;
        for (uint32_t i = 0; i < r->nslots; i++) {
            uint64_t w = atomic_load_explicit(&r->ctl[i].word, memory_order_relaxed);
            if (W_STATE(w) != RING_READY)
                continue;
            count++;
            /* oldest: lowest seq; random: reservoir sample, uniform over READY slots */
            if (random ? rng_next() % count == 0 : (best == UINT32_MAX || w < best_w)) {
                best = i;
                best_w = w;
            }
        }
        if (count && !mix_expired && count < min_ready) {
            uint64_t now = mono_ns();
            if (!t0) {
                t0 = now;
                ready_deadline = now + ready_ns;
            }
            if (now >= ready_deadline || (last && !carried))
                mix_expired = true;
        }
        if (count && (count >= min_ready || mix_expired)) {
            struct ring_ctl *c = &r->ctl[best];
            if (cas(c, &best_w, mine)) {
                /* we own it now: make the requeue seq match what we took */
                if (atomic_load_explicit(&c->seq, memory_order_relaxed) != W_VALUE(best_w))
                    atomic_store_explicit(&c->seq, W_VALUE(best_w), memory_order_relaxed);
                touch(c);
                *slot = best;
                hook(RING_HOOK_CLAIMED_READ, best);
                return 0;
            }
            continue;   /* lost the race for that slot: look again */
        }
        if (last)
            return -DF_ETIMEOUT;
        if (!deadline && timeout_ms > 0)
            deadline = deadline_from(timeout_ms);
        uint64_t until = deadline;
        if (count && !mix_expired && (!until || ready_deadline < until))
            until = ready_deadline;
        if (park(r, &h->ready, seen, until) < 0 && until == deadline)
            last = true;
    }
}

int ring_release(struct ring *r, unsigned slot)
{
    int rc = check_slot(r, slot);
    if (rc < 0)
        return rc;
    struct ring_ctl *c = &r->ctl[slot];
    uint64_t w = W_MAKE(RING_READING, r->owner);
    if (atomic_load_explicit(&c->word, memory_order_relaxed) != w)
        return -DF_ESTATE;
    hook(RING_HOOK_BEFORE_RELEASE, slot);
    if (!cas(c, &w, W_MAKE(RING_FREE, 0)))
        return -DF_ESTATE;
    touch(c);
    atomic_fetch_add_explicit(&r->h->consumed, 1, memory_order_relaxed);
    signal_word(&r->h->free);
    return 0;
}

int ring_requeue(struct ring *r, unsigned slot)
{
    int rc = check_slot(r, slot);
    if (rc < 0)
        return rc;
    struct ring_ctl *c = &r->ctl[slot];
    uint64_t w = W_MAKE(RING_READING, r->owner);
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_relaxed);
    if (!cas(c, &w, W_MAKE(RING_READY, seq)))
        return -DF_ESTATE;
    touch(c);
    signal_word(&r->h->ready);
    return 0;
}

int ring_retract(struct ring *r, unsigned slot, uint64_t batch_id, uint32_t keep_lease)
{
    int rc = check_slot(r, slot);
    if (rc < 0)
        return rc;
    struct ring_ctl *c = &r->ctl[slot];
    uint64_t w = atomic_load(&c->word);
    /* The bookkeeping and the payload header of a READY slot were written before the CAS that
     * made it READY, and the CAS below fails if the slot changed hands since this load. */
    if (W_STATE(w) != RING_READY || atomic_load(&c->batch_id) != batch_id)
        return -DF_ESTATE;
    if (keep_lease && ((volatile struct ring_payload *)ring_slot_header(r, slot))->lease == keep_lease)
        return -DF_ESTATE;
    if (!cas(c, &w, W_MAKE(RING_FREE, 0)))
        return -DF_ESTATE;
    touch(c);
    atomic_fetch_add_explicit(&r->h->retracted, 1, memory_order_relaxed);
    signal_word(&r->h->free);
    return 0;
}

/* ---- reclaim ---------------------------------------------------------------- */

/* Take one slot away from `owner` if it still holds it; exactly one CAS decides. */
static void reclaim_slot(struct ring *r, uint32_t i, uint64_t w, struct ring_reclaim *out)
{
    struct ring_ctl *c = &r->ctl[i];
    if (W_STATE(w) == RING_WRITING) {
        if (cas(c, &w, W_MAKE(RING_FREE, 0))) {
            touch(c);
            out->writing_freed++;
            atomic_fetch_add(&r->h->reclaimed_writing, 1);
            signal_word(&r->h->free);
        }
    } else if (W_STATE(w) == RING_READING) {
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_relaxed);
        if (cas(c, &w, W_MAKE(RING_READY, seq))) {
            touch(c);
            out->reading_requeued++;
            atomic_fetch_add(&r->h->reclaimed_reading, 1);
            signal_word(&r->h->ready);
        }
    }
}

int ring_reclaim_owner(struct ring *r, uint64_t owner, struct ring_reclaim *out)
{
    struct ring_reclaim tmp = { 0 };
    if (r->rdonly)
        return -EROFS;
    if (!owner || (owner & ~PROC_TOKEN_MASK))
        return -EINVAL;
    for (uint32_t i = 0; i < r->nslots; i++) {
        uint64_t w = atomic_load(&r->ctl[i].word);
        unsigned s = W_STATE(w);
        if ((s == RING_WRITING || s == RING_READING) && W_VALUE(w) == owner)
            reclaim_slot(r, i, w, &tmp);
    }
    if (out)
        *out = tmp;
    return 0;
}

/* Verdicts of one scan: many slots and waiters usually share few owners. */
struct alive_memo {
    uint64_t tok[32];
    int alive[32], n;
};

static int memo_alive(struct alive_memo *m, uint64_t tok)
{
    for (int i = 0; i < m->n; i++)
        if (m->tok[i] == tok)
            return m->alive[i];
    int alive = proc_token_alive(tok);
    if (alive < 0)
        alive = 1;   /* cannot tell (e.g. /proc unreadable): never steal */
    if (m->n < (int)(sizeof m->tok / sizeof m->tok[0])) {
        m->tok[m->n] = tok;
        m->alive[m->n++] = alive;
    }
    return alive;
}

int ring_reclaim_dead(struct ring *r, struct ring_reclaim *out)
{
    struct ring_reclaim tmp = { 0 };
    if (r->rdonly)
        return -EROFS;
    struct alive_memo memo = { .n = 0 };
    uint64_t stuck_ns = (uint64_t)r->h->stuck_writing_ms * 1000000ull, now = mono_ns();
    for (uint32_t i = 0; i < r->nslots; i++) {
        uint64_t w = atomic_load(&r->ctl[i].word);
        unsigned s = W_STATE(w);
        if (s != RING_WRITING && s != RING_READING)
            continue;
        uint64_t tok = W_VALUE(w);
        if (proc_token_is_lease(tok))
            continue;
        if (!memo_alive(&memo, tok))
            reclaim_slot(r, i, w, &tmp);
        else if (s == RING_WRITING) {
            uint64_t t = atomic_load_explicit(&r->ctl[i].t_ns, memory_order_relaxed);
            tmp.stuck_writing += t < now && now - t > stuck_ns;     /* (t may be after now) */
        }
    }
    /* Waiter entries of dead processes. The entry is marked first with this reclaimer's token (one
     * CAS: one reclaimer wins, and no waiter can take it meanwhile), then its bits are cleared,
     * then it is free again: a bit cleared here is never a new holder's. The mark of a reclaimer
     * that died half-way is taken over like a dead waiter's entry. */
    struct ring_hdr *h = r->h;
    uint64_t me = 0;
    proc_self_token(&me);   /* (0 on failure: a mark no later reclaimer takes over) */
    const uint64_t mark = WAITER_CLEARING | me;
    for (uint32_t i = 0; i < RING_WAITERS; i++) {
        uint64_t tok = atomic_load(&h->waiter[i]);
        uint64_t who = tok & ~WAITER_CLEARING;
        if (!tok || memo_alive(&memo, who) || !atomic_compare_exchange_strong(&h->waiter[i], &tok, mark))
            continue;
        atomic_fetch_and(&h->ready.parked, ~(1ull << i));
        atomic_fetch_and(&h->free.parked, ~(1ull << i));
        atomic_store(&h->waiter[i], 0);
        tmp.waiters_cleared++;
    }
    if (out)
        *out = tmp;
    return 0;
}

/* ---- inspection ---------------------------------------------------------------- */

const char *ring_state_name(unsigned state)
{
    static const char *const n[] = { "FREE", "WRITING", "READY", "READING" };
    return state < 4 ? n[state] : "?";
}

int ring_stats(const struct ring *r, struct ring_stats *st, struct ring_slot_stat *slots)
{
    const struct ring_hdr *h = r->h;
    memset(st, 0, sizeof *st);
    st->nslots = r->nslots;
    st->published = atomic_load(&h->published);
    st->consumed = atomic_load(&h->consumed);
    st->aborted = atomic_load(&h->aborted);
    st->retracted = atomic_load(&h->retracted);
    st->reclaimed_writing = atomic_load(&h->reclaimed_writing);
    st->reclaimed_reading = atomic_load(&h->reclaimed_reading);
    st->writers_waiting = (uint32_t)__builtin_popcountll(atomic_load(&h->free.parked)) + atomic_load(&h->free.overflow);
    st->readers_waiting = (uint32_t)__builtin_popcountll(atomic_load(&h->ready.parked)) + atomic_load(&h->ready.overflow);
    st->creator_pid = h->creator_pid;
    st->creator_token = h->creator_token;
    st->created_wall_ms = h->created_wall_ms;
    st->stuck_writing_ms = h->stuck_writing_ms;
    st->tag = h->tag;
    uint64_t now = mono_ns(), stuck_ns = (uint64_t)h->stuck_writing_ms * 1000000ull;
    for (uint32_t i = 0; i < r->nslots; i++) {
        const struct ring_ctl *c = &r->ctl[i];
        uint64_t w = atomic_load(&c->word);
        uint64_t t = atomic_load_explicit(&c->t_ns, memory_order_relaxed);
        unsigned s = W_STATE(w);
        uint64_t age = now > t ? now - t : 0;
        bool stuck = s == RING_WRITING && age > stuck_ns;
        st->count[s]++;
        st->stuck_writing += stuck;
        if (!slots)
            continue;
        struct ring_slot_stat *o = &slots[i];
        memset(o, 0, sizeof *o);
        o->state = (uint8_t)s;
        o->stuck = stuck;
        if (s == RING_WRITING || s == RING_READING) {
            o->owner = W_VALUE(w);
            o->pid = proc_token_pid(o->owner);
        }
        o->seq = s == RING_READY ? W_VALUE(w) : atomic_load_explicit(&c->seq, memory_order_relaxed);
        o->batch_id = atomic_load_explicit(&c->batch_id, memory_order_relaxed);
        o->n_tokens = atomic_load_explicit(&c->n_tokens, memory_order_relaxed);
        o->age_ms = age / 1000000ull;
    }
    return 0;
}
