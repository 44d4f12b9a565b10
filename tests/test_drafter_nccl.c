/* test_drafter_nccl.c: CUDA drafters in NCCL groups, each step all-reducing gradients and metric
 * sums in one call and read a step later, against one drafter taking plain steps on the whole
 * batch (bf16 tolerance):
 * - a group of one on GPU 0 with the whole batch (the group's calls on one GPU);
 * - a join that a peer never completes times out instead of hanging, its idle hook called;
 * - two processes on GPUs 0 and 1, each with half of the packed batch (its own sequences): the
 *   same steps as the whole batch, both ranks bit-identical.
 * Skips (77) without NCCL or a GPU; with one GPU, after the first two parts pass, since the
 * third needs two GPUs. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "tests/test_gpukern.h"
#if defined(DFLASH_HAVE_CUDA) && defined(DFLASH_HAVE_NCCL)
#include "common/timeutil.h"
#include "ipc/nccl_coll.h"
#include "model/drafter_cuda.h"
#include "tests/test_drafter_fixture.h"

#define STEPS 3
#define N_SEQS 4
static const double GAMMA = 5.0;
static const int LENS[N_SEQS] = { 300, 180, 260, 140 }, PROMPT[N_SEQS] = { 20, 0, 35, 12 };
static const int NUM_ANCHORS = 24, SPLIT_SEQ = 2;   /* rank 0: sequences 0-1, rank 1: 2-3 */

enum { WHO_R0, WHO_R1, WHO_SOLO, WHO_WHOLE, N_WHO };   /* two ranks; a group of one; plain steps */

/* What the processes report to the parent (MAP_SHARED, made before fork). */
struct report {
    double metrics[N_WHO][STEPS][DRAFTER_METRICS_N];
    double grad_norm[N_WHO][STEPS], lr[N_WHO][STEPS];
    int64_t step[N_WHO][STEPS];
    int done[N_WHO];
    int timeout_rc;
    double timeout_s;
    int idle_calls;             /* the idle hook while the lone rank waited */
    /* then, n_params floats each: step-0 gradients (summed, unscaled) and final parameters */
};

static struct report *rep;
static float *grads0[N_WHO], *params_end[N_WHO];
static struct fixture fx;
static struct drafter *host;    /* the common initial state */
static struct obj_block *blocks[STEPS][3];     /* whole, rank 0, rank 1 */
static int g_world;             /* the group rank_main joins: 1 (the whole batch) or 2 (halves) */
static int n_blocks[STEPS][3];
static struct obj_batch half[2];
static int32_t half_cu[2][N_SEQS + 1];

static const struct drafter_train_opts OPTS = { .lr = 2e-3, .min_lr_ratio = 0.1, .warmup_steps = 1,
                                                .total_steps = 20, .weight_decay = 0.01, .beta1 = 0.9,
                                                .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0 };

