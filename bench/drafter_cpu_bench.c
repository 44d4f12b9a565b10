/* drafter_cpu_bench.c: training-step time of the CPU drafter (forward + backward + AdamW) on a
 * small synthetic config, with the same-run reference: sgemm GFLOP/s on the MLP's GEMM shape.
 * usage: drafter_cpu_bench [-t threads] [-i iters] [-n tokens] [-s seq_len] [-a anchors_per_seq] */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "model/cpu_ops.h"
#include "model/drafter.h"

enum { HID = 256, LAYERS = 2, HEADS = 4, KV = 2, HD = 64, FFN = 768, VOCAB = 8192, CTX = 5, BS = 16 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    cpu_blas_pick_kernels(argv);     /* as the daemons run it */
    if (cpu_blas_note())
        fprintf(stderr, "%s\n", cpu_blas_note());
    int threads = 1, iters = 5, T = 2048, seq = 512, na = 32, opt;
    while ((opt = getopt(argc, argv, "t:i:n:s:a:")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 'n': T = atoi(optarg); break;
        case 's': seq = atoi(optarg); break;
        case 'a': na = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-t threads] [-i iters] [-n tokens] [-s seq_len] [-a anchors]\n", argv[0]);
            return 2;
        }
    }
    if (T < seq || seq < 2 || iters < 1) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    int n_seqs = T / seq;
    T = n_seqs * seq;

    struct drafter_config c = {
        .hidden_size = HID, .num_layers = LAYERS, .num_heads = HEADS, .num_kv_heads = KV,
        .head_dim = HD, .intermediate_size = FFN, .vocab_size = VOCAB, .num_target_layers = 36,
        .n_target_ids = CTX, .target_layer_ids = { 1, 9, 17, 25, 33 }, .block_size = BS,
        .mask_token_id = VOCAB - 1, .max_position_embeddings = 32768, .rms_norm_eps = 1e-6,
        .rope_theta = 1e6, .initializer_range = 0.02,
    };
    struct obj_rng r;
    obj_rng_seed(&r, 1, 2, 3, 4);
    float *embed = malloc(sizeof(float) * VOCAB * HID), *head = malloc(sizeof(float) * VOCAB * HID);
    float *hidden = malloc(sizeof(float) * (size_t)T * CTX * HID);
    uint32_t *tok = malloc(sizeof *tok * T);
    uint8_t *mask = malloc((size_t)T);
    int32_t *cu = malloc(sizeof *cu * (n_seqs + 1));
    for (size_t i = 0; i < (size_t)VOCAB * HID; i++) {
        embed[i] = (float)obj_rng_normal(&r);
        head[i] = (float)(obj_rng_normal(&r) * 0.05);
    }
    for (size_t i = 0; i < (size_t)T * CTX * HID; i++)
        hidden[i] = (float)obj_rng_normal(&r);
    for (int i = 0; i < T; i++) {
        tok[i] = (uint32_t)obj_rng_below(&r, VOCAB - 1);
        mask[i] = i % seq >= seq / 8;       /* a prompt of 1/8 of each sequence */
    }
    for (int s = 0; s <= n_seqs; s++)
        cu[s] = s * seq;
    struct obj_batch b = { .tokens = tok, .loss_mask = mask, .cu_seqlens = cu, .n_seqs = n_seqs,
                           .n_tokens = T, .hidden_f32 = hidden };

    struct drafter *d = NULL;
    char err[256];
    int max_blocks = drafter_max_blocks_for(T, n_seqs, na);
    if (drafter_create(&d, &c, embed, head, T, max_blocks, 1, err, sizeof err) < 0) {
        fprintf(stderr, "drafter_create: %s\n", err);
        return 1;
    }
    struct drafter_train_opts o = { .lr = 1e-4, .min_lr_ratio = 0.1, .warmup_steps = 10,
                                    .total_steps = 1000, .weight_decay = 0.01, .beta1 = 0.9,
                                    .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0 };
    double best = 1e30, sum = 0;
    struct drafter_metrics m;
    for (int it = 0; it <= iters; it++) {
        struct obj_rng_key key = { 7, 0, (uint64_t)it, 0 };
        struct drafter_step_info info;
        double t0 = now();
        int rc = drafter_train_step(d, &b, na, 7.0, &key, &o, &m, &info);
        double dt = now() - t0;
        if (rc < 0) {
            fprintf(stderr, "train step: %d\n", rc);
            return 1;
        }
        if (it == 0)
            continue;       /* warm-up: first touches of the arena */
        best = dt < best ? dt : best;
        sum += dt;
    }
    /* GEMM FLOPs: the backward of a layer is twice its forward; the frozen LM head's backward
     * only computes d(hidden), once its forward */
    double Q = m.blocks * BS, R = m.supervised, qd = HEADS * HD, kvd = KV * HD;
    /* keys per query: the context before its anchor (anchors uniform over [seq/8, seq): mean
     * 9/16 seq) plus its block */
    double ctx = Q * (seq * 9.0 / 16.0 + BS);
    double fwd = 2.0 * T * CTX * HID * HID
               + LAYERS * (2.0 * Q * HID * qd * 2 + 2.0 * (T + Q) * HID * kvd * 2 + 2.0 * Q * HID * FFN * 3
                           + 2.0 * ctx * HD * HEADS * 2)
               + 2.0 * R * HID * VOCAB;
    double headf = 2.0 * R * HID * VOCAB, total = 3 * (fwd - headf) + 2 * headf;
    /* reference: sgemm on the gate/up shape [Q, HID] x [HID, FFN] */
    int M = (int)Q;
    float *A = calloc((size_t)M * HID, 4), *B = calloc((size_t)FFN * HID, 4), *C = calloc((size_t)M * FFN, 4);
    double rbest = 1e30;
    for (int it = 0; it < 20; it++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, FFN, HID, 1.0f, A, HID, B, HID, 0.0f, C, FFN);
        double dt = now() - t0;
        rbest = dt < rbest ? dt : rbest;
    }
    double ref_gflops = 2.0 * M * FFN * HID / rbest * 1e-9;
    printf("config: hidden %d, %d layers, %d/%d heads x %d, ffn %d, vocab %d, %d captured layers, block %d\n",
           HID, LAYERS, HEADS, KV, HD, FFN, VOCAB, CTX, BS);
    printf("batch: %d tokens (%d x %d), %d anchors/seq -> %.0f blocks, %.0f supervised slots; threads %d\n",
           T, n_seqs, seq, na, m.blocks, m.supervised, threads);
    printf("step: best %.1f ms, mean %.1f ms over %d; %.0f tokens/s, %.0f block slots/s\n", best * 1e3,
           sum / iters * 1e3, iters, T / best, Q / best);
    printf("%.1f GFLOP/step (forward %.1f, of which LM head %.1f) -> %.1f GFLOP/s; "
           "reference sgemm [%d,%d]x[%d,%d]: %.1f GFLOP/s (step at %.0f%% of it)\n",
           total * 1e-9, fwd * 1e-9, headf * 1e-9, total / best * 1e-9, M, HID, HID, FFN, ref_gflops,
           100.0 * (total / best * 1e-9) / ref_gflops);
    printf("loss %.4f\n", drafter_metrics_loss(&m));
    free(A);
    free(B);
    free(C);
    drafter_free(d);
    free(embed);
    free(head);
    free(hidden);
    free(tok);
    free(mask);
    free(cu);
    return 0;
}
