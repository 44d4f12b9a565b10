/* cpu_ops.c: fp32 reference ops; GEMMs through OpenBLAS, the rest plain loops.
 * Numerics follow transformers' fp32 path (rope tables, rmsnorm, eager softmax attention). */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "model/cpu_ops.h"

/* set for the exec'd process: the core OpenBLAS had taken the CPU for */
#define BLAS_FROM_ENV "DFLASH_OPENBLAS_DETECTED"

static char blas_note[320];

void cpu_blas_pick_kernels(char **argv)
{
    const char *from = getenv(BLAS_FROM_ENV), *set = getenv("OPENBLAS_CORETYPE");
    if (from && set) {      /* this is the exec'd process: its name as before the exec, not "exe" */
        const char *base = argv && argv[0] ? strrchr(argv[0], '/') : NULL;
        if (argv && argv[0])
            prctl(PR_SET_NAME, base ? base + 1 : argv[0], 0, 0, 0);
        snprintf(blas_note, sizeof blas_note, "OpenBLAS took this CPU for %.24s (a model it does not know): "
                 "OPENBLAS_CORETYPE=%.24s set from its features (OpenBLAS now: %.24s)", from, set,
                 openblas_get_corename());
        unsetenv(BLAS_FROM_ENV);
        return;
    }
    if (set || !argv || !argv[0])
        return;     /* the operator's choice */
#if defined(__x86_64__) || defined(__i386__)
    const char *core = openblas_get_corename(), *config = openblas_get_config();
    /* only a DYNAMIC_ARCH build reads OPENBLAS_CORETYPE (Debian's does) */
    if (!core || !config || !strstr(config, "DYNAMIC_ARCH") ||
        (strcasecmp(core, "Prescott") && strcasecmp(core, "Core2") && strcasecmp(core, "Nehalem")))
        return;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                       : __builtin_cpu_supports("avx") ? "SandyBridge" : NULL;
    if (!want)
        return;
    char from_core[32];
    snprintf(from_core, sizeof from_core, "%s", core);
    if (setenv("OPENBLAS_CORETYPE", want, 1) < 0 || setenv(BLAS_FROM_ENV, from_core, 1) < 0)
        return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    int e = errno;
    unsetenv("OPENBLAS_CORETYPE");      /* (no exec: this process's OpenBLAS stays as it is) */
    unsetenv(BLAS_FROM_ENV);
    snprintf(blas_note, sizeof blas_note, "OpenBLAS took this CPU for %.24s (a model it does not know) and this "
             "process could not exec itself with OPENBLAS_CORETYPE=%s (/proc/self/exe: %s): it runs the slow "
             "generic kernels; set OPENBLAS_CORETYPE=%s in its environment", from_core, want, strerror(e), want);
#endif
}

const char *cpu_blas_note(void)
{
    return blas_note[0] ? blas_note : NULL;
}

#define ATTN_QUERY_CHUNK 64   /* query rows per score block: scratch is CHUNK x seq_len */

float cpu_f16_to_f32_one(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        v.u = sign;
    } else {                    /* subnormal half: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        v.u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    return v.f;
}

void cpu_bf16_to_f32(float *dst, const void *src, size_t n)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = cpu_bf16_to_f32_one(h);
    }
}

void cpu_f16_to_f32(float *dst, const void *src, size_t n)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = cpu_f16_to_f32_one(h);
    }
}

void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = cpu_f32_to_bf16_one(src[i]);
}

void cpu_linear(float *y, const float *x, const float *w, const float *b, int n, int in, int out, float beta)
{
    if (n <= 0 || out <= 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y, out);
    if (b)
        for (int r = 0; r < n; r++) {
            float *row = y + (size_t)r * out;
            for (int j = 0; j < out; j++)
                row[j] += b[j];
        }
}

void cpu_rmsnorm(float *out, const float *x, const float *w, int rows, int width, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * width;
        float *o = out + (size_t)r * width;
        double ss = 0;
        for (int j = 0; j < width; j++)
            ss += (double)xr[j] * xr[j];
        float inv = (float)(1.0 / sqrt(ss / width + eps));
        if (w)
            for (int j = 0; j < width; j++)
                o[j] = w[j] * (xr[j] * inv);
        else
            for (int j = 0; j < width; j++)
                o[j] = xr[j] * inv;
    }
}

void cpu_swiglu(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_rope_inv_freq(float *inv_freq, int head_dim, const struct hf_rope *rope)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* fp32 like transformers: base ** (arange(0, d, 2).float() / d), then 1 / that */
        float e = (float)(2 * i) / (float)head_dim;
        float p = (float)pow(rope->theta, (double)e);
        inv_freq[i] = 1.0f / p;
    }
    if (rope->type != HF_ROPE_LLAMA3)
        return;
    float factor = (float)rope->factor;
    float lo = (float)rope->low_freq_factor;
    float old = (float)rope->original_max_position_embeddings;
    float low_wavelen = (float)(rope->original_max_position_embeddings / rope->low_freq_factor);
    float high_wavelen = (float)(rope->original_max_position_embeddings / rope->high_freq_factor);
    float two_pi = (float)(2.0 * M_PI);
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = two_pi / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            /* medium band: interpolate between the scaled and unscaled frequency */
            float smooth = (old / wavelen - lo) / (float)(rope->high_freq_factor - rope->low_freq_factor);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}

