/* test_ring_crash.c: writers and readers SIGKILLed at random moments and deliberately
 * while WRITING / READING; the test supervises, reclaims and restarts them like the coordinator.
 * Checks: no half-written payload delivered, every published id read, all slots FREE at the end. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/err.h"
#include "common/proc.h"
#include "common/timeutil.h"
#include "tests/test.h"
#include "tests/test_ring_util.h"

#define NW 5
#define NR 3
#define NPROC (NW + NR)
#define NSLOTS 16
#define KILLS 240
#define MAX_IDS (1u << 21)

struct proc_rec {
    _Atomic int stop_req;       /* supervisor asks: stop yourself mid-write / mid-read */
    _Atomic uint64_t holding;   /* reader: id + 1 of the slot it holds */
    _Atomic uint64_t writing;   /* writer: id + 1 it is writing */
};

struct shared {
    _Atomic uint64_t next_id;
    _Atomic int stop_writers, stop_readers;
    _Atomic uint64_t bad, bad_id, child_errors;
    struct proc_rec rec[NPROC];
    _Atomic uint8_t pubmark[MAX_IDS];   /* publish returned 0 */
    _Atomic uint8_t midwrite[MAX_IDS];  /* writer was stopped and killed half way through it */
    _Atomic uint32_t received[MAX_IDS];
};

static char g_name[64];
static struct shared *g_sh;
static struct proc_rec *g_me;
static uint64_t g_cur_id;

static void stop_half(void)
{
    atomic_store(&g_sh->midwrite[g_cur_id], 1);
    raise(SIGSTOP);   /* the supervisor kills us here, payload half written */
}

static int writer(int v)
{
    char err[256];
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(NSLOTS);
    if (ring_attach(&r, g_name, &l, 0, err, sizeof err) < 0) {
        fprintf(stderr, "writer: %s\n", err);
        return 1;
    }
    g_me = &g_sh->rec[v];
    while (!atomic_load(&g_sh->stop_writers)) {
        unsigned s;
        int rc = ring_claim_write(r, 100, &s);
        if (rc == -DF_ETIMEOUT)
            continue;
        if (rc < 0)
            return fprintf(stderr, "writer: claim: %s\n", err_str(rc)), 1;
        uint64_t id = atomic_fetch_add(&g_sh->next_id, 1);
        if (id >= MAX_IDS) {
            ring_abort_write(r, s);
            break;
        }
        g_cur_id = id;
        atomic_store(&g_me->writing, id + 1);
        bool stop = atomic_exchange(&g_me->stop_req, 0);
        tr_write(r, s, id, stop ? stop_half : NULL);
        if ((rc = ring_publish(r, s)) < 0)   /* nobody may reclaim a live writer's slot */
            return fprintf(stderr, "writer: publish: %s\n", err_str(rc)), 1;
        atomic_store(&g_sh->pubmark[id], 1);
        atomic_store(&g_me->writing, 0);
    }
    ring_detach(r);
    return 0;
}

static int reader(int v)
{
    char err[256];
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(NSLOTS);
    if (ring_attach(&r, g_name, &l, 0, err, sizeof err) < 0) {
        fprintf(stderr, "reader: %s\n", err);
        return 1;
    }
    g_me = &g_sh->rec[v];
    struct ring_pick pick = { .policy = v % 2 ? RING_PICK_RANDOM : RING_PICK_OLDEST, .min_ready = 3, .ready_timeout_ms = 1 };
    while (!atomic_load(&g_sh->stop_readers)) {
        unsigned s;
        int rc = ring_claim_read(r, &pick, 50, &s);
        if (rc == -DF_ETIMEOUT)
            continue;
        if (rc < 0)
            return fprintf(stderr, "reader: claim: %s\n", err_str(rc)), 1;
        uint64_t id = ring_slot_header(r, s)->batch_id;
        atomic_store(&g_me->holding, id + 1);
        if (atomic_exchange(&g_me->stop_req, 0))
            raise(SIGSTOP);   /* killed here, holding the slot READING */
        if (!tr_verify(r, s) || id >= MAX_IDS) {
            atomic_fetch_add(&g_sh->bad, 1);
            atomic_store(&g_sh->bad_id, id);
        } else {
            atomic_fetch_add(&g_sh->received[id], 1);
        }
        if ((rc = ring_release(r, s)) < 0)
            return fprintf(stderr, "reader: release: %s\n", err_str(rc)), 1;
        atomic_store(&g_me->holding, 0);
    }
    ring_detach(r);
    return 0;
}

