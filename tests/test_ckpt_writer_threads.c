/* test_ckpt_writer_threads.c: checkpoints written by the background writer while the drafter
 * trains on. The copy-mode snapshot is the state at start, whatever training does meanwhile
 * (bitwise, through a reload); the still-twin mode writes the same; one write at a time (-EBUSY);
 * collect without waiting sees the write finish; old step dirs are pruned to `keep`, never the
 * head (the newest the coordinator accepted) or a newer one; a root that
 * cannot be made is a result with an error naming it, not a crash; the temp dir of an interrupted
 * write is removed after the next write unless a writer still holds its lock; a write of a
 * generation a later one fenced out changes nothing. Also run under TSan. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "model/checkpoint.h"
#include "model/ckpt_writer.h"
#include "model/optim.h"
#include "tests/test_drafter_fixture.h"

static const struct drafter_train_opts OPTS = {
    .lr = 3e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 20, .weight_decay = 0.01,
    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
};

static void train(struct drafter *d, struct fixture *f, int steps)
{
    for (int s = 0; s < steps; s++) {
        int64_t at = drafter_step_count(d);
        struct obj_rng_key key = { 42, 0, (uint64_t)at, 0 };
        struct drafter_metrics m;
        struct drafter_step_info info;
        CHECK_OK(drafter_train_step(d, &f->batch, 2, 7.0, &key, &OPTS, &m, &info));
    }
}

struct state { float *p, *m, *v; int64_t step; size_t n; };

static struct state keep_state(const struct drafter *d)
{
    size_t nb = d->n_params * sizeof(float);
    struct state s = { malloc(nb), malloc(nb), malloc(nb), d->opt->step, d->n_params };
    memcpy(s.p, d->params, nb);
    memcpy(s.m, d->opt->m, nb);
    memcpy(s.v, d->opt->v, nb);
    return s;
}

static void drop_state(struct state *s) { free(s->p); free(s->m); free(s->v); }

/* Load dir into a fresh drafter and compare with s bitwise. */
static void loads_as(struct fixture *f, const char *dir, const struct state *s, int64_t step)
{
    char err[512] = "";
    struct drafter *c = fixture_drafter(f, 64);
    struct ckpt_train_state ts;
    if (ckpt_load(dir, c, &ts, NULL, err, sizeof err) < 0)
        TEST_FAIL("ckpt_load %s: %s", dir, err);
    CHECK_INT(ts.step, ==, step);
    CHECK_INT(c->opt->step, ==, s->step);
    size_t nb = s->n * sizeof(float);
    CHECK(!memcmp(c->params, s->p, nb));
    CHECK(!memcmp(c->opt->m, s->m, nb));
    CHECK(!memcmp(c->opt->v, s->v, nb));
    drafter_free(c);
}

static int count_step_dirs(const char *root)
{
    DIR *d = opendir(root);
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, "step-", 5);
    closedir(d);
    return n;
}

static int give_up_third(void *arg)
{
    int *n = arg;
    return ++*n >= 3 ? -ETIMEDOUT : 0;
}

static char cmd_other[700];

static struct ckpt_result write_now(struct ckpt_writer *w, const char *root, struct drafter *d, int copy,
                                    int64_t step)
{
    struct ckpt_train_state ts = { .step = step, .seed = 42 };
    CHECK_OK(ckpt_writer_start(w, root, d, copy, &ts, 7, "test"));
    struct ckpt_result res;
    CHECK_INT(ckpt_writer_collect(w, 1, &res), ==, 1);
    return res;
}

