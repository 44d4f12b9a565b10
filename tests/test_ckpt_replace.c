/* test_ckpt_replace.c: saving a checkpoint of a step that already has one (a replay) replaces it
 * without ever leaving step-N missing, and a replace that fails leaves the previous checkpoint
 * in place. The file system's answers are steered by this program's own rename() and
 * renameat2(), which the library's calls reach (a symbol of the executable comes first):
 *  1. the exchange (renameat2 RENAME_EXCHANGE, checked to be the call that swapped them): step-N is
 *     the new checkpoint, nothing left over;
 *  2. no exchange (EINVAL, as on file systems without it): step-N moved aside, the new one moved
 *     in, the old one removed;
 *  3. no exchange and the move aside fails (EIO): step-N untouched, the error names it;
 *  4. no exchange and the move-in fails: the old one is moved back, the error names step-N;
 *  5. as 4 and the move back fails too: the error says where the previous checkpoint is.
 *  6. another process's sweep of leftovers (ckpt_remove_stale) between the two renames of 2: the
 *     old one set aside is locked, not put back (the move-in had failed, ENOTEMPTY);
 *  7. such a sweep between the temp dir's mkdir and its lock: the empty temp dir is left alone
 *     (it had been removed, the write failed, ENOENT); an empty one 10 minutes old is removed.
 * A save's rename() calls here: 0 the new one to step-N (fails: step-N exists), 1 step-N aside,
 * 2 the new one in, 3 the old one back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "model/checkpoint.h"
#include "tests/test_drafter_fixture.h"

static int no_exchange;         /* renameat2 with RENAME_EXCHANGE fails with EINVAL */
static int fail_from = -1;      /* rename() calls numbered from 0 at or after this one fail (EIO) */
static int fail_count;          /* ... this many of them */
static int renames;             /* rename() calls so far */
static int exchanges;           /* renameat2 RENAME_EXCHANGE calls that swapped */
static int exchange_refused;    /* ... that this file system refused (EINVAL) */

static const char *sweep_root;  /* set: ckpt_remove_stale(sweep_root) right after ... */
static int sweep_at_aside;      /* ... rename() number 1 (step-N set aside) */
static int sweep_at_mkdir;      /* ... the temp dir's mkdir */
static int sweeps;              /* leftovers those sweeps removed or put back */
static int in_sweep;

static void sweep(void)
{
    in_sweep = 1;
    sweeps += ckpt_remove_stale(sweep_root);
    in_sweep = 0;
}

static int real_renameat2(int ofd, const char *o, int nfd, const char *n, unsigned flags)
{
    return (int)syscall(SYS_renameat2, ofd, o, nfd, n, flags);
}

int renameat2(int ofd, const char *o, int nfd, const char *n, unsigned flags)
{
    if (no_exchange && (flags & RENAME_EXCHANGE)) {
        errno = EINVAL;
        return -1;
    }
    int r = real_renameat2(ofd, o, nfd, n, flags);
    if (flags & RENAME_EXCHANGE) {
        if (r == 0)
            exchanges++;
        else if (errno == EINVAL)
            exchange_refused++;
    }
    return r;
}

int rename(const char *o, const char *n)
{
    if (in_sweep)
        return real_renameat2(AT_FDCWD, o, AT_FDCWD, n, 0);
    int k = renames++;
    if (fail_from >= 0 && k >= fail_from && k < fail_from + fail_count) {
        errno = EIO;
        return -1;
    }
    int r = real_renameat2(AT_FDCWD, o, AT_FDCWD, n, 0);
    if (r == 0 && k == 1 && sweep_at_aside)
        sweep();
    return r;
}

int mkdir(const char *path, mode_t mode)
{
    int r = (int)syscall(SYS_mkdirat, AT_FDCWD, path, mode);
    if (r == 0 && sweep_at_mkdir && strstr(path, "/.tmp-step-"))
        sweep();
    return r;
}

static const struct drafter_train_opts OPTS = {
    .lr = 3e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 10, .weight_decay = 0.01,
    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
};

/* Names in root other than step-0000000005, joined by spaces ("" when none). */
static const char *leftovers(const char *root)
{
    static char out[2048];
    out[0] = 0;
    DIR *d = opendir(root);
    CHECK(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "step-0000000005"))
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", out[0] ? " " : "", e->d_name);
    closedir(d);
    return out;
}

/* Put the checkpoint left at `at` back as step-5 (case 5 left it there). */
static void remove_leftovers(const char *root, const char *at)
{
    char final[1100];
    snprintf(final, sizeof final, "%s/step-0000000005", root);
    CHECK_OK(real_renameat2(AT_FDCWD, at, AT_FDCWD, final, 0));
    CHECK_STR(leftovers(root), "");
}

/* The checkpoint at dir holds exactly want's weights. */
static void holds(const char *dir, struct drafter *scratch, const struct drafter *want, const char *what)
{
    char err[512];
    struct ckpt_train_state ts;
    if (ckpt_load(dir, scratch, &ts, NULL, err, sizeof err) < 0)
        TEST_FAIL("%s: %s", what, err);
    if (memcmp(scratch->params, want->params, want->n_params * sizeof(float)))
        TEST_FAIL("%s: %s does not hold the expected weights", what, dir);
}