static pid_t pids[NPROC];
static uint64_t tokens[NPROC];

static void kill_all(void)
{
    for (int i = 0; i < NPROC; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGKILL);
}

#define SUP_CHECK(cond) do { if (!(cond)) { kill_all(); TEST_FAIL("%s", #cond); } } while (0)

static void spawn(int v)
{
    pid_t pid = fork();
    SUP_CHECK(pid >= 0);
    if (pid == 0)
        _exit(v < NW ? writer(v) : reader(v));
    pids[v] = pid;
    uint64_t st;
    /* the child exists from fork on: its token is known before it runs */
    SUP_CHECK(proc_start_time(pid, &st) == 0);
    tokens[v] = proc_token_make(pid, st);
}

/* Wait (bounded) until child v stops itself at the requested point. */
static void wait_stopped(int v)
{
    uint64_t t0 = mono_ns();
    int status;
    for (;;) {
        pid_t p = waitpid(pids[v], &status, WUNTRACED | WNOHANG);
        SUP_CHECK(p >= 0);
        if (p == pids[v]) {
            if (!WIFSTOPPED(status)) {
                fprintf(stderr, "child %d exited early: %#x\n", v, status);
                pids[v] = 0;
                kill_all();
                exit(1);
            }
            return;
        }
        if (mono_ns() - t0 > 20000000000ull) {
            kill_all();
            TEST_FAIL("child %d never reached its stop point", v);
        }
        usleep(100);
    }
}

static void reap(int v)
{
    int status;
    SUP_CHECK(waitpid(pids[v], &status, 0) == pids[v]);
    if (WIFEXITED(status) && WEXITSTATUS(status)) {
        atomic_fetch_add(&g_sh->child_errors, 1);
        fprintf(stderr, "child %d failed with %d\n", v, WEXITSTATUS(status));
    }
    pids[v] = 0;
}

/* A failing CHECK exits: leave nothing behind in /dev/shm (children _exit, skipping this). */
static void cleanup_shm(void)
{
    ring_unlink(g_name);
}

