/* drafter_bench.c: training-step throughput of the CUDA drafter at a realistic shape (default: a
 * 5-layer drafter of Qwen3-8B shape, 512 anchors of block 16 on one 3072-token sequence): step
 * time, tokens/s, model TFLOP/s and MFU; tools/bench_drafter_torch.py is the same-run reference.
 * Prints "RESULT key value" lines.
 * Usage: drafter_bench [-d device] [-l layers] [-s seq_len] [-n n_seqs] [-a anchors] [-w warmup] [-i iters]
 *                      [-A auto|simple]   (attention kernels: tensor cores where possible, or CUDA cores)
 *                      [-c rows]          (LM head + CE rows per chunk; default the drafter's)
 *                      [-p steps]         (after the timed steps: this many more, each phase timed with
 *                                          events, and a table of GPU ms per phase) */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "model/drafter.h"
#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "model/drafter_cuda.h"

#define PEAK_TFLOPS 989.4   /* H100/H200 SXM dense bf16 datasheet figure */

enum { H = 4096, NH = 32, NKV = 8, HD = 128, FFN = 12288, VOCAB = 151936, BS = 16, NCTX = 5 };

static void die(const char *what, int r, const char *err)
{
    fprintf(stderr, "drafter_bench: %s: %s%s%s\n", what, err_str(r), err && *err ? ": " : "", err ? err : "");
    exit(1);
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "drafter_bench: %s: %s\n", #call, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
/* Roughly N(0, std): the sum of four uniforms, rounded to bf16. */
static uint16_t rand_bf16(float std)
{
    uint64_t x = next_u64();
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += (float)((x >> (16 * i)) & 0xffff) / 65536.0f - 0.5f;
    float f = s * std * 1.732f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Model FLOPs of one step (2 per multiply-add; backward = 2x forward for every product that needs
 * input and weight gradients, 1x where only one of them exists): the FLOPs the model needs, not
 * what a kernel recomputes. */
struct flops { double fc, proj, attn, mlp, head; };

static struct flops step_flops(const struct drafter_config *c, int T, const struct obj_block *blk, int nb,
                               const struct obj_batch *b, double gamma)
{
    const double Hd = c->hidden_size, qd = (double)c->num_heads * c->head_dim, kvd = (double)c->num_kv_heads * c->head_dim;
    const double I = c->intermediate_size, V = c->vocab_size, L = c->num_layers, bs = c->block_size;
    const double Q = (double)nb * bs, LcH = (double)c->n_target_ids * Hd;
    double keys = 0, rows = 0;
    int32_t label[64];
    float w[64];
    for (int i = 0; i < nb; i++) {
        keys += (double)(blk[i].anchor - b->cu_seqlens[blk[i].seq]) + bs;
        obj_block_targets(b, &blk[i], (int)bs, gamma, label, w);
        for (int k = 0; k < (int)bs; k++)
            rows += w[k] > 0;
    }
    struct flops f;
    f.fc = 2 * (2 * T * LcH * Hd);                                       /* no feature gradient */
    f.proj = L * 3 * (2 * T * Hd * 2 * kvd + 2 * Q * Hd * (qd + 2 * kvd) + 2 * Q * qd * Hd);
    f.attn = L * 3 * (4 * bs * c->num_heads * c->head_dim * keys);      /* QK^T and PV, per block */
    f.mlp = L * 3 * (2 * Q * Hd * 3 * I);
    f.head = 2 * (2 * rows * Hd * V);                                   /* frozen head: no weight gradient */
    return f;
}

static double total(const struct flops *f) { return f->fc + f->proj + f->attn + f->mlp + f->head; }

int main(int argc, char **argv)
{
    int device = 0, layers = 5, seq = 3072, n_seqs = 1, anchors = 512, warmup = 3, iters = 10, attn = 0, prof = 0;
    int chunk = 0, opt;
    while ((opt = getopt(argc, argv, "d:l:s:n:a:w:i:A:p:c:")) != -1) {
        switch (opt) {
        case 'd': device = atoi(optarg); break;
        case 'l': layers = atoi(optarg); break;
        case 's': seq = atoi(optarg); break;
        case 'n': n_seqs = atoi(optarg); break;
        case 'a': anchors = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 'A': attn = !strcmp(optarg, "simple"); break;
        case 'p': prof = atoi(optarg); break;
        case 'c': chunk = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-d device] [-l layers] [-s seq_len] [-n n_seqs] [-a anchors] [-w warmup] "
                    "[-i iters] [-A auto|simple] [-c head_chunk_rows] [-p profiled_steps]\n", argv[0]);
            return 2;
        }
    }
    if (layers < 1 || seq < 32 || n_seqs < 1 || anchors < 1 || iters < 1 || warmup < 0 || prof < 0 || chunk < 0) {
        fprintf(stderr, "drafter_bench: bad sizes\n");
        return 2;
    }
    const int T = seq * n_seqs, LcH = NCTX * H;
    const double gamma = 7.0;
    struct drafter_config c = {
        .hidden_size = H, .num_layers = layers, .num_heads = NH, .num_kv_heads = NKV, .head_dim = HD,
        .intermediate_size = FFN, .vocab_size = VOCAB, .num_target_layers = 36, .n_target_ids = NCTX,
        .target_layer_ids = { 1, 9, 17, 25, 33 }, .block_size = BS, .mask_token_id = VOCAB - 1,
        .max_position_embeddings = 40960, .rms_norm_eps = 1e-6, .rope_theta = 1e6, .initializer_range = 0.02,
    };
    double t0 = mono_ns() / 1e9;
    CK(cudaSetDevice(device));

    /* the batch: n_seqs sequences, a prompt of 1/8 each (no loss there), features in pinned memory */
    uint32_t *tok = malloc(sizeof *tok * (size_t)T);
    uint8_t *mask = malloc((size_t)T);
    int32_t *cu = malloc(sizeof *cu * (size_t)(n_seqs + 1));
    int32_t *work = malloc(sizeof *work * (size_t)T);
    int max_blocks = drafter_max_blocks_for(T, n_seqs, anchors);
    struct obj_block *blk = malloc(sizeof *blk * (size_t)max_blocks);
    uint16_t *hidden;
    if (!tok || !mask || !cu || !work || !blk)
        die("malloc", -ENOMEM, NULL);
    CK(cudaMallocHost((void **)&hidden, (size_t)T * LcH * 2));
    for (int i = 0; i < T; i++) {
        tok[i] = (uint32_t)(next_u64() % (VOCAB - 1));
        mask[i] = i % seq >= seq / 8;
    }
    for (int s = 0; s <= n_seqs; s++)
        cu[s] = s * seq;
    for (size_t i = 0; i < (size_t)T * LcH; i++)
        hidden[i] = rand_bf16(1.0f);
    struct obj_batch b = { .tokens = tok, .loss_mask = mask, .cu_seqlens = cu, .n_seqs = n_seqs, .n_tokens = T,
                           .hidden_bf16 = hidden };

    /* the frozen embedding / LM head (tied here: one [V, H] bf16 array), random, on the device */
    void *head_dev;
    const size_t VH = (size_t)VOCAB * H, tile = (size_t)1 << 24;
    CK(cudaMalloc(&head_dev, VH * 2));
    uint16_t *tmp = malloc(tile * 2);
    if (!tmp)
        die("malloc", -ENOMEM, NULL);
    for (size_t i = 0; i < tile; i++)
        tmp[i] = rand_bf16(0.02f);
    for (size_t off = 0; off < VH; off += tile)
        CK(cudaMemcpy((uint16_t *)head_dev + off, tmp, (VH - off < tile ? VH - off : tile) * 2, cudaMemcpyHostToDevice));
    free(tmp);

    /* the host drafter gives the layout and the initial parameters; its own embedding arrays are
     * never read (the CUDA drafter uses head_dev), so they stay untouched zero pages */
    float *host_embed = calloc(VH, sizeof(float));
    if (!host_embed)
        die("calloc", -ENOMEM, NULL);
    struct drafter *d = NULL;
    char err[512] = "";
    int r = drafter_create(&d, &c, host_embed, host_embed, 2, 1, 1, err, sizeof err);
    if (r < 0)
        die("drafter_create", r, err);
    double t1 = mono_ns() / 1e9;
    struct drafter_cuda *dc = NULL;
    struct drafter_cuda_opts o = { .device = device, .head_chunk_rows = chunk, .embed_bf16 = head_dev,
                                   .lm_head_bf16 = head_dev,
                                   .attn_impl = attn, .profile = prof > 0 };
    r = drafter_cuda_create(&dc, d, T, max_blocks, &o, err, sizeof err);
    if (r < 0)
        die("drafter_cuda_create", r, err);
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    double t2 = mono_ns() / 1e9;
    printf("drafter: %d layers, %zu parameters (%.2f B); batch %d x %d tokens, %d anchors/seq, block %d; "
           "attention %s\n", layers, d->n_params, d->n_params / 1e9, n_seqs, seq, anchors, BS,
           attn ? "CUDA cores" : "tensor cores");
    printf("setup: host drafter %.1f s, CUDA drafter %.1f s; GPU memory in use %.1f GiB of %.1f\n", t1 - t0,
           t2 - t1, (total_b - free_b) / 1073741824.0, total_b / 1073741824.0);

    struct drafter_train_opts to = { .lr = 1e-4, .min_lr_ratio = 0.1, .warmup_steps = 10, .total_steps = 1000,
                                     .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                     .grad_clip = 1.0 };
    /* the training loop as drafter-d runs it: fresh anchors every step, nothing waits on the
     * device but the reading of the previous step's metrics */
    struct flops fsum = { 0 };
    double loss_first = 0, loss_last = 0;
    int n_read = 0;
    double tstart = 0;
    for (int it = 0; it < warmup + iters; it++) {
        if (it == warmup) {
            while ((r = drafter_cuda_step_result(dc, 1, NULL, NULL)) != -ENOENT)
                if (r < 0 && r != -DF_ENAN)
                    die("step result", r, NULL);
            CK(cudaDeviceSynchronize());
            tstart = mono_ns() / 1e9;
        }
        struct obj_rng_key key = { .seed = 7, .epoch = 0, .batch_id = (uint64_t)it, .rank = 0 };
        int nb = obj_sample_anchors(&b, anchors, &key, blk, max_blocks, work);
        if (nb < 0)
            die("obj_sample_anchors", nb, NULL);
        if (it >= warmup) {
            struct flops f = step_flops(&c, T, blk, nb, &b, gamma);
            fsum.fc += f.fc; fsum.proj += f.proj; fsum.attn += f.attn; fsum.mlp += f.mlp; fsum.head += f.head;
        }
        if ((r = drafter_cuda_forward_backward_async(dc, &b, blk, nb, gamma)) < 0)
            die("forward_backward", r, NULL);
        if ((r = drafter_cuda_optimizer_step_async(dc, &to)) < 0)
            die("optimizer step", r, NULL);
        if (it > 0) {   /* the previous step's results */
            struct drafter_metrics m;
            struct drafter_step_info info;
            r = drafter_cuda_step_result(dc, 1, &m, &info);
            if (r < 0 && r != -ENOENT)
                die("step result", r, NULL);
            if (r == 0) {
                if (!n_read++)
                    loss_first = drafter_metrics_loss(&m);
                loss_last = drafter_metrics_loss(&m);
            }
        }
    }
    while ((r = drafter_cuda_step_result(dc, 1, NULL, NULL)) != -ENOENT)
        if (r < 0)
            die("step result", r, NULL);
    CK(cudaDeviceSynchronize());
    double step_s = (mono_ns() / 1e9 - tstart) / iters;

    /* forward alone (metrics read back each time) for the split */
    double tf0 = mono_ns() / 1e9;
    const int fwd_iters = 3;
    struct drafter_metrics mf;
    for (int it = 0; it < fwd_iters; it++) {
        struct obj_rng_key key = { .seed = 7, .epoch = 1, .batch_id = (uint64_t)it, .rank = 0 };
        int nb = obj_sample_anchors(&b, anchors, &key, blk, max_blocks, work);
        if ((r = drafter_cuda_forward(dc, &b, blk, nb, gamma, &mf, NULL)) < 0)
            die("forward", r, NULL);
    }
    double fwd_s = (mono_ns() / 1e9 - tf0) / fwd_iters;

    if (prof > 0) {     /* the phases of more steps, each waited for */
        double ms[DCP_N] = { 0 }, sum = 0;
        if ((r = drafter_cuda_profile_take(dc, ms)) < 0)    /* drops the timed steps' marks */
            die("profile", r, NULL);
        memset(ms, 0, sizeof ms);
        double tp0 = mono_ns() / 1e9;
        for (int it = 0; it < prof; it++) {
            struct obj_rng_key key = { .seed = 7, .epoch = 2, .batch_id = (uint64_t)it, .rank = 0 };
            int nb = obj_sample_anchors(&b, anchors, &key, blk, max_blocks, work);
            if (nb < 0 || (r = drafter_cuda_forward_backward_async(dc, &b, blk, nb, gamma)) < 0 ||
                (r = drafter_cuda_optimizer_step_async(dc, &to)) < 0 ||
                ((r = drafter_cuda_step_result(dc, 1, NULL, NULL)) < 0 && r != -DF_ENAN) ||
                (r = drafter_cuda_profile_take(dc, ms)) < 0)
                die("profiled step", nb < 0 ? nb : r, NULL);
        }
        double wall = (mono_ns() / 1e9 - tp0) / prof * 1e3;
        printf("phases (GPU ms per step, %d steps, each waited for: %.1f ms wall per step):\n", prof, wall);
        for (int p = 0; p < DCP_N; p++)
            sum += ms[p];
        for (int p = 0; p < DCP_N; p++)
            printf("PHASE %-16s %8.2f ms %5.1f%%\n", drafter_cuda_phase_name(p), ms[p] / prof, 100 * ms[p] / sum);
        printf("PHASE %-16s %8.2f ms\n", "sum", sum / prof);
    }

    double ft = total(&fsum) / iters;
    double tflops = ft / step_s / 1e12;
    printf("loss %.4f -> %.4f over the timed steps (random data)\n", loss_first, loss_last);
    printf("model FLOPs per step %.2f T: fc %.1f%%, q/k/v/o %.1f%%, attention %.1f%%, MLP %.1f%%, LM head %.1f%%\n",
           ft / 1e12, 100 * fsum.fc / total(&fsum), 100 * fsum.proj / total(&fsum), 100 * fsum.attn / total(&fsum),
           100 * fsum.mlp / total(&fsum), 100 * fsum.head / total(&fsum));
    printf("RESULT cuda_step_ms %.2f\n", step_s * 1e3);
    printf("RESULT cuda_forward_ms %.2f\n", fwd_s * 1e3);
    printf("RESULT cuda_tokens_per_s %.0f\n", T / step_s);
    printf("RESULT cuda_block_tokens_per_s %.0f\n", (double)n_seqs * anchors * BS / step_s);
    printf("RESULT cuda_tflops %.1f\n", tflops);
    printf("RESULT cuda_mfu %.3f\n", tflops / PEAK_TFLOPS);
    drafter_cuda_free(dc);
    drafter_free(d);
    cudaFree(head_dev);
    cudaFreeHost(hidden);
    free(host_embed);
    free(tok);
    free(mask);
    free(cu);
    free(work);
    free(blk);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "drafter_bench: built without CUDA\n");
    return 77;
}
#endif