int main(void)
{
    const char *tmp = getenv("DFLASH_TEST_TMP");
    char root[512];
    snprintf(root, sizeof root, "%s/ckptw-%d", tmp ? tmp : "/tmp", (int)getpid());

    int lens[3] = { 14, 11, 9 }, prompt[3] = { 3, 0, 4 };
    struct fixture f;
    fixture_init(&f, 21, 3, lens, prompt);
    struct drafter *a = fixture_drafter(&f, 64);
    train(a, &f, 4);

    struct ckpt_writer *w = NULL;
    CHECK_OK(ckpt_writer_create(&w, 2));
    struct ckpt_result res;
    CHECK_INT(ckpt_writer_collect(w, 1, &res), ==, 0);      /* nothing started */

    /* copy mode: training goes on at once; the checkpoint holds step 4 */
    struct state s4 = keep_state(a);
    struct ckpt_train_state ts = { .step = 4, .epoch = 1, .batch_in_epoch = 4, .seed = 42 };
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 11, "periodic"));
    CHECK(ckpt_writer_busy(w));
    CHECK_INT(ckpt_writer_start(w, root, a, 1, &ts, 11, "again"), ==, -EBUSY);
    train(a, &f, 2);
    uint64_t deadline = mono_ms() + 60000;
    int got;
    while (!(got = ckpt_writer_collect(w, 0, &res)) && mono_ms() < deadline)
        usleep(1000);
    CHECK_INT(got, ==, 1);
    CHECK(!ckpt_writer_busy(w));
    if (res.rc < 0)
        TEST_FAIL("write: %s", res.err);
    CHECK_INT(res.step, ==, 4);
    CHECK_INT(res.tag, ==, 11);
    CHECK_STR(res.why, "periodic");
    CHECK_CONTAINS(res.dir, "step-0000000004");
    CHECK(res.write_ms > 0);
    printf("step 4 written in %.1f ms while training two more steps\n", res.write_ms);
    loads_as(&f, res.dir, &s4, 4);
    CHECK_INT(drafter_step_count(a), ==, 6);

    /* still mode: the drafter is left alone until collected */
    struct state s6 = keep_state(a);
    res = write_now(w, root, a, 0, 6);
    CHECK_INT(res.rc, ==, 0);
    CHECK_INT(res.stale, ==, 0);
    loads_as(&f, res.dir, &s6, 6);
    CHECK_INT(res.pruned, ==, 0);
    CHECK_INT(count_step_dirs(root), ==, 2);

    /* keep = 2: the third write removes step 4, and the leftover of a crashed write (no lock), not
     * the temp dir of a write in progress (locked) */
    char dead[1024], live[1024], path[1200], cmd_cp[2600];
    snprintf(dead, sizeof dead, "%s/.tmp-step-0000000007-999999", root);
    snprintf(live, sizeof live, "%s/.tmp-step-0000000007-1", root);
    CHECK(mkdir(dead, 0755) == 0 && mkdir(live, 0755) == 0);
    int held = open(live, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(held >= 0 && flock(held, LOCK_EX) == 0);
    for (int k = 0; k < 2; k++) {   /* (written in: an empty one is left a while, see test_ckpt_replace) */
        snprintf(path, sizeof path, "%s/model.safetensors", k ? live : dead);
        FILE *junk = fopen(path, "w");
        CHECK(junk && fputs("half", junk) >= 0 && fclose(junk) == 0);
    }
    train(a, &f, 2);
    struct state s8 = keep_state(a);
    ckpt_writer_set_head(w, 6);             /* step 6 accepted: a restart loads it, not step 4 */
    res = write_now(w, root, a, 1, 8);
    CHECK_INT(res.rc, ==, 0);
    CHECK_INT(res.pruned, ==, 1);
    CHECK_INT(res.stale, ==, 1);
    CHECK(access(dead, F_OK) < 0 && errno == ENOENT);
    CHECK(access(live, F_OK) == 0);
    close(held);
    CHECK_INT(ckpt_remove_stale(root), ==, 1);
    CHECK(access(live, F_OK) < 0 && errno == ENOENT);
    CHECK_INT(count_step_dirs(root), ==, 2);
    snprintf(path, sizeof path, "%s/step-0000000004", root);
    CHECK(access(path, F_OK) < 0 && errno == ENOENT);
    loads_as(&f, res.dir, &s8, 8);

    /* A replacement by two renames (a file system that cannot exchange) cut between them: step 8
     * set aside as .old-step, no step-8. The leftover is put back, not removed (it is the
     * checkpoint the coordinator holds as durable); with step 8 there it is removed. */
    char aside[1200];
    snprintf(aside, sizeof aside, "%s/.old-step-0000000008-4242", root);
    CHECK_OK(rename(res.dir, aside));
    CHECK_INT(ckpt_remove_stale(root), ==, 0);
    CHECK(access(aside, F_OK) < 0 && errno == ENOENT);
    loads_as(&f, res.dir, &s8, 8);
    snprintf(cmd_cp, sizeof cmd_cp, "cp -r '%s' '%s'", res.dir, aside);
    CHECK(system(cmd_cp) == 0);
    CHECK_INT(ckpt_remove_stale(root), ==, 1);
    CHECK(access(aside, F_OK) < 0 && errno == ENOENT);
    loads_as(&f, res.dir, &s8, 8);

    /* a root under a regular file: an error result naming it */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/step-0000000008/config.json/sub", root);
    res = write_now(w, bad, a, 1, 9);
    CHECK(res.rc < 0);
    printf("expected error: %s\n", res.err);
    CHECK_CONTAINS(res.err, bad);

    /* free with a write in flight waits for it */
    train(a, &f, 1);
    ts.step = 9;
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 12, "last"));
    ckpt_writer_free(w);
    CHECK_INT(count_step_dirs(root), ==, 3);        /* 6 (the writer's head), 8, 9 */
    CHECK_INT(ckpt_prune(root, 1, 9, -1, 0), ==, 0);   /* no head: nothing goes by age */
    CHECK_INT(ckpt_prune(root, 1, 9, 8, 0), ==, 1);    /* step 6; the head (8) stays, and what is newer */
    CHECK_INT(count_step_dirs(root), ==, 2);
    CHECK_INT(ckpt_prune(root, 1, 9, 9, 0), ==, 1);
    snprintf(path, sizeof path, "%s/step-0000000009/optimizer.bin", root);
    CHECK(access(path, F_OK) == 0);
    CHECK_INT(count_step_dirs(root), ==, 1);

    /* Steps past the one written are from a generation that ended (the group restarted from an
     * earlier checkpoint): they go, and do not count against `keep`, which would prune the new
     * checkpoint itself. */
    for (int st = 12; st <= 14; st++) {
        snprintf(path, sizeof path, "%s/step-%010d", root, st);
        CHECK(mkdir(path, 0755) == 0);
    }
    /* ... but not the head: a write below it is no lineage's (a rank that did not load the
     * head), and must not take the checkpoint a restart loads */
    CHECK_INT(ckpt_prune(root, 1, 9, 13, 0), ==, 2);
    snprintf(path, sizeof path, "%s/step-0000000013", root);
    CHECK(access(path, F_OK) == 0);
    CHECK_INT(ckpt_prune(root, 1, 9, 9, 0), ==, 1);
    CHECK_INT(count_step_dirs(root), ==, 1);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/step-0000000009/optimizer.bin", root);
    CHECK(access(path, F_OK) == 0);
    snprintf(path, sizeof path, "%s/step-0000000020", root);
    CHECK(mkdir(path, 0755) == 0);
    ts.step = 10;                           /* the writer prunes after its write */
    w = NULL;
    CHECK_OK(ckpt_writer_create(&w, 1));
    ckpt_writer_set_head(w, 9);             /* the group restarted from step 9 */
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 13, "after a rollback"));
    ckpt_writer_free(w);
    /* step 20 (past the write) went; step 9 stays until step 10 is accepted: were the group to
     * end before that, its restart would load step 9 again (keep = 1 removed it: no restart) */
    CHECK_INT(count_step_dirs(root), ==, 2);
    snprintf(path, sizeof path, "%s/step-0000000009/optimizer.bin", root);
    CHECK(access(path, F_OK) == 0);
    CHECK_INT(ckpt_prune(root, 1, 10, 10, 0), ==, 1);
    CHECK_INT(count_step_dirs(root), ==, 1);
    snprintf(path, sizeof path, "%s/step-0000000010/optimizer.bin", root);
    CHECK(access(path, F_OK) == 0);

    /* The generation fence: a write of a generation that ended (its thread still at it when a
     * later generation formed and raised the fence) neither replaces the new lineage's same-step
     * checkpoint nor prunes its newer ones; then a write of the later generation goes through. */
    struct state s10 = keep_state(a);
    for (int st = 11; st <= 12; st++) {
        snprintf(path, sizeof path, "%s/step-%010d", root, st);
        CHECK(mkdir(path, 0755) == 0);
    }
    char err[512] = "";
    CHECK_OK(ckpt_fence_raise(root, 19, NULL, NULL, err, sizeof err));
    train(a, &f, 1);
    w = NULL;
    CHECK_OK(ckpt_writer_create(&w, 1));
    ckpt_writer_debug_delay(w, 300);
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 19, "stale"));
    CHECK_OK(ckpt_fence_raise(root, 20, NULL, NULL, err, sizeof err));     /* while the write waits */
    struct ckpt_result stale;
    CHECK_INT(ckpt_writer_collect(w, 1, &stale), ==, 1);
    CHECK_INT(stale.rc, ==, -DF_ESTATE);
    printf("expected error: %s\n", stale.err);
    CHECK_CONTAINS(stale.err, "generation 20");
    CHECK_INT(stale.pruned, ==, 0);
    CHECK_INT(count_step_dirs(root), ==, 3);                    /* 10, 11, 12 */
    snprintf(path, sizeof path, "%s/step-0000000010", root);
    loads_as(&f, path, &s10, 10);
    CHECK_INT(ckpt_prune(root, 1, 10, -1, 19), ==, 0);
    CHECK_INT(ckpt_remove_stale(root), ==, 0);                  /* no temp dir was left */
    /* never lowered (a ledger gone back: refused, naming both); text that is no generation
     * counts as none */
    CHECK_INT(ckpt_fence_raise(root, 7, NULL, NULL, err, sizeof err), ==, -DF_ESTATE);
    CHECK(strstr(err, "/generation says drafter group generation 20, the ledger's is 7: the ledger is older than "
                      "the folder (restored from a copy?)") != NULL);
    CHECK_OK(ckpt_fence_raise(root, 20, NULL, NULL, err, sizeof err));
    char fence[700], text[64] = "";
    snprintf(fence, sizeof fence, "%s/%s", root, CKPT_FENCE_FILE);
    int fd = open(fence, O_RDWR);
    CHECK(fd >= 0);
    CHECK_INT(read(fd, text, sizeof text - 1), ==, 17);
    CHECK_STR(text, "0000000000000014\n");
    struct ckpt_result ok20;
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 20, "current"));
    CHECK_INT(ckpt_writer_collect(w, 1, &ok20), ==, 1);
    CHECK_OK(ok20.rc);
    CHECK_INT(ok20.pruned, ==, 2);                              /* 11, 12: past the write */
    CHECK(pwrite(fd, "junk", 4, 0) == 4 && ftruncate(fd, 4) == 0);
    CHECK_OK(ckpt_writer_start(w, root, a, 1, &ts, 5, "unfenced"));
    CHECK_INT(ckpt_writer_collect(w, 1, &ok20), ==, 1);
    CHECK_OK(ok20.rc);
    CHECK_OK(ckpt_fence_raise(root, 21, NULL, NULL, err, sizeof err));
    memset(text, 0, sizeof text);
    CHECK_INT(pread(fd, text, sizeof text - 1, 0), ==, 17);
    CHECK_STR(text, "0000000000000015\n");
    /* Held by a write that does not end (another process's, stuck in the storage): the wait
     * ticks, and gives up when its tick says so, naming why. */
    int holder = open(fence, O_RDONLY);
    CHECK(holder >= 0 && flock(holder, LOCK_EX) == 0);
    int ticks = 0;
    CHECK_INT(ckpt_fence_raise(root, 22, give_up_third, &ticks, err, sizeof err), ==, -ETIMEDOUT);
    CHECK_INT(ticks, ==, 3);
    CHECK_CONTAINS(err, "held by a checkpoint write that does not end");
    close(holder);
    CHECK_OK(ckpt_fence_raise(root, 22, give_up_third, &ticks, err, sizeof err));
    close(fd);
    ckpt_writer_free(w);
    /* A new claim of a folder whose run-id was moved away without its fence (another run's,
     * numbering its generations from 1 again: every write would be dropped) removes the fence. */
    char other[600];
    snprintf(other, sizeof other, "%s-other", root);
    CHECK(mkdir(other, 0755) == 0);
    CHECK_OK(ckpt_fence_raise(other, 9, NULL, NULL, err, sizeof err));
    CHECK_OK(ckpt_claim_root(other, 0x77, "", err, sizeof err));
    snprintf(fence, sizeof fence, "%s/%s", other, CKPT_FENCE_FILE);
    CHECK(access(fence, F_OK) < 0 && errno == ENOENT);
    CHECK_OK(ckpt_fence_raise(other, 1, NULL, NULL, err, sizeof err));
    CHECK_OK(ckpt_claim_root(other, 0x77, "", err, sizeof err));     /* its own claim: the fence stays */
    CHECK(access(fence, F_OK) == 0);
    snprintf(cmd_other, sizeof cmd_other, "rm -rf '%s'", other);
    CHECK(system(cmd_other) == 0);

    drop_state(&s4);
    drop_state(&s6);
    drop_state(&s8);
    drop_state(&s10);
    drafter_free(a);
    fixture_done(&f);
    CHECK_INT(ckpt_prune(root, 0, INT64_MAX, INT64_MAX, 0), ==, 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    printf("ok\n");
    return 0;
}
