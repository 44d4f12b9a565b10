/* fuzz_st.h: what every safetensors fuzz target checks on an opened set: tensors sorted,
 * findable, consistent in size, readable in full through every accessor. */
#pragma once
#include <stdbool.h>
#include "common/err.h"
#include "model/safetensors.h"
#include "tests/fuzz/fuzz.h"

static void st_walk(const struct st_set *s)
{
    size_t n = st_count(s);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_at(s, i);
        FUZZ_ASSERT(t && t->name && t->file);
        FUZZ_ASSERT(st_find(s, t->name) == t);
        if (i)
            FUZZ_ASSERT(strcmp(st_at(s, i - 1)->name, t->name) < 0);
        FUZZ_ASSERT((unsigned)t->dtype < ST_NDTYPES && t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_ASSERT(t->shape[d] >= 0);
            numel *= t->shape[d];
        }
        FUZZ_ASSERT(numel == t->numel);
        FUZZ_ASSERT(t->nbytes == (size_t)t->numel * st_dtype_size(t->dtype));
        /* Every byte of the tensor lies inside the mapping (ASan / SIGBUS otherwise). */
        const volatile uint8_t *b = t->data;
        uint8_t sum = 0;
        for (size_t k = 0; k < t->nbytes; k++)
            sum ^= b[k];
        (void)sum;
        bool is_float = t->dtype == ST_BF16 || t->dtype == ST_F16 || t->dtype == ST_F32;
        char err[512];
        err[0] = 0;
        int r = st_expect(s, t->name, t->ndim, t->shape, NULL, err, sizeof err);
        if (!is_float) {
            FUZZ_ASSERT(r == -DF_EUNSUPPORTED);
            continue;
        }
        /* refused exactly when an element is NaN or infinite (all exponent bits set) */
        bool nonfinite = false;
        for (int64_t k = 0; k < t->numel && !nonfinite; k++) {
            uint32_t v = 0;
            memcpy(&v, (const uint8_t *)t->data + (size_t)k * st_dtype_size(t->dtype), st_dtype_size(t->dtype));
            nonfinite = t->dtype == ST_F32 ? (v & 0x7f800000u) == 0x7f800000u
                      : t->dtype == ST_BF16 ? (v & 0x7f80u) == 0x7f80u : (v & 0x7c00u) == 0x7c00u;
        }
        FUZZ_ASSERT(nonfinite ? r == -DF_ENAN : r == 0);     /* (a long name may cut the message) */
        float f[16];
        uint16_t h[16];
        int64_t k = t->numel < 16 ? t->numel : 16;
        FUZZ_ASSERT(st_read_f32(t, t->numel - k, k, f) == 0);
        FUZZ_ASSERT(st_read_bf16(t, 0, k, h) == 0);
        FUZZ_ASSERT(st_read_f32(t, t->numel, 1, f) == -DF_ERANGE);
        FUZZ_ASSERT(st_read_f32(t, 0, t->numel + 1, f) == -DF_ERANGE);
        if (t->numel <= (1 << 16)) {
            float *all = NULL;
            FUZZ_ASSERT(st_load_f32(t, &all) == 0 && all);
            free(all);
        }
    }
    FUZZ_ASSERT(st_find(s, "") == NULL || st_find(s, "")->name[0] == 0);
}
