/* test_collective.c: shared-memory all-reduce among processes: bitwise equal to the serial
 * rank-order sum on every rank, chunked buffers, broadcast, generations, dead and stalled peers. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/collective.h"
#include "tests/test.h"

static char g_name[64];

/* The shm name of generation gen's object (four calls' names held at once). */
static const char *obj(uint64_t gen)
{
    static char n[4][96];
    static int k;
    char *o = n[k++ % 4];
    CHECK_OK(coll_object_name(g_name, gen, o, sizeof n[0]));
    return o;
}
static int S = 1;       /* test_time_scale(): the timeouts below stretch with slow builds */

static float value(int rank, int iter, size_t i)
{
    uint64_t x = (uint64_t)rank * 0x9e3779b97f4a7c15ull ^ (uint64_t)iter << 32 ^ i;
    x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 29;
    /* wide dynamic range, so a different summation order would change the bits */
    return (float)((double)(int64_t)(x % 2000001) - 1e6) * (float)(1 << (x >> 60)) * 1e-3f;
}

#define N 100003   /* not a multiple of the chunk or the world */

/* Child: `iters` all-reduces + a broadcast; exits 0 when all match the serial sum bitwise. */
static int rank_main(int rank, int world, uint64_t gen, int iters)
{
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = gen, .chunk_floats = 4096 };
    int rc = coll_open(&c, g_name, rank, world, 20000, &o, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    float *buf = malloc(N * sizeof(float));
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < N; i++)
            buf[i] = value(rank, it, i);
        if ((rc = coll_allreduce_sum(c, buf, N)) < 0) {
            fprintf(stderr, "rank %d: allreduce: %s\n", rank, err_str(rc));
            return 2;
        }
        for (size_t i = 0; i < N; i++) {
            float s = value(0, it, i);
            for (int j = 1; j < world; j++)
                s += value(j, it, i);
            if (memcmp(&s, &buf[i], sizeof s)) {
                fprintf(stderr, "rank %d iter %d: element %zu is %.9g, serial sum %.9g\n", rank, it, i, buf[i], s);
                return 3;
            }
        }
    }
    char msg[20000];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = rank == world - 1 ? (char)(i * 7 + 3) : 0;
    if ((rc = coll_broadcast(c, msg, sizeof msg, world - 1)) < 0)
        return 4;
    for (size_t i = 0; i < sizeof msg; i++)
        if (msg[i] != (char)(i * 7 + 3))
            return 5;
    /* all-gather, interleaved with all-reduces so the staging areas are reused back to back */
    for (int it = 0; it < 50; it++) {
        uint64_t mine[2] = { (uint64_t)rank, ((uint64_t)it << 40) | (uint64_t)(rank * 977 + 1) }, all[2 * 64];
        if (world > 64 || (rc = coll_allgather(c, mine, sizeof mine, all)) < 0)
            return 7;
        for (int j = 0; j < world; j++)
            if (all[2 * j] != (uint64_t)j || all[2 * j + 1] != (((uint64_t)it << 40) | (uint64_t)(j * 977 + 1))) {
                fprintf(stderr, "rank %d iter %d: gathered entry %d is %llu/%llu\n", rank, it, j,
                        (unsigned long long)all[2 * j], (unsigned long long)all[2 * j + 1]);
                return 8;
            }
        float one = 1.0f;
        if (coll_allreduce_sum(c, &one, 1) < 0 || one != (float)world)
            return 9;
    }
    if (coll_allgather(c, msg, 4096 * sizeof(float) + 1, msg) != -E2BIG)
        return 10;
    if (coll_barrier(c) < 0)
        return 6;
    free(buf);
    coll_close(c);
    return 0;
}

static pid_t spawn_rank(int rank, int world, uint64_t gen, int iters)
{
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0)
        _exit(rank_main(rank, world, gen, iters));
    return p;
}