void cpu_rope_table(float *cos_t, float *sin_t, int max_pos, int head_dim, const float *inv_freq)
{
    int half = head_dim / 2;
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * inv_freq[i];
            cos_t[(size_t)p * half + i] = (float)cos((double)angle);
            sin_t[(size_t)p * half + i] = (float)sin((double)angle);
        }
}

void cpu_rope_apply(float *x, int rows, int n_heads, int head_dim, const int32_t *pos,
                    const float *cos_t, const float *sin_t)
{
    int half = head_dim / 2;
    for (int r = 0; r < rows; r++) {
        const float *c = cos_t + (size_t)pos[r] * half;
        const float *s = sin_t + (size_t)pos[r] * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)r * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

void cpu_positions(int32_t *pos, const int32_t *cu_seqlens, int n_seqs)
{
    for (int s = 0; s < n_seqs; s++)
        for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++)
            pos[t] = t - cu_seqlens[s];
}

size_t cpu_attention_scratch_floats(int max_seq_len)
{
    return (size_t)ATTN_QUERY_CHUNK * (size_t)(max_seq_len > 0 ? max_seq_len : 1);
}

void cpu_attention_varlen(float *out, const float *q, const float *k, const float *v,
                          const int32_t *cu_seqlens, int n_seqs, int n_heads, int n_kv_heads,
                          int head_dim, float scale, float *scratch)
{
    const int qs = n_heads * head_dim, ks = n_kv_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    for (int s = 0; s < n_seqs; s++) {
        const int start = cu_seqlens[s], len = cu_seqlens[s + 1] - start;
        for (int h = 0; h < n_heads; h++) {
            const float *kh = k + (size_t)start * ks + (size_t)(h / group) * head_dim;
            const float *vh = v + (size_t)start * ks + (size_t)(h / group) * head_dim;
            for (int i0 = 0; i0 < len; i0 += ATTN_QUERY_CHUNK) {
                const int m = len - i0 < ATTN_QUERY_CHUNK ? len - i0 : ATTN_QUERY_CHUNK;
                const int nk = i0 + m;          /* keys the last row of the chunk may see */
                const float *qh = q + (size_t)(start + i0) * qs + (size_t)h * head_dim;
                float *oh = out + (size_t)(start + i0) * qs + (size_t)h * head_dim;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, head_dim, scale,
                            qh, qs, kh, ks, 0.0f, scratch, nk);
                for (int r = 0; r < m; r++) {
                    float *row = scratch + (size_t)r * nk;
                    const int last = i0 + r;    /* causal: keys 0..last */
                    float mx = row[0];
                    for (int j = 1; j <= last; j++)
                        mx = row[j] > mx ? row[j] : mx;
                    float sum = 0;
                    for (int j = 0; j <= last; j++) {
                        row[j] = expf(row[j] - mx);
                        sum += row[j];
                    }
                    float inv = 1.0f / sum;
                    for (int j = 0; j <= last; j++)
                        row[j] *= inv;
                    for (int j = last + 1; j < nk; j++)
                        row[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, head_dim, nk, 1.0f,
                            scratch, nk, vh, ks, 0.0f, oh, qs);
            }
        }
    }
}
