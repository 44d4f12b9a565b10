/* collective.c: shared-memory all-reduce / broadcast / barrier among the ranks of one host.
 * Futex barriers with per-rank arrival counters, so a dead or stalled peer is named, not waited on. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "common/err.h"
#include "common/fileio.h"
#include "common/mapname.h"
#include "common/proc.h"
#include "common/timeutil.h"
#include "ipc/collective.h"
#include "ipc/futex.h"

#define COLL_MAX_WORLD 64
#define CHECK_SLICE_NS 50000000ull   /* how often a waiting rank checks its peers are alive */

struct coll_hdr {
    _Atomic uint64_t magic;           /* stored last by rank 0 */
    uint32_t version;
    uint32_t world;
    uint64_t generation;
    uint64_t chunk_floats;
    uint64_t total_size;
    uint64_t data_off;
    int32_t creator_pid;
    uint32_t pad;
    alignas(64) _Atomic int32_t abort_code;     /* 0, or the negative error every rank returns */
    alignas(64) _Atomic uint64_t decided;       /* (last decided barrier << 1) | 1 if it was aborted */
    alignas(64) _Atomic uint32_t bar_word;      /* futex: bumped on each arrival and on abort/leave */
    _Atomic uint32_t bar_waiters;
    alignas(64) _Atomic uint64_t rank_token[COLL_MAX_WORLD];  /* owner token; 0 = not joined / left */
    struct {
        alignas(64) _Atomic uint64_t n;     /* barriers reached */
        _Atomic uint64_t busy_until_ns;     /* coll_busy: busy outside the group until then (mono_ns;
                                               0: never) */
    } arrived[COLL_MAX_WORLD];
};

struct coll {
    struct coll_hdr *h;
    float *in;          /* [world][chunk_floats]: each rank's contribution */
    float *out;         /* [chunk_floats]: the reduced chunk */
    struct map_ent *map;
    int rank, world;
    int timeout_ms;
    int (*idle)(void *arg);
    void *idle_arg;
    uint64_t chunk;
    uint64_t bar_seq;   /* barriers this rank has entered */
    uint64_t token;
};

/* Ranks that live in one process (threads) share one mapping of the object, so the
 * memory they share has one address (and ThreadSanitizer sees the sharing). */
struct map_ent {
    dev_t dev;
    ino_t ino;
    void *base;
    size_t size;
    int refs;
    struct map_ent *next;
};
static struct map_ent *g_maps;
static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;

static int map_get(int fd, size_t size, const char *name, struct map_ent **out)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    pthread_mutex_lock(&g_maps_lock);
    for (struct map_ent *m = g_maps; m; m = m->next)
        if (m->dev == st.st_dev && m->ino == st.st_ino && m->size == size) {
            m->refs++;
            *out = m;
            pthread_mutex_unlock(&g_maps_lock);
            return 0;
        }
    int rc = 0;
    struct map_ent *m = calloc(1, sizeof *m);
    void *p = m ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (!m)
        rc = -ENOMEM;
    else if (p == MAP_FAILED) {
        rc = -errno;
        free(m);
    } else {
        *m = (struct map_ent){ st.st_dev, st.st_ino, p, size, 1, g_maps };
        g_maps = m;
        mapname_add(p, size, "collective", name);
        *out = m;
    }
    pthread_mutex_unlock(&g_maps_lock);
    return rc;
}

static void map_put(struct map_ent *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&g_maps_lock);
    if (--m->refs == 0) {
        for (struct map_ent **pp = &g_maps; *pp; pp = &(*pp)->next)
            if (*pp == m) {
                *pp = m->next;
                break;
            }
        mapname_remove(m->base);
        munmap(m->base, m->size);
        free(m);
    }
    pthread_mutex_unlock(&g_maps_lock);
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Where the ranks' buffers start: the page after the header. */
#define DATA_OFF align_up(sizeof(struct coll_hdr), 4096)