/* A drafter bigger than the fixture's: head_dim 32, GQA 4/2, two target layers, block 8. */
static void setup(void)
{
    fixture_init(&fx, 21, N_SEQS, LENS, PROMPT);
    struct drafter_config *c = &fx.cfg;
    c->hidden_size = 128;
    c->num_heads = 4;
    c->num_kv_heads = 2;
    c->head_dim = 32;
    c->intermediate_size = 256;
    c->vocab_size = 1003;
    c->mask_token_id = 1002;
    c->n_target_ids = 2;
    c->block_size = 8;
    int V = c->vocab_size, H = c->hidden_size, LcH = c->n_target_ids * H;
    struct obj_rng r;
    obj_rng_seed(&r, 8, 7, 6, 5);
    free(fx.embed);
    free(fx.lm_head);
    free(fx.hidden);
    fx.embed = malloc((size_t)V * H * sizeof(float));
    fx.lm_head = malloc((size_t)V * H * sizeof(float));
    fx.hidden = malloc((size_t)fx.n_tokens * LcH * sizeof(float));
    CHECK(fx.embed && fx.lm_head && fx.hidden);
    for (size_t i = 0; i < (size_t)V * H; i++) {
        fx.embed[i] = (float)obj_rng_normal(&r);
        fx.lm_head[i] = (float)(obj_rng_normal(&r) * 0.1);
    }
    for (size_t i = 0; i < (size_t)fx.n_tokens * LcH; i++)
        fx.hidden[i] = (float)obj_rng_normal(&r);
    for (int t = 0; t < fx.n_tokens; t++)
        fx.tokens[t] = (uint32_t)obj_rng_below(&r, (uint64_t)(V - 1));
    fx.batch.hidden_f32 = fx.hidden;

    int max_blocks = N_SEQS * NUM_ANCHORS;
    host = fixture_drafter(&fx, max_blocks);
    fixture_randomize_params(host, 3, 0.08);

    /* the two halves: their own packed batches */
    int split = fx.cu[SPLIT_SEQ];
    for (int h = 0; h < 2; h++) {
        int s0 = h ? SPLIT_SEQ : 0, s1 = h ? N_SEQS : SPLIT_SEQ, base = fx.cu[s0];
        for (int s = s0; s <= s1; s++)
            half_cu[h][s - s0] = fx.cu[s] - base;
        half[h] = (struct obj_batch){ fx.tokens + base, fx.loss_mask + base, half_cu[h], s1 - s0,
                                      fx.cu[s1] - base, NULL, fx.hidden + (size_t)base * LcH, 0 };
    }
    /* each step's anchors, drawn on the whole batch (as one drafter would) and split by sequence */
    int32_t *work = malloc((size_t)fx.n_tokens * sizeof *work);
    CHECK(work);
    for (int s = 0; s < STEPS; s++) {
        for (int w = 0; w < 3; w++) {
            blocks[s][w] = malloc((size_t)max_blocks * sizeof(struct obj_block));
            CHECK(blocks[s][w]);
        }
        struct obj_rng_key key = { .seed = 5, .epoch = 0, .batch_id = (uint64_t)s, .rank = 0 };
        int nb = obj_sample_anchors(&fx.batch, NUM_ANCHORS, &key, blocks[s][0], max_blocks, work);
        CHECK(nb > 0);
        n_blocks[s][0] = nb;
        n_blocks[s][1] = n_blocks[s][2] = 0;
        for (int i = 0; i < nb; i++) {
            struct obj_block b = blocks[s][0][i];
            if (b.seq < SPLIT_SEQ)
                blocks[s][1][n_blocks[s][1]++] = b;
            else
                blocks[s][2][n_blocks[s][2]++] = (struct obj_block){ b.anchor - split, b.seq - SPLIT_SEQ };
        }
        CHECK(n_blocks[s][1] > 0 && n_blocks[s][2] > 0);
    }
    free(work);
}

static struct drafter_cuda *make_cuda(int device)
{
    struct drafter_cuda *dc = NULL;
    struct drafter_cuda_opts o = { .device = device, .head_chunk_rows = 128 };
    char err[256] = "";
    if (drafter_cuda_create(&dc, host, fx.n_tokens + 8, N_SEQS * NUM_ANCHORS, &o, err, sizeof err) < 0)
        TEST_FAIL("drafter_cuda_create on device %d: %s", device, err);
    return dc;
}

static void record(int who, int s, const struct drafter_metrics *m, const struct drafter_step_info *i)
{
    memcpy(rep->metrics[who][s], m, sizeof *m);
    rep->grad_norm[who][s] = i->grad_norm;
    rep->lr[who][s] = i->lr;
    rep->step[who][s] = i->step;
}

/* Read the oldest step result, the wait bounded by the group's timeout. */
static void read_result(struct drafter_cuda *dc, struct nccl_coll *c, int who, int s)
{
    struct drafter_metrics m;
    struct drafter_step_info info;
    CHECK_OK(nccl_coll_wait(c, drafter_cuda_result_event(dc)));
    CHECK_OK(drafter_cuda_step_result(dc, 0, &m, &info));
    record(who, s, &m, &info);
}

/* One rank of a group of g_world: world 1 takes the whole batch and then, as the reference, the
 * plain steps on it; world 2 takes its half. */
