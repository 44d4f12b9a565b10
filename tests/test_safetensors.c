/* test_safetensors.c: the safetensors reader on hand-made files: valid tensors and conversions,
 * and every kind of bad file (truncated, offsets past the end, overlap, bad dtype/shape/JSON, bad shards). */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/progress.h"
#include "model/cpu_ops.h"
#include "model/safetensors.h"
#include "tests/test.h"

static char tmpdir[512];

static const char *tpath(const char *name)
{
    static char p[4][1024];
    static int i;
    i = (i + 1) % 4;
    snprintf(p[i], sizeof p[i], "%s/%s", tmpdir, name);
    return p[i];
}

/* u64 header length (hlen_override if >= 0), header text, then data. */
static void write_st(const char *path, const char *header, const void *data, size_t len, long long hlen_override)
{
    FILE *f = fopen(path, "wb");
    CHECK(f);
    uint64_t h = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(header);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(h >> (8 * i));
    CHECK(fwrite(b, 1, 8, f) == 8);
    CHECK(fwrite(header, 1, strlen(header), f) == strlen(header));
    if (len)
        CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
}

/* Opening must fail with `code` and a one-line message naming the path and `needle`. */
static void expect_fail(const char *path, int code, const char *needle)
{
    struct st_set *s = (struct st_set *)1;
    char err[512] = "";
    int r = st_open_file(&s, path, err, sizeof err);
    if (r != code)
        TEST_FAIL("%s: got %d (%s), want %d; err: %s", needle, r, err_str(r), code, err);
    CHECK(s == NULL);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, needle);
    CHECK(!strchr(err, '\n'));
}

static unsigned char data[256];