static uint64_t total_size(uint32_t world, uint64_t chunk)
{
    return DATA_OFF + align_up(((uint64_t)world + 1) * chunk * sizeof(float), 4096);
}

void coll_busy(struct coll *c, unsigned ms)
{
    if (c && c->h)
        atomic_store(&c->h->arrived[c->rank].busy_until_ns, mono_ns() + (uint64_t)ms * 1000000ull);
}

int coll_rank(const struct coll *c) { return c->rank; }
int coll_world(const struct coll *c) { return c->world; }

void coll_abort(struct coll *c, int code)
{
    if (!c || !c->h)
        return;
    int32_t zero = 0;
    atomic_compare_exchange_strong(&c->h->abort_code, &zero, code < 0 ? code : -DF_EPEER);
    atomic_fetch_add(&c->h->bar_word, 1);
    futex_wake((uint32_t *)&c->h->bar_word, INT_MAX);
}

/* Is rank j gone for barrier k? Before it ever joined (k == 1) it may still come. */
static bool peer_gone(struct coll *c, int j, uint64_t k)
{
    uint64_t tok = atomic_load(&c->h->rank_token[j]);
    if (!tok)
        return k > 1;
    return proc_token_alive(tok) == 0;
}

/* Barrier k ends one way for every rank: the first rank to see all arrived (complete) or an
 * abort (peer dead, deadline, coll_abort) decides it with one CAS on `decided`, and all
 * ranks return that. (Deciding each on its own view let a late arrival complete on one rank
 * while another timed out.) A barrier that completed before an abort leaves the abort to the
 * next call. */