int main(void)
{
    const char *tmp = getenv("DFLASH_TEST_TMP");
    char root[512], dir[1024], final[1100], err[1024];
    snprintf(root, sizeof root, "%s/replace-%d", tmp ? tmp : "/tmp", (int)getpid());
    snprintf(final, sizeof final, "%s/step-0000000005", root);
    int lens[2] = { 12, 9 }, prompt[2] = { 2, 0 };
    struct fixture f;
    fixture_init(&f, 5, 2, lens, prompt);
    struct drafter *a = fixture_drafter(&f, 64), *b = fixture_drafter(&f, 64), *x = fixture_drafter(&f, 64);
    struct obj_rng_key key = { 42, 0, 0, 0 };
    struct drafter_metrics m;
    struct drafter_step_info info;
    CHECK_OK(drafter_train_step(b, &f.batch, 2, 7.0, &key, &OPTS, &m, &info));   /* b differs from a */
    struct ckpt_train_state ts = { .step = 5 };
    const struct drafter *order[2] = { a, b };

    /* 1 and 2: each replace succeeds (a, then b, then a ... in step-5) */
    for (int c = 0; c < 2; c++) {
        no_exchange = c;
        CHECK_OK(ckpt_save(root, order[0], &ts, 0, dir, sizeof dir, err, sizeof err));
        renames = exchanges = exchange_refused = 0;
        if (ckpt_save(root, order[1], &ts, 0, dir, sizeof dir, err, sizeof err) < 0)
            TEST_FAIL("replace (%s): %s", c ? "no exchange" : "exchange", err);
        CHECK_STR(dir, final);
        holds(final, x, order[1], c ? "no exchange" : "exchange");
        CHECK_STR(leftovers(root), "");
        if (c == 0 && exchange_refused) {
            printf("note: %s cannot exchange: the swap fell back to two renames\n", root);
        } else {
            /* the exchange: only the first rename (step-5 exists); else that one, aside, in */
            CHECK_INT(exchanges, ==, c ? 0 : 1);
            CHECK_INT(renames, ==, c ? 3 : 1);
        }
        printf("replace by %s: step-5 is the new checkpoint, nothing left over\n", c ? "two renames" : "exchange");
    }

    /* 3, 4: step-5 holds b; the move aside, then the move-in of a fails: b stays / goes back */
    no_exchange = 1;
    for (int c = 1; c <= 2; c++) {
        renames = 0;
        fail_from = c;
        fail_count = 1;
        CHECK_INT(ckpt_save(root, a, &ts, 0, dir, sizeof dir, err, sizeof err), ==, -EIO);
        CHECK_INT(renames, ==, c == 1 ? 2 : 4);
        printf("expected error: %s\n", err);
        CHECK_CONTAINS(err, "replace ");
        CHECK_CONTAINS(err, final);
        if (strstr(err, "left at"))
            TEST_FAIL("the previous checkpoint was not moved back: %s", err);
        holds(final, x, b, c == 1 ? "failed move aside" : "failed move-in");
        CHECK_STR(leftovers(root), "");
        printf("%s failed: step-5 is the previous checkpoint, nothing left over\n", c == 1 ? "move aside" : "move-in");
    }

    /* 5: the move back fails too: the error names where the previous checkpoint is */
    renames = 0;
    fail_from = 2;
    fail_count = 2;
    CHECK_INT(ckpt_save(root, a, &ts, 0, dir, sizeof dir, err, sizeof err), ==, -EIO);
    printf("expected error: %s\n", err);
    const char *at = strstr(err, "the previous one is left at ");
    CHECK(at);
    at += strlen("the previous one is left at ");
    holds(at, x, b, "left aside");
    CHECK(access(final, F_OK) != 0);
    fail_from = -1;
    printf("move-in and move-back failed: the error names %s, which holds the previous checkpoint\n", at);
    remove_leftovers(root, at);

    /* 6: a sweep between the two renames; 7: a sweep between the temp dir's mkdir and its lock */
    sweep_root = root;
    CHECK_OK(ckpt_save(root, b, &ts, 0, dir, sizeof dir, err, sizeof err));
    for (int c = 6; c <= 7; c++) {
        sweep_at_aside = c == 6;
        sweep_at_mkdir = c == 7;
        renames = sweeps = 0;
        const struct drafter *want = c == 6 ? a : b;
        if (ckpt_save(root, want, &ts, 0, dir, sizeof dir, err, sizeof err) < 0)
            TEST_FAIL("a sweep %s: %s", c == 6 ? "between the two renames" : "after the temp dir's mkdir", err);
        CHECK_INT(sweeps, ==, 0);
        holds(final, x, want, c == 6 ? "swept between the renames" : "swept after the mkdir");
        CHECK_STR(leftovers(root), "");
        printf("a sweep %s: nothing taken, step-5 is the new checkpoint\n",
               c == 6 ? "between the two renames" : "after the temp dir's mkdir");
    }
    sweep_at_aside = sweep_at_mkdir = 0;
    snprintf(dir, sizeof dir, "%s/.tmp-step-0000000009-4242", root);
    CHECK_OK(mkdir(dir, 0755));
    CHECK_INT(ckpt_remove_stale(root), ==, 0);
    struct timespec old[2] = { { time(NULL) - 601, 0 }, { time(NULL) - 601, 0 } };
    CHECK_OK(utimensat(AT_FDCWD, dir, old, 0));
    CHECK_INT(ckpt_remove_stale(root), ==, 1);
    CHECK_STR(leftovers(root), "");
    printf("an empty temp dir left for 10 minutes, then removed\n");

    drafter_free(a);
    drafter_free(b);
    drafter_free(x);
    fixture_done(&f);
    return 0;
}