static int rank_main(int rank, int id_fd)
{
    int world = g_world, who = world == 1 ? WHO_SOLO : rank, part = world == 1 ? 0 : 1 + rank;
    const struct obj_batch *batch = world == 1 ? &fx.batch : &half[rank];
    uint8_t id[NCCL_COLL_ID_BYTES];
    char err[512] = "";
    if (rank == 0) {
        if (nccl_coll_make_id(id, err, sizeof err) < 0)
            TEST_FAIL("%s", err);
        if (id_fd >= 0)
            CHECK(write(id_fd, id, sizeof id) == (ssize_t)sizeof id);
    } else {
        struct pollfd p = { .fd = id_fd, .events = POLLIN };
        CHECK(poll(&p, 1, 60000) == 1);
        CHECK(read(id_fd, id, sizeof id) == (ssize_t)sizeof id);
    }
    if (id_fd >= 0)
        close(id_fd);
    CUDA_CHECK(cudaSetDevice(rank));
    struct drafter_cuda *dc = make_cuda(rank);
    struct nccl_coll *c = NULL;
    double t0 = gk_now();
    if (nccl_coll_open(&c, id, rank, world, rank, 60000, NULL, NULL, err, sizeof err) < 0)
        TEST_FAIL("rank %d of %d: %s", rank, world, err);
    printf("rank %d of %d: joined the NCCL group in %.2f s\n", rank, world, gk_now() - t0);
    CHECK_INT(nccl_coll_rank(c), ==, rank);
    CHECK_INT(nccl_coll_world(c), ==, world);

    size_t n;
    float *g = drafter_cuda_grads(dc, &n);
    double *mv = drafter_cuda_metrics_dev(dc);
    void *stream = drafter_cuda_stream(dc);
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(drafter_cuda_forward_backward_async(dc, batch, blocks[s][part], n_blocks[s][part], GAMMA));
        CHECK_OK(nccl_coll_allreduce_sum(c, g, n, mv, DRAFTER_METRICS_N, stream));
        CHECK_OK(drafter_cuda_optimizer_step_async(dc, &OPTS));
        if (s == 0)     /* the optimizer leaves the summed gradients as they are */
            CHECK_OK(drafter_cuda_download_grads(dc, grads0[who]));
        if (s > 0)
            read_result(dc, c, who, s - 1);
    }
    read_result(dc, c, who, STEPS - 1);
    CHECK_OK(drafter_cuda_download_params(dc, params_end[who]));
    nccl_coll_close(c);
    drafter_cuda_free(dc);

    if (world == 1) {   /* the reference: plain steps on the whole batch */
        struct drafter_cuda *w = make_cuda(0);
        for (int s = 0; s < STEPS; s++) {
            struct drafter_metrics m;
            struct drafter_step_info info;
            CHECK_OK(drafter_cuda_forward_backward(w, &fx.batch, blocks[s][0], n_blocks[s][0], GAMMA, &m));
            if (s == 0)
                CHECK_OK(drafter_cuda_download_grads(w, grads0[WHO_WHOLE]));
            CHECK_OK(drafter_cuda_optimizer_step(w, m.weight_sum, &OPTS, &info));
            record(WHO_WHOLE, s, &m, &info);
        }
        CHECK_OK(drafter_cuda_download_params(w, params_end[WHO_WHOLE]));
        drafter_cuda_free(w);
        rep->done[WHO_WHOLE] = 1;
    }
    rep->done[who] = 1;
    return 0;
}

static int count_idle(void *n)
{
    ++*(int *)n;
    return 0;
}

/* Rank 0 of a world of 2 whose rank 1 never comes: the join must give up, calling its idle hook
 * (a daemon's heartbeat) all the while. */
