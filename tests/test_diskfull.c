/* test_diskfull.c: a drafter checkpoint saved onto a full filesystem (a small private tmpfs):
 * the save fails with a clear ENOSPC error, leaves no temp dir, the previous checkpoint stays
 * byte-identical and loadable, the in-memory training state is untouched, training continues
 * and a save after space is freed works. Out of blocks at every file and out of inodes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "model/checkpoint.h"
#include "model/optim.h"
#include "tests/test_drafter_fixture.h"

static const struct drafter_train_opts OPTS = {
    .lr = 3e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 20, .weight_decay = 0.01,
    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
};

static const char *const FILES[] = { CKPT_CONFIG, CKPT_WEIGHTS, CKPT_OPTIMIZER };
#define NFILES 3

/* What training holds in memory: weights, moments, step. */
struct snapshot {
    size_t n;
    float *params, *m, *v;
    int64_t step;
};

static void snap_take(struct snapshot *s, const struct drafter *d)
{
    s->n = d->n_params;
    size_t nb = s->n * sizeof(float);
    s->params = realloc(s->params, nb);
    s->m = realloc(s->m, nb);
    s->v = realloc(s->v, nb);
    CHECK(s->params && s->m && s->v);
    memcpy(s->params, d->params, nb);
    memcpy(s->m, d->opt->m, nb);
    memcpy(s->v, d->opt->v, nb);
    s->step = d->opt->step;
}

static void snap_same(const struct snapshot *s, const struct drafter *d, const char *what)
{
    size_t nb = s->n * sizeof(float);
    if (d->n_params != s->n || memcmp(s->params, d->params, nb) || memcmp(s->m, d->opt->m, nb) ||
        memcmp(s->v, d->opt->v, nb) || d->opt->step != s->step)
        TEST_FAIL("%s: training state differs from the snapshot (step %lld vs %lld)", what,
                  (long long)d->opt->step, (long long)s->step);
}

static void snap_free(struct snapshot *s)
{
    free(s->params);
    free(s->m);
    free(s->v);
}

static void train(struct drafter *d, struct fixture *f, int64_t from, int64_t to)
{
    for (int64_t s = from; s < to; s++) {
        struct obj_rng_key key = { 42, 0, (uint64_t)s, 0 };
        struct drafter_metrics m;
        struct drafter_step_info info;
        CHECK_OK(drafter_train_step(d, &f->batch, 2, 7.0, &key, &OPTS, &m, &info));
        CHECK_INT(info.step, ==, s + 1);
    }
}

/* The bytes of a checkpoint's files, to prove they did not change. */
struct ckpt_bytes {
    char dir[1024];
    uint8_t *data[NFILES];
    size_t len[NFILES];
};

static uint8_t *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        TEST_FAIL("open %s: %s", path, strerror(errno));
    struct stat st;
    CHECK_OK(fstat(fd, &st));
    uint8_t *b = malloc((size_t)st.st_size + 1);
    CHECK(b);
    ssize_t got = read(fd, b, (size_t)st.st_size);
    CHECK_INT(got, ==, st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return b;
}

static void bytes_take(struct ckpt_bytes *c, const char *dir)
{
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    for (int i = 0; i < NFILES; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, FILES[i]);
        free(c->data[i]);
        c->data[i] = slurp(p, &c->len[i]);
    }
}

static size_t bytes_total_pages(const struct ckpt_bytes *c)
{
    size_t pages = 0;
    for (int i = 0; i < NFILES; i++)
        pages += (c->len[i] + 4095) / 4096;
    return pages;
}

static void bytes_same(const struct ckpt_bytes *c)
{
    for (int i = 0; i < NFILES; i++) {
        char p[1200];
        size_t len;
        snprintf(p, sizeof p, "%s/%s", c->dir, FILES[i]);
        uint8_t *now = slurp(p, &len);
        if (len != c->len[i] || memcmp(now, c->data[i], len))
            TEST_FAIL("%s changed (%zu -> %zu bytes)", p, c->len[i], len);
        free(now);
    }
}

/* ---- filling the filesystem ---- */

static uint64_t free_bytes(const char *mnt)
{
    struct statvfs v;
    CHECK_OK(statvfs(mnt, &v));
    return (uint64_t)v.f_bavail * v.f_frsize;
}

static uint64_t free_inodes(const char *mnt)
{
    struct statvfs v;
    CHECK_OK(statvfs(mnt, &v));
    return v.f_favail;
}