static void test_valid(void)
{
    /* a: F32 [2,3] at 0..24; b: BF16 [4] at 24..32; c: F16 [4] at 32..40; d: I32 [1] at 40..44; e: empty */
    float a[6] = { 1, -2, 3.5f, 0, 1e-3f, -7 };
    uint16_t bf[4] = { 0x3f80, 0xc000, 0x7f80, 0x0001 };      /* 1, -2, inf, smallest subnormal */
    uint16_t hf[4] = { 0x3c00, 0xc400, 0x0001, 0x7bff };      /* 1, -4, 2^-24, 65504 */
    int32_t d = 42;
    memcpy(data, a, 24);
    memcpy(data + 24, bf, 8);
    memcpy(data + 32, hf, 8);
    memcpy(data + 40, &d, 4);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[32,40]},"
                      "\"d\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[40,44]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[44,44]}}   ";
    const char *p = tpath("valid.safetensors");
    write_st(p, hdr, data, 44, -1);
    struct st_set *s;
    char err[512] = "";
    CHECK_OK(st_open_file(&s, p, err, sizeof err));
    CHECK_INT(st_count(s), ==, 5);
    CHECK_STR(st_at(s, 0)->name, "a");          /* sorted by name */
    CHECK_STR(st_source(s), p);
    CHECK(st_find(s, "zz") == NULL);

    const struct st_tensor *t = st_find(s, "a");
    CHECK(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6);
    float out[8];
    CHECK_OK(st_read_f32(t, 0, 6, out));
    CHECK(memcmp(out, a, 24) == 0);
    CHECK_OK(st_read_f32(t, 4, 2, out));
    CHECK(out[0] == 1e-3f && out[1] == -7);
    CHECK_INT(st_read_f32(t, 4, 3, out), ==, -DF_ERANGE);

    CHECK_OK(st_read_f32(st_find(s, "b"), 0, 4, out));
    CHECK(out[0] == 1 && out[1] == -2 && isinf(out[2]) && out[3] == ldexpf(1, -133));
    CHECK_OK(st_read_f32(st_find(s, "c"), 0, 4, out));
    CHECK(out[0] == 1 && out[1] == -4 && out[2] == ldexpf(1, -24) && out[3] == 65504);
    uint16_t o16[6];
    CHECK_OK(st_read_bf16(st_find(s, "a"), 0, 6, o16));
    for (int i = 0; i < 6; i++)
        CHECK_INT(o16[i], ==, cpu_f32_to_bf16_one(a[i]));
    CHECK_INT(st_read_f32(st_find(s, "d"), 0, 1, out), ==, -DF_EUNSUPPORTED);
    CHECK_INT(st_find(s, "e")->numel, ==, 0);

    /* st_expect: each failure names the file and the tensor */
    int64_t good[2] = { 2, 3 }, wrong[2] = { 3, 2 };
    CHECK_OK(st_expect(s, "a", 2, good, &t, err, sizeof err));
    CHECK_INT(st_expect(s, "a", 2, wrong, &t, err, sizeof err), ==, -DF_ESHAPE);
    CHECK_CONTAINS(err, p);
    CHECK_CONTAINS(err, "'a'");
    CHECK_CONTAINS(err, "[2, 3] does not match config.json (expected [3, 2])");
    int64_t one[1] = { 1 };
    CHECK_INT(st_expect(s, "d", 1, one, &t, err, sizeof err), ==, -DF_EUNSUPPORTED);
    CHECK_CONTAINS(err, "'d': dtype I32 is not supported");
    CHECK_CONTAINS(err, p);
    CHECK_INT(st_expect(s, "missing.weight", 1, one, &t, err, sizeof err), ==, -DF_EMISSING);
    CHECK_CONTAINS(err, "'missing.weight' not found");
    CHECK_CONTAINS(err, p);
    /* a weight with an infinity (b[2]), in every float dtype: refused, the element named */
    int64_t four[1] = { 4 };
    CHECK_INT(st_expect(s, "b", 1, four, &t, err, sizeof err), ==, -DF_ENAN);
    CHECK_CONTAINS(err, "'b': element 2 is NaN or infinite");
    CHECK_CONTAINS(err, p);
    CHECK_OK(st_expect(s, "c", 1, four, &t, err, sizeof err));     /* 65504: finite */
    st_close(s);
    float fnan[5000];
    uint16_t hnan[3] = { 0x3c00, 0x0000, 0x7e00 };                /* F16 NaN at 2 */
    for (int i = 0; i < 5000; i++)
        fnan[i] = (float)i;
    fnan[4321] = NAN;                                             /* in the second block of 4096 */
    static unsigned char big[5000 * 4 + 6];
    memcpy(big, fnan, sizeof fnan);
    memcpy(big + sizeof fnan, hnan, sizeof hnan);
    const char *pn = tpath("nan.safetensors");
    write_st(pn, "{\"f\":{\"dtype\":\"F32\",\"shape\":[5000],\"data_offsets\":[0,20000]},"
                 "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[20000,20006]}}", big, sizeof big, -1);
    CHECK_OK(st_open_file(&s, pn, err, sizeof err));
    int64_t n5000[1] = { 5000 }, n3[1] = { 3 };
    CHECK_INT(st_expect(s, "f", 1, n5000, &t, err, sizeof err), ==, -DF_ENAN);
    CHECK_CONTAINS(err, "'f': element 4321 is NaN or infinite");
    CHECK_INT(st_expect(s, "h", 1, n3, &t, err, sizeof err), ==, -DF_ENAN);
    CHECK_CONTAINS(err, "'h': element 2 is NaN or infinite");
    st_close(s);
    st_close(NULL);

    /* a header without tensors is a valid (empty) file; an empty sharded index an empty set */
    const char *none = tpath("none.safetensors");
    write_st(none, "{\"__metadata__\":{\"format\":\"pt\"}}", NULL, 0, -1);
    CHECK_OK(st_open_file(&s, none, err, sizeof err));
    CHECK_INT(st_count(s), ==, 0);
    CHECK(st_find(s, "a") == NULL && st_at(s, 0) == NULL);
    st_close(s);
    write_st(none, "{}", NULL, 0, -1);
    CHECK_OK(st_open_file(&s, none, err, sizeof err));
    CHECK_INT(st_count(s), ==, 0);
    st_close(s);
    write_st(none, "{} \r\n\t    ", NULL, 0, -1);     /* blanks after the object: padding */
    CHECK_OK(st_open_file(&s, none, err, sizeof err));
    CHECK_INT(st_count(s), ==, 0);
    st_close(s);

    /* round to nearest even, NaN kept */
    CHECK_INT(cpu_f32_to_bf16_one(1.0f + ldexpf(1, -8)), ==, 0x3f80);      /* tie -> even */
    CHECK_INT(cpu_f32_to_bf16_one(1.0f + 3 * ldexpf(1, -8)), ==, 0x3f82);  /* tie -> even (up) */
    CHECK(isnan(cpu_bf16_to_f32_one(cpu_f32_to_bf16_one(NAN))));
}

