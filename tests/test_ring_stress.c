/* test_ring_stress.c: 5 writer + 3 reader processes push 100,000 checksummed payloads
 * with unique ids through a 16-slot ring; every id arrives exactly once, intact. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "tests/test.h"
#include "tests/test_ring_util.h"

#define WRITERS 5
#define READERS 3
#define PER_WRITER 20000
#define TOTAL (WRITERS * PER_WRITER)

struct shared {
    _Atomic uint32_t received[TOTAL];
    _Atomic uint64_t total;
    _Atomic uint64_t bad;
    _Atomic uint64_t bad_id;
};

static char g_name[64];
static struct shared *g_sh;

static int writer(int w)
{
    char err[256];
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(16);
    if (ring_attach(&r, g_name, &l, 0, err, sizeof err) < 0) {
        fprintf(stderr, "writer %d: %s\n", w, err);
        return 1;
    }
    for (uint64_t k = 0; k < PER_WRITER; k++) {
        unsigned s;
        int rc = ring_claim_write(r, 30000, &s);
        if (rc < 0) {
            fprintf(stderr, "writer %d: claim: %s\n", w, err_str(rc));
            return 1;
        }
        tr_write(r, s, (uint64_t)w * PER_WRITER + k, NULL);
        if ((rc = ring_publish(r, s)) < 0) {
            fprintf(stderr, "writer %d: publish: %s\n", w, err_str(rc));
            return 1;
        }
    }
    ring_detach(r);
    return 0;
}

static int reader(int id)
{
    char err[256];
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(16);
    if (ring_attach(&r, g_name, &l, 0, err, sizeof err) < 0) {
        fprintf(stderr, "reader %d: %s\n", id, err);
        return 1;
    }
    /* one reader mixes: random pick once 4 are READY (or after 2 ms) */
    struct ring_pick pick = { .policy = id == 0 ? RING_PICK_RANDOM : RING_PICK_OLDEST, .min_ready = id == 0 ? 4 : 1, .ready_timeout_ms = 2 };
    while (atomic_load(&g_sh->total) < TOTAL) {
        unsigned s;
        int rc = ring_claim_read(r, &pick, 100, &s);
        if (rc == -DF_ETIMEOUT)
            continue;
        if (rc < 0) {
            fprintf(stderr, "reader %d: claim: %s\n", id, err_str(rc));
            return 1;
        }
        uint64_t b = ring_slot_header(r, s)->batch_id;
        if (!tr_verify(r, s) || b >= TOTAL) {
            atomic_fetch_add(&g_sh->bad, 1);
            atomic_store(&g_sh->bad_id, b);
        } else {
            atomic_fetch_add(&g_sh->received[b], 1);
        }
        if ((rc = ring_release(r, s)) < 0) {
            fprintf(stderr, "reader %d: release: %s\n", id, err_str(rc));
            return 1;
        }
        atomic_fetch_add(&g_sh->total, 1);
    }
    ring_detach(r);
    return 0;
}

/* A failing CHECK exits: leave nothing behind in /dev/shm (children _exit, skipping this). */
static void cleanup_shm(void)
{
    ring_unlink(g_name);
}

int main(void)
{
    char err[256];
    snprintf(g_name, sizeof g_name, "/dflash-test-stress-%d", (int)getpid());
    atexit(cleanup_shm);
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(g_sh != MAP_FAILED);
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(16);
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));

    pid_t pids[WRITERS + READERS];
    uint64_t t0 = mono_ns();
    for (int i = 0; i < WRITERS + READERS; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(i < WRITERS ? writer(i) : reader(i - WRITERS));
    }
    int failed = 0;
    for (int i = 0; i < WRITERS + READERS; i++) {
        int status;
        CHECK_INT(waitpid(pids[i], &status, 0), ==, pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) {
            fprintf(stderr, "child %d (%s) failed: status %#x\n", i, i < WRITERS ? "writer" : "reader", status);
            failed = 1;
            for (int j = 0; j < WRITERS + READERS; j++)   /* do not leave helpers behind */
                kill(pids[j], SIGKILL);
        }
    }
    double secs = (double)(mono_ns() - t0) / 1e9;
    CHECK(!failed);
    CHECK_INT(atomic_load(&g_sh->bad), ==, 0);
    CHECK_INT(atomic_load(&g_sh->total), ==, TOTAL);
    for (uint32_t i = 0; i < TOTAL; i++)
        if (atomic_load(&g_sh->received[i]) != 1)
            TEST_FAIL("id %u received %u times", i, atomic_load(&g_sh->received[i]));
    struct ring_stats st;
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.count[RING_FREE], ==, 16);
    CHECK_INT(st.published, ==, TOTAL);
    CHECK_INT(st.consumed, ==, TOTAL);
    fprintf(stderr, "%d handoffs in %.2f s (%.0f/s), %d writers, %d readers, 16 slots\n",
            TOTAL, secs, TOTAL / secs, WRITERS, READERS);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
    return 0;
}
