/* target_bench.c: throughput of the CUDA target: (a) forward only, (b) forward + capture DMA'd into
 * shm ring slots that a second process consumes (claim, H2D into its GPU buffer, release).
 * Batches come from a file of sequence lengths (one batch a line; tools/bench_target_hf.py bench
 * writes it with the model). Prints "RESULT key value" lines.
 * Usage: target_bench --model DIR --batches FILE [--ids 1,9,17,25,33] [--warmup 1] [--slots 6] [--mode ab] */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/ring.h"
#include "model/target.h"
#ifdef DFLASH_HAVE_TARGET_CUDA
#include <cuda_runtime_api.h>
#include "model/target_cuda.h"

#define MAX_BATCHES 256
#define MAX_SEQS 64

struct batch {
    int n_seqs, n_tokens;
    int32_t cu[MAX_SEQS + 1];
    uint32_t *tokens;
};

static struct batch batches[MAX_BATCHES];
static int n_batches;

static void die(const char *what, int r, const char *err)
{
    fprintf(stderr, "target_bench: %s: %s%s%s\n", what, err_str(r), err && *err ? ": " : "", err ? err : "");
    exit(1);
}

static void read_batches(const char *path, int vocab)
{
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(1); }
    char line[4096];
    uint64_t x = 88172645463325252ull;
    while (fgets(line, sizeof line, f) && n_batches < MAX_BATCHES) {
        struct batch *b = &batches[n_batches];
        char *p = line, *end;
        b->n_seqs = 0;
        b->cu[0] = 0;
        for (long v; (v = strtol(p, &end, 10)), end != p; p = end) {
            if (b->n_seqs == MAX_SEQS || v <= 0) { fprintf(stderr, "%s: bad batch line\n", path); exit(1); }
            b->cu[b->n_seqs + 1] = b->cu[b->n_seqs] + (int32_t)v;
            b->n_seqs++;
        }
        if (!b->n_seqs) continue;
        b->n_tokens = b->cu[b->n_seqs];
        b->tokens = malloc(4 * (size_t)b->n_tokens);
        for (int t = 0; t < b->n_tokens; t++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            b->tokens[t] = (uint32_t)(x % (uint64_t)vocab);
        }
        n_batches++;
    }
    fclose(f);
}

static double batch_flops(const struct hf_config *c, int n_layers, const struct batch *b)
{
    const double H = c->hidden_size, D = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads;
    const double FF = c->intermediate_size;
    double per_tok = 2 * (H * (NH + 2 * NKV) * D + NH * D * H + 3 * H * FF), att = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        double l = b->cu[s + 1] - b->cu[s];
        att += 4 * D * NH * l * (l + 1) / 2;
    }
    return n_layers * (per_tok * b->n_tokens + att);
}

/* The second process: takes READY slots, copies each slot's hidden states to its GPU, releases. */
static int consumer(const char *ring_name, int expect)
{
    char err[256] = "";
    struct ring *r = NULL;
    int rc = -1;
    for (int i = 0; i < 100 && rc < 0; i++) {
        rc = ring_attach(&r, ring_name, NULL, RING_ATTACH_ANY, err, sizeof err);
        if (rc == -EAGAIN) { struct timespec ts = { 0, 10000000 }; nanosleep(&ts, NULL); }
        else if (rc < 0) break;
    }
    if (rc < 0) { fprintf(stderr, "consumer: ring_attach: %s\n", err); return 1; }
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaHostRegister(ring_base(r), ring_map_size(r), cudaHostRegisterPortable) != cudaSuccess) {
        fprintf(stderr, "consumer: cudaHostRegister failed\n");
        return 1;
    }
    void *dev = NULL;
    cudaStream_t s;
    if (cudaMalloc(&dev, ring_hidden_bytes(r)) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) return 1;
    uint64_t bytes = 0;
    double busy = 0;
    for (int n = 0; n < expect; n++) {
        unsigned slot;
        int x = ring_claim_read(r, NULL, 600000, &slot);
        if (x < 0) { fprintf(stderr, "consumer: ring_claim_read: %s\n", err_str(x)); return 1; }
        size_t nb = (size_t)ring_slot_header(r, slot)->n_tokens * ring_hidden_pitch(r);
        uint64_t t0 = mono_ns();
        if (cudaMemcpyAsync(dev, ring_slot_hidden(r, slot), nb, cudaMemcpyHostToDevice, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess) { fprintf(stderr, "consumer: H2D failed\n"); return 1; }
        busy += (mono_ns() - t0) * 1e-9;
        bytes += nb;
        if ((x = ring_release(r, slot)) < 0) { fprintf(stderr, "consumer: ring_release: %s\n", err_str(x)); return 1; }
    }
    printf("RESULT consumer_h2d_gb_s %.1f\n", bytes / busy / 1e9);
    fflush(stdout);
    cudaHostUnregister(ring_base(r));
    ring_detach(r);
    return 0;
}

static struct ring *ring;
static int published;

