/* gemm.cu: row-major bf16 GEMM mapped onto cuBLASLt's column-major matmul; the algorithm
 * heuristic runs once per shape (and operand alignment) and is cached. The row count M of packed
 * batches changes from call to call: it is bucketed (m_bucket), the bucket's plan serves every M
 * in it with its layouts set to the real M at the call (host-side attributes: no allocation), so
 * the target's forward and the drafter's linear layers stop creating plans once each bucket has
 * been seen. (N and K stay exact: the callers' are model dimensions. The drafter's weight
 * gradients, whose K is the token count, go through cublasGemmEx: gpukern/gemmx.cu.) */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>
#include "gpukern/gemm.h"
#include "gpukern/gk_impl.cuh"

/* Plans by a hash of their key, each looked for in GEMM_PROBE slots from its own: a lookup per
 * call costs a few compares, and a process's shapes all fit (~6-8 (N, K) x every bucket its row
 * counts reach: 83 buckets up to 16K rows), so a run stops making plans. (~900 KB of host memory) */
enum { GEMM_CACHE = 4096, GEMM_PROBE = 16 };

struct gemm_key {
    int ta, tb, M, N, K;            /* M: the bucket (or the exact M when `exact`) */
    int exact;                      /* the bucket's algorithm refused this M: a plan of its own */
    long lda, ldb, ldc, ldd;
    int has_c, align_a, align_b, align_c, align_d, cd_f32;
};

struct gemm_plan {
    struct gemm_key key;
    int used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
    int cur_M;                      /* the M the layouts describe now */
};

struct gk_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t ws_bytes;
    struct gemm_plan plans[GEMM_CACHE];
    unsigned next;                  /* which of a full probe run is replaced next */
    long made;
};

static void plan_done(struct gemm_plan *p)
{
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatrixLayoutDestroy(p->ld);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

extern "C" void gk_gemm_free(gk_gemm *g)
{
    if (!g) return;
    for (int i = 0; i < GEMM_CACHE; i++) plan_done(&g->plans[i]);
    if (g->workspace) cudaFree(g->workspace);
    if (g->lt) cublasLtDestroy(g->lt);
    free(g);
}

extern "C" int gk_gemm_create(gk_gemm **out, size_t workspace_bytes, char *err, size_t errlen)
{
    *out = NULL;
    gk_gemm *g = (gk_gemm *)calloc(1, sizeof(*g));
    if (!g) return -ENOMEM;
    g->ws_bytes = workspace_bytes ? workspace_bytes : GK_GEMM_WORKSPACE_DEFAULT;
    cublasStatus_t s = cublasLtCreate(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        if (err) snprintf(err, errlen, "cublasLtCreate: %s", cublasGetStatusString(s));
        g->lt = NULL;
        gk_gemm_free(g);
        return -DF_ECUDA;
    }
    cudaError_t e = cudaMalloc(&g->workspace, g->ws_bytes);
    if (e != cudaSuccess) {
        if (err) snprintf(err, errlen, "cudaMalloc(%zu) for the GEMM workspace: %s", g->ws_bytes,
                          cudaGetErrorString(e));
        g->workspace = NULL;
        gk_gemm_free(g);
        return -DF_ECUDA;
    }
    *out = g;
    return 0;
}

extern "C" long gk_gemm_plans_made(const gk_gemm *g) { return g ? g->made : 0; }

static int ptr_align(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 2 && (u & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

#define LT(call) do { if ((call) != CUBLAS_STATUS_SUCCESS) goto fail; } while (0)

/* Column-major view: D^T[N,M] = op'(B) op'(A) with op'(B) = B^T stored as is (trans_b: transposed). */
static int plan_make(gk_gemm *g, const struct gemm_key *k, struct gemm_plan *p)
{
    memset(p, 0, sizeof(*p));
    p->key = *k;
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;  /* cuBLAS A = our B */
    cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;  /* cuBLAS B = our A */
    uint64_t m = (uint64_t)k->N, n = (uint64_t)k->M, kk = (uint64_t)k->K;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const cudaDataType_t cd = k->cd_f32 ? CUDA_R_32F : CUDA_R_16BF;
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, opa == CUBLAS_OP_N ? m : kk,
                                  opa == CUBLAS_OP_N ? kk : m, k->ldb));
    LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, opb == CUBLAS_OP_N ? kk : n,
                                  opb == CUBLAS_OP_N ? n : kk, k->lda));
    LT(cublasLtMatrixLayoutCreate(&p->lc, cd, m, n, k->has_c ? k->ldc : k->ldd));
    LT(cublasLtMatrixLayoutCreate(&p->ld, cd, m, n, k->ldd));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    {
        uint64_t ws = g->ws_bytes;
        uint32_t aa = (uint32_t)k->align_b, ab = (uint32_t)k->align_a;
        uint32_t ac = (uint32_t)k->align_c, ad = (uint32_t)k->align_d;
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac)));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
    }
    LT(cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->la, p->lb, p->lc, p->ld, pref, 1, &res, &found));
    if (found < 1) goto fail;
    p->algo = res.algo;
    p->cur_M = k->M;
    g->made++;
    cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1;
    return 0;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof(*p));
    return -DF_ECUDA;
}