static int barrier(struct coll *c)
{
    struct coll_hdr *h = c->h;
    int ab = atomic_load(&h->abort_code);
    if (ab)
        return ab;
    uint64_t k = ++c->bar_seq;
    atomic_store(&h->arrived[c->rank].n, k);
    atomic_fetch_add(&h->bar_word, 1);
    if (atomic_load(&h->bar_waiters))
        futex_wake((uint32_t *)&h->bar_word, INT_MAX);

    uint64_t start = mono_ns(), deadline = c->timeout_ms < 0 ? 0 : start + (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t next_check = start + CHECK_SLICE_NS;
    for (;;) {
        uint32_t seen = atomic_load(&h->bar_word);
        uint64_t d = atomic_load(&h->decided);
        if (d >> 1 >= k)
            return d >> 1 > k || !(d & 1) ? 0 : atomic_load(&h->abort_code);
        uint64_t undecided = (k - 1) << 1;
        bool all = true;
        for (int j = 0; j < c->world && all; j++)
            all = atomic_load(&h->arrived[j].n) >= k;
        if (all) {
            atomic_compare_exchange_strong(&h->decided, &undecided, k << 1);
            continue;
        }
        if (atomic_load(&h->abort_code)) {
            atomic_compare_exchange_strong(&h->decided, &undecided, k << 1 | 1);
            continue;
        }
        uint64_t now = mono_ns();
        if (now >= next_check) {
            for (int j = 0; j < c->world; j++)
                if (atomic_load(&h->arrived[j].n) < k && peer_gone(c, j, k)) {
                    coll_abort(c, -DF_EDEAD);
                    break;
                }
            if (c->idle && c->idle(c->idle_arg))
                coll_abort(c, -ECANCELED);
            next_check = mono_ns() + CHECK_SLICE_NS;
        }
        if (deadline && now >= deadline) {
            /* A rank busy with a bounded wait of its own (coll_busy) is not stalled: the timeout
             * counts from when its mark lapses (or lapsed: it cleared it a moment ago). */
            uint64_t lapse = 0;
            for (int j = 0; j < c->world; j++)
                if (atomic_load(&h->arrived[j].n) < k && atomic_load(&h->arrived[j].busy_until_ns) > lapse)
                    lapse = atomic_load(&h->arrived[j].busy_until_ns);
            if (lapse && lapse + (uint64_t)c->timeout_ms * 1000000ull > now)
                deadline = lapse + (uint64_t)c->timeout_ms * 1000000ull;
            else
                coll_abort(c, -DF_ETIMEOUT);
        }
        if (atomic_load(&h->abort_code))
            continue;
        uint64_t until = next_check;
        if (deadline && deadline < until)
            until = deadline;
        struct timespec ts = { (time_t)(until / 1000000000ull), (long)(until % 1000000000ull) };
        atomic_fetch_add(&h->bar_waiters, 1);
        futex_wait_until((uint32_t *)&h->bar_word, seen, &ts);
        atomic_fetch_sub(&h->bar_waiters, 1);
    }
}

int coll_barrier(struct coll *c) { return barrier(c); }

int coll_allreduce_sum(struct coll *c, float *buf, size_t n)
{
    int rc = atomic_load(&c->h->abort_code);
    if (rc)
        return rc;
    const int world = c->world;
    for (size_t off = 0; off < n; off += c->chunk) {
        size_t m = n - off < c->chunk ? n - off : c->chunk;
        memcpy(c->in + (size_t)c->rank * c->chunk, buf + off, m * sizeof(float));
        if ((rc = barrier(c)) < 0)
            return rc;
        /* This rank reduces its share of the chunk, always in rank order 0..world-1, so the
         * result does not depend on which rank computed it. */
        size_t lo = m * (size_t)c->rank / (size_t)world, hi = m * (size_t)(c->rank + 1) / (size_t)world;
        float *out = c->out;
        memcpy(out + lo, c->in + lo, (hi - lo) * sizeof(float));
        for (int j = 1; j < world; j++) {
            const float *in = c->in + (size_t)j * c->chunk;
            for (size_t i = lo; i < hi; i++)
                out[i] += in[i];
        }
        if ((rc = barrier(c)) < 0)
            return rc;
        memcpy(buf + off, out, m * sizeof(float));
        /* The next round's writes into `in` are safe now (all reductions are done); `out` is
         * rewritten only after the next first barrier, which every rank reaches after its copy. */
    }
    return 0;
}

int coll_allgather(struct coll *c, const void *mine, size_t bytes, void *all)
{
    int rc = atomic_load(&c->h->abort_code);
    if (rc)
        return rc;
    if (bytes > c->chunk * sizeof(float))
        return -E2BIG;
    /* Staged in each rank's input area, read between the barriers, as the all-reduce does. */
    memcpy(c->in + (size_t)c->rank * c->chunk, mine, bytes);
    if ((rc = barrier(c)) < 0)
        return rc;
    for (int j = 0; j < c->world; j++)
        memcpy((char *)all + (size_t)j * bytes, c->in + (size_t)j * c->chunk, bytes);
    return barrier(c);
}

int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    int rc = atomic_load(&c->h->abort_code);
    if (rc)
        return rc;
    if (root < 0 || root >= c->world)
        return -EINVAL;
    /* Staged in the root's own input area: like an all-reduce contribution it may be written
     * before the first barrier, as nobody reads it outside the window between the barriers
     * (`out` may still be being copied out of by peers finishing the previous call). */
    size_t cap = c->chunk * sizeof(float);
    char *stage = (char *)(c->in + (size_t)root * c->chunk);
    for (size_t off = 0; off < bytes; off += cap) {
        size_t m = bytes - off < cap ? bytes - off : cap;
        if (c->rank == root)
            memcpy(stage, (char *)buf + off, m);
        if ((rc = barrier(c)) < 0)
            return rc;
        if (c->rank != root)
            memcpy((char *)buf + off, stage, m);
        if ((rc = barrier(c)) < 0)
            return rc;
    }
    return 0;
}

void coll_close(struct coll *c)
{
    if (!c)
        return;
    if (c->h) {
        uint64_t mine = c->token;
        /* leaving: peers still waiting for us see the rank as gone */
        atomic_compare_exchange_strong(&c->h->rank_token[c->rank], &mine, 0);
        atomic_fetch_add(&c->h->bar_word, 1);
        futex_wake((uint32_t *)&c->h->bar_word, INT_MAX);
    }
    map_put(c->map);
    free(c);
}