/* Take blocks until only `leave` bytes are free (0: until the filesystem says ENOSPC). */
static void fill_blocks(const char *mnt, uint64_t leave)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/filler", mnt);
    int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    static uint8_t chunk[65536];
    memset(chunk, 0xa5, sizeof chunk);
    for (;;) {
        uint64_t avail = free_bytes(mnt);
        if (avail <= leave)
            break;
        uint64_t want = avail - leave;
        ssize_t w = write(fd, chunk, want < sizeof chunk ? (size_t)want : sizeof chunk);
        if (w < 0 && errno == ENOSPC)
            break;
        if (w < 0)
            TEST_FAIL("filling %s: %s", p, strerror(errno));
    }
    close(fd);
}

/* Take inodes until only `leave` are free. */
static int fill_inodes(const char *mnt, uint64_t leave)
{
    int made = 0;
    while (free_inodes(mnt) > leave) {
        char p[1024];
        snprintf(p, sizeof p, "%s/inode-%d", mnt, made);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == ENOSPC)
            break;
        if (fd < 0)
            TEST_FAIL("creating %s: %s", p, strerror(errno));
        close(fd);
        made++;
    }
    return made;
}

static void unfill(const char *mnt, int inodes)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/filler", mnt);
    unlink(p);
    for (int i = 0; i < inodes; i++) {
        snprintf(p, sizeof p, "%s/inode-%d", mnt, i);
        CHECK_OK(unlink(p));
    }
}

/* ---- the checks after a save that had to fail ---- */

static void no_leftovers(const char *root)
{
    DIR *d = opendir(root);
    CHECK(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, ".tmp-", 5) || !strncmp(e->d_name, ".old-", 5))
            TEST_FAIL("failed save left %s/%s behind", root, e->d_name);
    closedir(d);
}

struct env {
    const char *mnt;
    char root[1024];
    struct fixture *f;
    struct drafter *d;          /* the training drafter */
    struct snapshot at_save;    /* its state when the good checkpoint was written */
    struct ckpt_bytes good;     /* that checkpoint's bytes */
    int64_t good_step;
    int failures;
};

static void expect_failed_save(struct env *e, int64_t step, const char *why)
{
    char err[512] = "", out[1024] = "";
    struct snapshot before = { 0 };
    snap_take(&before, e->d);
    struct ckpt_train_state ts = { .step = step, .batch_in_epoch = (uint64_t)step, .seed = 42 };
    int r = ckpt_save(e->root, e->d, &ts, 0, out, sizeof out, err, sizeof err);
    if (r >= 0)
        TEST_FAIL("%s: save of step %lld succeeded on a full filesystem (%s)", why, (long long)step, out);
    printf("%-34s -> %d: %s\n", why, r, err);
    CHECK_INT(r, ==, -ENOSPC);
    CHECK_CONTAINS(err, strerror(ENOSPC));
    CHECK_CONTAINS(err, e->root);                 /* names the file or dir it failed on */
    CHECK(!strchr(err, '\n'));
    snap_same(&before, e->d, why);                /* memory untouched by the failure */
    snap_free(&before);
    no_leftovers(e->root);
    bytes_same(&e->good);

    char latest[1024];
    int64_t lstep = -1;
    CHECK_OK(ckpt_latest(e->root, latest, sizeof latest, &lstep));
    CHECK_INT(lstep, ==, e->good_step);
    CHECK_STR(latest, e->good.dir);
    /* and it loads, exactly, into a fresh drafter */
    struct drafter *x = fixture_drafter(e->f, 64);
    struct ckpt_train_state got;
    if (ckpt_load(latest, x, &got, NULL, err, sizeof err) < 0)
        TEST_FAIL("%s: previous checkpoint no longer loads: %s", why, err);
    CHECK_INT(got.step, ==, e->good_step);
    snap_same(&e->at_save, x, "reloaded previous checkpoint");
    drafter_free(x);
    e->failures++;
}

/* Save for real and make that the checkpoint the next failures must preserve. */
static void good_save(struct env *e, int64_t step)
{
    char err[512] = "", out[1024] = "";
    struct ckpt_train_state ts = { .step = step, .batch_in_epoch = (uint64_t)step, .seed = 42 };
    if (ckpt_save(e->root, e->d, &ts, 0, out, sizeof out, err, sizeof err) < 0)
        TEST_FAIL("save of step %lld with space free: %s", (long long)step, err);
    snap_take(&e->at_save, e->d);
    bytes_take(&e->good, out);
    e->good_step = step;
    no_leftovers(e->root);
}

