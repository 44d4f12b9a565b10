/* test_target_cuda.c: the CUDA target forward on the tiny golden models (Qwen3; Llama with GQA,
 * Llama-3 rope, biases, fp32 shards; Llama with the hub config form) against the CPU backend and the
 * transformers golden hidden states, per captured layer; then the capture pipeline into registered
 * host memory (double buffering, several packings, callback order); buffers larger than the GPU refused
 * as a configuration error. Exit 77 without a GPU.
 * The CUDA backend holds weights in bf16. For an fp32 checkpoint (the Llama) the CPU reference runs
 * on a copy whose weights are rounded to bf16 (the model the GPU really holds): the forward must be
 * within 1e-2 of it; against the fp32 golden data the rounding of the weights adds its own error
 * (measured here as CPU-on-rounded-weights vs golden), so there the bound is 1e-2 plus that. */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include "tests/test.h"
#ifdef DFLASH_HAVE_TARGET_CUDA
#include <cuda_runtime_api.h>
#include "common/err.h"
#include "gpukern/gk.h"
#include "model/safetensors.h"
#include "model/target.h"
#include "model/target_cuda.h"

#define NSEQ 3
static struct st_set *golden;
static char errbuf[512];

struct batch {
    int n_seqs, n_tokens;
    int seq[NSEQ];              /* golden sequence index of each packed sequence */
    int32_t cu[NSEQ + 1];
    uint32_t tokens[1024];
};

/* "<model>.tokens.<a>" (b < 0) or "<model>.hs.<a>.<b>" */
static const struct st_tensor *gfind(const char *model, int a, int b)
{
    char name[128];
    if (b < 0)
        snprintf(name, sizeof name, "%s.tokens.%d", model, a);
    else
        snprintf(name, sizeof name, "%s.hs.%d.%d", model, a, b);
    const struct st_tensor *t = st_find(golden, name);
    if (!t) TEST_FAIL("golden tensor %s missing", name);
    return t;
}

static void make_batch(struct batch *b, const char *model, const int *order, int n)
{
    memset(b, 0, sizeof *b);
    b->n_seqs = n;
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = gfind(model, order[i], -1);
        b->seq[i] = order[i];
        for (int64_t j = 0; j < t->numel; j++) {
            int32_t v;
            memcpy(&v, (const char *)t->data + 4 * j, 4);
            b->tokens[b->cu[i] + j] = (uint32_t)v;
        }
        b->cu[i + 1] = b->cu[i] + (int32_t)t->numel;
    }
    b->n_tokens = b->cu[n];
}

/* Relative error of one sequence's rows of captured layer k in a [T, pitch] buffer vs ref [len, H]. */
static double seq_err_ref(const void *out, bool bf16, size_t pitch, int row0, int len, int k, int H,
                          const float *ref)
{
    double num = 0, den = 0;
    for (int t = 0; t < len; t++) {
        const char *row = (const char *)out + (size_t)(row0 + t) * pitch;
        for (int c = 0; c < H; c++) {
            double o;
            if (bf16) {
                uint16_t h;
                memcpy(&h, row + ((size_t)k * H + c) * 2, 2);
                o = gk_bf16_to_f32(h);
            } else {
                float f;
                memcpy(&f, row + ((size_t)k * H + c) * 4, 4);
                o = f;
            }
            if (!isfinite(o)) TEST_FAIL("non-finite output at token %d col %d of capture %d", row0 + t, c, k);
            double r = ref[(size_t)t * H + c];
            num += (o - r) * (o - r);
            den += r * r;
        }
    }
    return sqrt(num / den);
}

