/* test_coord_util.h: helpers of the coordinator tests: a private cluster dir + config, a
 * dataset, the coordinator as a real process, status queries, and protocol-speaking peers
 * (a fake target and a fake drafter built on ipc/client.h and ipc/ring.h). */
#pragma once
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/dataset.h"
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/client.h"
#include "ipc/ring.h"
#include "tests/test.h"

struct tcluster {
    char dir[200];
    char name[32];
    char ini[400];
    char sock[400];
    char ledger[400];
    char ring[96];
    char data[400];
    pid_t coord;
};

static struct tcluster TC;

static __attribute__((unused)) void tc_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Dataset of n samples with lengths in [lo, hi]. */
static __attribute__((unused)) void tc_dataset(const char *path, int n, uint32_t lo, uint32_t hi, uint32_t vocab)
{
    char err[512];
    struct dataset_writer *w;
    CHECK_OK(dataset_writer_open(&w, path, vocab, err, sizeof err));
    uint32_t *tok = malloc(hi * 4);
    uint8_t *mask = malloc(hi);
    uint64_t x = 7;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t len = lo + (uint32_t)((x >> 33) % (hi - lo + 1));
        for (uint32_t t = 0; t < len; t++) {
            tok[t] = (uint32_t)(i + t) % vocab;
            mask[t] = t > len / 3;
        }
        CHECK_OK(dataset_writer_add(w, tok, mask, len, err, sizeof err));
    }
    CHECK_OK(dataset_writer_finish(w, err, sizeof err));
    dataset_writer_free(w);
    free(tok);
    free(mask);
}

/* Whether the INI lines `text` set section.key (`sec0` is their section before any [section]:
 * extra lines without one go on the last default section, [data]). */
static int tc_sets(const char *text, const char *sec0, const char *section, const char *key)
{
    char sec[64];
    snprintf(sec, sizeof sec, "%s", sec0);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p), k = strcspn(p, " =\n");
        const char *close = memchr(p, ']', n);
        if (p[0] == '[' && close)
            snprintf(sec, sizeof sec, "%.*s", (int)(close - p - 1), p + 1);
        else if (k < n && k == strlen(key) && !strncmp(p, key, k) && !strcmp(sec, section))
            return 1;
        p = nl ? nl + 1 : p + n;
    }
    return 0;
}

/* A cluster dir under $TMPDIR with its config; extra_cluster = more [cluster] lines, extra = more
 * INI lines (sections included). A key they set replaces its default (a key twice is an error). */
static __attribute__((unused)) void tc_setup(const char *extra_cluster, const char *extra)
{
    const char *t = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(TC.dir, sizeof TC.dir, "%s", t);
    snprintf(TC.name, sizeof TC.name, "tc%d", (int)getpid());
    snprintf(TC.ini, sizeof TC.ini, "%s/dflash.ini", TC.dir);
    snprintf(TC.sock, sizeof TC.sock, "%s/%s.sock", TC.dir, TC.name);
    snprintf(TC.ledger, sizeof TC.ledger, "%s/%s-ledger.db", TC.dir, TC.name);
    snprintf(TC.ring, sizeof TC.ring, "/dflash-%s", TC.name);
    snprintf(TC.data, sizeof TC.data, "%s/data.bin", TC.dir);
    const struct { const char *section, *key, *value; } def[] = {
        { "cluster", "name", TC.name }, { "cluster", "runtime_dir", TC.dir }, { "cluster", "state_dir", TC.dir },
        { "cluster", "log_level", "info" },
        { "ring", "slots", "6" }, { "ring", "max_tokens", "512" }, { "ring", "max_seqs", "64" },
        { "model", "capture_layers", "1,2" },
        { "coordinator", "ring_hidden", "8" }, { "coordinator", "heartbeat_ms", "50" },
        { "coordinator", "dead_after_ms", "3000" }, { "coordinator", "recovery_ms", "600" },
        { "coordinator", "min_free_mb", "16" },
        { "data", "path", TC.data }, { "data", "token_budget", "512" }, { "data", "max_seq_len", "256" },
        { "data", "bucket_width", "32" },
    };
    FILE *f = fopen(TC.ini, "w");
    CHECK(f);
    const char *sec = "";
    for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) {
        if (strcmp(sec, def[i].section)) {
            if (!strcmp(sec, "cluster"))
                fprintf(f, "%s\n", extra_cluster ? extra_cluster : "");
            fprintf(f, "[%s]\n", sec = def[i].section);
        }
        if (!tc_sets(extra_cluster, "cluster", def[i].section, def[i].key) && !tc_sets(extra, "data", def[i].section, def[i].key))
            fprintf(f, "%s = %s\n", def[i].key, def[i].value);
    }
    fprintf(f, "%s", extra ? extra : "");
    fclose(f);
}

