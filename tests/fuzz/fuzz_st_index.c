/* fuzz_st_index.c: fuzz target for the sharded safetensors reader (st_open_dir with a
 * model.safetensors.index.json): the input is the index; two small valid shards sit beside it. */
#include <limits.h>
#include <sys/stat.h>
#include "model/st_writer.h"
#include "tests/fuzz/fuzz_st.h"

static char st_index_dir[PATH_MAX];

static void st_index_cleanup(void)
{
    char p[PATH_MAX + 64];
    static const char *const names[] = { ST_INDEX_SHARD1, ST_INDEX_SHARD2, "model.safetensors.index.json" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", st_index_dir, names[i]);
        unlink(p);
    }
    rmdir(st_index_dir);
}

/* A private dir with the two shards, made once per process. */
static int st_index_setup(void)
{
    static int done;
    if (done)
        return done > 0 ? 0 : -1;
    done = -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(st_index_dir, sizeof st_index_dir, "%s/dflash-fuzz-stidx-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    if (mkdir(st_index_dir, 0700) < 0 && errno != EEXIST)
        return -1;
    atexit(st_index_cleanup);
    static const float a[6] = { 1, 2, 3, 4, 5, 6 };
    static const uint16_t b[4] = { 0x3f80, 0x4000, 0xbf80, 0 };
    static const uint16_t c[4] = { 0x3c00, 0x4000, 0xbc00, 0 };
    static const int64_t d[3] = { 7, -1, 1 };
    const struct st_out s1[] = {
        { "a.weight", ST_F32, 2, { 2, 3 }, a },
        { "b.bias", ST_BF16, 1, { 4 }, b },
    };
    const struct st_out s2[] = {
        { "c.weight", ST_F16, 2, { 2, 2 }, c },
        { "d.ids", ST_I64, 1, { 3 }, d },
    };
    char p[PATH_MAX + 64], err[256];
    snprintf(p, sizeof p, "%s/%s", st_index_dir, ST_INDEX_SHARD1);
    if (st_write_file(p, s1, 2, NULL, 0, err, sizeof err) < 0)
        return -1;
    snprintf(p, sizeof p, "%s/%s", st_index_dir, ST_INDEX_SHARD2);
    if (st_write_file(p, s2, 2, NULL, 0, err, sizeof err) < 0)
        return -1;
    done = 1;
    return 0;
}

int fuzz_st_index(const uint8_t *data, size_t size)
{
    char p[PATH_MAX + 64], err[512];
    if (st_index_setup() < 0)
        return 0;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", st_index_dir);
    FILE *f = fopen(p, "wb");
    if (!f)
        return 0;
    size_t put = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || put != size)
        return 0;
    struct st_set *s = NULL;
    err[0] = 0;
    if (st_open_dir(&s, st_index_dir, err, sizeof err) == 0) {
        FUZZ_ASSERT(s);
        st_walk(s);
        st_close(s);
    } else {
        FUZZ_ASSERT(s == NULL);
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
    }
    return 0;
}