/* Whether the rank 0 that made the object (its owner token, else its pid) still lives: one
 * whose maker is gone is stale (a run before that crashed), whatever it says. */
static bool maker_alive(struct coll_hdr *h)
{
    uint64_t owner = atomic_load(&h->rank_token[0]);
    return owner ? proc_token_alive(owner) == 1 : h->creator_pid > 0 && kill(h->creator_pid, 0) == 0;
}

/* Rank 0: a fresh object for this generation, under the generation's own name (one there is
 * an earlier run's of the same number, or one this generation's rank 0 left by dying: replaced). */
static int create_object(struct coll *c, const char *name, uint64_t gen, unsigned mode, int *fd_out,
                         char *err, size_t errlen)
{
    shm_unlink(name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode ? mode : 0600);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errlen, "collective %s: create: %s", name, strerror(-rc));
        return rc;
    }
    uint64_t size = total_size((uint32_t)c->world, c->chunk);
    int e = fchmod(fd, mode ? mode : 0600) < 0 ? errno : -fileio_reserve(fd, size);
    int rc = e ? -e : map_get(fd, size, name, &c->map);
    if (rc < 0) {
        snprintf(err, errlen, "collective %s: cannot reserve %llu bytes: %s", name, (unsigned long long)size,
                 strerror(-rc));
        close(fd);
        shm_unlink(name);
        return rc;
    }
    struct coll_hdr *h = c->map->base;
    h->version = COLL_VERSION;
    h->world = (uint32_t)c->world;
    h->generation = gen;
    h->chunk_floats = c->chunk;
    h->total_size = size;
    h->data_off = DATA_OFF;
    h->creator_pid = (int32_t)getpid();
    atomic_store_explicit(&h->magic, COLL_MAGIC, memory_order_release);
    *fd_out = fd;
    return 0;
}