static __attribute__((unused)) const char *tc_bin(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    const char *b = getenv("DFLASH_BUILD");
    snprintf(p[k], sizeof p[k], "%s/%s", b ? b : "build", name);
    return p[k];
}

static __attribute__((unused)) pid_t tc_spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Connect as dflashctl would; waits up to timeout_ms for the socket. */
static __attribute__((unused)) struct client *tc_ctl(int timeout_ms)
{
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_CTL, .device = -1, .name = "test",
                             .connect_timeout_ms = timeout_ms };
    struct client *c = NULL;
    char err[512];
    if (client_open(&c, &o, err, sizeof err) < 0)
        return NULL;
    return c;
}

static __attribute__((unused)) void tc_start_coord(void)
{
    char log[400];
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    struct client *c = tc_ctl(20000);   /* readiness = the socket answers */
    if (!c) {
        char cmd[500];
        snprintf(cmd, sizeof cmd, "tail -20 %s >&2", log);
        if (system(cmd)) {}
        TEST_FAIL("coordinator did not come up");
    }
    client_free(c);
}

/* Wait until every event c sent was acknowledged (the coordinator has handled and committed
 * it); fails after ms (scaled). */
static __attribute__((unused)) void tc_wait_acked(struct client *c, int ms)
{
    uint64_t end = mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale();
    struct client_stats st;
    char err[256];
    do {
        CHECK_OK(client_idle(c, 10, err, sizeof err));
        client_get_stats(c, &st);
    } while (st.outbox && mono_ms() < end);
    CHECK_INT(st.outbox, ==, 0);
}

/* The status document (caller cJSON_Delete's it), or NULL when the coordinator is down. */
static __attribute__((unused)) cJSON *tc_query(enum proto_query_what what)
{
    struct client *c = tc_ctl(0);
    if (!c)
        return NULL;
    char *json = NULL, err[256];
    int status;
    cJSON *doc = NULL;
    if (client_query(c, what, 1000, &json, &status, err, sizeof err) == 0)
        doc = cJSON_Parse(json);
    free(json);
    client_free(c);
    return doc;
}

static __attribute__((unused)) double tc_num(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsNumber(cur) ? cur->valuedouble : -1;
}

static __attribute__((unused)) double tc_status_num(const char *path)
{
    cJSON *s = tc_query(PROTO_Q_STATUS);
    double v = s ? tc_num(s, path) : -1;
    cJSON_Delete(s);
    return v;
}

/* Wait until status.<path> >= value (timeout fails the test). */
static __attribute__((unused)) void tc_wait_num(const char *path, double value, int timeout_ms)
{
    uint64_t end = mono_ms() + (uint64_t)timeout_ms * (uint64_t)test_time_scale();
    double v = -1;
    while (mono_ms() < end) {
        v = tc_status_num(path);
        if (v >= value)
            return;
        tc_sleep_ms(50);
    }
    TEST_FAIL("status.%s stayed at %g, wanted >= %g", path, v, value);
}

/* The batch's state in the coordinator's in-flight list ("leased", "published", "trained"), or
 * "queued" when it is not in flight (pending or done). */
static __attribute__((unused)) const char *tc_batch_state(uint64_t id)
{
    static char st[32];
    snprintf(st, sizeof st, "queued");
    cJSON *doc = tc_query(PROTO_Q_BATCHES);
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(doc, "in_flight")) {
        const cJSON *bid = cJSON_GetObjectItemCaseSensitive(b, "id"), *s = cJSON_GetObjectItemCaseSensitive(b, "state");
        if (cJSON_IsNumber(bid) && (uint64_t)bid->valuedouble == id && cJSON_IsString(s))
            snprintf(st, sizeof st, "%s", s->valuestring);
    }
    cJSON_Delete(doc);
    return st;
}

/* Exit code of child pid (128 + signal when killed), or -1 when it is still running after
 * timeout_ms. */
static __attribute__((unused)) int tc_exit_status(pid_t pid, int timeout_ms)
{
    uint64_t end = mono_ms() + (uint64_t)timeout_ms;
    int st;
    while (mono_ms() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        tc_sleep_ms(20);
    }
    return -1;
}

