/* target_cpu_bench.c: tokens/s of the CPU target forward on a small synthetic Qwen3 checkpoint
 * (or a given model dir), with the same-run reference: sgemm GFLOP/s on the layer's GEMM shapes.
 * usage: target_cpu_bench [-m model_dir] [-t threads] [-n tokens] [-s seq_len] [-i iters] */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "model/cpu_ops.h"
#include "model/target.h"

/* The synthetic model: a scaled-down Qwen3 (GQA 4:1, q/k norms, tied embeddings). */
enum { HID = 512, LAYERS = 8, HEADS = 8, KV = 2, HD = 64, FFN = 1536, VOCAB = 8192 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct w { char name[96]; int64_t rows, cols; float std, mean; };

static int make_model(const char *dir)
{
    struct w ws[8 + 12 * LAYERS];
    int n = 0;
    ws[n++] = (struct w){ "model.embed_tokens.weight", VOCAB, HID, 0.5f, 0 };
    ws[n++] = (struct w){ "model.norm.weight", HID, 0, 0.1f, 1 };
    for (int l = 0; l < LAYERS; l++) {
        const struct { const char *s; int64_t r, c; float std, mean; } per[] = {
            { "input_layernorm.weight", HID, 0, 0.1f, 1 }, { "post_attention_layernorm.weight", HID, 0, 0.1f, 1 },
            { "self_attn.q_proj.weight", HEADS * HD, HID, 0.05f, 0 }, { "self_attn.k_proj.weight", KV * HD, HID, 0.05f, 0 },
            { "self_attn.v_proj.weight", KV * HD, HID, 0.05f, 0 }, { "self_attn.o_proj.weight", HID, HEADS * HD, 0.05f, 0 },
            { "self_attn.q_norm.weight", HD, 0, 0.1f, 1 }, { "self_attn.k_norm.weight", HD, 0, 0.1f, 1 },
            { "mlp.gate_proj.weight", FFN, HID, 0.05f, 0 }, { "mlp.up_proj.weight", FFN, HID, 0.05f, 0 },
            { "mlp.down_proj.weight", HID, FFN, 0.03f, 0 },
        };
        for (size_t i = 0; i < sizeof per / sizeof *per; i++) {
            snprintf(ws[n].name, sizeof ws[n].name, "model.layers.%d.%s", l, per[i].s);
            ws[n].rows = per[i].r;
            ws[n].cols = per[i].c;
            ws[n].std = per[i].std;
            ws[n].mean = per[i].mean;
            n++;
        }
    }
    cJSON *hdr = cJSON_CreateObject();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(hdr, ws[i].name);
        cJSON_AddStringToObject(t, "dtype", "BF16");
        double shape[2] = { (double)ws[i].rows, (double)ws[i].cols };
        cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, ws[i].cols ? 2 : 1));
        uint64_t bytes = (uint64_t)ws[i].rows * (ws[i].cols ? ws[i].cols : 1) * 2;
        double offs[2] = { (double)off, (double)(off + bytes) };
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        off += bytes;
    }
    char *text = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint64_t hl = strlen(text);
    fwrite(&hl, 8, 1, f);       /* little-endian host */
    fwrite(text, 1, hl, f);
    free(text);
    unsigned seed = 1;
    uint16_t buf[4096];
    for (int i = 0; i < n; i++) {
        int64_t cnt = ws[i].rows * (ws[i].cols ? ws[i].cols : 1);
        for (int64_t j = 0; j < cnt;) {
            int k = 0;
            for (; k < 4096 && j < cnt; k++, j++) {
                seed = seed * 1664525u + 1013904223u;
                float u = ((seed >> 8) / 16777216.0f - 0.5f) * 3.4641f;    /* unit variance uniform */
                buf[k] = cpu_f32_to_bf16_one(ws[i].mean + ws[i].std * u);
            }
            fwrite(buf, 2, k, f);
        }
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(f = fopen(path, "w")))
        return -1;
    fprintf(f, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":%d,\"num_hidden_layers\":%d,"
               "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"intermediate_size\":%d,"
               "\"vocab_size\":%d,\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":true,"
               "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}\n",
            HID, LAYERS, HEADS, KV, HD, FFN, VOCAB);
    fclose(f);
    return 0;
}

/* GFLOP/s of cblas_sgemm on one layer's projection shapes for `tokens` rows: the ceiling the forward can hope for. */
static double sgemm_reference(const struct hf_config *c, int tokens, int iters)
{
    const int H = c->hidden_size, Q = c->num_heads * c->head_dim, K = c->num_kv_heads * c->head_dim;
    const int F = c->intermediate_size;
    size_t big = (size_t)tokens * (F > Q ? F : Q);
    float *x = calloc(big, 4), *y = calloc(big, 4), *w = calloc((size_t)F * (H > Q ? H : Q) + 1, 4);
    for (size_t i = 0; i < big; i++)
        x[i] = 0.01f * (float)(i % 97);
    const int shapes[][2] = { { Q, H }, { K, H }, { K, H }, { H, Q }, { F, H }, { F, H }, { H, F } };
    double flops = 0, dt = INFINITY;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        flops += 2.0 * tokens * shapes[s][0] * shapes[s][1];
    for (int it = 0; it < iters; it++) {      /* best of iters: the machine may be shared */
        double t0 = now();
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            cpu_linear(y, x, w, NULL, tokens, shapes[s][1], shapes[s][0], 0.0f);
        dt = fmin(dt, now() - t0);
    }
    free(x);
    free(y);
    free(w);
    return flops / dt * 1e-9;
}

