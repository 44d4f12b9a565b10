/* test_target_cuda_hf.c: the CUDA target forward on a Qwen3 of realistic shape (hidden 1024, 24 layers,
 * random weights) against transformers, on one packed batch. The data comes from
 * `tools/bench_target_hf.py parity --out DIR` (run on a CUDA host; DIR/model, DIR/ref.safetensors);
 * DFLASH_HF_PARITY_DIR=DIR selects it, else the test skips (77), as it does without a GPU.
 * Per captured layer it prints the relative error of the CUDA forward against transformers in bf16
 * and in fp32, and of transformers bf16 against fp32. Pass: within 1e-2 of the fp32 run, or no
 * further from it than 1.25x the transformers bf16 run is (bf16 noise grows with depth). */
#include <stdbool.h>
#include "tests/test.h"
#ifdef DFLASH_HAVE_TARGET_CUDA
#include <cuda_runtime_api.h>
#include "gpukern/gk.h"
#include "model/safetensors.h"
#include "model/target.h"

static char errbuf[512];

static const struct st_tensor *need(const struct st_set *s, const char *name)
{
    const struct st_tensor *t = st_find(s, name);
    if (!t) TEST_FAIL("ref.safetensors: %s missing", name);
    return t;
}

static double rel(const float *a, size_t apitch_f, const float *b, int T, int H, int col0)
{
    double num = 0, den = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            double x = a[(size_t)t * apitch_f + col0 + c], y = b[(size_t)t * H + c];
            if (!isfinite(x)) TEST_FAIL("non-finite value at token %d col %d", t, c);
            num += (x - y) * (x - y);
            den += y * y;
        }
    return sqrt(num / den);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) SKIP("no CUDA device");
    const char *dir = getenv("DFLASH_HF_PARITY_DIR");
    if (!dir || !*dir) SKIP("DFLASH_HF_PARITY_DIR not set (tools/bench_target_hf.py parity makes the data)");
    char path[4096];
    struct st_set *ref = NULL;
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    if (st_open_file(&ref, path, errbuf, sizeof errbuf) < 0) TEST_FAIL("%s", errbuf);
    const struct st_tensor *tt = need(ref, "tokens"), *tc = need(ref, "cu_seqlens"), *ti = need(ref, "layer_ids");
    const int T = (int)tt->numel, n_seqs = (int)tc->numel - 1, n_ids = (int)ti->numel;
    int32_t *tok32 = malloc(4 * T), *cu = malloc(4 * (n_seqs + 1)), ids[64];
    CHECK(n_ids <= 64);
    memcpy(tok32, tt->data, 4 * (size_t)T);
    memcpy(cu, tc->data, 4 * (size_t)(n_seqs + 1));
    memcpy(ids, ti->data, 4 * (size_t)n_ids);

    struct target *m = NULL;
    snprintf(path, sizeof path, "%s/model", dir);
    if (target_open(&m, path, ids, n_ids, TARGET_BACKEND_CUDA, 0, T, errbuf, sizeof errbuf) < 0)
        TEST_FAIL("target_open %s: %s", path, errbuf);
    const int H = target_config(m)->hidden_size;
    printf("model %s: hidden %d, %d layers, heads %d/%d, head_dim %d; batch of %d sequences, %d tokens\n", path, H,
           target_config(m)->num_layers, target_config(m)->num_heads, target_config(m)->num_kv_heads,
           target_config(m)->head_dim, n_seqs, T);
    const size_t pitch_f = (size_t)n_ids * H;
    float *out = malloc(sizeof(float) * pitch_f * T);
    CHECK_OK(target_forward(m, (const uint32_t *)tok32, cu, n_seqs, T, out, OUT_F32, pitch_f * 4));

    float *hb = malloc(sizeof(float) * (size_t)T * H), *h32 = malloc(sizeof(float) * (size_t)T * H);
    bool ok = true;
    printf("layer   cuda~hf_bf16   cuda~hf_fp32   hf_bf16~hf_fp32\n");
    for (int k = 0; k < n_ids; k++) {
        char name[32];
        snprintf(name, sizeof name, "hs.%d", k);
        CHECK_OK(st_read_f32(need(ref, name), 0, (int64_t)T * H, hb));
        snprintf(name, sizeof name, "hs32.%d", k);
        CHECK_OK(st_read_f32(need(ref, name), 0, (int64_t)T * H, h32));
        double e_b = rel(out, pitch_f, hb, T, H, k * H), e_32 = rel(out, pitch_f, h32, T, H, k * H);
        double e_hf = rel(hb, H, h32, T, H, 0);
        bool pass = e_32 <= 1e-2 || e_32 <= 1.25 * e_hf;
        printf("%5d   %.3e      %.3e      %.3e   %s\n", ids[k], e_b, e_32, e_hf, pass ? "ok" : "FAIL");
        ok = ok && pass;
    }
    target_close(m);
    st_close(ref);
    free(tok32); free(cu); free(out); free(hb); free(h32);
    CHECK(ok);
    return 0;
}
#else
int main(void) { SKIP("built without the CUDA target backend"); }
#endif