static int reap(pid_t p)
{
    int status;
    CHECK_INT(waitpid(p, &status, 0), ==, p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_correct(void)
{
    enum { W = 4 };
    pid_t p[W];
    /* ranks 1.. start first: they wait for rank 0's object of their generation */
    for (int r = W - 1; r >= 0; r--)
        p[r] = spawn_rank(r, W, 11, 3);
    for (int r = 0; r < W; r++)
        CHECK_INT(reap(p[r]), ==, 0);
    CHECK_INT(shm_open(obj(11), O_RDONLY, 0), <, 0);   /* nothing left in /dev/shm */
    /* a world of one is a copy */
    CHECK_INT(reap(spawn_rank(0, 1, 12, 1)), ==, 0);
}

/* Fork rank r of a group of `world` (generation gen): NULL in the parent (*pid set), the joined
 * handle in the child (which exits 10 when it cannot join). */
static struct coll *fork_rank(int r, int world, uint64_t gen, int timeout_ms, pid_t *pid)
{
    *pid = fork();
    CHECK(*pid >= 0);
    if (*pid)
        return NULL;
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = gen };
    if (coll_open(&c, g_name, r, world, timeout_ms, &o, err, sizeof err) < 0)
        _exit(10);
    return c;
}

/* A peer that dies mid-training makes the others fail fast with DF_EDEAD, not time out. */
static void test_dead_peer(int stall)
{
    enum { W = 3 };
    int pfd[2];
    CHECK_OK(pipe(pfd));
    pid_t p[W];
    for (int r = 0; r < W; r++) {
        struct coll *c = fork_rank(r, W, 20 + (uint64_t)stall, stall ? 300 * S : 30000, &p[r]);
        if (!c)
            continue;
        float x[64] = { 1 };
        if (coll_allreduce_sum(c, x, 64) < 0 || x[0] != W)
            _exit(11);
        if (r == 2)
            raise(stall ? SIGSTOP : SIGKILL);
        uint64_t t0 = mono_ns();
        int rc = coll_allreduce_sum(c, x, 64);
        uint64_t ms = (mono_ns() - t0) / 1000000;
        int again = coll_barrier(c);   /* the group stays failed */
        if (write(pfd[1], &ms, sizeof ms) != sizeof ms)
            _exit(12);
        _exit(rc == (stall ? -DF_ETIMEOUT : -DF_EDEAD) && again == rc ? 0 : 13);
    }
    CHECK_INT(reap(p[0]), ==, 0);
    CHECK_INT(reap(p[1]), ==, 0);
    uint64_t longest = 0;
    for (int i = 0; i < 2; i++) {
        uint64_t ms;
        CHECK_INT(read(pfd[0], &ms, sizeof ms), ==, sizeof ms);
        CHECK_INT(ms, <, 3000 * S);   /* fail fast: 30 s would be the timeout */
        longest = ms > longest ? ms : longest;
    }
    /* the first rank to give up waited its full timeout; the other may learn it sooner */
    if (stall)
        CHECK_INT(longest, >=, 300 * S);
    kill(p[2], SIGKILL);
    reap(p[2]);
    close(pfd[0]);
    close(pfd[1]);
}

/* A rank busy outside the group (coll_busy, renewed: rank 0 writing a checkpoint) for several
 * timeouts keeps its peer waiting, not timed out; the peer's timeout counts from when the mark is
 * cleared, so a rank that then never comes still fails the group, one timeout later. */
static void test_busy_peer(void)
{
    enum { W = 2 };
    pid_t p[W];
    for (int r = 0; r < W; r++) {
        struct coll *c = fork_rank(r, W, 40, 200 * S, &p[r]);
        if (!c)
            continue;
        if (r == 0) {           /* busy for 5 timeouts, then into the barrier */
            uint64_t end = mono_ns() + 1000ull * 1000000 * (uint64_t)S;
            while (mono_ns() < end) {
                coll_busy(c, 100 * (unsigned)S);
                usleep(20000);
            }
            coll_busy(c, 0);
            if (coll_barrier(c) < 0)
                _exit(11);
            /* busy again, then gone quiet (stalled) without coming */
            coll_busy(c, 300 * (unsigned)S);
            coll_busy(c, 0);
            pause();
            _exit(12);
        }
        uint64_t t0 = mono_ns();
        if (coll_barrier(c) < 0)
            _exit(13);
        uint64_t ms = (mono_ns() - t0) / 1000000;
        if (ms < 900 * (uint64_t)S)
            _exit(14);
        t0 = mono_ns();
        int rc = coll_barrier(c);
        ms = (mono_ns() - t0) / 1000000;
        _exit(rc == -DF_ETIMEOUT && ms < 2000 * (uint64_t)S ? 0 : 15);
    }
    CHECK_INT(reap(p[1]), ==, 0);
    kill(p[0], SIGKILL);
    reap(p[0]);
}

static void test_generations(void)
{
    char err[256];
    struct coll *c = NULL;
    /* a rank of another generation never joins this object; it times out and says why */
    pid_t p0 = fork();
    if (p0 == 0) {
        struct coll *c0 = NULL;
        struct coll_opts o = { .generation = 31 };
        /* rank 1 of gen 31 never comes: rank 0 times out too */
        _exit(coll_open(&c0, g_name, 0, 2, 600 * S, &o, err, sizeof err) == -DF_ETIMEOUT ? 0 : 1);
    }
    struct coll_opts stale = { .generation = 30 };
    int rc = coll_open(&c, g_name, 1, 2, 300 * S, &stale, err, sizeof err);
    CHECK_INT(rc, ==, -DF_ETIMEOUT);
    CHECK_CONTAINS(err, g_name);
    CHECK(strstr(err, "expected 30") || strstr(err, "no such") || strstr(err, "not initialised"));
    CHECK_INT(reap(p0), ==, 0);
    CHECK_INT(shm_open(obj(31), O_RDONLY, 0), <, 0);   /* the failed rank 0 cleaned up */
    /* world size mismatch inside one generation is refused at once */
    p0 = fork();
    if (p0 == 0) {
        struct coll *c0 = NULL;
        struct coll_opts o = { .generation = 32 };
        _exit(coll_open(&c0, g_name, 0, 2, 800 * S, &o, err, sizeof err) == -DF_ETIMEOUT ? 0 : 1);
    }
    struct coll_opts g32 = { .generation = 32 };
    uint64_t t0 = mono_ns();
    do
        rc = coll_open(&c, g_name, 1, 3, 0, &g32, err, sizeof err);
    while (rc == -DF_ETIMEOUT && mono_ns() - t0 < 700000000ull * (uint64_t)S);   /* until rank 0's object exists */
    CHECK_INT(rc, ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "world size 2");
    CHECK_INT(reap(p0), ==, 0);
    CHECK_INT(coll_open(&c, g_name, 0, 2, 100, &(struct coll_opts){ 0 }, err, sizeof err), ==, -EINVAL);
    CHECK_INT(coll_open(&c, g_name, 2, 2, 100, &g32, err, sizeof err), ==, -DF_ERANGE);
    coll_close(NULL);
}

/* An object under the name that its sizes would have a rank map or index past: refused, not
 * used (a data offset far beyond the object; a chunk whose size product wraps around 2^64). */
static void put_object(uint64_t gen, uint32_t world, uint64_t chunk, uint64_t total, uint64_t data_off, size_t object)
{
    shm_unlink(obj(gen));
    int fd = shm_open(obj(gen), O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (off_t)object) == 0);
    struct { uint64_t magic; uint32_t version, world; uint64_t gen, chunk, total, data_off; } h = {
        COLL_MAGIC, COLL_VERSION, world, gen, chunk, total, data_off };
    CHECK(pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
    int32_t maker = (int32_t)getpid();      /* creator_pid: a maker alive (a gone one: stale) */
    CHECK(pwrite(fd, &maker, 4, 48) == 4);
    close(fd);
}

static void test_hostile_header(void)
{
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = 40 };
    put_object(40, 2, 1, 8192 + 4096, 1ull << 40, 8192 + 4096);
    CHECK_INT(coll_open(&c, g_name, 1, 2, 200, &o, err, sizeof err), ==, -DF_ETRUNC);
    CHECK_CONTAINS(err, "corrupt");
    put_object(40, 3, 1ull << 60, 8192, 8192, 8192);     /* (3 + 1) x 2^60 x 4 bytes = 2^64: 0 */
    CHECK_INT(coll_open(&c, g_name, 1, 3, 200, &o, err, sizeof err), ==, -DF_ETRUNC);
    CHECK(!c);
    /* a well-formed object that others may write (rank 0 makes it 0600) */
    put_object(40, 2, 1, 8192 + 4096, 8192, 8192 + 4096);
    int fd = shm_open(obj(40), O_RDWR, 0);
    CHECK(fd >= 0 && fchmod(fd, 0606) == 0);
    close(fd);
    CHECK_INT(coll_open(&c, g_name, 1, 2, 200, &o, err, sizeof err), ==, -EPERM);
    CHECK_CONTAINS(err, "not to this user alone");
    /* a rank 0 late for generation 39 has a name of its own: generation 40's object, its maker
     * alive, stays (one name for all let the late one unlink it before its peers joined) */
    fd = shm_open(obj(40), O_RDWR, 0);
    int32_t maker = (int32_t)getpid();
    CHECK(fd >= 0 && fchmod(fd, 0600) == 0 && pwrite(fd, &maker, 4, 48) == 4);     /* creator_pid */
    struct coll_opts late = { .generation = 39 };
    CHECK_INT(coll_open(&c, g_name, 0, 2, 200, &late, err, sizeof err), ==, -DF_ETIMEOUT);   /* its peer never came */
    CHECK_CONTAINS(err, "not all 2 ranks joined");
    CHECK_CONTAINS(err, obj(39));
    uint64_t gen_there = 0;
    CHECK(pread(fd, &gen_there, 8, 16) == 8 && gen_there == 40);
    struct stat st_fd, st_name;
    CHECK(fstat(fd, &st_fd) == 0);
    int again = shm_open(obj(40), O_RDONLY, 0);
    CHECK(again >= 0 && fstat(again, &st_name) == 0 && st_name.st_ino == st_fd.st_ino);
    close(again);
    CHECK_INT(shm_open(obj(39), O_RDONLY, 0), <, 0);      /* the late one removed its own */
    /* generation 41's rank 0 leaves 40's object alone while its maker lives (a late rank 0,
     * which removes its own); once its maker is gone (it died while 40 formed), it goes */
    CHECK_INT(coll_open(&c, g_name, 0, 2, 100, &(struct coll_opts){ .generation = 41 }, err, sizeof err), ==,
              -DF_ETIMEOUT);
    again = shm_open(obj(40), O_RDONLY, 0);
    CHECK(again >= 0);
    close(again);
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    CHECK_INT(reap(gone), ==, 0);
    maker = (int32_t)gone;
    CHECK(pwrite(fd, &maker, 4, 48) == 4);
    close(fd);
    CHECK_INT(coll_open(&c, g_name, 0, 2, 100, &(struct coll_opts){ .generation = 41 }, err, sizeof err), ==,
              -DF_ETIMEOUT);
    CHECK_INT(shm_open(obj(40), O_RDONLY, 0), <, 0);
    /* an earlier run's object of this generation's number, of another world size, its maker gone
     * (the numbers start again with a new ledger): a rank waits for this run's rank 0 to replace
     * it, it does not fail the run as a config error */
    put_object(40, 4, 1, 5 * 4 + 8192, 8192, 5 * 4 + 8192);
    fd = shm_open(obj(40), O_RDWR, 0);
    CHECK(fd >= 0 && pwrite(fd, &maker, 4, 48) == 4);
    close(fd);
    CHECK_INT(coll_open(&c, g_name, 1, 2, 300, &o, err, sizeof err), ==, -DF_ETIMEOUT);
    CHECK_CONTAINS(err, "whose rank 0 is gone");
    shm_unlink(obj(40));
    printf("ok: a collective object with impossible sizes, or others may write, is refused; a newer one stays "
           "(a late rank 0 has a name of its own); one left by a dead rank 0 goes; a stale one of this "
           "generation's number is waited past\n");
}

