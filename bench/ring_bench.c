/* ring_bench.c: ring handoff rate and latency with small slots, and GB/s with 64 MiB slots
 * against a pipe and a unix socket moving the same bytes, all measured in one run. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/ring.h"

static char g_name[64];

static void die(const char *what, int rc)
{
    fprintf(stderr, "ring_bench: %s: %s\n", what, err_str(rc));
    exit(1);
}

static struct ring *make_ring(struct ring_layout *l)
{
    char err[256];
    struct ring *r = NULL;
    int rc = ring_create(&r, g_name, l, &(struct ring_create_opts){ .gid = -1, .flags = RING_CREATE_REPLACE },
                         err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return r;
}

static struct ring *attach(struct ring_layout *l)
{
    char err[256];
    struct ring *r = NULL;
    /* prefaulted, as a daemon's mapping is after cudaHostRegister */
    if (ring_attach(&r, g_name, l, RING_ATTACH_POPULATE, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        _exit(1);
    }
    return r;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void wait_child(pid_t p)
{
    int st;
    if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "ring_bench: child failed (%#x)\n", st);
        exit(1);
    }
}

/* ---- small slots -------------------------------------------------------------- */

static struct ring_layout small_layout(uint32_t nslots)
{
    struct ring_layout l = { .nslots = nslots, .hidden = 8, .n_layers = 1, .dtype = RING_DTYPE_BF16,
                             .max_tokens = 16, .max_seqs = 1 };
    return l;
}

/* Writer: n publishes, each stamped with the time just before ring_publish. */
static void small_writer(struct ring_layout *l, long n)
{
    struct ring *r = attach(l);
    for (long i = 0; i < n; i++) {
        unsigned s;
        int rc = ring_claim_write(r, -1, &s);
        if (rc < 0)
            die("claim_write", rc);
        struct ring_payload *p = ring_slot_header(r, s);
        p->batch_id = (uint64_t)i;
        p->n_tokens = 1;
        p->checksum = mono_ns();
        if ((rc = ring_publish(r, s)) < 0)
            die("publish", rc);
    }
    ring_detach(r);
    _exit(0);
}

/* Reader: n claims; poll = retry with timeout 0 (busy) instead of parking on the futex. */
static void small_reader(struct ring_layout *l, long n, bool poll, uint64_t *lat)
{
    struct ring *r = attach(l);
    for (long i = 0; i < n; i++) {
        unsigned s;
        int rc;
        do
            rc = ring_claim_read(r, NULL, poll ? 0 : -1, &s);
        while (rc == -DF_ETIMEOUT);
        if (rc < 0)
            die("claim_read", rc);
        uint64_t now = mono_ns();
        if (lat)
            lat[i] = now - ring_slot_header(r, s)->checksum;
        if ((rc = ring_release(r, s)) < 0)
            die("release", rc);
    }
    ring_detach(r);
}

static void bench_small(uint32_t nslots, long n, bool poll, const char *label)
{
    struct ring_layout l = small_layout(nslots);
    struct ring *r = make_ring(&l);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)n);
    uint64_t t0 = mono_ns();
    pid_t w = fork();
    if (w == 0)
        small_writer(&l, n);
    small_reader(&l, n, poll, lat);
    wait_child(w);
    double secs = (double)(mono_ns() - t0) / 1e9;
    qsort(lat, (size_t)n, sizeof *lat, cmp_u64);
    printf("%-44s %10.0f handoffs/s   latency p50 %7.2f us  p99 %8.2f us\n", label, (double)n / secs,
           (double)lat[n / 2] / 1e3, (double)lat[n * 99 / 100] / 1e3);
    free(lat);
    ring_detach(r);
    ring_unlink(g_name);
}

/* ---- 64 MiB payloads -------------------------------------------------------------- */

#define BIG (64ull << 20)

static inline void fill(uint64_t *p, size_t bytes, uint64_t seed)
{
    for (size_t i = 0; i < bytes / 8; i++)
        p[i] = seed + i;
}

static inline uint64_t consume(const uint64_t *p, size_t bytes)
{
    uint64_t s = 0;
    for (size_t i = 0; i < bytes / 8; i++)
        s += p[i];
    return s;
}

static uint64_t expect_sum(size_t bytes, uint64_t seed)
{
    uint64_t n = bytes / 8;
    return seed * n + n * (n - 1) / 2;
}