static void mount_tmpfs(const char *mnt, const char *opts)
{
    mkdir(mnt, 0700);
    if (mount("dflash-diskfull", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        SKIP("mount tmpfs (%s) on %s: %s", opts, mnt, strerror(errno));
}

int main(void)
{
    const char *tmp = getenv("DFLASH_TEST_TMP");
    char mnt[512];
    snprintf(mnt, sizeof mnt, "%s/diskfull-%d", tmp ? tmp : "/tmp", (int)getpid());

    /* A private mount namespace: the tmpfs is invisible outside and goes away with us. */
    if (unshare(CLONE_NEWNS) < 0)
        SKIP("unshare(CLONE_NEWNS): %s (needs root or CAP_SYS_ADMIN)", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        SKIP("make / private in the new mount namespace: %s", strerror(errno));

    int lens[3] = { 14, 11, 9 }, prompt[3] = { 3, 0, 4 };
    struct fixture f;
    fixture_init(&f, 21, 3, lens, prompt);
    struct env e = { .mnt = mnt, .f = &f };
    e.d = fixture_drafter(&f, 64);
    snprintf(e.root, sizeof e.root, "%s/checkpoints", mnt);

    /* ---- out of blocks ---- */
    mount_tmpfs(mnt, "size=4m,mode=0700");
    train(e.d, &f, 0, 3);
    good_save(&e, 3);
    size_t pages = bytes_total_pages(&e.good);
    printf("checkpoint: %zu + %zu + %zu bytes (%zu pages); tmpfs free %llu bytes\n", e.good.len[0],
           e.good.len[1], e.good.len[2], pages, (unsigned long long)free_bytes(mnt));
    CHECK_INT(free_bytes(mnt), >, (uint64_t)pages * 4096);    /* room for a second one */
    train(e.d, &f, 3, 5);

    /* Run out at each file in turn: nothing free, config.json fits, config + weights fit,
     * all but the last pages of optimizer.bin fit. */
    uint64_t cfg_b = (e.good.len[0] + 4095) / 4096 * 4096, w_b = (e.good.len[1] + 4095) / 4096 * 4096;
    const struct { uint64_t leave; const char *why; } levels[] = {
        { 0, "no space at all" },
        { cfg_b, "space for config.json only" },
        { cfg_b + w_b, "space for config + weights" },
        { (uint64_t)(pages - 2) * 4096, "two pages short" },
    };
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        fill_blocks(mnt, levels[i].leave);
        expect_failed_save(&e, 5, levels[i].why);
        /* the same step as the good checkpoint: the replace path must not lose it either */
        expect_failed_save(&e, 3, "same step as the kept checkpoint");
        unfill(mnt, 0);
    }

    /* Training goes on while the disk is full, and saves work again once space is back. */
    fill_blocks(mnt, 0);
    train(e.d, &f, 5, 6);
    expect_failed_save(&e, 6, "full again, after more training");
    unfill(mnt, 0);
    good_save(&e, 6);
    struct drafter *x = fixture_drafter(&f, 64);
    struct ckpt_train_state got;
    char err[512] = "";
    CHECK_OK(ckpt_load(e.good.dir, x, &got, NULL, err, sizeof err));
    snap_same(&e.at_save, x, "checkpoint saved after freeing space");
    /* resumed from it == trained straight through */
    train(x, &f, 6, 8);
    train(e.d, &f, 6, 8);
    struct snapshot s8 = { 0 };
    snap_take(&s8, e.d);
    snap_same(&s8, x, "resume after disk full vs straight through");
    drafter_free(x);
    printf("out of blocks: %d failed saves, each clean; save after freeing space resumes bitwise\n", e.failures);
    CHECK_OK(umount(mnt));

    /* ---- out of inodes: fail at the temp dir and at each file ---- */
    mount_tmpfs(mnt, "size=4m,nr_inodes=64,mode=0700");
    e.failures = 0;
    good_save(&e, 8);
    for (uint64_t leave = 0; leave < 1 + NFILES; leave++) {
        int made = fill_inodes(mnt, leave);
        char why[64];
        snprintf(why, sizeof why, "%llu inode(s) free", (unsigned long long)leave);
        expect_failed_save(&e, 9, why);
        unfill(mnt, made);
    }
    good_save(&e, 9);
    printf("out of inodes: %d failed saves, each clean\n", e.failures);
    CHECK_OK(umount(mnt));

    for (int i = 0; i < NFILES; i++)
        free(e.good.data[i]);
    snap_free(&e.at_save);
    snap_free(&s8);
    drafter_free(e.d);
    fixture_done(&f);
    rmdir(mnt);
    return 0;
}