/* A rank that finds rank 0's object while rank 0 is still sizing it waits for it instead of
 * calling it truncated (a big object takes rank 0 a while to reserve). The old order (size read
 * before the header) failed here only when rank 1 was preempted between the two reads, as on a
 * loaded 2-core CI machine; this exercises the path, it cannot force that preemption. */
static void test_join_during_create(void)
{
    char err[256];
    for (int i = 0; i < 20; i++) {
        struct coll_opts o = { .generation = 500 + (uint64_t)i, .chunk_floats = 4u << 20 };
        shm_unlink(obj(o.generation));
        pid_t p = fork();
        CHECK(p >= 0);
        if (p == 0) {
            struct coll *c = NULL;
            int rc = coll_open(&c, g_name, 1, 2, 20000, &o, err, sizeof err);
            if (rc < 0)
                fprintf(stderr, "rank 1, round %d: %s\n", i, err);
            _exit(rc < 0 || coll_barrier(c) < 0 ? 1 : (coll_close(c), 0));
        }
        usleep(1000 + 300 * (unsigned)i);
        struct coll *c = NULL;
        CHECK_INT(coll_open(&c, g_name, 0, 2, 20000, &o, err, sizeof err), ==, 0);
        CHECK_INT(coll_barrier(c), ==, 0);
        coll_close(c);
        CHECK_INT(reap(p), ==, 0);
    }
    printf("ok: a rank joining while rank 0 still sizes a 48 MiB object waits for it (20 rounds)\n");
}

int main(void)
{
    snprintf(g_name, sizeof g_name, "/dflash-test-coll-%d", (int)getpid());
    S = test_time_scale();
    test_correct();
    test_dead_peer(0);
    test_dead_peer(1);
    test_busy_peer();
    test_generations();
    test_hostile_header();
    test_join_during_create();
    shm_unlink(g_name);
    fprintf(stderr, "ok\n");
    return 0;
}