static void on_copied(void *ctx, int status)
{
    unsigned slot = (unsigned)(uintptr_t)ctx;
    if (status < 0) die("batch failed on the GPU", status, NULL);
    int r = ring_publish(ring, slot);
    if (r < 0) die("ring_publish", r, NULL);
    published++;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *bfile = NULL, *ids_s = "1,9,17,25,33", *mode = "ab";
    int warmup = 1, slots = 6;
    static const struct option opts[] = {
        { "model", 1, 0, 'm' }, { "batches", 1, 0, 'b' }, { "ids", 1, 0, 'i' }, { "warmup", 1, 0, 'w' },
        { "slots", 1, 0, 's' }, { "mode", 1, 0, 'o' }, { 0, 0, 0, 0 } };
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'b': bfile = optarg; break;
        case 'i': ids_s = optarg; break;
        case 'w': warmup = atoi(optarg); break;
        case 's': slots = atoi(optarg); break;
        case 'o': mode = optarg; break;
        default: return 2;
        }
    }
    if (!model || !bfile) {
        fprintf(stderr, "usage: target_bench --model DIR --batches FILE [--ids 1,9,17,25,33] [--warmup N] "
                        "[--slots N] [--mode a|b|ab]\n");
        return 2;
    }
    int ids[64], n_ids = 0;
    for (const char *p = ids_s; *p && n_ids < 64;) {
        ids[n_ids++] = (int)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    struct hf_config cfg;
    char err[512] = "";
    int r = hf_config_load(model, &cfg, err, sizeof err);
    if (r < 0) die("config", r, err);
    read_batches(bfile, cfg.vocab_size);
    if (n_batches <= warmup) { fprintf(stderr, "need more than %d batches\n", warmup); return 1; }
    int max_tokens = 0;
    for (int i = 0; i < n_batches; i++)
        if (batches[i].n_tokens > max_tokens) max_tokens = batches[i].n_tokens;
    const bool do_a = strchr(mode, 'a'), do_b = strchr(mode, 'b');

    /* (b): the ring and its consumer come first: the consumer must fork before this process uses CUDA */
    char ring_name[64];
    pid_t child = -1;
    if (do_b) {
        snprintf(ring_name, sizeof ring_name, "/dflash-bench-%d", (int)getpid());
        struct ring_layout L = { 0 };
        L.nslots = (uint32_t)slots;
        L.hidden = (uint32_t)cfg.hidden_size;
        L.n_layers = (uint32_t)n_ids;
        for (int k = 0; k < n_ids; k++) L.layer_ids[k] = (uint32_t)ids[k];
        L.dtype = RING_DTYPE_BF16;
        L.max_tokens = (uint32_t)max_tokens;
        L.max_seqs = MAX_SEQS;
        struct ring_create_opts o = { .mode = 0600, .gid = -1, .flags = RING_CREATE_REPLACE };
        uint64_t t0 = mono_ns();
        if ((r = ring_create(&ring, ring_name, &L, &o, err, sizeof err)) < 0) die("ring_create", r, err);
        printf("ring %s: %d slots, %.2f GB, created in %.2f s\n", ring_name, slots, ring_map_size(ring) / 1e9,
               (mono_ns() - t0) * 1e-9);
        fflush(stdout);
        child = fork();
        if (child == 0) _exit(consumer(ring_name, n_batches));
        if (child < 0) die("fork", -errno, NULL);
    }

    uint64_t t0 = mono_ns();
    struct target *m = NULL;
    if ((r = target_open(&m, model, ids, n_ids, TARGET_BACKEND_CUDA, 0, max_tokens, err, sizeof err)) < 0) {
        if (child > 0) kill(child, SIGKILL);
        die("target_open", r, err);
    }
    int n_layers = 0;
    for (int k = 0; k < n_ids; k++)
        if (ids[k] + 1 > n_layers) n_layers = ids[k] + 1;
    printf("model %s: %d of %d layers loaded in %.1f s; %d batches (%d warm-up), max %d tokens\n", model, n_layers,
           cfg.num_layers, (mono_ns() - t0) * 1e-9, n_batches, warmup, max_tokens);
    struct target_pipe *p = NULL;
    if ((r = target_pipe_create(&p, m, err, sizeof err)) < 0) die("target_pipe_create", r, err);

    double tok = 0, flops = 0;
    for (int i = warmup; i < n_batches; i++) {
        tok += batches[i].n_tokens;
        flops += batch_flops(&cfg, n_layers, &batches[i]);
    }
    double a_tok_s = 0, b_tok_s = 0;
    /* untimed pass over every batch: GEMM plans for every token count are made before timing */
    for (int i = 0; i < n_batches; i++) {
        struct batch *b = &batches[i];
        if ((r = target_pipe_submit(p, b->tokens, b->cu, b->n_seqs, b->n_tokens, NULL, 0, NULL, NULL)) < 0)
            die("submit", r, NULL);
    }
    if ((r = target_pipe_drain(p)) < 0) die("drain", r, NULL);
    if (do_a) {
        for (int i = 0; i < warmup; i++) {
            struct batch *b = &batches[i];
            if ((r = target_pipe_submit(p, b->tokens, b->cu, b->n_seqs, b->n_tokens, NULL, 0, NULL, NULL)) < 0)
                die("submit", r, NULL);
        }
        if ((r = target_pipe_drain(p)) < 0) die("drain", r, NULL);
        struct target_pipe_stats s0, s1;
        target_pipe_get_stats(p, &s0);
        uint64_t t = mono_ns();
        for (int i = warmup; i < n_batches; i++) {
            struct batch *b = &batches[i];
            if ((r = target_pipe_submit(p, b->tokens, b->cu, b->n_seqs, b->n_tokens, NULL, 0, NULL, NULL)) < 0)
                die("submit", r, NULL);
            if ((r = target_pipe_poll(p)) < 0) die("poll", r, NULL);
        }
        if ((r = target_pipe_drain(p)) < 0) die("drain", r, NULL);
        double dt = (mono_ns() - t) * 1e-9;
        target_pipe_get_stats(p, &s1);
        a_tok_s = tok / dt;
        printf("RESULT a_forward_tok_s %.1f\n", a_tok_s);
        printf("RESULT a_tflops %.1f\n", flops / dt / 1e12);
        printf("RESULT a_mfu_989 %.3f\n", flops / dt / 989e12);
        printf("RESULT a_gpu_forward_ms_per_batch %.1f\n", (s1.forward_ms - s0.forward_ms) / (n_batches - warmup));
    }
    if (do_b) {
        uint64_t tr = mono_ns();
        if ((r = target_cuda_host_register(ring_base(ring), ring_map_size(ring), err, sizeof err)) < 0)
            die("register", r, err);
        printf("RESULT ring_register_s %.3f\n", (mono_ns() - tr) * 1e-9);
        struct target_pipe_stats s0 = { 0 }, s1;
        uint64_t t = 0;
        for (int i = 0; i < n_batches; i++) {
            if (i == warmup) {      /* warm-up batches fully consumed before the clock starts */
                while (published < warmup)
                    if ((r = target_pipe_drain(p)) < 0) die("drain", r, NULL);
                target_pipe_get_stats(p, &s0);
                t = mono_ns();
            }
            struct batch *b = &batches[i];
            unsigned slot;
            for (;;) {
                if ((r = target_pipe_poll(p)) < 0) die("poll", r, NULL);
                r = ring_claim_write(ring, 1, &slot);
                if (r == 0) break;
                if (r != -DF_ETIMEOUT) die("ring_claim_write", r, NULL);
            }
            struct ring_payload *h = ring_slot_header(ring, slot);
            h->batch_id = (uint64_t)i;
            h->n_seqs = (uint32_t)b->n_seqs;
            h->n_tokens = (uint32_t)b->n_tokens;
            memcpy(ring_slot_cu_seqlens(ring, slot), b->cu, 4 * (size_t)(b->n_seqs + 1));
            memcpy(ring_slot_tokens(ring, slot), b->tokens, 4 * (size_t)b->n_tokens);
            if ((r = target_pipe_submit(p, ring_slot_tokens(ring, slot), ring_slot_cu_seqlens(ring, slot), b->n_seqs,
                                        b->n_tokens, ring_slot_hidden(ring, slot), ring_hidden_pitch(ring), on_copied,
                                        (void *)(uintptr_t)slot)) < 0)
                die("submit", r, NULL);
            if ((r = target_pipe_poll(p)) < 0) die("poll", r, NULL);
        }
        if ((r = target_pipe_drain(p)) < 0) die("drain", r, NULL);
        double dt = (mono_ns() - t) * 1e-9;
        target_pipe_get_stats(p, &s1);
        b_tok_s = tok / dt;
        printf("RESULT b_ring_tok_s %.1f\n", b_tok_s);
        printf("RESULT b_tflops %.1f\n", flops / dt / 1e12);
        printf("RESULT b_mfu_989 %.3f\n", flops / dt / 989e12);
        printf("RESULT b_gpu_forward_ms_per_batch %.1f\n", (s1.forward_ms - s0.forward_ms) / (n_batches - warmup));
        printf("RESULT b_d2h_gb_s %.1f\n", (s1.copy_bytes - s0.copy_bytes) / ((s1.copy_ms - s0.copy_ms) * 1e-3) / 1e9);
        printf("RESULT b_d2h_gb_per_batch %.3f\n", (s1.copy_bytes - s0.copy_bytes) / 1e9 / (n_batches - warmup));
        int st = 0;
        if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "consumer failed (status %d)\n", st);
            return 1;
        }
        target_cuda_host_unregister(ring_base(ring));
    }
    if (do_a && do_b) printf("RESULT b_over_a %.3f\n", b_tok_s / a_tok_s);
    target_pipe_free(p);
    target_close(m);
    if (ring) {
        ring_detach(ring);
        ring_unlink(ring_name);
    }
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "target_bench: built without the CUDA target backend\n");
    return 77;
}
#endif
