/* test_config.c: the INI loader: defaults, overrides, every error names file:line: key.
 * Also checks etc/dflash.ini documents every key with its default. */
#include <unistd.h>
#include "common/config.h"
#include "tests/test.h"

static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_error(const char *text, const char *needle)
{
    struct dflash_cfg cfg;
    char err[512] = "";
    const char *p = write_tmp("bad.ini", text);
    CHECK(cfg_load(&cfg, p, err, sizeof err) < 0);
    CHECK_CONTAINS(err, p);
    CHECK_CONTAINS(err, needle);
}

int main(void)
{
    struct dflash_cfg cfg;
    char err[512] = "";

    CHECK_OK(cfg_load(&cfg, NULL, err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 16);
    CHECK_STR(cfg.drafter.pick, "oldest");
    CHECK_NEAR(cfg.drafter.gamma, 7.0, 0);

    const char *p = write_tmp("ok.ini", "[ring]\nslots = 8\n[drafter]\ngamma = 3.5\npick = random\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 8);
    CHECK_NEAR(cfg.drafter.gamma, 3.5, 0);
    CHECK_STR(cfg.drafter.pick, "random");
    CHECK_OK(cfg_set(&cfg, "ring.slots=32", err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 32);
    CHECK(cfg_set(&cfg, "ring.nope=1", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "unknown key");

    expect_error("[ring]\nslots = 8\nbogus = 1\n", ":3: ring.bogus: unknown key");
    expect_error("[nosuch]\nx = 1\n", ":2: nosuch.x: unknown section");
    expect_error("[ring]\n\nslots = eight\n", ":3: ring.slots: not an integer");
    expect_error("[ring]\nslots = 1\n", ":2: ring.slots: 1 out of range");
    expect_error("[drafter]\ngamma = -2\n", "drafter.gamma: -2 out of range");
    expect_error("[drafter]\nbeta2 = 1\n", "drafter.beta2: 1 out of range");     /* bias correction 1 - 1^t = 0 */
    expect_error("[drafter]\nadam_eps = 0\n", "drafter.adam_eps: 0 out of range");
    expect_error("[drafter]\ngamma = nan\n", "drafter.gamma: not a number");
    expect_error("[ring\nslots=3\n", ":1: syntax error");
    expect_error("[ring]\nslots = 8\nbogus = 1\nalso = 2\n", ":3: ring.bogus: unknown key");     /* the first */

    /* A line too long for the reader is refused, never split: the tail of this comment would
     * otherwise come alive as "seed = 99". */
    static char x[5001], longline[6000];
    memset(x, 'x', 5000);
    snprintf(longline, sizeof longline, "[data]\n# %s seed = 99\n", x);
    expect_error(longline, ":2: line longer than 4094 bytes");
    /* One that fits, as long as the longest string key allows. */
    char dir[300], text2[400];
    memset(dir, 'd', 250);
    dir[0] = '/';
    dir[250] = 0;
    snprintf(text2, sizeof text2, "[cluster]\nstate_dir = %s\n", dir);
    p = write_tmp("long.ini", text2);
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_STR(cfg.cluster.state_dir, dir);
    /* Indented keys are keys (no continuation lines), integers are decimal. */
    p = write_tmp("indent.ini", "[data]\n    epochs = 010\n    seed = 7\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.data.epochs, ==, 10);
    CHECK_INT(cfg.data.seed, ==, 7);

    CHECK(cfg_load(&cfg, "/nonexistent/x.ini", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "/nonexistent/x.ini: cannot open");

    int ids[8];
    CHECK_INT(cfg_parse_int_list("1, 9,17,25,33", ids, 8), ==, 5);
    CHECK_INT(ids[4], ==, 33);
    CHECK(cfg_parse_int_list("1,x", ids, 8) < 0);

    /* The effective config is printed with the shortest decimals that read back exactly. */
    CHECK_OK(cfg_load(&cfg, NULL, err, sizeof err));
    cfg.drafter.lr = 0.1 + 0.2;         /* 0.30000000000000004 */
    cfg.drafter.adam_eps = 1e-300;
    cfg.drafter.gamma = 100;
    cfg.drafter.grad_clip = 1e6;
    char *out = NULL;
    size_t outlen = 0;
    FILE *mf = open_memstream(&out, &outlen);
    CHECK(mf);
    cfg_print(&cfg, mf, "drafter");
    fclose(mf);
    CHECK_CONTAINS(out, "drafter.beta1 = 0.9\n");
    CHECK_CONTAINS(out, "drafter.min_lr_ratio = 0.1\n");
    CHECK_CONTAINS(out, "drafter.lr = 0.30000000000000004\n");
    CHECK_CONTAINS(out, "drafter.adam_eps = 1e-300\n");
    CHECK_CONTAINS(out, "drafter.gamma = 100\n");
    CHECK_CONTAINS(out, "drafter.grad_clip = 1000000\n");
    struct dflash_cfg back;
    CHECK_OK(cfg_load(&back, NULL, err, sizeof err));
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *eq = strstr(line, " =");
        CHECK(eq);
        char assign[600];
        snprintf(assign, sizeof assign, "%.*s=%s", (int)(eq - line), line, eq[2] ? eq + 3 : "");
        CHECK_OK(cfg_set(&back, assign, err, sizeof err));     /* every printed line reads back */
    }
    free(out);
    CHECK(!memcmp(&back.drafter, &cfg.drafter, sizeof cfg.drafter));     /* bit for bit */

    /* The shipped file loads and documents every key with its default. */
    char shipped[512];
    snprintf(shipped, sizeof shipped, "%s/etc/dflash.ini", test_srcdir());
    CHECK_OK(cfg_load(&cfg, shipped, err, sizeof err));
    FILE *f = fopen(shipped, "r");
    CHECK(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    for (size_t i = 0; i < cfg_nkeys; i++) {
        char line[400];
        snprintf(line, sizeof line, "\n%s =%s%s\n", cfg_keys[i].key, *cfg_keys[i].def ? " " : "", cfg_keys[i].def);
        if (!strstr(text, line))
            TEST_FAIL("etc/dflash.ini lacks '%s.%s = %s'", cfg_keys[i].section, cfg_keys[i].key, cfg_keys[i].def);
    }
    printf("config ok: %zu keys\n", cfg_nkeys);
    return 0;
}