/* Other ranks: wait for rank 0's object of our generation. */
static int find_object(struct coll *c, const char *name, uint64_t gen, int *fd_out, char *err, size_t errlen)
{
    uint64_t deadline = c->timeout_ms < 0 ? 0 : mono_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t next_idle = mono_ns() + CHECK_SLICE_NS;
    unsigned nap_us = 500;
    char last[200] = "no such shm object";
    for (;;) {
        int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            struct coll_hdr hdr;
            struct stat st;
            memset(&hdr, 0, sizeof hdr);
            /* Header first, size second: rank 0 sizes the object before it stores the magic, so
             * a size read after a complete header is the final one (the other order could see
             * the object still empty and call it truncated). */
            ssize_t got = pread(fd, &hdr, sizeof hdr, 0);
            if (got >= 0 && fstat(fd, &st) < 0)
                got = -1;
            if (got >= 0 && (st.st_uid != geteuid() || (st.st_mode & 077))) {
                /* rank 0 makes it 0600 as this user (the ranks of a group are one user) */
                snprintf(err, errlen, "collective %s: refused: the object belongs to uid %u with mode %04o, not to "
                         "this user alone", name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
                close(fd);
                return -EPERM;
            }
            uint64_t magic = atomic_load(&hdr.magic);
            /* One of this generation's number whose rank 0 is gone is an earlier run's, left by a
             * crash (the numbers start again with a new ledger): wait for this rank 0 to replace
             * it, rather than take its version or world size for a config error. */
            bool stale = got == (ssize_t)sizeof hdr && magic == COLL_MAGIC && hdr.generation == gen &&
                         !maker_alive(&hdr);
            if (got == (ssize_t)sizeof hdr && magic == COLL_MAGIC && hdr.generation == gen && !stale) {
                if (hdr.version != COLL_VERSION) {
                    snprintf(err, errlen, "collective %s: version %u, this build speaks %u", name, hdr.version, COLL_VERSION);
                    close(fd);
                    return -DF_EVERSION;
                }
                if (hdr.world != (uint32_t)c->world) {
                    snprintf(err, errlen, "collective %s: generation %llu has world size %u, this rank expects %d",
                             name, (unsigned long long)gen, hdr.world, c->world);
                    close(fd);
                    return -DF_ELAYOUT;
                }
                /* bounded before the product: a foreign object's sizes must not wrap it around */
                if (hdr.chunk_floats < 1 || hdr.chunk_floats > COLL_MAX_CHUNK ||
                    hdr.data_off != DATA_OFF ||
                    hdr.total_size != total_size(hdr.world, hdr.chunk_floats) ||
                    (uint64_t)st.st_size < hdr.total_size) {
                    snprintf(err, errlen, "collective %s: truncated or corrupt object", name);
                    close(fd);
                    return -DF_ETRUNC;
                }
                c->chunk = hdr.chunk_floats;
                int rc = map_get(fd, hdr.total_size, name, &c->map);
                if (rc < 0) {
                    snprintf(err, errlen, "collective %s: mmap: %s", name, strerror(-rc));
                    close(fd);
                    return rc;
                }
                /* pairs with rank 0's release store: the header we use is the complete one */
                atomic_load_explicit(&((struct coll_hdr *)c->map->base)->magic, memory_order_acquire);
                *fd_out = fd;
                return 0;
            }
            if (stale)
                snprintf(last, sizeof last, "an object of generation %llu whose rank 0 is gone (an earlier run's)",
                         (unsigned long long)gen);
            else if (got == (ssize_t)sizeof hdr && magic == COLL_MAGIC)
                snprintf(last, sizeof last, "object is generation %llu, expected %llu",
                         (unsigned long long)hdr.generation, (unsigned long long)gen);
            else if (magic && magic != COLL_MAGIC)
                snprintf(last, sizeof last, "not a dflash collective (bad magic)");
            else
                snprintf(last, sizeof last, "object not initialised");
            close(fd);
        } else if (errno != ENOENT) {
            int rc = -errno;
            snprintf(err, errlen, "collective %s: %s", name, strerror(-rc));
            return rc;
        }
        if (deadline && mono_ns() >= deadline) {
            snprintf(err, errlen, "collective %s: rank %d gave up waiting for rank 0: %s", name, c->rank, last);
            return -DF_ETIMEOUT;
        }
        if (c->idle && mono_ns() >= next_idle) {
            if (c->idle(c->idle_arg)) {
                snprintf(err, errlen, "collective %s: rank %d stopped waiting for rank 0", name, c->rank);
                return -ECANCELED;
            }
            next_idle = mono_ns() + CHECK_SLICE_NS;
        }
        /* Nothing to wait on before the object exists: poll with a growing nap. */
        usleep(nap_us);
        if (nap_us < 10000)
            nap_us *= 2;
    }
}