static void test_bad_files(void)
{
    const char *p;
    char err[512];
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";

    p = tpath("tiny.safetensors");
    write_text(p, "abc");
    expect_fail(p, -DF_ETRUNC, "shorter than the 8-byte header length");

    p = tpath("fifo.safetensors");                       /* refused at once, not waited on */
    CHECK_OK(mkfifo(p, 0600));
    expect_fail(p, -DF_EFORMAT, "not a regular file");

    p = tpath("truncated.safetensors");                  /* data block cut short */
    write_st(p, ok, data, 10, -1);
    expect_fail(p, -DF_ETRUNC, "tensor 'w': data_offsets [0, 16] run past the end");

    p = tpath("hlen.safetensors");                       /* header length past the end */
    write_st(p, ok, data, 16, 1 << 20);
    expect_fail(p, -DF_ETRUNC, "header length 1048576 runs past the end");
    write_st(p, ok, data, 16, (long long)1 << 62);
    expect_fail(p, -DF_ETRUNC, "header length");

    p = tpath("past.safetensors");                       /* offsets past the data block */
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", data, 20, -1);
    expect_fail(p, -DF_ETRUNC, "tensor 'w': data_offsets [16, 32] run past the end of the data block (20 bytes)");

    p = tpath("overlap.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", data, 20, -1);
    expect_fail(p, -DF_EFORMAT, "tensors 'w' [0, 16) and 'v' [12, 20) overlap");

    /* bytes no tensor owns: a hole, a head, a tail (the format's own readers refuse them) */
    p = tpath("hole.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", data, 20, -1);
    expect_fail(p, -DF_EFORMAT, "data bytes [8, 12) belong to no tensor (after 'w')");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12, -1);
    expect_fail(p, -DF_EFORMAT, "data bytes [0, 4) belong to no tensor (before the first tensor)");
    write_st(p, ok, data, 20, -1);
    expect_fail(p, -DF_EFORMAT, "data bytes [16, 20) belong to no tensor (after 'w', at the end of the file)");
    write_st(p, "{}", data, 4, -1);
    expect_fail(p, -DF_EFORMAT, "data bytes [0, 4) belong to no tensor (before the first tensor, at the end");

    /* a NUL in a name would make "w\u0000x" answer to "w"; an escaped backslash before u0000 is no NUL */
    p = tpath("nul.safetensors");
    write_st(p, "{\"w\\u0000x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "header has a NUL character (\\u0000) in a string, at byte 3");
    write_st(p, "{\"__metadata__\":{\"a\":\"\\\\\\u0000\"}}", data, 0, -1);
    expect_fail(p, -DF_EFORMAT, "NUL character");
    {   /* a raw NUL byte in a name: cJSON keeps it, and the name would be read as "w" */
        static const char raw[] = "{\"w\0x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
        const size_t n = sizeof raw - 1;
        FILE *f = fopen(p, "wb");
        CHECK(f);
        unsigned char len8[8] = { (unsigned char)n };
        CHECK(fwrite(len8, 1, 8, f) == 8 && fwrite(raw, 1, n, f) == n && fwrite(data, 1, 16, f) == 16);
        fclose(f);
        expect_fail(p, -DF_EFORMAT, "header has a NUL byte, at byte 3");
    }
    struct st_set *ns = NULL;
    write_st(p, "{\"w\\\\u0000x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    CHECK_OK(st_open_file(&ns, p, err, sizeof err));
    CHECK(st_find(ns, "w\\u0000x") != NULL);
    st_close(ns);

    p = tpath("twice.safetensors");                      /* one name twice: said so */
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w' appears twice");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w' appears twice");

    p = tpath("field-twice.safetensors");                /* a field twice in an entry: readers differ */
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"shape\":[1,2],\"data_offsets\":[0,8]}}", data, 8, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'a': shape appears twice in its entry");
    write_st(p, "{\"__metadata__\":{\"format\":\"pt\",\"format\":\"np\"},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8, -1);
    expect_fail(p, -DF_EFORMAT, "__metadata__: format appears twice in its entry");

    p = tpath("dtype.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    expect_fail(p, -DF_EUNSUPPORTED, "tensor 'w': unknown dtype 'Q4_K'");

    p = tpath("size.safetensors");                       /* shape disagrees with the byte span */
    write_st(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w': shape [4] of BF16 needs 8 bytes, data_offsets span 16");

    p = tpath("reversed.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,0]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "reversed");

    const char *bad_offsets[] = { "[0]", "[-4,12]", "[0.5,16]", "\"0,16\"", "[0,16,3]", "[0,1e300]" };
    char hdr[256];
    for (size_t i = 0; i < sizeof bad_offsets / sizeof *bad_offsets; i++) {
        snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":%s}}", bad_offsets[i]);
        write_st(p, hdr, data, 16, -1);
        expect_fail(p, -DF_EFORMAT, "tensor 'w': data_offsets must be");
    }
    const char *bad_shapes[] = { "[-1]", "[2.5]", "[1,1,1,1,1,1,1,1,1]", "4", "[\"4\"]" };
    for (size_t i = 0; i < sizeof bad_shapes / sizeof *bad_shapes; i++) {
        snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[0,16]}}", bad_shapes[i]);
        write_st(p, hdr, data, 16, -1);
        expect_fail(p, -DF_EFORMAT, "tensor 'w': shape");
    }
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
             data, 16, -1);
    expect_fail(p, -DF_ERANGE, "tensor 'w': shape too large");

    p = tpath("json.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "header is not valid JSON");
    write_st(p, "[1,2,3]", data, 0, -1);
    expect_fail(p, -DF_EFORMAT, "header is not a JSON object");
    /* after the object only blanks (writers pad with spaces): a second object's tensor, or
     * junk, is a damaged header, not one to read the first part of */
    char two[200];
    snprintf(two, sizeof two, "%s%s", ok, ok);
    write_st(p, two, data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "header has bytes after its JSON object (at byte 55 of 110)");
    snprintf(two, sizeof two, "%s \n\tx  ", ok);
    write_st(p, two, data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "header has bytes after its JSON object (at byte 58 of 61)");
    write_st(p, "{\"w\":[1]}", data, 0, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w': header entry is not an object");
    write_st(p, "{\"w\":{\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w': dtype missing");
    write_st(p, "{\"__metadata__\":3}", data, 0, -1);
    expect_fail(p, -DF_EFORMAT, "__metadata__");

    p = tpath("dup.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, 16, -1);
    expect_fail(p, -DF_EFORMAT, "tensor 'w' appears twice");

    struct st_set *s;
    CHECK(st_open_file(&s, tpath("no-such-file"), err, sizeof err) == -ENOENT);
    CHECK_CONTAINS(err, "no-such-file");
}

/* Header bytes flipped at random: always a clean error or a valid set, never a crash (run under ASan). */
static void test_mutations(void)
{
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
    const char *p = tpath("mut.safetensors");
    size_t hl = strlen(hdr);
    char buf[512];
    unsigned seed = 12345;
    int opened = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, hdr, hl + 1);
        for (int k = 0; k < 1 + it % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t pos = (seed >> 8) % hl;
            seed = seed * 1103515245u + 12345u;
            const char alphabet[] = "0123456789[]{},:\"-.eE abFB";
            buf[pos] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
        }
        write_st(p, buf, data, 22 + it % 5, -1);
        struct st_set *s;
        char err[512] = "";
        if (st_open_file(&s, p, err, sizeof err) == 0) {
            opened++;
            for (size_t i = 0; i < st_count(s); i++) {
                const struct st_tensor *t = st_at(s, i);
                float tmp[64];
                if (t->numel <= 64)
                    st_read_f32(t, 0, t->numel, tmp);
            }
            st_close(s);
        } else {
            CHECK(err[0] != 0);
        }
    }
    printf("mutations: %d of 3000 still valid\n", opened);
}

static void test_sharded(void)
{
    char d[1024], err[512] = "";
    snprintf(d, sizeof d, "%s/shards", tmpdir);
    CHECK(mkdir(d, 0700) == 0);
    char p1[1100], p2[1100], idx[1100];
    snprintf(p1, sizeof p1, "%s/m-1.safetensors", d);
    snprintf(p2, sizeof p2, "%s/m-2.safetensors", d);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    write_st(p1, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8, -1);
    write_st(p2, "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, 8, -1);
    write_text(idx, "{\"metadata\":{},\"weight_map\":{\"x\":\"m-1.safetensors\",\"y\":\"m-2.safetensors\","
                    "\"z\":\"m-2.safetensors\"}}");
    struct st_set *s;
    CHECK_OK(st_open_dir(&s, d, err, sizeof err));
    CHECK_INT(st_count(s), ==, 3);
    CHECK(st_find(s, "x") && strstr(st_find(s, "x")->file, "m-1"));
    CHECK(st_find(s, "z") && strstr(st_find(s, "z")->file, "m-2"));
    int64_t sh[1] = { 3 };
    CHECK_INT(st_expect(s, "nope", 1, sh, NULL, err, sizeof err), ==, -DF_EMISSING);
    CHECK_CONTAINS(err, "model.safetensors.index.json: tensor 'nope' not found");
    st_close(s);

    struct { const char *index; int code; const char *needle; } bad[] = {
        { "{\"weight_map\":{\"x\":\"m-2.safetensors\"}}", -DF_EMISSING, "tensor 'x' is not in m-2.safetensors" },
        { "{\"weight_map\":{\"x\":\"../m-1.safetensors\"}}", -DF_EFORMAT, "tensor 'x': file must be a plain file name" },
        { "{\"weight_map\":{\"x\":\"gone.safetensors\"}}", -DF_EMISSING,
          "model.safetensors.index.json: weight_map: tensor 'x': shard gone.safetensors does not exist" },
        { "{\"weight_map\":[]}", -DF_EFORMAT, "weight_map missing" },
        { "{\"weight_map\":", -DF_EFORMAT, "not valid JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(idx, bad[i].index);
        s = (struct st_set *)1;
        int r = st_open_dir(&s, d, err, sizeof err);
        if (r != bad[i].code)
            TEST_FAIL("index %zu: got %d, want %d: %s", i, r, bad[i].code, err);
        CHECK(s == NULL);
        CHECK_CONTAINS(err, bad[i].needle);
        CHECK_CONTAINS(err, d);
    }
    /* the same tensor in two shards */
    write_st(p2, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8, -1);
    write_text(idx, "{\"weight_map\":{\"x\":\"m-1.safetensors\",\"y\":\"m-2.safetensors\"}}");
    CHECK_INT(st_open_dir(&s, d, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "tensor 'x' appears twice");

    /* an index that maps nothing */
    write_text(idx, "{\"weight_map\":{}}");
    CHECK_OK(st_open_dir(&s, d, err, sizeof err));
    CHECK_INT(st_count(s), ==, 0);
    st_close(s);

    /* model.safetensors beside an index (a folder saved again in the other layout): the single
     * file is read, as transformers reads it, also when the index names a shard that is gone */
    char single[1100];
    snprintf(single, sizeof single, "%s/model.safetensors", d);
    write_st(single, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4, -1);
    write_text(idx, "{\"weight_map\":{\"x\":\"m-1.safetensors\",\"y\":\"gone.safetensors\"}}");
    CHECK_OK(st_open_dir(&s, d, err, sizeof err));
    CHECK_INT(st_count(s), ==, 1);
    CHECK(st_find(s, "w") && !st_find(s, "x") && strstr(st_find(s, "w")->file, "model.safetensors"));
    st_close(s);
    CHECK_OK(unlink(single));

    /* neither file */
    char empty[1100];
    snprintf(empty, sizeof empty, "%s/empty", tmpdir);
    CHECK(mkdir(empty, 0700) == 0);
    CHECK_INT(st_open_dir(&s, empty, err, sizeof err), ==, -DF_EMISSING);
    CHECK_CONTAINS(err, empty);
}

/* The weights' fingerprint: the same tensors give the same one however they are sharded; a byte
 * of a sample, a name or a shape changed gives another. */
static uint64_t fingerprint_of(const char *name, const char *header, const void *d, size_t len)
{
    char dir[1024], path[1100], err[512] = "";
    snprintf(dir, sizeof dir, "%s/fp-%s", tmpdir, name);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, header, d, len, -1);
    uint64_t fp = 0;
    CHECK_OK(st_dir_fingerprint(dir, &fp, err, sizeof err));
    CHECK(fp != 0);
    return fp;
}

static void test_fingerprint(void)
{
    static unsigned char big[4096 + 8];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 13 + 5);
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1024],\"data_offsets\":[0,4096]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4096,4104]}}";
    uint64_t one = fingerprint_of("one", hdr, big, sizeof big);
    CHECK(fingerprint_of("again", hdr, big, sizeof big) == one);
    /* sharded: a in one file, b in another */
    char d[1024], p1[1100], p2[1100], idx[1100], err[512] = "";
    snprintf(d, sizeof d, "%s/fp-shards", tmpdir);
    CHECK(mkdir(d, 0700) == 0);
    snprintf(p1, sizeof p1, "%s/m-1.safetensors", d);
    snprintf(p2, sizeof p2, "%s/m-2.safetensors", d);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    write_st(p1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1024],\"data_offsets\":[0,4096]}}", big, 4096, -1);
    write_st(p2, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", big + 4096, 8, -1);
    write_text(idx, "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}");
    uint64_t sharded = 0;
    CHECK_OK(st_dir_fingerprint(d, &sharded, err, sizeof err));
    CHECK(sharded == one);
    /* other weights: the first and the last bytes of a (samples), a byte of the small b */
    size_t at[] = { 0, 4095, 4100 };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "byte%zu", at[i]);
        big[at[i]] ^= 1;
        CHECK(fingerprint_of(name, hdr, big, sizeof big) != one);
        big[at[i]] ^= 1;
    }
    /* another name, another shape of the same bytes */
    CHECK(fingerprint_of("renamed", "{\"c\":{\"dtype\":\"F32\",\"shape\":[1024],\"data_offsets\":[0,4096]},"
                                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4096,4104]}}",
                         big, sizeof big) != one);
    CHECK(fingerprint_of("reshaped", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,512],\"data_offsets\":[0,4096]},"
                                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4096,4104]}}",
                         big, sizeof big) != one);
    uint64_t fp = 7;
    snprintf(d, sizeof d, "%s/fp-none", tmpdir);
    CHECK_INT(st_dir_fingerprint(d, &fp, err, sizeof err), ==, -DF_EMISSING);
    CHECK(fp == 7);
}