int main(void)
{
    char err[256];
    snprintf(g_name, sizeof g_name, "/dflash-test-crash-%d", (int)getpid());
    atexit(cleanup_shm);
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(g_sh != MAP_FAILED);
    struct ring *r = NULL;
    struct ring_layout l = tr_layout(NSLOTS);
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    static uint32_t died_holding[MAX_IDS];
    uint64_t rng = 0x12345678u ^ (uint64_t)getpid();
    int kills = 0, stopped_writing = 0, stopped_reading = 0;
    struct ring_reclaim total = { 0 };

    for (int v = 0; v < NPROC; v++)
        spawn(v);
    uint64_t t0 = mono_ns();
    while (kills < KILLS) {
        rng = tr_mix(rng);
        int v = (int)(rng % NPROC);
        bool deliberate = (rng >> 20) % 3 == 0;
        if (deliberate) {
            atomic_store(&g_sh->rec[v].stop_req, 1);
            wait_stopped(v);
            /* it is parked inside the state we wanted: check the ring agrees */
            struct ring_stats st;
            struct ring_slot_stat ss[NSLOTS];
            ring_stats(r, &st, ss);
            int held = 0;
            for (int i = 0; i < NSLOTS; i++)
                if (ss[i].pid == pids[v])
                    held += ss[i].state == (v < NW ? RING_WRITING : RING_READING);
            SUP_CHECK(held == 1);
            if (v < NW)
                stopped_writing++;
            else
                stopped_reading++;
        } else {
            usleep((useconds_t)((rng >> 32) % 3000));   /* a random moment */
        }
        kill(pids[v], SIGKILL);
        reap(v);
        kills++;
        uint64_t h = atomic_exchange(&g_sh->rec[v].holding, 0);
        if (h)
            died_holding[h - 1]++;
        atomic_store(&g_sh->rec[v].writing, 0);
        atomic_store(&g_sh->rec[v].stop_req, 0);
        /* the coordinator's two ways: it knows who died, or it scans for the dead */
        struct ring_reclaim rc;
        if (kills % 2)
            SUP_CHECK(ring_reclaim_owner(r, tokens[v], &rc) == 0);
        else
            SUP_CHECK(ring_reclaim_dead(r, &rc) == 0);
        total.writing_freed += rc.writing_freed;
        total.reading_requeued += rc.reading_requeued;
        spawn(v);
    }
    double kill_secs = (double)(mono_ns() - t0) / 1e9;

    /* drain: writers finish, readers empty the ring */
    atomic_store(&g_sh->stop_writers, 1);
    for (int v = 0; v < NW; v++)
        reap(v);
    struct ring_stats st;
    for (uint64_t t1 = mono_ns();;) {
        struct ring_reclaim rc;
        ring_reclaim_dead(r, &rc);
        total.writing_freed += rc.writing_freed;
        ring_stats(r, &st, NULL);
        if (st.count[RING_FREE] == NSLOTS)
            break;
        if (mono_ns() - t1 > 30000000000ull) {
            kill_all();
            TEST_FAIL("ring did not drain: %u READY, %u READING, %u WRITING", st.count[RING_READY],
                      st.count[RING_READING], st.count[RING_WRITING]);
        }
        usleep(1000);
    }
    atomic_store(&g_sh->stop_readers, 1);
    for (int v = NW; v < NPROC; v++)
        reap(v);

    CHECK_INT(atomic_load(&g_sh->child_errors), ==, 0);
    CHECK_INT(atomic_load(&g_sh->bad), ==, 0);
    uint64_t n = atomic_load(&g_sh->next_id), published = 0, dups = 0, midwrite = 0;
    if (n > MAX_IDS)
        n = MAX_IDS;
    for (uint64_t id = 0; id < n; id++) {
        uint32_t got = atomic_load(&g_sh->received[id]);
        if (atomic_load(&g_sh->pubmark[id])) {
            published++;
            if (got < 1)
                TEST_FAIL("id %llu was published but never read", (unsigned long long)id);
        }
        if (atomic_load(&g_sh->midwrite[id])) {
            midwrite++;
            if (got)
                TEST_FAIL("half-written id %llu was delivered", (unsigned long long)id);
        }
        if (got > 1 + died_holding[id])
            TEST_FAIL("id %llu read %u times, but only %u readers died holding it",
                      (unsigned long long)id, got, died_holding[id]);
        dups += got > 1;
    }
    ring_stats(r, &st, NULL);
    CHECK_INT(st.count[RING_FREE], ==, NSLOTS);
    CHECK_INT(stopped_writing, >=, 10);
    CHECK_INT(stopped_reading, >=, 10);
    CHECK_INT(midwrite, ==, stopped_writing);
    CHECK_INT(total.writing_freed, >=, stopped_writing);
    CHECK_INT(total.reading_requeued, >=, stopped_reading);
    CHECK_INT(published, >=, 5000);
    fprintf(stderr, "%d kills in %.1f s (%d stopped WRITING, %d stopped READING, rest at random); "
            "reclaimed %u WRITING->FREE, %u READING->READY; %llu ids published, %llu redelivered\n",
            kills, kill_secs, stopped_writing, stopped_reading, total.writing_freed, total.reading_requeued,
            (unsigned long long)published, (unsigned long long)dups);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
    return 0;
}