static double bench_big_ring(int n)
{
    struct ring_layout l = { .nslots = 4, .hidden = 4096, .n_layers = 4, .dtype = RING_DTYPE_BF16,
                             .max_tokens = (uint32_t)(BIG / (2 * 4096 * 4)), .max_seqs = 1 };
    struct ring *r = make_ring(&l);
    /* first touch of the shm pages happens outside the timing, as in a long-running cluster */
    for (unsigned i = 0; i < l.nslots; i++)
        memset(ring_slot_hidden(r, i), 0, ring_hidden_bytes(r));
    int go[2], ready[2];
    char b = 0;
    if (pipe(go) || pipe(ready))
        exit(1);
    pid_t w = fork();
    if (w == 0) {
        struct ring *c = attach(&l);
        if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) != 1)
            _exit(1);
        for (int i = 0; i < n; i++) {
            unsigned s;
            int rc = ring_claim_write(c, -1, &s);
            if (rc < 0)
                die("claim_write", rc);
            fill(ring_slot_hidden(c, s), BIG, (uint64_t)i);
            ring_slot_header(c, s)->batch_id = (uint64_t)i;
            if ((rc = ring_publish(c, s)) < 0)
                die("publish", rc);
        }
        _exit(0);
    }
    struct ring *c = attach(&l);
    if (read(ready[0], &b, 1) != 1)
        exit(1);
    uint64_t t0 = mono_ns();
    if (write(go[1], &b, 1) != 1)
        exit(1);
    for (int i = 0; i < n; i++) {
        unsigned s;
        int rc = ring_claim_read(c, NULL, -1, &s);
        if (rc < 0)
            die("claim_read", rc);
        uint64_t id = ring_slot_header(c, s)->batch_id;
        if (consume(ring_slot_hidden(c, s), BIG) != expect_sum(BIG, id)) {
            fprintf(stderr, "ring_bench: ring payload corrupt\n");
            exit(1);
        }
        ring_release(c, s);
    }
    wait_child(w);
    double secs = (double)(mono_ns() - t0) / 1e9;
    ring_detach(c);
    ring_detach(r);
    ring_unlink(g_name);
    return (double)BIG * n / secs / 1e9;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The same work through a byte stream: the writer fills its buffer and sends it, the
 * reader receives into its buffer and reads it. */
static double bench_stream(int n, bool sock)
{
    int fds[2];
    if (sock ? socketpair(AF_UNIX, SOCK_STREAM, 0, fds) : pipe(fds)) {
        perror("ring_bench: pipe/socketpair");
        exit(1);
    }
    if (!sock)
        fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);   /* the largest an unprivileged pipe gets by default */
    else {
        int sz = 4 << 20;
        setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
        setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    }
    uint64_t *buf = malloc(BIG);
    memset(buf, 1, BIG);   /* non-zero: really faults the pages in before timing */
    uint64_t t0 = mono_ns();
    pid_t w = fork();
    if (w == 0) {
        close(fds[0]);
        uint64_t *wb = malloc(BIG);
        memset(wb, 1, BIG);
        for (int i = 0; i < n; i++) {
            fill(wb, BIG, (uint64_t)i);
            if (write_all(fds[1], wb, BIG) < 0)
                _exit(1);
        }
        _exit(0);
    }
    close(fds[1]);
    for (int i = 0; i < n; i++) {
        if (read_all(fds[0], buf, BIG) < 0 || consume(buf, BIG) != expect_sum(BIG, (uint64_t)i)) {
            fprintf(stderr, "ring_bench: stream payload corrupt\n");
            exit(1);
        }
    }
    wait_child(w);
    double secs = (double)(mono_ns() - t0) / 1e9;
    close(fds[0]);
    free(buf);
    return (double)BIG * n / secs / 1e9;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    long n = quick ? 20000 : 200000;
    int nbig = quick ? 4 : 16;
    snprintf(g_name, sizeof g_name, "/dflash-ring-bench-%d", (int)getpid());

    printf("small slots (%ld handoffs, 1 writer process, 1 reader process)\n", n);
    bench_small(16, n, false, "16 slots, reader parks on futex (throughput)");
    bench_small(16, n, true, "16 slots, reader polls (throughput)");
    bench_small(1, n / 4, false, "1 slot ping-pong, reader parks (latency)");
    bench_small(1, n / 4, true, "1 slot ping-pong, reader polls (latency)");

    printf("64 MiB payloads x %d (writer fills, reader reads every byte)\n", nbig);
    double g_ring = bench_big_ring(nbig);
    double g_pipe = bench_stream(nbig, false);
    double g_sock = bench_stream(nbig, true);
    printf("%-44s %8.2f GB/s\n", "ring (4 x 64 MiB slots)", g_ring);
    printf("%-44s %8.2f GB/s   ring/pipe %.2fx\n", "pipe (1 MiB pipe buffer)", g_pipe, g_ring / g_pipe);
    printf("%-44s %8.2f GB/s   ring/socket %.2fx\n", "unix socket (stream, 4 MiB buffers)", g_sock, g_ring / g_sock);
    return 0;
}