static int ticks;
static void count_tick(void *arg)
{
    (void)arg;
    ticks++;
}

/* A tensor's scan and reads tick the start's progress hook every PROGRESS_CHUNK_BYTES of the file
 * (a daemon's watchdog: more start time while the weights are read), small reads adding up, and
 * the values come out right across the pieces. */
static void test_progress(void)
{
    const int64_t n = (int64_t)(PROGRESS_CHUNK_BYTES / 2) * 5 / 2;   /* 2.5 pieces of bf16 */
    uint16_t *w = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * 4);
    uint16_t *b = malloc((size_t)n * 2);
    CHECK(w && f && b);
    for (int64_t i = 0; i < n; i++)
        w[i] = (uint16_t)(0x3f80 + (i % 127));   /* 1.0 .. 1.98: finite */
    char hdr[160];
    snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[0,%lld]}}",
             (long long)n, (long long)(2 * n));
    write_st(tpath("big.safetensors"), hdr, w, (size_t)n * 2, -1);
    struct st_set *s;
    char err[512];
    CHECK_OK(st_open_file(&s, tpath("big.safetensors"), err, sizeof err));
    progress_set(count_tick, NULL);
    const struct st_tensor *t;
    CHECK_OK(st_expect(s, "w", 1, &n, &t, err, sizeof err));
    CHECK_INT(ticks, ==, 2);    /* the finite-value scan: at 1 and 2 pieces, half a piece left over */
    ticks = 0;
    CHECK_OK(st_read_f32(t, 0, n, f));
    CHECK_INT(ticks, ==, 3);    /* 0.5 + 2.5 pieces */
    progress_set(count_tick, NULL);     /* (counts from 0 again) */
    ticks = 0;
    CHECK_OK(st_read_bf16(t, 1, n - 1, b));
    CHECK_INT(ticks, ==, 2);
    progress_set(count_tick, NULL);
    ticks = 0;
    const int64_t third = (int64_t)(PROGRESS_CHUNK_BYTES / 2) / 3 + 1;     /* 3 reads: just over a piece */
    for (int i = 0; i < 3; i++) {
        CHECK_INT(ticks, ==, 0);
        CHECK_OK(st_read_f32(t, (int64_t)i * third, third, f));
    }
    CHECK_INT(ticks, ==, 1);
    CHECK_OK(st_read_f32(t, 0, n, f));
    for (int64_t i = 0; i < n - 1; i++)
        if (f[i] != cpu_bf16_to_f32_one(w[i]) || b[i] != w[i + 1])
            TEST_FAIL("element %lld: read %g / %04x, file %04x", (long long)i, f[i], b[i], w[i]);
    progress_set(NULL, NULL);
    st_close(s);
    unlink(tpath("big.safetensors"));
    free(w);
    free(f);
    free(b);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/st-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    CHECK(mkdir(tmpdir, 0700) == 0);
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 37 + 11);
    test_valid();
    test_bad_files();
    test_mutations();
    test_sharded();
    test_fingerprint();
    test_progress();
    printf("ok\n");
    return 0;
}