static int timeout_main(void)
{
    uint8_t id[NCCL_COLL_ID_BYTES];
    char err[512] = "";
    if (nccl_coll_make_id(id, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    struct nccl_coll *c = NULL;
    double t0 = gk_now();
    rep->timeout_rc = nccl_coll_open(&c, id, 0, 2, 0, 3000, count_idle, &rep->idle_calls, err, sizeof err);
    rep->timeout_s = gk_now() - t0;
    printf("lone rank: nccl_coll_open -> %d after %.2f s: %s\n", rep->timeout_rc, rep->timeout_s, err);
    nccl_coll_close(c);
    return 0;
}

/* ---- the parent: no CUDA here (it would not survive fork) ---- */

static pid_t spawn(int (*fn)(int, int), int arg, int fd, int close_fd)
{
    fflush(NULL);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        if (close_fd >= 0)
            close(close_fd);
        int rc = fn(arg, fd);
        fflush(NULL);       /* _exit does not flush: the child's lines would be lost */
        _exit(rc);
    }
    return p;
}

static int probe_main(int a, int b)
{
    (void)a; (void)b;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        n = 0;
    return n > 100 ? 100 : n;
}

static int timeout_entry(int a, int b) { (void)a; (void)b; return timeout_main(); }

/* Wait for all of pids within limit_s; the first failure kills the rest. Returns the first
 * non-zero status code (77 kept), 0 if all passed. */
static int wait_all(pid_t *pids, int n, double limit_s, const char *what)
{
    int result = 0, left = n;
    uint64_t deadline = mono_ns() + (uint64_t)(limit_s * 1e9);
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p < 0)
            TEST_FAIL("waitpid: %s", strerror(errno));
        if (p == 0) {
            if (mono_ns() > deadline) {
                fprintf(stderr, "%s: still running after %.0f s: killed\n", what, limit_s);
                result = result ? result : 1;
                for (int i = 0; i < n; i++)
                    if (pids[i] > 0)
                        kill(pids[i], SIGKILL);
                deadline = UINT64_MAX;
            }
            struct timespec ts = { 0, 5000000 };
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < n; i++)
            if (pids[i] == p) {
                pids[i] = -1;
                left--;
                int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                if (code && !result) {
                    result = code;
                    fprintf(stderr, "%s: process %d ended with %d: stopping the others\n", what, i, code);
                    for (int j = 0; j < n; j++)
                        if (pids[j] > 0)
                            kill(pids[j], SIGKILL);
                }
            }
    }
    return result;
}

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) TEST_FAIL("non-finite value at %zu", i);
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/* The steps of `who` (a group's rank) against the plain steps on the whole batch. */
static void check_against_whole(int who, const char *what)
{
    size_t n = host->n_params;
    for (int s = 0; s < STEPS; s++) {
        const double *a = rep->metrics[who][s], *w = rep->metrics[WHO_WHOLE][s];
        printf("%s, step %d: loss %.6f whole %.6f | weight %.4f / %.4f | grad norm %.6g / %.6g | lr %.3g / %.3g\n",
               what, s, a[0] / a[1], w[0] / w[1], a[1], w[1], rep->grad_norm[who][s],
               rep->grad_norm[WHO_WHOLE][s], rep->lr[who][s], rep->lr[WHO_WHOLE][s]);
        CHECK_NEAR(a[0], w[0], 2e-3 * fabs(w[0]));                    /* loss_sum (bf16) */
        CHECK_NEAR(a[1], w[1], 1e-9 * w[1]);                          /* weight_sum */
        for (int k = 3; k < DRAFTER_METRICS_N; k++)
            if (k != 4)
                CHECK_NEAR(a[k], w[k], 0);      /* supervised, accept_blocks, blocks, tokens */
        CHECK(fabs(a[2] - w[2]) <= fmax(2.0, 0.05 * w[3]));          /* correct: bf16 near-ties */
        CHECK_NEAR(rep->grad_norm[who][s], rep->grad_norm[WHO_WHOLE][s], 2e-3 * rep->grad_norm[WHO_WHOLE][s]);
        CHECK_NEAR(rep->lr[who][s], rep->lr[WHO_WHOLE][s], 1e-12);
        CHECK_INT(rep->step[who][s], ==, s + 1);
        CHECK_INT(rep->step[WHO_WHOLE][s], ==, s + 1);
    }

    /* gradients of step 0, per tensor */
    double worst = 2;
    const char *worst_name = "-";
    for (int i = 0; i < host->n_tensors; i++) {
        const struct drafter_tensor *t = &host->tensors[i];
        double c = cosine(grads0[who] + t->offset, grads0[WHO_WHOLE] + t->offset, t->numel);
        if (c < worst) {
            worst = c;
            worst_name = t->name;
        }
    }
    printf("%s, step 0 gradients: cosine all %.7f, worst tensor %.7f (%s)\n", what,
           cosine(grads0[who], grads0[WHO_WHOLE], n), worst, worst_name);
    CHECK(worst >= 0.999);

    /* the update after the steps */
    float *du = calloc(n, sizeof *du), *dw = calloc(n, sizeof *dw);
    CHECK(du && dw);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        du[i] = params_end[who][i] - host->params[i];
        dw[i] = params_end[WHO_WHOLE][i] - host->params[i];
        num += ((double)du[i] - dw[i]) * ((double)du[i] - dw[i]);
        den += (double)dw[i] * dw[i];
    }
    double cu = cosine(du, dw, n), rel = sqrt(num / den);
    printf("%s, after %d steps: update cosine %.7f, |group - whole| / |whole update| %.3g, params cosine %.9f\n",
           what, STEPS, cu, rel, cosine(params_end[who], params_end[WHO_WHOLE], n));
    CHECK(den > 0);
    CHECK(cu >= 0.999);
    CHECK(rel <= 0.05);
    free(du);
    free(dw);
}

