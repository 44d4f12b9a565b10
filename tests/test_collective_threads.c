/* test_collective_threads.c: the collective with ranks as threads of one process (they share
 * one mapping), so ThreadSanitizer checks its ordering; plus leave/abort propagation, and the
 * idle hook that keeps a waiting rank's heartbeat going (rank 0 waits for a slow rank 1). */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "common/err.h"
#include "ipc/collective.h"
#include "tests/test.h"

#define W 4
#define N 50001

static char g_name[64];
static uint64_t g_gen;
static _Atomic int g_fail;
static int g_results[W];

static float value(int rank, int iter, size_t i)
{
    return (float)(((uint64_t)(rank + 1) * 2654435761u * (i + 1) + (uint64_t)iter * 40503u) % 100003) * 0.37f - 1.5e4f;
}

static void *rank_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = g_gen, .chunk_floats = 2048 };
    if (coll_open(&c, g_name, rank, W, 20000, &o, err, sizeof err) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        atomic_store(&g_fail, 1);
        return NULL;
    }
    float *buf = malloc(N * sizeof(float));
    for (int it = 0; it < 4; it++) {
        for (size_t i = 0; i < N; i++)
            buf[i] = value(rank, it, i);
        int rc = coll_allreduce_sum(c, buf, N);
        if (rc < 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err_str(rc));
            atomic_store(&g_fail, 1);
            break;
        }
        for (size_t i = 0; i < N; i++) {
            float s = value(0, it, i);
            for (int j = 1; j < W; j++)
                s += value(j, it, i);
            if (memcmp(&s, &buf[i], sizeof s)) {
                fprintf(stderr, "rank %d: element %zu differs from the serial sum\n", rank, i);
                atomic_store(&g_fail, 1);
                break;
            }
        }
    }
    uint64_t word = rank == 2 ? 0xfeedfacecafebeefull : 0;
    if (coll_broadcast(c, &word, sizeof word, 2) < 0 || word != 0xfeedfacecafebeefull)
        atomic_store(&g_fail, 1);
    /* phase 2: rank 3 leaves; the others' next collective fails with DF_EDEAD */
    if (rank == 3) {
        coll_close(c);
        free(buf);
        return NULL;
    }
    g_results[rank] = coll_allreduce_sum(c, buf, 16);
    coll_close(c);
    free(buf);
    return NULL;
}

struct abort_arg { int rank; int rc; };

static void *abort_main(void *arg)
{
    struct abort_arg *a = arg;
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = g_gen + 1 };
    if (coll_open(&c, g_name, a->rank, 2, 20000, &o, err, sizeof err) < 0) {
        a->rc = 1;
        return NULL;
    }
    if (a->rank == 1)
        coll_abort(c, -DF_ENAN);   /* e.g. this rank saw a NaN loss and stops the step */
    else
        a->rc = coll_barrier(c);
    coll_close(c);
    return NULL;
}

struct idle_arg { int rank; int rc; _Atomic int calls; };

static int count_idle(void *arg) { atomic_fetch_add(&((struct idle_arg *)arg)->calls, 1); return 0; }

static void *idle_main(void *arg)
{
    struct idle_arg *a = arg;
    char err[256];
    struct coll *c = NULL;
    struct coll_opts o = { .generation = g_gen + 2, .idle = count_idle, .idle_arg = a };
    if (coll_open(&c, g_name, a->rank, 2, 20000, &o, err, sizeof err) < 0) {
        a->rc = 1;
        return NULL;
    }
    int before = atomic_load(&a->calls);
    if (a->rank == 1)
        usleep(400000);     /* the slow peer (as rank 0 is while it writes a checkpoint) */
    a->rc = coll_barrier(c);
    if (a->rank == 0 && atomic_load(&a->calls) - before < 4)
        a->rc = 2;          /* waited 400 ms: the hook ran about every 50 ms */
    if (a->rank == 1 && atomic_load(&a->calls) != before)
        a->rc = 3;          /* never waited: never called */
    coll_close(c);
    return NULL;
}

int main(void)
{
    snprintf(g_name, sizeof g_name, "/dflash-test-collt-%d", (int)getpid());
    g_gen = (uint64_t)getpid() << 8;
    pthread_t t[W];
    for (int r = W - 1; r >= 0; r--)
        CHECK_INT(pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r), ==, 0);
    for (int r = 0; r < W; r++)
        pthread_join(t[r], NULL);
    CHECK_INT(atomic_load(&g_fail), ==, 0);
    for (int r = 0; r < W - 1; r++)
        CHECK_INT(g_results[r], ==, -DF_EDEAD);

    struct abort_arg a[2] = { { 0, 0 }, { 1, 0 } };
    for (int r = 0; r < 2; r++)
        CHECK_INT(pthread_create(&t[r], NULL, abort_main, &a[r]), ==, 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    CHECK_INT(a[0].rc, ==, -DF_ENAN);
    CHECK_INT(a[1].rc, ==, 0);

    struct idle_arg ia[2] = { { .rank = 0 }, { .rank = 1 } };
    for (int r = 0; r < 2; r++)
        CHECK_INT(pthread_create(&t[r], NULL, idle_main, &ia[r]), ==, 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    CHECK_INT(ia[0].rc, ==, 0);
    CHECK_INT(ia[1].rc, ==, 0);
    printf("idle hook: %d calls while rank 0 waited 400 ms\n", atomic_load(&ia[0].calls));
    fprintf(stderr, "ok\n");
    return 0;
}
