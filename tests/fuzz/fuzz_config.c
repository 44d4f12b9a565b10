/* fuzz_config.c: fuzz target for the INI config loader (common/config.c cfg_load) and the
 * command-line override parser (cfg_set): every accepted value must lie inside its key's range. */
#include <math.h>
#include "common/config.h"
#include "tests/fuzz/fuzz.h"

/* What the key table promises about a loaded config. */
static void config_check_ranges(const struct dflash_cfg *cfg)
{
    for (size_t i = 0; i < cfg_nkeys; i++) {
        const struct cfg_key *k = &cfg_keys[i];
        const char *p = (const char *)cfg + k->offset;
        switch (k->type) {
        case CFG_INT: {
            int64_t v;
            memcpy(&v, p, sizeof v);
            FUZZ_ASSERT((double)v >= k->min && (double)v <= k->max);
            break;
        }
        case CFG_DOUBLE: {
            double v;
            memcpy(&v, p, sizeof v);
            FUZZ_ASSERT(isfinite(v) && v >= k->min && v <= k->max);
            break;
        }
        case CFG_BOOL: {
            int v;
            memcpy(&v, p, sizeof v);
            FUZZ_ASSERT(v == 0 || v == 1);
            break;
        }
        case CFG_STR:
            FUZZ_ASSERT(strnlen(p, (size_t)k->max) < (size_t)k->max);
            break;
        }
    }
}

static void config_use(const struct dflash_cfg *cfg)
{
    static FILE *devnull;
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    if (devnull)
        cfg_print(cfg, devnull, NULL);
    int ids[64];
    int n = cfg_parse_int_list(cfg->model.capture_layers, ids, 64);
    FUZZ_ASSERT(n <= 64);
    for (int i = 0; i < n; i++)
        FUZZ_ASSERT(ids[i] >= 0);
}

int fuzz_config(const uint8_t *data, size_t size)
{
    static int fd = -1;
    char path[64], err[512];
    struct dflash_cfg cfg;

    /* 1. The whole input as an INI file. */
    const char *p = fuzz_memfile(&fd, path, sizeof path, data, size);
    if (!p)
        return 0;
    err[0] = 0;
    if (cfg_load(&cfg, p, err, sizeof err) == 0) {
        config_check_ranges(&cfg);
        config_use(&cfg);
    } else {
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
    }

    /* 2. Each of the first lines as a "section.key=value" override on the defaults. */
    FUZZ_ASSERT(cfg_load(&cfg, NULL, err, sizeof err) == 0);
    size_t off = 0;
    for (int line = 0; line < 16 && off < size; line++) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        size_t len = nl ? (size_t)(nl - (data + off)) : size - off;
        char *a = malloc(len + 1);
        if (!a)
            return 0;
        memcpy(a, data + off, len);
        a[len] = 0;         /* an embedded NUL just shortens the override */
        err[0] = 0;
        if (cfg_set(&cfg, a, err, sizeof err) < 0)
            FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        free(a);
        off += len + 1;
    }
    config_check_ranges(&cfg);
    config_use(&cfg);
    return 0;
}