static __attribute__((unused)) void tc_kill(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/* ---- peers (run in forked children) ---- */

struct tc_shared {
    _Atomic uint64_t step[64];      /* drafter group step counter per generation (lockstep stand-in) */
    _Atomic uint64_t published, trained;
};
static struct tc_shared *TS;

static __attribute__((unused)) void tc_shared_init(void)
{
    TS = mmap(NULL, sizeof *TS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(TS != MAP_FAILED);
    memset(TS, 0, sizeof *TS);
}

static __attribute__((unused)) struct client *peer_connect(enum proto_role role, int device)
{
    struct client_opts o = { .socket_path = TC.sock, .role = role, .device = device, .connect_timeout_ms = 20000 };
    struct client *c;
    char err[512];
    if (client_open(&c, &o, err, sizeof err) < 0) {
        fprintf(stderr, "peer %d: %s\n", device, err);
        _exit(3);
    }
    return c;
}

/* JOIN_GROUP, then the GROUP (its generation 0 when none came within ms, scaled). */
static __attribute__((unused)) struct proto_group tc_join_group(struct client *d, int ms)
{
    struct proto_msg m;
    char err[256];
    struct proto_group g = { .generation = 0 };
    client_join_group(d);
    uint64_t end = mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale();
    while (!g.generation && mono_ms() < end)
        if (client_poll(d, 20, &m, err, sizeof err) > 0 && m.type == PROTO_GROUP)
            g = m.group;
    return g;
}

static __attribute__((unused)) struct ring *peer_ring(void)
{
    struct ring *r = NULL;
    char err[512];
    for (int i = 0; i < 200 && ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY, err, sizeof err) < 0; i++)
        tc_sleep_ms(20);
    if (!r) {
        fprintf(stderr, "peer: ring: %s\n", err);
        _exit(4);
    }
    return r;
}

/* Fill the claimed write slot with the samples of the held lease `id` (from the dataset) and
 * publish it in the ring; the PUBLISHED report is the caller's. Returns the token count, -1 when
 * the lease is gone or its token count is not the grant's (the slot is aborted), -2 when the
 * ring refuses the publication. */
static __attribute__((unused)) int tc_fill_publish(struct client *c, struct ring *r, const struct dataset *ds,
                                                   uint64_t id, uint32_t epoch, uint32_t want_tokens,
                                                   unsigned slot)
{
    struct ring_payload *p = ring_slot_header(r, slot);
    int32_t *cu = ring_slot_cu_seqlens(r, slot);
    uint32_t *tok = ring_slot_tokens(r, slot);
    const struct client_lease *l = client_lease_find(c, id);
    uint32_t n = 0;
    cu[0] = 0;
    for (uint32_t i = 0; l && i < l->n_samples; i++) {
        uint32_t s = l->samples[i], len = dataset_sample_len(ds, s);
        if (len > l->max_seq_len)
            len = l->max_seq_len;
        memcpy(tok + n, dataset_sample_tokens(ds, s), len * 4);
        n += len;
        cu[i + 1] = (int32_t)n;
    }
    p->batch_id = id;
    p->epoch = epoch;
    p->lease = l ? l->lease : 0;
    p->n_seqs = l ? l->n_samples : 0;
    p->n_tokens = n;
    if (!l || !client_lease_held(c, id) || n != want_tokens) {
        ring_abort_write(r, slot);
        return -1;
    }
    return ring_publish(r, slot) < 0 ? -2 : (int)n;
}

/* Fake target: leases -> fill a slot from the dataset -> publish. work_ms per batch. */
static __attribute__((unused)) void peer_target(int device, int work_ms)
{
    struct client *c = peer_connect(PROTO_ROLE_TARGET, device);
    struct ring *r = peer_ring();
    struct dataset ds;
    char err[512];
    if (dataset_open(&ds, TC.data, DATASET_OPEN_NO_CHECKSUM, err, sizeof err) < 0)
        _exit(5);
    int paused = 0, draining = 0;
    for (;;) {
        struct proto_msg m;
        int got = client_poll(c, 10, &m, err, sizeof err);
        if (got < 0)
            _exit(6);
        if (got && m.type == PROTO_CONTROL) {
            if (m.control.cmd == PROTO_CTL_STOP)
                _exit(0);
            paused = m.control.cmd == PROTO_CTL_PAUSE;
            draining |= m.control.cmd == PROTO_CTL_DRAIN;
        }
        if (got && m.type == PROTO_WELCOME) {
            paused = m.welcome.cluster_state == PROTO_STATE_PAUSED;
            draining = m.welcome.cluster_state >= PROTO_STATE_DRAINING;
        }
        struct client_stats st;
        client_get_stats(c, &st);
        if (!paused && !draining && st.leases_held + st.leases_wanted < 2)
            client_lease_request(c, 1);
        if (!got || m.type != PROTO_LEASE_GRANT)
            continue;
        const uint64_t id = m.grant.batch_id;
        const uint32_t epoch = m.grant.epoch, want_tokens = m.grant.n_tokens;
        if (draining) {
            client_lease_return(c, id);
            continue;
        }
        tc_sleep_ms(work_ms);  /* "forward" */
        unsigned slot;
        int rr;
        while ((rr = ring_claim_write(r, 20, &slot)) == -DF_ETIMEOUT) {
            /* Keep heartbeats going while the ring is full. A grant arriving meanwhile cannot be
             * served now: hand it back rather than drop it (a dropped grant stays held forever). */
            struct proto_msg m2;
            if (client_poll(c, 0, &m2, err, sizeof err) == 1) {
                if (m2.type == PROTO_LEASE_GRANT)
                    client_lease_return(c, m2.grant.batch_id);
                else if (m2.type == PROTO_CONTROL && m2.control.cmd == PROTO_CTL_STOP)
                    _exit(0);
            }
        }
        if (rr < 0)
            _exit(7);
        int n = tc_fill_publish(c, r, &ds, id, epoch, want_tokens, slot);
        if (n == -1)
            continue;
        if (n < 0)
            _exit(8);
        client_published(c, id, slot, (uint32_t)n);
        atomic_fetch_add(&TS->published, 1);
    }
}

/* Fake drafter: group, then claim READY slots, "train", report; rank 0 checkpoints. Another rank
 * sends one stray CHECKPOINTED (far ahead, dir "stray-...") that the coordinator must refuse. */
static __attribute__((unused)) void peer_drafter(int device, int work_ms, int ckpt_every)
{
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, device);
    struct ring *r = peer_ring();
    char err[512], dir[400];
    client_join_group(c);
    int in_group = 0, rank = -1, paused = 0, draining = 0;
    uint64_t gen = 0, last_ckpt = 0;
    int stray_sent = 0;
    for (;;) {
        struct proto_msg m;
        int got = client_poll(c, in_group && !paused ? 0 : 10, &m, err, sizeof err);
        if (got < 0)
            _exit(6);
        if (got && m.type == PROTO_GROUP) {
            in_group = 1;
            rank = (int)m.group.rank;
            gen = m.group.generation;
            uint64_t zero = 0;
            atomic_compare_exchange_strong(&TS->step[gen % 64], &zero, m.group.ckpt_step);
            last_ckpt = m.group.ckpt_step;
        } else if (got && m.type == PROTO_RESTART) {
            in_group = 0;
            client_join_group(c);
        } else if (got && m.type == PROTO_CONTROL) {
            if (m.control.cmd == PROTO_CTL_STOP)
                _exit(0);
            paused = m.control.cmd == PROTO_CTL_PAUSE;
            if (m.control.cmd == PROTO_CTL_DRAIN)
                draining = 1;
        } else if (got && m.type == PROTO_WELCOME) {
            paused = m.welcome.cluster_state == PROTO_STATE_PAUSED;
        }
        if (!in_group || paused)
            continue;
        if (draining) {
            if (rank == 0 && draining == 1) {
                uint64_t s = atomic_load(&TS->step[gen % 64]);
                snprintf(dir, sizeof dir, "%s/ckpt-g%llu-s%llu", TC.dir, (unsigned long long)gen, (unsigned long long)s);
                client_checkpointed(c, s, gen, dir);
            }
            draining = 2;
            continue;
        }
        unsigned slot;
        if (ring_claim_read(r, NULL, 20, &slot) < 0)
            continue;
        uint64_t id = ring_slot_header(r, slot)->batch_id;
        uint32_t lease = ring_slot_header(r, slot)->lease;
        tc_sleep_ms(work_ms);
        if (ring_release(r, slot) < 0)
            continue;
        uint64_t step = atomic_fetch_add(&TS->step[gen % 64], 1) + 1;
        client_trained(c, id, lease, step, (uint32_t)rank, gen);
        atomic_fetch_add(&TS->trained, 1);
        if (rank > 0 && !stray_sent) {
            snprintf(dir, sizeof dir, "%s/stray-rank%d", TC.dir, rank);
            client_checkpointed(c, step + 1000000, gen, dir);
            stray_sent = 1;
        }
        if (rank == 0 && step - last_ckpt >= (uint64_t)ckpt_every) {
            snprintf(dir, sizeof dir, "%s/ckpt-g%llu-s%llu", TC.dir, (unsigned long long)gen, (unsigned long long)step);
            client_checkpointed(c, step, gen, dir);
            last_ckpt = step;
        }
    }
}

static __attribute__((unused)) pid_t tc_fork_target(int device, int work_ms, const char *stop_at)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (stop_at)
            setenv("DFLASH_RING_STOP_AT", stop_at, 1);
        peer_target(device, work_ms);
        _exit(0);
    }
    return pid;
}

static __attribute__((unused)) pid_t tc_fork_drafter(int device, int work_ms, int ckpt_every)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        peer_drafter(device, work_ms, ckpt_every);
        _exit(0);
    }
    return pid;
}