/* Remove `name` only if it still names the object behind fd (a newer group may own it). */
static void unlink_if_ours(const char *name, int fd)
{
    struct stat a, b;
    int nfd = fileio_shm_open(name, O_RDONLY, &a);
    if (nfd >= 0 && fstat(fd, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        shm_unlink(name);
    if (nfd >= 0)
        close(nfd);
}

int coll_object_name(const char *name, uint64_t gen, char *out, size_t len)
{
    int n = snprintf(out, len, "%s-%llu", name, (unsigned long long)gen);
    return n < 0 || (size_t)n >= len || n > NAME_MAX ? -ENAMETOOLONG : 0;
}

/* The object of generation gen - 1, left named by a rank 0 that died while it formed (a rank 0
 * that lives is late for it, and removes it itself): removed by the next generation's rank 0. */
static void remove_left_behind(const char *group, uint64_t gen)
{
    char name[NAME_MAX + 2];
    if (gen < 2 || coll_object_name(group, gen - 1, name, sizeof name) < 0)
        return;
    int fd = fileio_shm_open(name, O_RDONLY, NULL);
    if (fd < 0)
        return;
    struct coll_hdr hdr;
    memset(&hdr, 0, sizeof hdr);
    ssize_t got = pread(fd, &hdr, sizeof hdr, 0);
    if (got == (ssize_t)sizeof hdr && atomic_load(&hdr.magic) == COLL_MAGIC && hdr.generation == gen - 1 &&
        !maker_alive(&hdr))
        unlink_if_ours(name, fd);
    close(fd);
}

int coll_open(struct coll **out, const char *group, int rank, int world, int timeout_ms,
              const struct coll_opts *opts, char *err, size_t errlen)
{
    *out = NULL;
    if (!group || group[0] != '/' || strchr(group + 1, '/') || strlen(group) > NAME_MAX) {
        snprintf(err, errlen, "collective '%s': bad shm name", group ? group : "(null)");
        return -EINVAL;
    }
    if (world < 1 || world > COLL_MAX_WORLD || rank < 0 || rank >= world) {
        snprintf(err, errlen, "collective %s: rank %d / world %d out of range (world 1..%d)", group, rank, world,
                 COLL_MAX_WORLD);
        return -DF_ERANGE;
    }
    if (!opts || !opts->generation) {
        snprintf(err, errlen, "collective %s: a non-zero generation is required", group);
        return -EINVAL;
    }
    char name[NAME_MAX + 2];
    if (coll_object_name(group, opts->generation, name, sizeof name) < 0) {
        snprintf(err, errlen, "collective '%s': the name of generation %llu is too long", group,
                 (unsigned long long)opts->generation);
        return -EINVAL;
    }
    if (opts->chunk_floats > COLL_MAX_CHUNK) {
        snprintf(err, errlen, "collective %s: chunk of %zu floats above %llu", name, opts->chunk_floats, COLL_MAX_CHUNK);
        return -DF_ERANGE;
    }
    struct coll *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->rank = rank;
    c->world = world;
    c->timeout_ms = timeout_ms;
    c->idle = opts->idle;
    c->idle_arg = opts->idle_arg;
    c->chunk = opts->chunk_floats ? opts->chunk_floats : (1u << 20);
    int rc = proc_self_token(&c->token), fd = -1;
    if (rc < 0) {
        snprintf(err, errlen, "collective %s: own start time: %s", name, strerror(-rc));
        goto fail;
    }
    if (rank == 0)
        remove_left_behind(group, opts->generation);
    rc = rank == 0 ? create_object(c, name, opts->generation, opts->mode, &fd, err, errlen)
                   : find_object(c, name, opts->generation, &fd, err, errlen);
    if (rc < 0)
        goto fail;
    struct coll_hdr *h = c->h = c->map->base;
    c->in = (float *)((char *)c->map->base + DATA_OFF);  /* not the header's word */
    c->out = c->in + (size_t)world * c->chunk;

    uint64_t expect = 0;
    if (!atomic_compare_exchange_strong(&h->rank_token[rank], &expect, c->token)) {
        bool alive = proc_token_alive(expect) == 1;
        snprintf(err, errlen, "collective %s: rank %d of generation %llu is already taken by pid %d%s", name, rank,
                 (unsigned long long)opts->generation, proc_token_pid(expect),
                 alive ? "" : " (dead: the group is broken, restart it with a new generation)");
        rc = alive ? -EBUSY : -DF_EDEAD;
        c->token = 0;   /* not ours: close must not clear it */
        goto fail;
    }
    if ((rc = barrier(c)) < 0) {
        snprintf(err, errlen, "collective %s: not all %d ranks joined: %s", name, world, err_str(rc));
        goto fail;
    }
    /* Everyone has it mapped: the name is no longer needed, and a crash leaves nothing behind. */
    if (rank == 0)
        unlink_if_ours(name, fd);
    close(fd);
    *out = c;
    return 0;

fail:
    if (fd >= 0) {
        if (rank == 0)
            unlink_if_ours(name, fd);
        close(fd);
    }
    if (c->h && c->token)
        coll_abort(c, rc == -DF_ETIMEOUT ? -DF_ETIMEOUT : -DF_EPEER);
    coll_close(c);
    return rc;
}