/* Every captured layer of every packed sequence vs golden output_hidden_states[id + 1]. */
static double check_golden(const char *model, const struct batch *b, const int *ids, int n_ids, int H,
                           const void *out, bool bf16, size_t pitch, double tol, const char *what)
{
    double worst = 0;
    float *ref = malloc(sizeof(float) * 1024 * H);
    for (int i = 0; i < b->n_seqs; i++)
        for (int k = 0; k < n_ids; k++) {
            const struct st_tensor *t = gfind(model, b->seq[i], ids[k] + 1);
            CHECK_INT(t->numel, ==, (int64_t)(b->cu[i + 1] - b->cu[i]) * H);
            CHECK_OK(st_read_f32(t, 0, t->numel, ref));
            double e = seq_err_ref(out, bf16, pitch, b->cu[i], b->cu[i + 1] - b->cu[i], k, H, ref);
            if (e > worst) worst = e;
            if (e > tol) TEST_FAIL("%s %s: seq %d layer %d: rel err %.3e > %.0e", model, what, b->seq[i], ids[k], e, tol);
        }
    free(ref);
    printf("%-10s %-28s worst rel err vs transformers %.3e\n", model, what, worst);
    return worst;
}

/* CUDA vs CPU backend output, per captured layer, both [T, n_ids*H] f32 with the given pitches. */
static void check_cpu(const char *model, const float *gpu, size_t gpitch, const float *cpu, int T, int n_ids, int H)
{
    double worst = 0;
    for (int k = 0; k < n_ids; k++) {
        double num = 0, den = 0;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < H; c++) {
                double o = *(const float *)((const char *)gpu + (size_t)t * gpitch + ((size_t)k * H + c) * 4);
                double r = cpu[(size_t)t * n_ids * H + (size_t)k * H + c];
                num += (o - r) * (o - r);
                den += r * r;
            }
        double e = sqrt(num / den);
        if (e > worst) worst = e;
        if (e > 1e-2) TEST_FAIL("%s: capture %d: CUDA vs CPU rel err %.3e", model, k, e);
    }
    printf("%-10s %-28s worst rel err vs CPU backend  %.3e\n", model, "forward f32", worst);
}

static void *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) TEST_FAIL("open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(*len ? *len : 1);
    CHECK(b && fread(b, 1, *len, f) == *len);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, len, f) == len);
    fclose(f);
}

/* dst/ = config.json from cfg_dir + the safetensors files and index of w_dir with every F32 value
 * rounded to the nearest bf16 (stored as F32, so the CPU backend reads exactly what the GPU holds). */
static void quantized_copy(const char *w_dir, const char *cfg_dir, const char *dst)
{
    static const char *files[] = { "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                   "model-00003-of-00003.safetensors", "model.safetensors.index.json" };
    char a[4096], b[4096];
    size_t len;
    CHECK(mkdir(dst, 0700) == 0);
    snprintf(a, sizeof a, "%.3000s/config.json", cfg_dir);
    snprintf(b, sizeof b, "%.3000s/config.json", dst);
    void *buf = read_all(a, &len);
    write_all(b, buf, len);
    free(buf);
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%.3000s/%s", w_dir, files[i]);
        snprintf(b, sizeof b, "%.3000s/%s", dst, files[i]);
        unsigned char *d = read_all(a, &len);
        if (i < 3) {
            uint64_t n;
            memcpy(&n, d, 8);
            CHECK(n + 8 <= len);
            cJSON *hdr = cJSON_ParseWithLength((const char *)d + 8, n);
            CHECK(hdr);
            int rounded = 0;
            for (cJSON *t = hdr->child; t; t = t->next) {
                cJSON *dt = cJSON_GetObjectItem(t, "dtype"), *off = cJSON_GetObjectItem(t, "data_offsets");
                if (!dt || !off || strcmp(dt->valuestring, "F32")) continue;
                size_t lo = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, hi = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
                CHECK(8 + n + hi <= len);
                for (size_t p = 8 + n + lo; p < 8 + n + hi; p += 4) {
                    float f;
                    memcpy(&f, d + p, 4);
                    f = gk_bf16_to_f32(gk_f32_to_bf16(f));
                    memcpy(d + p, &f, 4);
                }
                rounded++;
            }
            CHECK(rounded > 0);
            cJSON_Delete(hdr);
        }
        write_all(b, d, len);
        free(d);
    }
}

static void remove_copy(const char *dst)
{
    static const char *files[] = { "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                   "model-00003-of-00003.safetensors", "model.safetensors.index.json", "config.json" };
    char p[4096];
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%.3000s/%s", dst, files[i]);
        unlink(p);
    }
    rmdir(dst);
}

struct done_log {
    int order[16], n, status;
};

