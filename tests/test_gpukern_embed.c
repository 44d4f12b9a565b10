/* test_gpukern_embed.c: gk_embed and gk_embed_f32 against a CPU gather on fresh random data
 * (strided output, out-of-range ids give zero rows, shape checks). */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/embed.h"

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    const int vocab = 1000 + gk_rng_int(0, 100), H = 8 * gk_rng_int(8, 200), T = gk_rng_int(300, 700);
    const long ostride = H + 8 * gk_rng_int(0, 4);
    uint16_t *table = gk_rand_bf16((size_t)vocab * H, 1.0f, 0.f, NULL);
    int32_t *tok = malloc(T * sizeof(int32_t));
    for (int t = 0; t < T; t++) tok[t] = gk_rng_int(0, vocab - 1);
    tok[0] = -1;
    tok[T - 1] = vocab;
    void *dt = gk_dev_upload(table, (size_t)vocab * H * 2);
    int32_t *dtok = gk_dev_upload(tok, T * sizeof(int32_t));
    void *dout = gk_dev_poisoned((size_t)T * ostride);
    CHECK_INT(gk_embed(dt, vocab, H, dtok, T, dout, ostride, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)T * ostride);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            float want = (tok[t] < 0 || tok[t] >= vocab) ? 0.f : gk_bf16_to_f32(table[(size_t)tok[t] * H + c]);
            if (out[(size_t)t * ostride + c] != want)
                TEST_FAIL("token %d col %d: %g vs %g", t, c, out[(size_t)t * ostride + c], want);
        }
    /* fp32 output (an fp32 residual stream) */
    float *df = NULL;
    CUDA_CHECK(cudaMalloc((void **)&df, sizeof(float) * T * ostride));
    CUDA_CHECK(cudaMemset(df, 0xff, sizeof(float) * T * ostride));
    CHECK_INT(gk_embed_f32(dt, vocab, H, dtok, T, df, ostride, 0), ==, 0);
    float *of = malloc(sizeof(float) * T * ostride);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(of, df, sizeof(float) * T * ostride, cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++)
            if (of[(size_t)t * ostride + c] != out[(size_t)t * ostride + c])
                TEST_FAIL("f32 token %d col %d: %g vs %g", t, c, of[(size_t)t * ostride + c], out[(size_t)t * ostride + c]);
    cudaFree(df);
    free(of);
    CHECK_INT(gk_embed(dt, vocab, H + 4, dtok, T, dout, ostride, 0), ==, -EINVAL);
    CHECK_INT(gk_embed(dt, vocab, H, dtok, T, (char *)dout + 2, ostride, 0), ==, -EINVAL);
    CHECK_INT(gk_embed(dt, vocab, H, dtok, 0, dout, ostride, 0), ==, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(dt); cudaFree(dtok); cudaFree(dout);
    free(table); free(tok); free(out);
    printf("embed ok: vocab %d H %d T %d\n", vocab, H, T);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