int main(int argc, char **argv)
{
    cpu_blas_pick_kernels(argv);     /* as the daemons run it */
    if (cpu_blas_note())
        fprintf(stderr, "%s\n", cpu_blas_note());
    const char *model = NULL;
    int threads = 1, tokens = 2048, seq = 512, iters = 3, opt;
    while ((opt = getopt(argc, argv, "m:t:n:s:i:")) != -1)
        switch (opt) {
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'n': tokens = atoi(optarg); break;
        case 's': seq = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-m model_dir] [-t threads] [-n tokens] [-s seq_len] [-i iters]\n", argv[0]);
            return 2;
        }
    if (tokens < 1 || seq < 1 || iters < 1) {
        fprintf(stderr, "tokens, seq_len and iters must be positive\n");
        return 2;
    }
    char dir[512];
    if (!model) {
        snprintf(dir, sizeof dir, "%s/target-bench-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        if (mkdir(dir, 0700) < 0 || make_model(dir) < 0) {
            fprintf(stderr, "cannot write the synthetic model under %s\n", dir);
            return 1;
        }
        model = dir;
    }
    target_cpu_set_threads(threads);

    char err[512];
    struct hf_config cfg;
    if (hf_config_load(model, &cfg, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int ids[8];
    int n_ids = target_default_layer_ids(cfg.num_layers, cfg.num_layers >= 8 ? 5 : 1, ids);
    struct target *m;
    if (target_open(&m, model, ids, n_ids, TARGET_BACKEND_CPU, 0, tokens, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int n_seqs = (tokens + seq - 1) / seq;
    uint32_t *tok = malloc((size_t)tokens * 4);
    int32_t *cu = malloc((size_t)(n_seqs + 1) * 4);
    for (int t = 0; t < tokens; t++)
        tok[t] = (uint32_t)((t * 2654435761u) % (unsigned)cfg.vocab_size);
    for (int s = 0; s <= n_seqs; s++)
        cu[s] = s * seq < tokens ? s * seq : tokens;
    size_t pitch = (size_t)n_ids * cfg.hidden_size * 2;
    void *out = malloc((size_t)tokens * pitch);

    int rc = target_forward(m, tok, cu, n_seqs, tokens, out, OUT_BF16, pitch);   /* warm-up */
    double dt = INFINITY, sum = 0;
    for (int i = 0; i < iters && rc == 0; i++) {
        double t0 = now();
        rc = target_forward(m, tok, cu, n_seqs, tokens, out, OUT_BF16, pitch);
        dt = fmin(dt, now() - t0);
        sum += now() - t0;
    }
    if (rc < 0) {
        fprintf(stderr, "target_forward: %d\n", rc);
        return 1;
    }
    const int run_layers = ids[n_ids - 1] + 1;
    const double H = cfg.hidden_size, Q = cfg.num_heads * cfg.head_dim, K = cfg.num_kv_heads * cfg.head_dim;
    double gemm = 2.0 * tokens * (H * (Q + 2 * K) + Q * H + 3 * H * cfg.intermediate_size) * run_layers;
    double attn = 0;
    for (int s = 0; s < n_seqs; s++) {
        double L = cu[s + 1] - cu[s];
        attn += 2.0 * 2.0 * cfg.num_heads * cfg.head_dim * L * (L + 1) / 2 * run_layers;
    }
    double ref = sgemm_reference(&cfg, tokens, iters);
    printf("model %s: %s hidden %d, layers run %d of %d, capture %d ids, heads %d/%d, ffn %d\n",
           model == dir ? "synthetic" : model, cfg.arch_name, cfg.hidden_size, run_layers, cfg.num_layers, n_ids,
           cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size);
    printf("batch %d tokens (%d seqs of <= %d), threads %d, %d iters\n", tokens, n_seqs, seq, threads, iters);
    printf("forward (best of %d): %.1f ms, %.0f tokens/s (mean %.0f), %.2f GFLOP/s (GEMM %.2f + attention %.2f GFLOP)\n",
           iters, dt * 1e3, tokens / dt, tokens * iters / sum, (gemm + attn) / dt * 1e-9, gemm * 1e-9, attn * 1e-9);
    printf("reference (best of %d): sgemm on one layer's GEMM shapes, same run: %.2f GFLOP/s -> forward at %.0f%% of it\n",
           iters, ref,
           100.0 * (gemm + attn) / dt * 1e-9 / ref);
    free(out);
    free(cu);
    free(tok);
    target_close(m);
    if (model == dir) {
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        unlink(p);
        snprintf(p, sizeof p, "%s/config.json", dir);
        unlink(p);
        rmdir(dir);
    }
    return 0;
}