static void on_done(void *ctx, int status)
{
    struct done_log *l = ctx;
    l->order[l->n] = l->n;
    l->n++;
    if (status) l->status = status;
}

static void on_done_idx(void *ctx, int status);
static struct done_log plog;
static int pexpect;
static void on_done_idx(void *ctx, int status)
{
    int idx = (int)(intptr_t)ctx;
    if (idx != pexpect) TEST_FAIL("pipeline completion order: got batch %d, expected %d", idx, pexpect);
    pexpect++;
    plog.n++;
    if (status) plog.status = status;
}

/* cpu_dir: the checkpoint the CPU reference loads (dir itself, or its bf16-rounded copy). */
static void run_model(const char *name, const char *dir, const char *cpu_dir)
{
    const char *gname = strncmp(name, "llama", 5) ? "qwen3" : "llama";
    const int ids[] = { 2, 0, 3, 1 };      /* out of order; id 3 = last layer, taken after the final norm */
    const int n_ids = 4;
    struct target *g = NULL, *c = NULL;
    int r = target_open(&g, dir, ids, n_ids, TARGET_BACKEND_CUDA, 0, 256, errbuf, sizeof errbuf);
    if (r < 0) TEST_FAIL("target_open CUDA %s: %s", dir, errbuf);
    r = target_open(&c, cpu_dir, ids, n_ids, TARGET_BACKEND_CPU, 0, 256, errbuf, sizeof errbuf);
    if (r < 0) TEST_FAIL("target_open CPU %s: %s", cpu_dir, errbuf);
    const int H = target_config(g)->hidden_size;

    struct batch b;
    const int order[NSEQ] = { 0, 1, 2 };
    make_batch(&b, gname, order, NSEQ);
    const size_t pitch32 = (size_t)n_ids * H * 4 + 64, pitch16 = (size_t)n_ids * H * 2 + 32;
    float *out32 = malloc(pitch32 * b.n_tokens);
    void *out16 = malloc(pitch16 * b.n_tokens);
    float *cpu = malloc(sizeof(float) * n_ids * H * b.n_tokens);
    memset(out32, 0xff, pitch32 * b.n_tokens);
    memset(out16, 0xff, pitch16 * b.n_tokens);
    CHECK_OK(target_forward(g, b.tokens, b.cu, b.n_seqs, b.n_tokens, out32, OUT_F32, pitch32));
    CHECK_OK(target_forward(g, b.tokens, b.cu, b.n_seqs, b.n_tokens, out16, OUT_BF16, pitch16));
    CHECK_OK(target_forward(c, b.tokens, b.cu, b.n_seqs, b.n_tokens, cpu, OUT_F32, (size_t)n_ids * H * 4));
    check_cpu(name, out32, pitch32, cpu, b.n_tokens, n_ids, H);
    /* the part of the golden error that the bf16 weights alone cause (0 for a bf16 checkpoint) */
    double e_w = check_golden(gname, &b, ids, n_ids, H, cpu, false, (size_t)n_ids * H * 4, 1.0,
                              strcmp(dir, cpu_dir) ? "CPU on bf16-rounded weights" : "CPU backend");
    const double tol = 1e-2 + e_w;
    check_golden(gname, &b, ids, n_ids, H, out32, false, pitch32, tol, "forward f32 (packed)");
    check_golden(gname, &b, ids, n_ids, H, out16, true, pitch16, tol, "forward bf16 (packed)");

    /* device-memory output */
    void *dout = NULL;
    CHECK(cudaMalloc(&dout, pitch16 * b.n_tokens) == cudaSuccess);
    CHECK_OK(target_forward(g, b.tokens, b.cu, b.n_seqs, b.n_tokens, dout, OUT_BF16, pitch16));
    void *back = malloc(pitch16 * b.n_tokens);
    CHECK(cudaMemcpy(back, dout, pitch16 * b.n_tokens, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < b.n_tokens; t++)
        CHECK(!memcmp((char *)back + t * pitch16, (char *)out16 + t * pitch16, (size_t)n_ids * H * 2));
    cudaFree(dout);
    free(back);

    /* argument checks done by target.c reach the CUDA backend unchanged */
    uint32_t badtok[2] = { 1, (uint32_t)target_config(g)->vocab_size };
    int32_t cu2[2] = { 0, 2 };
    CHECK_INT(target_forward(g, badtok, cu2, 1, 2, out16, OUT_BF16, pitch16), ==, -DF_ERANGE);

    /* pipeline: 5 batches, alternating capture sets, into registered memory */
    struct target_pipe *p = NULL;
    r = target_pipe_create(&p, g, errbuf, sizeof errbuf);
    if (r < 0) TEST_FAIL("target_pipe_create: %s", errbuf);
    struct target_pipe *p2 = NULL;
    CHECK_INT(target_pipe_create(&p2, g, errbuf, sizeof errbuf), ==, -DF_ESTATE);
    const int orders[5][NSEQ] = { { 0, 1, 2 }, { 2, 1, 0 }, { 1, 0, 0 }, { 2, 0, 1 }, { 1, 2, 0 } };
    const int counts[5] = { 3, 3, 1, 2, 3 };
    struct batch pb[5];
    const size_t pitch = (size_t)n_ids * H * 2;
    const size_t region = 4096 * ((pitch * 256 + 4095) / 4096);
    char *host = aligned_alloc(4096, region * 5);
    CHECK(host);
    memset(host, 0xff, region * 5);
    r = target_cuda_host_register(host, region * 5, errbuf, sizeof errbuf);
    if (r < 0) TEST_FAIL("%s", errbuf);
    /* a registration that fails (here: registered already) leaves no error behind for the
     * pipeline's first kernel (target-d goes on with pageable copies when pinning fails) */
    CHECK_INT(target_cuda_host_register(host, region * 5, errbuf, sizeof errbuf), ==, -DF_ECUDA);
    memset(&plog, 0, sizeof plog);
    pexpect = 0;
    for (int i = 0; i < 5; i++) {
        make_batch(&pb[i], gname, orders[i], counts[i]);
        CHECK_OK(target_pipe_submit(p, pb[i].tokens, pb[i].cu, pb[i].n_seqs, pb[i].n_tokens, host + i * region, pitch,
                                    on_done_idx, (void *)(intptr_t)i));
        CHECK_OK(target_pipe_poll(p));
    }
    int32_t badcu[2] = { 1, 3 };
    CHECK_INT(target_pipe_submit(p, b.tokens, badcu, 1, 3, host, pitch, on_done_idx, NULL), ==, -DF_EFORMAT);
    CHECK_OK(target_pipe_drain(p));
    CHECK_INT(plog.n, ==, 5);
    CHECK_INT(plog.status, ==, 0);
    CHECK_INT(target_pipe_pending(p), ==, 0);
    CHECK(target_pipe_last_forward_ms(p) > 0);
    for (int i = 0; i < 5; i++) {
        char what[64];
        snprintf(what, sizeof what, "pipeline batch %d", i);
        check_golden(gname, &pb[i], ids, n_ids, H, host + i * region, true, pitch, tol, what);
    }
    /* forward-only submissions and the synchronous forward share set 0 with the pipeline */
    CHECK_OK(target_pipe_submit(p, pb[0].tokens, pb[0].cu, pb[0].n_seqs, pb[0].n_tokens, NULL, 0, NULL, NULL));
    CHECK_OK(target_pipe_submit(p, pb[1].tokens, pb[1].cu, pb[1].n_seqs, pb[1].n_tokens, host, pitch, on_done, &plog));
    memset(out16, 0xff, pitch16 * b.n_tokens);
    CHECK_OK(target_forward(g, b.tokens, b.cu, b.n_seqs, b.n_tokens, out16, OUT_BF16, pitch16));
    CHECK_OK(target_pipe_drain(p));
    check_golden(gname, &b, ids, n_ids, H, out16, true, pitch16, tol, "forward during pipeline");
    check_golden(gname, &pb[1], ids, n_ids, H, host, true, pitch, tol, "pipeline after forward-only");
    struct target_pipe_stats st;
    target_pipe_get_stats(p, &st);
    CHECK_INT(st.batches, ==, 7);
    CHECK_INT(st.copy_bytes, ==, (uint64_t)pitch * (pb[0].n_tokens + pb[1].n_tokens * 2 + pb[2].n_tokens +
                                                    pb[3].n_tokens + pb[4].n_tokens));
    target_pipe_free(p);
    CHECK_OK(target_cuda_host_unregister(host));
    free(host);

    target_close(g);
    target_close(c);
    free(out32); free(out16); free(cpu);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) SKIP("no CUDA device");
    char path[4096];
    const char *src = test_srcdir();
    snprintf(path, sizeof path, "%s/tests/data/golden/golden.safetensors", src);
    if (st_open_file(&golden, path, errbuf, sizeof errbuf) < 0) TEST_FAIL("%s", errbuf);

    /* buffers for more tokens than the GPU holds (64 captured layers of 2^24 tokens, two capture sets:
     * 256 GiB): -DF_ERANGE naming the key to lower (target-d exits 78 on it, as a restart would only
     * repeat it), before anything large is allocated */
    {
        int ids64[TARGET_MAX_CAPTURE];
        for (int i = 0; i < TARGET_MAX_CAPTURE; i++)
            ids64[i] = i % 4;
        const size_t caps = 2 * (size_t)TARGET_MAX_CAPTURE * ((size_t)1 << 24) * 64 * 2;  /* hidden 64 */
        size_t free_b = 0, total_b = 0;
        CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
        if (total_b >= caps) {
            printf("too big: not tried, this GPU holds %zu GiB\n", total_b >> 30);
        } else {
            struct target *big = NULL;
            snprintf(path, sizeof path, "%s/tests/data/golden/qwen3", src);
            CHECK_INT(target_open(&big, path, ids64, TARGET_MAX_CAPTURE, TARGET_BACKEND_CUDA, 0, 1 << 24, errbuf,
                                  sizeof errbuf), ==, -DF_ERANGE);
            CHECK(!big);
            CHECK_CONTAINS(errbuf, "lower ring.max_tokens");
            printf("too big: %s\n", errbuf);
        }
    }

    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char qdir[1024], wdir[4096];
    snprintf(path, sizeof path, "%s/tests/data/golden/qwen3", src);
    run_model("qwen3", path, path);            /* bf16 checkpoint */
    snprintf(path, sizeof path, "%s/tests/data/golden/llama", src);
    snprintf(qdir, sizeof qdir, "%.900s/llama-bf16-%d", tmp, (int)getpid());
    quantized_copy(path, path, qdir);
    run_model("llama", path, qdir);            /* fp32 checkpoint */
    remove_copy(qdir);

    /* hub-form config.json with the same weights: a private dir of links */
    char hub[1024], a[4096], l[2048], root[4096];
    CHECK(realpath(src, root));
    snprintf(hub, sizeof hub, "%.900s/llama-hub-%d", tmp, (int)getpid());
    CHECK(mkdir(hub, 0700) == 0);
    const char *files[] = { "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors", "model.safetensors.index.json" };
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%.3000s/tests/data/golden/llama/%s", root, files[i]);
        snprintf(l, sizeof l, "%s/%s", hub, files[i]);
        CHECK(symlink(a, l) == 0);
    }
    snprintf(a, sizeof a, "%.3000s/tests/data/golden/llama-hub/config.json", root);
    snprintf(l, sizeof l, "%s/config.json", hub);
    FILE *fi = fopen(a, "rb"), *fo = fopen(l, "wb");
    CHECK(fi && fo);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fi)) > 0) CHECK(fwrite(buf, 1, n, fo) == n);
    fclose(fi);
    fclose(fo);
    snprintf(wdir, sizeof wdir, "%.3000s/tests/data/golden/llama", root);
    snprintf(a, sizeof a, "%.3000s/tests/data/golden/llama-hub", root);
    quantized_copy(wdir, a, qdir);
    run_model("llama-hub", hub, qdir);
    remove_copy(qdir);
    for (int i = 0; i < 4; i++) { snprintf(l, sizeof l, "%s/%s", hub, files[i]); unlink(l); }
    snprintf(l, sizeof l, "%s/config.json", hub);
    unlink(l);
    rmdir(hub);

    st_close(golden);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    printf("ok\n");
    return 0;
}
#else
int main(void) { SKIP("built without the CUDA target backend"); }
#endif
