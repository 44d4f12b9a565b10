/* ckpt_bench.c: how long a checkpoint pauses training. Reference, same run: the synchronous write
 * (ckpt_save: bf16 conversion, three files, fsyncs, rename), which is what a periodic checkpoint
 * cost before it moved to the background writer; measured: ckpt_writer_start (the snapshot copy
 * of the fp32 state), and the background write's own duration.
 * usage: ckpt_bench [-H hidden] [-L layers] [-F ffn] [-r repeats] [-d dir] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "model/checkpoint.h"
#include "model/ckpt_writer.h"
#include "model/drafter.h"

enum { VOCAB = 1024 };

static double ms_since(uint64_t t0) { return (double)(mono_ns() - t0) / 1e6; }

int main(int argc, char **argv)
{
    int H = 2048, L = 2, F = 6144, reps = 3, opt;
    const char *dir = "/tmp";
    while ((opt = getopt(argc, argv, "H:L:F:r:d:")) != -1) {
        switch (opt) {
        case 'H': H = atoi(optarg); break;
        case 'L': L = atoi(optarg); break;
        case 'F': F = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'd': dir = optarg; break;
        default:
            fprintf(stderr, "usage: %s [-H hidden] [-L layers] [-F ffn] [-r repeats] [-d dir]\n", argv[0]);
            return 2;
        }
    }
    if (H < 128 || H % 128 || L < 1 || F < 1 || reps < 1) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    struct drafter_config c = {
        .hidden_size = H, .num_layers = L, .num_heads = H / 128, .num_kv_heads = H / 512 ? H / 512 : 1,
        .head_dim = 128, .intermediate_size = F, .vocab_size = VOCAB, .num_target_layers = 36,
        .n_target_ids = 5, .target_layer_ids = { 1, 9, 17, 25, 33 }, .block_size = 16,
        .mask_token_id = VOCAB - 1, .max_position_embeddings = 32768, .rms_norm_eps = 1e-6,
        .rope_theta = 1e6, .initializer_range = 0.02,
    };
    float *embed = calloc((size_t)VOCAB * H, sizeof(float));
    struct drafter *d = NULL;
    char err[512], root[1024], out[1024];
    if (!embed || drafter_create(&d, &c, embed, embed, 2, 1, 1, err, sizeof err) < 0) {
        fprintf(stderr, "drafter: %s\n", embed ? err : "out of memory");
        return 1;
    }
    snprintf(root, sizeof root, "%s/ckpt-bench-%d", dir, (int)getpid());
    struct ckpt_writer *w = NULL;
    if (ckpt_writer_create(&w, 1) < 0)
        return 1;
    printf("drafter: hidden %d, %d layers, ffn %d: %zu params (%.2f GB written per checkpoint)\n", H, L, F,
           d->n_params, (double)d->n_params * 14 / 1e9);
    uint64_t t_res = mono_ns();
    if (ckpt_writer_reserve(w, d->n_params) < 0)
        return 1;
    printf("snapshot buffer reserved at start-up in %.1f ms (once)\n", ms_since(t_res));
    printf("%-4s %14s %14s %14s\n", "rep", "sync_ms", "pause_ms", "bg_write_ms");
    double sync_sum = 0, pause_sum = 0;
    for (int i = 0; i < reps; i++) {
        struct ckpt_train_state ts = { .step = 2 * i + 1 };
        uint64_t t0 = mono_ns();
        if (ckpt_save(root, d, &ts, 0, out, sizeof out, err, sizeof err) < 0) {
            fprintf(stderr, "ckpt_save: %s\n", err);
            return 1;
        }
        double sync = ms_since(t0);
        ts.step++;
        t0 = mono_ns();
        int r = ckpt_writer_start(w, root, d, 1, &ts, 0, "bench");
        double pause = ms_since(t0);
        struct ckpt_result res;
        if (r < 0 || ckpt_writer_collect(w, 1, &res) != 1 || res.rc < 0) {
            fprintf(stderr, "writer: %s\n", r < 0 ? err_str(r) : res.err);
            return 1;
        }
        printf("%-4d %14.1f %14.1f %14.1f\n", i, sync, pause, res.write_ms);
        sync_sum += sync;
        pause_sum += pause;
    }
    printf("pause: %.1f ms vs %.1f ms synchronous: %.1fx shorter\n", pause_sum / reps, sync_sum / reps,
           sync_sum / pause_sum);
    ckpt_writer_free(w);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        return 1;
    drafter_free(d);
    free(embed);
    return 0;
}