int main(void)
{
    pid_t probe = spawn(probe_main, 0, -1, -1);
    int st;
    CHECK(waitpid(probe, &st, 0) == probe);
    int n_gpu = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (n_gpu < 1)
        SKIP("no CUDA device");

    setup();
    size_t n = host->n_params;
    size_t bytes = sizeof(struct report) + 2 * N_WHO * n * sizeof(float);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED);
    rep = mem;
    float *f = (float *)((char *)mem + sizeof(struct report));
    for (int w = 0; w < N_WHO; w++) {
        grads0[w] = f + (size_t)(2 * w) * n;
        params_end[w] = f + (size_t)(2 * w + 1) * n;
    }
    printf("drafter %zu parameters; batch %d tokens in %d sequences, halves of %d and %d tokens; blocks per step "
           "%d = %d + %d ...\n", n, fx.n_tokens, N_SEQS, half[0].n_tokens, half[1].n_tokens, n_blocks[0][0],
           n_blocks[0][1], n_blocks[0][2]);

    /* a group of one on GPU 0 (then the plain steps, in the same process) */
    g_world = 1;
    pid_t solo = spawn(rank_main, 0, -1, -1);
    int r = wait_all(&solo, 1, 240.0 * test_time_scale(), "group of one");
    if (r == 77)
        SKIP("the group of one skipped");
    CHECK_INT(r, ==, 0);
    CHECK(rep->done[WHO_SOLO] && rep->done[WHO_WHOLE]);
    check_against_whole(WHO_SOLO, "group of one");

    /* a join that never completes gives up within its timeout */
    pid_t tp = spawn(timeout_entry, 0, -1, -1);
    CHECK_INT(wait_all(&tp, 1, 60.0 * test_time_scale(), "lone rank"), ==, 0);
    printf("lone rank: join returned %d after %.2f s (timeout 3 s)\n", rep->timeout_rc, rep->timeout_s);
    CHECK_INT(rep->timeout_rc, ==, -DF_ETIMEOUT);
    CHECK(rep->timeout_s >= 2.5 && rep->timeout_s < 30.0);
    printf("lone rank: idle hook called %d times while waiting\n", rep->idle_calls);
    CHECK_INT(rep->idle_calls, >=, 20);

    if (n_gpu < 2)
        SKIP("the group of one and the lone rank passed; two ranks on two GPUs need a second CUDA device");

    /* two ranks, one per GPU, each on its half */
    g_world = 2;
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pids[2];
    pids[0] = spawn(rank_main, 0, fds[1], fds[0]);
    pids[1] = spawn(rank_main, 1, fds[0], fds[1]);
    close(fds[0]);
    close(fds[1]);
    r = wait_all(pids, 2, 240.0 * test_time_scale(), "ranks");
    if (r == 77)
        SKIP("a rank skipped");
    CHECK_INT(r, ==, 0);
    CHECK(rep->done[WHO_R0] && rep->done[WHO_R1]);
    for (int s = 0; s < STEPS; s++)     /* the ranks agree exactly */
        CHECK(!memcmp(rep->metrics[WHO_R0][s], rep->metrics[WHO_R1][s], DRAFTER_METRICS_N * sizeof(double)));
    CHECK(!memcmp(grads0[WHO_R0], grads0[WHO_R1], n * sizeof(float)));
    CHECK(!memcmp(params_end[WHO_R0], params_end[WHO_R1], n * sizeof(float)));
    check_against_whole(WHO_R0, "two ranks");

    munmap(mem, bytes);
    drafter_free(host);
    fixture_done(&fx);
    for (int s = 0; s < STEPS; s++)
        for (int w = 0; w < 3; w++)
            free(blocks[s][w]);
    printf("PASS\n");
    return 0;
}
#else
int main(void) { SKIP("built without CUDA and NCCL"); }
#endif
