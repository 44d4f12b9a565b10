/* test_checkpoint.c: drafter checkpoints: config.json fields and tensor names as SGLang / vLLM
 * read them, save -> load -> continue equals training straight through (bitwise), latest-checkpoint
 * discovery, and clear errors for a missing tensor, a wrong shape, another target's config, a
 * corrupt optimizer state and a missing config. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "common/err.h"
#include "model/checkpoint.h"
#include "model/hfconfig.h"
#include "model/cpu_ops.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "model/st_writer.h"
#include "tests/test_drafter_fixture.h"

/* An allocation that cannot be had is a NULL here, as from glibc (the write's out-of-memory path
 * is tested), not a sanitizer's report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }

static const struct drafter_train_opts OPTS = {
    .lr = 3e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 10, .weight_decay = 0.01,
    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
};

static void train(struct drafter *d, struct fixture *f, int from, int to)
{
    for (int s = from; s < to; s++) {
        struct obj_rng_key key = { 42, 0, (uint64_t)s, 0 };
        struct drafter_metrics m;
        struct drafter_step_info info;
        CHECK_OK(drafter_train_step(d, &f->batch, 2, 7.0, &key, &OPTS, &m, &info));
        CHECK_INT(info.step, ==, s + 1);
    }
}

static void same_state(const struct drafter *a, const struct drafter *b)
{
    CHECK_INT(a->n_params, ==, b->n_params);
    CHECK(!memcmp(a->params, b->params, a->n_params * sizeof(float)));
    CHECK(!memcmp(a->opt->m, b->opt->m, a->n_params * sizeof(float)));
    CHECK(!memcmp(a->opt->v, b->opt->v, a->n_params * sizeof(float)));
    CHECK_INT(a->opt->step, ==, b->opt->step);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    CHECK(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* The checkpoint in dir read with its config.json (path) replaced by k (freed here). */
static int read_config_as(cJSON *k, const char *path, const char *dir, struct drafter_config *c, char *err,
                          size_t errlen)
{
    char *text = cJSON_Print(k);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0);
    fclose(f);
    free(text);
    cJSON_Delete(k);
    return ckpt_read_config(dir, c, err, errlen);
}

static int jint(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v))
        TEST_FAIL("config.json: %s missing", k);
    return (int)v->valuedouble;
}

/* Write model.safetensors of d into dir, leaving out tensor `skip` or giving `bad` a wrong shape. */
static void write_weights_variant(const char *dir, const struct drafter *d, const char *skip, const char *bad)
{
    char path[1024], err[256];
    uint16_t *bf = malloc(d->n_params * sizeof *bf);
    cpu_f32_to_bf16(bf, d->params, d->n_params);
    struct st_out t[64];
    size_t n = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *x = &d->tensors[i];
        if (skip && !strcmp(x->name, skip))
            continue;
        t[n] = (struct st_out){ .name = x->name, .dtype = ST_BF16, .ndim = x->ndim,
                                .shape = { x->shape[0], x->shape[1] }, .data = bf + x->offset };
        if (bad && !strcmp(x->name, bad))
            t[n].shape[0] -= 1;
        n++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write_file(path, t, n, NULL, 0, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    free(bf);
}

static void count_call(void *n)
{
    ++*(int *)n;
}

static int expect_load_error(const char *dir, struct drafter *d, const char *needle)
{
    char err[512] = "";
    struct ckpt_train_state ts;
    int r = ckpt_load(dir, d, &ts, NULL, err, sizeof err);
    if (r >= 0)
        TEST_FAIL("loading %s succeeded; expected an error about %s", dir, needle);
    printf("expected error: %s\n", err);
    CHECK_CONTAINS(err, needle);
    return r;
}

/* optimizer.bin's last 8 bytes made the FNV-1a of everything before them (its checksum right). */
static void reseal(unsigned char *file, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len - 8; i++)
        h = (h ^ file[i]) * 0x100000001b3ull;
    memcpy(file + len - 8, &h, sizeof h);
}

/* optimizer.bin's header field at `off` (8 bytes) set to v, its checksum made to match when
 * `fix_sum` (a whole file of another version or layout), else left (a damaged one). */
static void set_opt_header(const char *path, size_t off, uint64_t v, int fix_sum)
{
    int fd = open(path, O_RDWR);
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0);
    size_t len = (size_t)st.st_size;
    unsigned char *file = malloc(len);
    CHECK(file && pread(fd, file, len, 0) == (ssize_t)len);
    memcpy(file + off, &v, sizeof v);
    if (fix_sum)
        reseal(file, len);
    CHECK(pwrite(fd, file, len, 0) == (ssize_t)len);
    close(fd);
    free(file);
}

/* A drafter of more parameters than one chunk of the load's verification (4 Mi floats): the
 * chunks add up to the whole, the second chunk is hashed and its master weights checked (by
 * index), and a refused checkpoint leaves the drafter it was loaded into as it was. */