/* Row counts up to 64 are their own bucket; then powers of two up to 2048; then multiples of 1024. */
static int m_bucket(int M)
{
    if (M <= 64) return M;
    if (M > 2048) return (int)(((long)M + 1023) / 1024 * 1024);
    int b = 128;
    while (b < M) b <<= 1;
    return b;
}

/* Point the plan's layouts at M rows (our row-major M = cuBLAS's column count n). */
static int plan_set_m(struct gemm_plan *p, int M)
{
    if (p->cur_M == M) return 0;
    uint64_t n = (uint64_t)M;
    cublasLtMatrixLayoutAttribute_t lb_dim = p->key.ta ? CUBLASLT_MATRIX_LAYOUT_ROWS : CUBLASLT_MATRIX_LAYOUT_COLS;
    if (cublasLtMatrixLayoutSetAttribute(p->lb, lb_dim, &n, sizeof(n)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof(n)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(p->ld, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof(n)) != CUBLAS_STATUS_SUCCESS) {
        p->cur_M = -1;
        return -DF_ECUDA;
    }
    p->cur_M = M;
    return 0;
}

static unsigned key_hash(const struct gemm_key *k)
{
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(*k); i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return (unsigned)(h ^ (h >> 32));
}

static struct gemm_plan *plan_get(gk_gemm *g, const struct gemm_key *k, int *rc)
{
    unsigned h = key_hash(k);
    struct gemm_plan *p = NULL;
    for (unsigned i = 0; i < GEMM_PROBE; i++) {
        struct gemm_plan *q = &g->plans[(h + i) % GEMM_CACHE];
        if (q->used && !memcmp(&q->key, k, sizeof(*k))) return q;
        if (!q->used && !p) p = q;
    }
    if (!p) p = &g->plans[(h + g->next++ % GEMM_PROBE) % GEMM_CACHE];
    plan_done(p);
    *rc = plan_make(g, k, p);
    return *rc ? NULL : p;
}

extern "C" int gk_gemm_bf16(gk_gemm *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                            int K, float alpha, const void *A, long lda, const void *B, long ldb,
                            float beta, const void *C, long ldc, void *D, long ldd)
{
    return gk_gemm_bf16_cd(g, stream, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, D, ldd, 0);
}

extern "C" int gk_gemm_bf16_cd(gk_gemm *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N, int K,
                          float alpha, const void *A, long lda, const void *B, long ldb, float beta,
                          const void *C, long ldc, void *D, long ldd, int cd_f32)
{
    if (!g || M < 0 || N < 0 || K <= 0 || !A || !B || !D) return -EINVAL;
    if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldd < N) return -EINVAL;
    int has_c = beta != 0.0f;
    if (has_c && (!C || ldc < N || (C == D && ldc != ldd))) return -EINVAL;
    if (M == 0 || N == 0) return 0;
    struct gemm_key k;
    memset(&k, 0, sizeof(k));
    k.ta = !!trans_a; k.tb = !!trans_b; k.M = m_bucket(M); k.N = N; k.K = K;
    if (trans_a && k.M > lda) k.M = (int)lda;   /* A stored [K, M]: its layout's rows cannot pass lda */
    k.lda = lda; k.ldb = ldb; k.ldc = has_c ? ldc : 0; k.ldd = ldd; k.has_c = has_c; k.cd_f32 = !!cd_f32;
    k.align_a = ptr_align(A); k.align_b = ptr_align(B);
    k.align_c = has_c ? ptr_align(C) : ptr_align(D); k.align_d = ptr_align(D);
    for (;;) {
        int r = 0;
        struct gemm_plan *p = plan_get(g, &k, &r);
        if (!p) return r;
        if ((r = plan_set_m(p, M)) < 0) return r;
        cublasStatus_t s = cublasLtMatmul(g->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, has_c ? C : D, p->lc,
                                          D, p->ld, &p->algo, g->workspace, g->ws_bytes, stream);
        if (s == CUBLAS_STATUS_SUCCESS) return 0;
        if (s != CUBLAS_STATUS_NOT_SUPPORTED || k.M == M) return -DF_ECUDA;
        /* (checked on the host before anything is enqueued) the bucket's algorithm cannot do
         * this M: an exact plan for it */
        k.M = M;
        k.exact = 1;
    }
}
