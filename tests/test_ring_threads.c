/* test_ring_threads.c: the stress test with threads sharing one mapping (5 writers,
 * 3 readers, 100,000 handoffs), so ThreadSanitizer can check the ring's memory ordering. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "tests/test.h"
#include "tests/test_ring_util.h"

#define WRITERS 5
#define READERS 3
#define PER_WRITER 20000
#define TOTAL (WRITERS * PER_WRITER)

static struct ring *g_r;
static _Atomic uint32_t g_received[TOTAL];
static _Atomic uint64_t g_total, g_bad;
static _Atomic int g_fail;

static void *writer(void *arg)
{
    int w = (int)(intptr_t)arg;
    for (uint64_t k = 0; k < PER_WRITER && !atomic_load(&g_fail); k++) {
        unsigned s;
        int rc = ring_claim_write(g_r, 30000, &s);
        if (rc == 0) {
            tr_write(g_r, s, (uint64_t)w * PER_WRITER + k, NULL);
            rc = ring_publish(g_r, s);
        }
        if (rc < 0) {
            fprintf(stderr, "writer %d: %s\n", w, err_str(rc));
            atomic_store(&g_fail, 1);
        }
    }
    return NULL;
}

static void *reader(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct ring_pick pick = { .policy = id == 0 ? RING_PICK_RANDOM : RING_PICK_OLDEST, .min_ready = id == 0 ? 4 : 1, .ready_timeout_ms = 2 };
    while (atomic_load(&g_total) < TOTAL && !atomic_load(&g_fail)) {
        unsigned s;
        int rc = ring_claim_read(g_r, &pick, 100, &s);
        if (rc == -DF_ETIMEOUT)
            continue;
        if (rc < 0) {
            fprintf(stderr, "reader %d: %s\n", id, err_str(rc));
            atomic_store(&g_fail, 1);
            break;
        }
        uint64_t b = ring_slot_header(g_r, s)->batch_id;
        if (!tr_verify(g_r, s) || b >= TOTAL)
            atomic_fetch_add(&g_bad, 1);
        else
            atomic_fetch_add(&g_received[b], 1);
        if ((rc = ring_release(g_r, s)) < 0) {
            fprintf(stderr, "reader %d: release: %s\n", id, err_str(rc));
            atomic_store(&g_fail, 1);
        }
        atomic_fetch_add(&g_total, 1);
    }
    return NULL;
}

int main(void)
{
    char name[64], err[256];
    snprintf(name, sizeof name, "/dflash-test-threads-%d", (int)getpid());
    struct ring_layout l = tr_layout(16);
    CHECK_OK(ring_create(&g_r, name, &l, NULL, err, sizeof err));
    CHECK_OK(ring_unlink(name));   /* the mapping stays; nothing to clean up on failure */
    pthread_t t[WRITERS + READERS];
    uint64_t t0 = mono_ns();
    for (int i = 0; i < WRITERS + READERS; i++)
        CHECK_INT(pthread_create(&t[i], NULL, i < WRITERS ? writer : reader,
                                 (void *)(intptr_t)(i < WRITERS ? i : i - WRITERS)), ==, 0);
    for (int i = 0; i < WRITERS + READERS; i++)
        pthread_join(t[i], NULL);
    double secs = (double)(mono_ns() - t0) / 1e9;
    CHECK_INT(atomic_load(&g_fail), ==, 0);
    CHECK_INT(atomic_load(&g_bad), ==, 0);
    for (uint32_t i = 0; i < TOTAL; i++)
        if (atomic_load(&g_received[i]) != 1)
            TEST_FAIL("id %u received %u times", i, atomic_load(&g_received[i]));
    struct ring_stats st;
    CHECK_OK(ring_stats(g_r, &st, NULL));
    CHECK_INT(st.count[RING_FREE], ==, 16);
    CHECK_INT(st.published, ==, TOTAL);
    fprintf(stderr, "%d handoffs in %.2f s between threads\n", TOTAL, secs);
    ring_detach(g_r);
    return 0;
}