static void multi_chunk_load(const char *root)
{
    struct drafter_config c;
    fixture_config(&c);
    c.hidden_size = 512;
    c.num_layers = 1;
    c.num_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.intermediate_size = 2048;
    float *embed = calloc((size_t)c.vocab_size * c.hidden_size, sizeof(float));
    float *head = calloc((size_t)c.vocab_size * c.hidden_size, sizeof(float));
    CHECK(embed && head);
    char err[512] = "", dir[1024], path[1200];
    struct drafter *a = NULL, *b = NULL;
    CHECK_OK(drafter_create(&a, &c, embed, head, 64, 8, 1, err, sizeof err));
    CHECK_OK(drafter_create(&b, &c, embed, head, 64, 8, 2, err, sizeof err));
    CHECK_INT(a->n_params, >, (size_t)(4u << 20) + 1000);
    for (size_t i = 0; i < a->n_params; i++) {
        a->opt->m[i] = a->params[i] * 0.5f + 1e-3f;
        a->opt->v[i] = a->params[i] * a->params[i] + 1e-6f;
    }
    a->opt->step = 3;
    struct ckpt_train_state ts = { .step = 3, .seed = 5 }, got;
    CHECK_OK(ckpt_save(root, a, &ts, 0, dir, sizeof dir, err, sizeof err));
    CHECK_OK(ckpt_load(dir, b, &got, NULL, err, sizeof err));
    same_state(a, b);
    CHECK_INT(got.step, ==, 3);
    /* the same files in a directory named for another step: refused (the lineage is by step) */
    char moved[1100], cmd[2400];
    snprintf(moved, sizeof moved, "%s/step-0000000005", root);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", dir, moved);
    CHECK(system(cmd) == 0);
    struct drafter *c2 = NULL;
    CHECK_OK(drafter_create(&c2, &c, embed, head, 64, 8, 4, err, sizeof err));
    CHECK(ckpt_load(moved, c2, &got, NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "step 3 (optimizer step 3) in a directory named for step 5");
    /* a config.json that cannot be read is said so, not "not a JSON object" */
    snprintf(cmd, sizeof cmd, "rm '%s/config.json' && mkdir '%s/config.json'", moved, moved);
    CHECK(system(cmd) == 0);
    struct drafter_config rc;
    CHECK(ckpt_read_config(moved, &rc, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "config.json: not a regular file");
    drafter_free(c2);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", moved);
    CHECK(system(cmd) == 0);

    /* master weight 4 Mi + 5 (the second chunk) changed: a damaged file; then, with its checksum
     * made to match, a master weight that no longer rounds to its bf16 weight */
    struct drafter *fresh = NULL;
    CHECK_OK(drafter_create(&fresh, &c, embed, head, 64, 8, 3, err, sizeof err));
    drafter_free(b);
    CHECK_OK(drafter_create(&b, &c, embed, head, 64, 8, 3, err, sizeof err));
    snprintf(path, sizeof path, "%s/optimizer.bin", dir);
    size_t len = 128 + 3 * a->n_params * sizeof(float) + 8;
    unsigned char *file = malloc(len);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0 && file);
    CHECK(pread(fd, file, len, 0) == (ssize_t)len);
    float bad = 1234.5f;
    memcpy(file + 128 + 4 * ((size_t)(4u << 20) + 5), &bad, sizeof bad);
    CHECK(pwrite(fd, file, len, 0) == (ssize_t)len);
    expect_load_error(dir, b, "checksum mismatch");
    same_state(fresh, b);
    reseal(file, len);
    CHECK(pwrite(fd, file + len - 8, 8, (off_t)(len - 8)) == 8);
    expect_load_error(dir, b, "element 4194309");
    same_state(fresh, b);
    /* the master weight put back, a second moment made NaN (checksum matching): refused as such */
    memcpy(file + 128 + 4 * ((size_t)(4u << 20) + 5), &a->params[(4u << 20) + 5], sizeof(float));
    float nan = NAN;
    memcpy(file + 128 + 4 * (2 * a->n_params + 77), &nan, sizeof nan);
    reseal(file, len);
    CHECK(pwrite(fd, file, len, 0) == (ssize_t)len);
    close(fd);
    free(file);
    expect_load_error(dir, b, "second moment 77 is NaN or infinite");
    same_state(fresh, b);
    printf("%zu parameters: loaded over %zu chunks; a bad master weight in the second refused, the drafter left as it was\n",
           a->n_params, (a->n_params + (4u << 20) - 1) / (4u << 20));
    drafter_free(a);
    drafter_free(b);
    drafter_free(fresh);
    free(embed);
    free(head);
}

/* ckpt_claim_root: a checkpoint folder holds one run's checkpoints. */
static void claim_root(const char *base)
{
    char root[600], p[700], step[700], link_path[700], err[512] = "";
    snprintf(root, sizeof root, "%s/claim/", base);     /* made with its parent; a trailing slash */
    CHECK_INT(ckpt_claim_root(root, 0x1234, "", err, sizeof err), <, 0);    /* the parent is missing */
    CHECK_CONTAINS(err, "mkdir");
    CHECK_OK(mkdir(base, 0755));
    /* a file where the folder should be (or its parent): refused for good */
    snprintf(p, sizeof p, "%s/afile", base);
    FILE *af = fopen(p, "w");
    CHECK(af);
    fclose(af);
    CHECK_INT(ckpt_claim_root(p, 0x1234, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "afile: not a folder (a file is there)");
    snprintf(step, sizeof step, "%s/afile/sub", base);
    CHECK_INT(ckpt_claim_root(step, 0x1234, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "afile/sub: mkdir: Not a directory");
    CHECK_OK(unlink(p));
    CHECK_INT(ckpt_claim_root(root, 0, "", err, sizeof err), ==, -EINVAL);  /* no run named */
    CHECK_OK(ckpt_claim_root(root, 0x1234, "", err, sizeof err));
    snprintf(p, sizeof p, "%s/%s", root, CKPT_RUN_FILE);
    CHECK_STR(read_text(p), "0000000000001234\n");
    CHECK_OK(ckpt_claim_root(root, 0x1234, "", err, sizeof err));          /* its own again */

    /* a claim's temp file: left by a crash (written and unlocked, or empty for long) it goes at the
     * next clean-up; one a claimant holds locked, or one just made and not written yet, stays */
    static const char *const temps[4] = { ".run-id-crashed", ".run-id-claiming", ".run-id-creating",
                                          ".run-id-crashed-early" };
    int held = -1;
    for (int i = 0; i < 4; i++) {
        char t[700];
        snprintf(t, sizeof t, "%s/%s", root, temps[i]);
        int fd = open(t, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        CHECK(fd >= 0);
        if (i < 2)
            CHECK_INT(write(fd, "0000000000005678\n", 17), ==, 17);
        if (i == 3) {   /* made 11 minutes ago */
            struct timespec ts[2] = { { .tv_sec = time(NULL) - 660 }, { .tv_sec = time(NULL) - 660 } };
            CHECK_OK(futimens(fd, ts));
        }
        if (i == 1) {
            CHECK_OK(flock(fd, LOCK_EX));
            held = fd;
        } else {
            close(fd);
        }
    }
    CHECK_INT(ckpt_remove_stale(root), ==, 2);
    for (int i = 0; i < 4; i++) {
        char t[700];
        snprintf(t, sizeof t, "%s/%s", root, temps[i]);
        CHECK_INT(access(t, F_OK) == 0, ==, i == 1 || i == 2);
        if (i == 1 || i == 2)
            CHECK_OK(unlink(t));
    }
    close(held);
    CHECK_STR(read_text(p), "0000000000001234\n");

    /* another run's folder, with no checkpoint yet (that run may be running) or with one */
    CHECK_INT(ckpt_claim_root(root, 0x99, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "belongs to run 0000000000001234, not to this run (0000000000000099): move the folder "
                        "away (with its run-id and generation)");
    snprintf(step, sizeof step, "%s/step-0000000040", root);
    CHECK_OK(mkdir(step, 0755));
    CHECK_INT(ckpt_claim_root(root, 0x99, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_STR(read_text(p), "0000000000001234\n");

    /* unclaimed with a step folder (or one an interrupted replacement set aside): refused from
     * scratch, adopted when the run resumes from it, also through another spelling of the
     * folder; an unfinished write is no checkpoint */
    CHECK_OK(unlink(p));
    snprintf(link_path, sizeof link_path, "%s/.old-step-0000000040-77", root);
    CHECK_OK(rename(step, link_path));
    CHECK_INT(ckpt_claim_root(root, 0x77, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "holds checkpoints of no known run (.old-step-0000000040-77 ...)");
    CHECK_OK(rmdir(link_path));
    snprintf(link_path, sizeof link_path, "%s/.tmp-step-0000000050-77", root);
    CHECK_OK(mkdir(link_path, 0755));
    CHECK_OK(ckpt_claim_root(root, 0x99, "", err, sizeof err));            /* nothing in it: taken */
    CHECK_STR(read_text(p), "0000000000000099\n");
    CHECK_OK(rmdir(link_path));
    CHECK_OK(unlink(p));
    CHECK_OK(mkdir(step, 0755));
    CHECK_INT(ckpt_claim_root(root, 0x77, "", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "holds checkpoints of no known run (step-0000000040 ...), which this run could prune or replace");
    CHECK_INT(ckpt_claim_root(root, 0x77, "/elsewhere/step-0000000040", err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_INT(access(p, F_OK), <, 0);
    snprintf(link_path, sizeof link_path, "%s/claim-link", base);
    CHECK_OK(symlink(root, link_path));
    snprintf(link_path, sizeof link_path, "%s/claim-link/step-0000000040", base);
    CHECK_OK(ckpt_claim_root(root, 0x77, link_path, err, sizeof err));
    CHECK_STR(read_text(p), "0000000000000077\n");

    /* a run-id that is not one */
    FILE *fp = fopen(p, "w");
    CHECK(fp);
    fputs("77\n", fp);
    fclose(fp);
    CHECK_INT(ckpt_claim_root(root, 0x77, step, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "not a run id");
    /* 16 characters strtoull would take ("0x" and 14 digits, a sign, blanks): not a run id either */
    static const char *const odd[] = { "0x00000000000077\n", "+000000000000077\n", " 000000000000077\n" };
    for (int i = 0; i < 3; i++) {
        CHECK((fp = fopen(p, "w")) != NULL);
        fputs(odd[i], fp);
        fclose(fp);
        CHECK_INT(ckpt_claim_root(root, 0x77, step, err, sizeof err), ==, -DF_ELAYOUT);
        CHECK_CONTAINS(err, "not a run id");
    }
    /* a FIFO as the run id, the fence or a claim's temp file: refused (or left) at once, not
     * waited on for a writer (the alarm fails the test where an open would wait) */
    char fifo[700];
    alarm(20);
    CHECK_OK(unlink(p));
    CHECK_OK(mkfifo(p, 0600));
    CHECK_INT(ckpt_claim_root(root, 0x77, step, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "run-id: not a regular file");
    uint64_t rid = 0;
    CHECK_INT(ckpt_read_run_id(root, &rid, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_OK(unlink(p));
    snprintf(fifo, sizeof fifo, "%s/%s", root, CKPT_FENCE_FILE);
    unlink(fifo);
    CHECK_OK(mkfifo(fifo, 0600));
    CHECK_INT(ckpt_fence_raise(root, 3, NULL, NULL, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "generation: not a regular file");
    CHECK_OK(unlink(fifo));
    snprintf(fifo, sizeof fifo, "%s/.run-id-fifo", root);
    CHECK_OK(mkfifo(fifo, 0600));
    ckpt_remove_stale(root);
    CHECK_OK(access(fifo, F_OK));       /* (not a claim's file: left) */
    CHECK_OK(unlink(fifo));
    /* a socket at either name: refused the same way (its open fails with ENXIO) */
    for (int i = 0; i < 2; i++) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        CHECK(snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", root, i ? CKPT_FENCE_FILE : CKPT_RUN_FILE) <
              (int)sizeof sa.sun_path);
        int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(sfd >= 0 && bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0);
        if (i) {
            CHECK_INT(ckpt_fence_raise(root, 3, NULL, NULL, err, sizeof err), ==, -DF_ELAYOUT);
            CHECK_CONTAINS(err, "generation: not a regular file");
        } else {
            CHECK_INT(ckpt_claim_root(root, 0x77, step, err, sizeof err), ==, -DF_ELAYOUT);
            CHECK_CONTAINS(err, "run-id: not a regular file");
        }
        close(sfd);
        CHECK_OK(unlink(sa.sun_path));
    }
    alarm(0);
    printf("checkpoint folder claims: ok\n");
}

/* The training position's epoch moves forward only: batches of epoch 1, then one of epoch 0 queued
 * again and trained late, then epoch 1 again (it had gone 1, 0, 1 and counted epoch 1 from 0 twice). */
static void epoch_position(void)
{
    struct ckpt_train_state ts = { 0 };
    static const uint64_t epochs[] = { 0, 0, 1, 1, 0, 1 };
    for (size_t i = 0; i < sizeof epochs / sizeof epochs[0]; i++) {
        ckpt_epoch_seen(&ts, epochs[i]);
        ts.batch_in_epoch++;
    }
    CHECK_INT(ts.epoch, ==, 1);
    CHECK_INT(ts.batch_in_epoch, ==, 4);    /* since the first batch of epoch 1 */
}

int main(void)
{
    epoch_position();
    const char *tmp = getenv("DFLASH_TEST_TMP");
    char root[512], dir[1024], path[1200], err[512] = "";
    snprintf(root, sizeof root, "%s/ckpt-%d", tmp ? tmp : "/tmp", (int)getpid());

    int lens[3] = { 14, 11, 9 }, prompt[3] = { 3, 0, 4 };
    struct fixture f;
    fixture_init(&f, 21, 3, lens, prompt);
    struct drafter *a = fixture_drafter(&f, 64);
    train(a, &f, 0, 4);
    struct ckpt_train_state ts = { .step = 4, .epoch = 0, .batch_in_epoch = 4, .seed = 42,
                                   .samples = 12, .tokens = 136 };
    if (ckpt_save(root, a, &ts, 0, dir, sizeof dir, err, sizeof err) < 0)
        TEST_FAIL("ckpt_save: %s", err);
    printf("saved %s\n", dir);

    /* A write that fails for want of memory says which file and why (it said nothing), and
     * leaves no checkpoint of that step. */
    struct drafter huge = *a;
    huge.n_params = SIZE_MAX / 2;   /* the bf16 staging buffer cannot be had */
    struct ckpt_train_state ts_huge = ts;
    ts_huge.step = 99;
    char hdir[1024];
    err[0] = 0;
    CHECK_INT(ckpt_save(root, &huge, &ts_huge, 0, hdir, sizeof hdir, err, sizeof err), ==, -ENOMEM);
    CHECK_CONTAINS(err, "/model.safetensors: ");
    CHECK_CONTAINS(err, strerror(ENOMEM));
    snprintf(path, sizeof path, "%s/step-0000000099", root);
    CHECK(access(path, F_OK) < 0 && errno == ENOENT);

    /* config.json as SGLang / vLLM read it */
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *j = cJSON_Parse(read_text(path));
    CHECK(j);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    CHECK(cJSON_GetArraySize(arch) == 1);
    CHECK_STR(cJSON_GetArrayItem(arch, 0)->valuestring, "DFlashDraftModel");
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(j, "model_type")->valuestring, "qwen3");
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(j, "torch_dtype")->valuestring, "bfloat16");
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(j, "hidden_act")->valuestring, "silu");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")));
    CHECK_INT(jint(j, "block_size"), ==, f.cfg.block_size);
    CHECK_INT(jint(j, "num_target_layers"), ==, f.cfg.num_target_layers);
    CHECK_INT(jint(j, "hidden_size"), ==, f.cfg.hidden_size);
    CHECK_INT(jint(j, "num_hidden_layers"), ==, f.cfg.num_layers);
    CHECK_INT(jint(j, "num_attention_heads"), ==, f.cfg.num_heads);
    CHECK_INT(jint(j, "num_key_value_heads"), ==, f.cfg.num_kv_heads);
    CHECK_INT(jint(j, "head_dim"), ==, f.cfg.head_dim);
    CHECK_INT(jint(j, "intermediate_size"), ==, f.cfg.intermediate_size);
    CHECK_INT(jint(j, "vocab_size"), ==, f.cfg.vocab_size);
    CHECK_INT(jint(j, "max_position_embeddings"), ==, f.cfg.max_position_embeddings);
    CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(j, "rms_norm_eps")->valuedouble, 1e-6, 0);
    CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(j, "rope_theta")->valuedouble, 10000.0, 0);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    CHECK_INT(cJSON_GetArraySize(lt), ==, f.cfg.num_layers);
    CHECK_STR(cJSON_GetArrayItem(lt, 0)->valuestring, "full_attention");
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
    CHECK_INT(jint(df, "mask_token_id"), ==, f.cfg.mask_token_id);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(df, "target_layer_ids");
    CHECK_INT(cJSON_GetArraySize(ids), ==, 3);
    for (int i = 0; i < 3; i++)
        CHECK_INT(cJSON_GetArrayItem(ids, i)->valuedouble, ==, f.cfg.target_layer_ids[i]);
    cJSON_Delete(j);

    /* numbers that are not exact ints are refused, never truncated (1.5 -> 1) or cast out of range */
    static const struct { const char *key; double v; const char *raw; } bad_num[] = {
        { "target_layer_ids", 1.5, NULL }, { "target_layer_ids", 3e9, NULL }, { "hidden_size", 1e30, NULL },
        { "block_size", 16.25, NULL }, { "rope_theta", 0, "1e999" }, { "rms_norm_eps", 0, "-1e400" },
    };
    char bdir[1100], bpath[1200];
    snprintf(bdir, sizeof bdir, "%s/badcfg", root);
    snprintf(bpath, sizeof bpath, "%s/config.json", bdir);
    CHECK(mkdir(bdir, 0755) == 0);
    for (size_t i = 0; i < sizeof bad_num / sizeof *bad_num; i++) {
        cJSON *k = cJSON_Parse(read_text(path));
        CHECK(k);
        if (!strcmp(bad_num[i].key, "target_layer_ids")) {
            cJSON *kids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(k, "dflash_config"),
                                                           "target_layer_ids");
            CHECK(cJSON_ReplaceItemInArray(kids, 0, cJSON_CreateNumber(bad_num[i].v)));
        } else {
            cJSON *nv = bad_num[i].raw ? cJSON_CreateRaw(bad_num[i].raw) : cJSON_CreateNumber(bad_num[i].v);
            CHECK(cJSON_ReplaceItemInObjectCaseSensitive(k, bad_num[i].key, nv));
        }
        struct drafter_config bc;
        int r = read_config_as(k, bpath, bdir, &bc, err, sizeof err);
        if (r != -DF_EFORMAT)
            TEST_FAIL("%s = %g: got %d (%s), want -DF_EFORMAT", bad_num[i].key, bad_num[i].v, r, err);
        CHECK_CONTAINS(err, bad_num[i].key);
        CHECK_CONTAINS(err, bpath);
    }
    /* a field inside an object is named with it, and a wrong type is not called missing */
    static const struct { const char *edit, *value, *want; int code; } nested[] = {
        { "dflash_config.block_size", "16.25", "dflash_config.block_size: not an integer", -DF_EFORMAT },
        { "dflash_config.mask_token_id", "\"x\"", "dflash_config.mask_token_id: not an integer", -DF_EFORMAT },
        { "dflash_config", "[1]", "dflash_config: not an object", -DF_EFORMAT },
        { "rope_parameters", "{}", "rope_parameters.rope_theta: missing", -DF_EMISSING },
        { "rope_parameters", "{\"rope_theta\":\"big\"}", "rope_parameters.rope_theta: not a finite number", -DF_EFORMAT },
        /* a scaled RoPE (another trainer's checkpoint) is refused, not trained at plain angles */
        { "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0}",
          "rope_scaling.rope_type: llama3 RoPE is not supported: the drafter trains with plain RoPE", -DF_EUNSUPPORTED },
        { "rope_scaling", "{\"type\":\"yarn\",\"factor\":4.0}", "rope_scaling.type: yarn RoPE is not supported",
          -DF_EUNSUPPORTED },
        { "rope_scaling", "[1]", "rope_scaling: expected an object or null", -DF_EFORMAT },
        { "rope_parameters", "{\"rope_theta\":10000,\"rope_type\":\"llama3\"}",
          "rope_parameters.rope_type: llama3 RoPE is not supported", -DF_EUNSUPPORTED },
        { "rope_scaling", "{\"rope_type\":\"default\"}", "", 0 },
        { "rope_parameters", "{\"rope_theta\":10000,\"rope_type\":\"default\"}", "", 0 },
    };
    for (size_t i = 0; i < sizeof nested / sizeof *nested; i++) {
        cJSON *k = cJSON_Parse(read_text(path));
        CHECK(k);
        char key[64];
        snprintf(key, sizeof key, "%s", nested[i].edit);
        char *dot = strchr(key, '.');
        cJSON *obj = k;
        if (dot) {
            *dot = 0;
            obj = cJSON_GetObjectItemCaseSensitive(k, key);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(obj, dot ? dot + 1 : key);
        CHECK(cJSON_AddItemToObject(obj, dot ? dot + 1 : key, cJSON_CreateRaw(nested[i].value)));
        if (!strcmp(key, "rope_parameters"))
            cJSON_DeleteItemFromObjectCaseSensitive(k, "rope_theta");
        struct drafter_config bc;
        err[0] = 0;
        int got = read_config_as(k, bpath, bdir, &bc, err, sizeof err);
        if (got != nested[i].code)
            TEST_FAIL("%s = %s: got %d (%s), want %d", nested[i].edit, nested[i].value, got, err, nested[i].code);
        if (nested[i].code) {
            CHECK_CONTAINS(err, bpath);
            CHECK_CONTAINS(err, nested[i].want);
        }
    }

    /* tensor names: exactly the DFlash set, bf16, with their shapes and values */
    struct st_set *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_open_file(&st, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    static const char *const per_layer[] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        "input_layernorm.weight", "post_attention_layernorm.weight",
    };
    size_t expected = 3 + 11 * (size_t)f.cfg.num_layers;
    CHECK_INT(st_count(st), ==, expected);
    CHECK(st_find(st, "fc.weight") && st_find(st, "hidden_norm.weight") && st_find(st, "norm.weight"));
    for (int l = 0; l < f.cfg.num_layers; l++)
        for (size_t k = 0; k < sizeof per_layer / sizeof *per_layer; k++) {
            char name[128];
            snprintf(name, sizeof name, "layers.%d.%s", l, per_layer[k]);
            if (!st_find(st, name))
                TEST_FAIL("model.safetensors lacks %s", name);
        }
    for (int i = 0; i < a->n_tensors; i++) {
        const struct drafter_tensor *t = &a->tensors[i];
        const struct st_tensor *x = st_find(st, t->name);
        CHECK(x && x->dtype == ST_BF16 && x->ndim == t->ndim && x->shape[0] == t->shape[0]);
        if (t->ndim == 2)
            CHECK_INT(x->shape[1], ==, t->shape[1]);
        uint16_t v;
        memcpy(&v, (const char *)x->data + 2 * (t->numel - 1), 2);
        CHECK_INT(v, ==, cpu_f32_to_bf16_one(a->params[t->offset + t->numel - 1]));
    }
    st_close(st);

    /* save, load into a differently initialised drafter, continue == straight through */
    struct fixture g;
    fixture_init(&g, 21, 3, lens, prompt);
    struct drafter *b = NULL;
    CHECK_OK(drafter_create(&b, &g.cfg, g.embed, g.lm_head, g.n_tokens + 8, 64, 999, err, sizeof err));
    struct ckpt_train_state ts2;
    int calls = 0;
    struct ckpt_load_opts lo = { .progress = count_call, .progress_arg = &calls };
    if (ckpt_load(dir, b, &ts2, &lo, err, sizeof err) < 0)
        TEST_FAIL("ckpt_load: %s", err);
    CHECK(!memcmp(&ts, &ts2, sizeof ts));
    /* between the reads: every tensor, each optimizer array verified (one chunk each here), read into place */
    CHECK_INT(calls, ==, b->n_tensors + 6);
    same_state(a, b);
    train(b, &g, 4, 8);
    struct drafter *c = fixture_drafter(&f, 64);
    train(c, &f, 0, 8);
    same_state(b, c);
    printf("save at 4, load, 4 more == 8 straight: bitwise\n");

    /* latest: the newest complete step-N; incomplete and temp dirs are ignored */
    ts2.step = 8;
    CHECK_OK(ckpt_save(root, b, &ts2, 0, NULL, 0, err, sizeof err));
    /* Same step again: replaced in one exchange. What a crash in a two-rename replacement leaves
     * behind (an .old- dir under this pid) neither blocks that nor is needed for it. */
    snprintf(path, sizeof path, "%s/.old-step-0000000008-%d", root, (int)getpid());
    CHECK_OK(mkdir(path, 0755));
    snprintf(path, sizeof path, "%s/.old-step-0000000008-%d/config.json", root, (int)getpid());
    FILE *stale = fopen(path, "w");
    CHECK(stale);
    fclose(stale);
    if (ckpt_save(root, b, &ts2, 0, NULL, 0, err, sizeof err) < 0)
        TEST_FAIL("second save of step 8: %s", err);
    struct drafter *e = NULL;
    CHECK_OK(drafter_create(&e, &g.cfg, g.embed, g.lm_head, g.n_tokens + 8, 64, 7, err, sizeof err));
    snprintf(path, sizeof path, "%s/step-0000000008", root);
    struct ckpt_train_state ts8;
    if (ckpt_load(path, e, &ts8, NULL, err, sizeof err) < 0)
        TEST_FAIL("load of the replaced step 8: %s", err);
    CHECK_INT(ts8.step, ==, 8);
    same_state(b, e);
    drafter_free(e);
    snprintf(path, sizeof path, "%s/step-0000000099", root);
    CHECK_OK(mkdir(path, 0755));
    snprintf(path, sizeof path, "%s/.tmp-step-0000000100-1", root);
    CHECK_OK(mkdir(path, 0755));
    char latest[1024];
    int64_t lstep = -1;
    CHECK_OK(ckpt_latest(root, latest, sizeof latest, &lstep));
    CHECK_INT(lstep, ==, 8);
    CHECK_CONTAINS(latest, "step-0000000008");
    snprintf(path, sizeof path, "%s/nothing-here", root);
    CHECK_INT(ckpt_latest(path, latest, sizeof latest, &lstep), ==, -ENOENT);

    /* bad inputs */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/bad", root);
    CHECK_OK(mkdir(bad, 0755));
    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));
    write_weights_variant(bad, a, "layers.1.mlp.up_proj.weight", NULL);
    expect_load_error(bad, b, "layers.1.mlp.up_proj.weight");
    write_weights_variant(bad, a, NULL, "layers.0.self_attn.k_norm.weight");
    CHECK_INT(ckpt_damaged(bad, expect_load_error(bad, b, "layers.0.self_attn.k_norm.weight")), ==, 1);

    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));
    snprintf(path, sizeof path, "%s/optimizer.bin", bad);
    FILE *fp = fopen(path, "r+b");
    CHECK(fp);
    fseek(fp, 4096, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 4096, SEEK_SET);
    fputc(ch ^ 0x10, fp);
    fclose(fp);
    expect_load_error(bad, b, "checksum");
    CHECK_INT(ckpt_damaged(bad, -DF_ECHECKSUM), ==, 1);
    /* A byte flipped in the header's parameter count, layout hash or version (behind a config.json
     * that matches): damage (the lineage falls back), not a config error that ends the run. Whole
     * files of another layout or version (checksums right) stay config errors. */
    const size_t at_version = 8, at_n_params = 16, at_layout = 24;
    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));
    set_opt_header(path, at_n_params, a->n_params ^ 0x100, 0);
    int r = expect_load_error(bad, b, "checksum mismatch (corrupt file: its header says version 1");
    CHECK_INT(ckpt_damaged(bad, r), ==, 1);
    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));
    uint64_t lay;
    int lfd = open(path, O_RDONLY);
    CHECK(lfd >= 0 && pread(lfd, &lay, 8, at_layout) == 8);
    close(lfd);
    set_opt_header(path, at_layout, lay ^ 1, 0);
    CHECK_INT(expect_load_error(bad, b, "checksum mismatch"), ==, -DF_ECHECKSUM);
    set_opt_header(path, at_layout, lay ^ 1, 1);
    CHECK_INT(expect_load_error(bad, b, "parameter layout"), ==, -DF_ELAYOUT);
    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));
    set_opt_header(path, at_version, (uint64_t)128 << 32 | 7, 0);    /* version 7, header_size kept */
    CHECK_INT(expect_load_error(bad, b, "checksum mismatch"), ==, -DF_ECHECKSUM);
    set_opt_header(path, at_version, (uint64_t)128 << 32 | 7, 1);
    CHECK_INT(expect_load_error(bad, b, "version 7, this build reads"), ==, -DF_EVERSION);
    CHECK_INT(ckpt_damaged(bad, -DF_EVERSION), ==, 0);
    CHECK_OK(ckpt_write_files(bad, a, &ts, err, sizeof err));

    /* weights only (no optimizer state): bf16 values, fresh optimizer */
    CHECK_OK(unlink(path));
    expect_load_error(bad, b, "optimizer.bin");
    size_t moments = 0;         /* b holds a trained optimizer state now: the load must clear it */
    for (size_t i = 0; i < b->n_params; i++)
        moments += b->opt->m[i] != 0 || b->opt->v[i] != 0;
    CHECK(moments > 0);
    struct ckpt_train_state ts3;
    CHECK_OK(ckpt_load(bad, b, &ts3, &(struct ckpt_load_opts){ .weights_only_ok = true }, err, sizeof err));
    CHECK_INT(b->opt->step, ==, 0);
    CHECK_INT(ts3.step, ==, 0);
    for (size_t i = 0; i < b->n_params; i++) {
        CHECK(b->params[i] == cpu_bf16_to_f32_one(cpu_f32_to_bf16_one(a->params[i])));
        CHECK(b->opt->m[i] == 0 && b->opt->v[i] == 0);
    }

    /* another target: a different capture or hidden size */
    struct drafter_config other = f.cfg;
    other.target_layer_ids[1] = 4;
    struct drafter *o = NULL;
    CHECK_OK(drafter_create(&o, &other, f.embed, f.lm_head, 64, 16, 1, err, sizeof err));
    expect_load_error(dir, o, "target_layer_ids");
    drafter_free(o);
    other = f.cfg;
    other.hidden_size = 32;
    other.vocab_size = 90;
    other.mask_token_id = 89;
    CHECK_OK(drafter_create(&o, &other, f.embed, f.lm_head, 64, 16, 1, err, sizeof err));
    expect_load_error(dir, o, "hidden_size 48 does not match this target's 32");
    drafter_free(o);
    other = f.cfg;
    other.rope_theta = f.cfg.rope_theta * 2;          /* another RoPE base: another model */
    CHECK_OK(drafter_create(&o, &other, f.embed, f.lm_head, 64, 16, 1, err, sizeof err));
    expect_load_error(dir, o, "rope_theta");
    drafter_free(o);
    other = f.cfg;
    other.rms_norm_eps = 1e-5;
    CHECK_OK(drafter_create(&o, &other, f.embed, f.lm_head, 64, 16, 1, err, sizeof err));
    expect_load_error(dir, o, "rms_norm_eps");
    drafter_free(o);

    /* config.json missing / not a DFlash drafter */
    snprintf(path, sizeof path, "%s/config.json", bad);
    FILE *cf = fopen(path, "w");
    CHECK(cf);
    fputs("{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 48}", cf);
    fclose(cf);
    CHECK_INT(ckpt_damaged(bad, expect_load_error(bad, b, "DFlashDraftModel")), ==, 1);
    CHECK_OK(unlink(path));
    expect_load_error(bad, b, "config.json");

    /* a new drafter from the target's config, a layer initialised from a target layer's tensors */
    struct hf_config hc = { .arch = HF_ARCH_QWEN3, .hidden_size = 48, .num_layers = 8, .num_heads = 4,
                            .num_kv_heads = 2, .head_dim = 16, .intermediate_size = 80, .vocab_size = 97,
                            .max_position_embeddings = 4096, .rms_eps = 1e-6, .rope = { .theta = 1e4 } };
    struct drafter_config nc;
    int tids[3] = { 1, 3, 5 };
    CHECK_OK(drafter_config_from_target(&nc, &hc, 2, tids, 3, 4, -1, 0, 0, 0, 0, err, sizeof err));
    CHECK_INT(nc.mask_token_id, ==, 96);
    CHECK_INT(nc.num_target_layers, ==, 8);
    CHECK_INT(nc.head_dim, ==, 16);
    CHECK_NEAR(nc.rope_theta, 1e4, 0);
    CHECK(!memcmp(&nc, &f.cfg, sizeof nc));      /* the fixture is exactly this drafter */
    CHECK_INT(drafter_config_from_target(&nc, &hc, 2, tids, 3, 4, -1, 3, 0, 0, 0, err, sizeof err), <, 0);
    CHECK_CONTAINS(err, "num_key_value_heads");

    struct st_out src[11];
    char names[11][96];
    int n_src = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const struct drafter_tensor *t = &a->tensors[i];
        if (strncmp(t->name, "layers.0.", 9))
            continue;
        snprintf(names[n_src], sizeof names[n_src], "model.layers.6.%s", t->name + 9);
        src[n_src] = (struct st_out){ .name = names[n_src], .dtype = ST_F32, .ndim = t->ndim,
                                      .shape = { t->shape[0], t->shape[1] }, .data = a->params + t->offset };
        n_src++;
    }
    CHECK_INT(n_src, ==, 11);
    snprintf(path, sizeof path, "%s/target-layers.safetensors", root);
    CHECK_OK(st_write_file(path, src, (size_t)n_src, NULL, 0, err, sizeof err));
    struct st_set *tl = NULL;
    CHECK_OK(st_open_file(&tl, path, err, sizeof err));
    CHECK_OK(drafter_init_layer_from(b, 1, tl, "model.layers.6.", err, sizeof err));
    for (int i = 0; i < a->n_tensors; i++) {
        const struct drafter_tensor *t = &a->tensors[i];
        if (strncmp(t->name, "layers.0.", 9))
            continue;
        char dst[96];
        snprintf(dst, sizeof dst, "layers.1.%s", t->name + 9);
        const struct drafter_tensor *u = drafter_find_tensor(b, dst);
        CHECK(u && !memcmp(b->params + u->offset, a->params + t->offset, t->numel * sizeof(float)));
    }
    CHECK_INT(drafter_init_layer_from(b, 1, tl, "model.layers.5.", err, sizeof err), <, 0);
    CHECK_CONTAINS(err, "model.layers.5.input_layernorm.weight");
    st_close(tl);

    drafter_free(a);
    drafter_free(b);
    drafter_free(c);
    fixture_done(&f);
    fixture_done(&g);

    snprintf(root, sizeof root, "%s/ckpt-big-%d", tmp ? tmp : "/tmp", (int)getpid());
    multi_chunk_load(root);
    snprintf(root, sizeof root, "%s/ckpt-claim-%d", tmp ? tmp : "/tmp", (int)getpid());
    claim_root(root);
    return 0;
}
