/* test_proto.c: every message round-trips; truncated, oversized, wrong-version,
 * garbage and non-canonical frames are rejected with a reason. */
#include <errno.h>
#include <stddef.h>
#include "common/err.h"
#include "ipc/proto.h"
#include "tests/test.h"

static uint8_t buf[PROTO_MAX_FRAME + 64] __attribute__((aligned(8)));

/* Encode, decode, re-encode: same bytes, same fields. Returns the frame size. */
static int64_t roundtrip(const struct proto_msg *m, struct proto_msg *out)
{
    char err[256] = "";
    int64_t n = proto_encode(m, buf, sizeof buf, err, sizeof err);
    if (n < 0)
        TEST_FAIL("encode %s: %s", proto_type_name(m->type), err);
    CHECK_INT(proto_frame_size(buf, (size_t)n, err, sizeof err), ==, n);
    CHECK_INT(proto_frame_size(buf, 11, err, sizeof err), ==, 0);
    int r = proto_decode(buf, (size_t)n, out, err, sizeof err);
    if (r < 0)
        TEST_FAIL("decode %s: %s", proto_type_name(m->type), err);
    CHECK_INT(out->type, ==, m->type);
    CHECK_INT(out->version, ==, PROTO_VERSION);
    static uint8_t again[PROTO_MAX_FRAME];
    CHECK_INT(proto_encode(out, again, sizeof again, err, sizeof err), ==, n);
    CHECK(!memcmp(buf, again, (size_t)n));
    /* Every strict prefix is a truncated frame. */
    for (int64_t cut = 0; cut < n; cut += (n > 600 ? 97 : 1)) {
        struct proto_msg x;
        err[0] = 0;
        CHECK(proto_decode(buf, (size_t)cut, &x, err, sizeof err) < 0);
        CHECK(err[0]);
    }
    return n;
}

static void expect_reject(const void *frame, size_t len, int code, const char *needle)
{
    struct proto_msg m;
    char err[256] = "";
    int r = proto_decode(frame, len, &m, err, sizeof err);
    if (r >= 0)
        TEST_FAIL("accepted a bad frame (expected '%s')", needle);
    if (code)
        CHECK_INT(r, ==, code);
    CHECK_CONTAINS(err, needle);
}

/* A text too long for its field ends in "...", cut before a UTF-8 character, not inside one;
 * one that fits is kept as it is. */
static void text_fields(void)
{
    char f[16], src[64];
    proto_textset(f, sizeof f, "fits, fifteen!!");
    CHECK_STR(f, "fits, fifteen!!");
    proto_textset(f, sizeof f, "one byte too long");
    CHECK_STR(f, "one byte too...");
    CHECK_INT(f[15], ==, 0);
    snprintf(src, sizeof src, "abcdefghijk\xc3\xa9xyz");   /* the cut (at 12) falls inside the e-acute */
    proto_textset(f, sizeof f, src);
    CHECK_STR(f, "abcdefghijk...");
    proto_textset(f, sizeof f, NULL);
    CHECK_STR(f, "");
}

int main(void)
{
    text_fields();
    struct proto_msg m, d;
    char err[256];

    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.hello = (struct proto_hello){ .role = PROTO_ROLE_TARGET, .device = 3, .pid = 1234, .group_rank = PROTO_NONE32,
                                    .start_ticks = 99, .token = 0x123456789ull, .group_generation = 0 };
    proto_strset(m.hello.name, sizeof m.hello.name, "target@3");
    roundtrip(&m, &d);
    CHECK_INT(d.hello.device, ==, 3);
    CHECK_INT(d.hello.token, ==, 0x123456789ull);
    CHECK_STR(d.hello.name, "target@3");

    memset(&m, 0, sizeof m);
    m.type = PROTO_WELCOME;
    m.welcome = (struct proto_welcome){ .member_id = 7, .heartbeat_ms = 500, .dead_after_ms = 5000,
                                        .cluster_state = PROTO_STATE_RUNNING, .n_regrants = 2, .ring_slots = 16,
                                        .world_size = 2, .max_seq_len = 4096, .epochs = 3 };
    proto_strset(m.welcome.ring_name, sizeof m.welcome.ring_name, "/dflash-x");
    proto_strset(m.welcome.dataset_path, sizeof m.welcome.dataset_path, "/data/set.bin");
    m.welcome.dataset_checksum = 0x0123456789abcdefull;
    m.welcome.resumes = 4;
    int64_t wn = roundtrip(&m, &d);
    CHECK_STR(d.welcome.dataset_path, "/data/set.bin");
    CHECK_INT(d.welcome.n_regrants, ==, 2);
    CHECK_INT(d.welcome.dataset_checksum, ==, 0x0123456789abcdefull);
    CHECK_INT(d.welcome.resumes, ==, 4);
    {
        uint8_t wb[1024];
        char werr[256];
        CHECK_INT(proto_encode(&m, wb, sizeof wb, werr, sizeof werr), ==, wn);
        uint32_t one = 1;       /* (the payload is not aligned in wb: bytes, not a struct access) */
        memcpy(wb + sizeof(struct proto_hdr) + offsetof(struct proto_welcome, pad), &one, sizeof one);
        CHECK(proto_decode(wb, (size_t)wn, &d, werr, sizeof werr) == -DF_EFORMAT);
        CHECK_CONTAINS(werr, "pad must be 0");
    }

    memset(&m, 0, sizeof m);
    m.type = PROTO_CONTROL;
    m.control.cmd = PROTO_CTL_RESUME;
    m.control.resumes = 9;
    roundtrip(&m, &d);
    CHECK_INT(d.control.resumes, ==, 9);

    memset(&m, 0, sizeof m);
    m.type = PROTO_REFUSE;
    m.refuse.code = -DF_EVERSION;
    m.refuse.server_version = PROTO_VERSION;
    proto_strset(m.refuse.message, sizeof m.refuse.message, "protocol version 9, expected 1");
    int64_t n = roundtrip(&m, &d);
    CHECK_STR(d.refuse.message, "protocol version 9, expected 1");
    /* REFUSE is readable whatever the version: a mismatched peer learns why. */
    ((struct proto_hdr *)buf)->version = 77;
    CHECK_OK(proto_decode(buf, (size_t)n, &d, err, sizeof err));
    CHECK_INT(d.version, ==, 77);

    memset(&m, 0, sizeof m);
    m.type = PROTO_HEARTBEAT;
    m.heartbeat = (struct proto_heartbeat){ .state = PROTO_STATE_RUNNING, .step = 41, .loss = NAN, .tokens_per_s = 1.5e5 };
    roundtrip(&m, &d);
    CHECK(isnan(d.heartbeat.loss));  /* a NaN loss must reach the coordinator */
    CHECK_INT(d.heartbeat.step, ==, 41);

    memset(&m, 0, sizeof m);
    m.type = PROTO_LEASE_REQUEST;
    m.lease_request.n = 4;
    roundtrip(&m, &d);
    CHECK_INT(d.lease_request.n, ==, 4);

    uint32_t samples[1000];
    for (uint32_t i = 0; i < 1000; i++)
        samples[i] = i * 7919u;
    memset(&m, 0, sizeof m);
    m.type = PROTO_LEASE_GRANT;
    m.grant = (struct proto_lease_grant){ .batch_id = 1ull << 40, .epoch = 2, .flags = PROTO_GRANT_REGRANT,
                                          .n_samples = 1000, .n_tokens = 16000, .max_seq_len = 4096, .lease = 2 };
    m.samples = samples;
    roundtrip(&m, &d);
    CHECK_INT(d.grant.n_samples, ==, 1000);
    CHECK_INT(d.grant.lease, ==, 2);
    for (uint32_t i = 0; i < 1000; i++)
        CHECK_INT(proto_grant_sample(&d, i), ==, samples[i]);

    memset(&m, 0, sizeof m);
    m.type = PROTO_LEASE_REVOKE;
    m.batch.batch_id = 5;
    roundtrip(&m, &d);
    m.type = PROTO_LEASE_RETURN;
    roundtrip(&m, &d);
    CHECK_INT(d.batch.batch_id, ==, 5);

    memset(&m, 0, sizeof m);
    m.type = PROTO_PUBLISHED;
    m.published = (struct proto_published){ .seq = 9, .batch_id = 10, .slot = 3, .n_tokens = 777 };
    roundtrip(&m, &d);
    CHECK_INT(d.published.slot, ==, 3);

    memset(&m, 0, sizeof m);
    m.type = PROTO_JOIN_GROUP;
    CHECK_INT(roundtrip(&m, &d), ==, (int64_t)sizeof(struct proto_hdr));

    memset(&m, 0, sizeof m);
    m.type = PROTO_GROUP;
    m.group.generation = 3;
    m.group.rank = 1;
    m.group.world_size = 2;
    m.group.ckpt_step = 1000;
    m.group.run_id = 0x8badf00d12345678ull;
    for (int i = 0; i < PROTO_NCCL_ID_BYTES; i++)
        m.group.group_id[i] = (uint8_t)(i * 13 + 1);
    proto_strset(m.group.coll_name, sizeof m.group.coll_name, "/dflash-x-coll-3");
    proto_strset(m.group.ckpt_dir, sizeof m.group.ckpt_dir, "/var/lib/dflash/ckpt/step-1000");
    roundtrip(&m, &d);
    CHECK(!memcmp(d.group.group_id, m.group.group_id, PROTO_NCCL_ID_BYTES));
    CHECK_STR(d.group.ckpt_dir, "/var/lib/dflash/ckpt/step-1000");
    CHECK_INT(d.group.n_done, ==, 0);
    CHECK(d.group.run_id == 0x8badf00d12345678ull);
    /* with the batch ids kept from earlier generations, the most a frame takes */
    static uint64_t done[PROTO_MAX_GROUP_IDS];
    for (uint32_t i = 0; i < PROTO_MAX_GROUP_IDS; i++)
        done[i] = ((uint64_t)(i % 3) << 32) | (i * 2654435761u);
    m.group.n_done = PROTO_MAX_GROUP_IDS;
    m.ids = done;
    CHECK_INT(roundtrip(&m, &d), ==, (int64_t)(sizeof(struct proto_hdr) + sizeof(struct proto_group) +
                                               8ull * PROTO_MAX_GROUP_IDS));
    CHECK_INT(d.group.n_done, ==, PROTO_MAX_GROUP_IDS);
    for (uint32_t i = 0; i < PROTO_MAX_GROUP_IDS; i += 997)
        CHECK_INT(proto_group_id(&d, i), ==, done[i]);
    CHECK_INT(proto_group_id(&d, PROTO_MAX_GROUP_IDS - 1), ==, done[PROTO_MAX_GROUP_IDS - 1]);

    memset(&m, 0, sizeof m);
    m.type = PROTO_TRAINED;
    m.trained = (struct proto_trained){ .seq = 1, .batch_id = 2, .step = 3, .generation = 4, .rank = 1, .lease = 5 };
    roundtrip(&m, &d);
    CHECK_INT(d.trained.generation, ==, 4);
    CHECK_INT(d.trained.lease, ==, 5);

    memset(&m, 0, sizeof m);
    m.type = PROTO_SKIPPED;
    m.skipped = (struct proto_skipped){ .seq = 6, .batch_id = 7, .lease = 8 };
    roundtrip(&m, &d);
    CHECK_INT(d.skipped.batch_id, ==, 7);
    CHECK_INT(d.skipped.lease, ==, 8);

    /* CKPT_BAD: the reason is a peer's text (control characters arrive as '?'); a code that is no
     * error and a nonzero pad are refused */
    memset(&m, 0, sizeof m);
    m.type = PROTO_CKPT_BAD;
    m.ckpt_bad = (struct proto_ckpt_bad){ .generation = 3, .step = 40, .code = -DF_ETRUNC };
    proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, "/c/step-0000000040");
    proto_strset(m.ckpt_bad.reason, sizeof m.ckpt_bad.reason, "short\nread");
    {
        uint8_t fr[1024];
        char e[256];
        int64_t fn = proto_encode(&m, fr, sizeof fr, e, sizeof e);
        CHECK(fn > 0);
        CHECK_INT(proto_decode(fr, (size_t)fn, &d, e, sizeof e), ==, 0);
        CHECK_INT(d.ckpt_bad.step, ==, 40);
        CHECK_INT(d.ckpt_bad.code, ==, -DF_ETRUNC);
        CHECK_STR(d.ckpt_bad.dir, "/c/step-0000000040");
        CHECK_STR(d.ckpt_bad.reason, "short?read");
        m.ckpt_bad.code = 0;
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_ERANGE);
        m.ckpt_bad.code = -DF_ETRUNC;
        m.ckpt_bad.pad = 1;
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_EFORMAT);
        m.ckpt_bad.pad = 0;
        memset(m.ckpt_bad.dir, 0, sizeof m.ckpt_bad.dir);     /* a path cannot be mended: refused */
        strcpy(m.ckpt_bad.dir, "/c/step-\n40");
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_EFORMAT);
        CHECK_CONTAINS(e, "dir holds a control character");
    }

    /* BYE: the reason is a peer's text ('?' for control characters); an exit status past 255 and
     * a nonzero pad are refused */
    memset(&m, 0, sizeof m);
    m.type = PROTO_BYE;
    m.bye.exit_status = 78;
    proto_strset(m.bye.reason, sizeof m.bye.reason, "target-d@0 exits 78:\tconfig");
    {
        uint8_t fr[1024];
        char e[256];
        int64_t fn = proto_encode(&m, fr, sizeof fr, e, sizeof e);
        CHECK(fn > 0);
        CHECK_INT(proto_decode(fr, (size_t)fn, &d, e, sizeof e), ==, 0);
        CHECK_INT(d.type, ==, PROTO_BYE);
        CHECK_INT(d.bye.exit_status, ==, 78);
        CHECK_STR(d.bye.reason, "target-d@0 exits 78:?config");
        CHECK_STR(proto_type_name(PROTO_BYE), "BYE");
        m.bye.exit_status = 256;
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_ERANGE);
        CHECK_CONTAINS(e, "exit status 256");
        m.bye.exit_status = 0;
        m.bye.pad = 1;
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_EFORMAT);
    }

    memset(&m, 0, sizeof m);
    m.type = PROTO_CHECKPOINTED;
    m.checkpointed.seq = 5;
    m.checkpointed.step = 1000;
    m.checkpointed.generation = 4;
    proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, "/ck/step-1000");
    roundtrip(&m, &d);
    CHECK_STR(d.checkpointed.dir, "/ck/step-1000");
    {
        uint8_t fr[1024];
        char e[256];
        memset(m.checkpointed.dir, 0, sizeof m.checkpointed.dir);
        strcpy(m.checkpointed.dir, "/ck/\033[2Jstep-1000");
        CHECK(proto_encode(&m, fr, sizeof fr, e, sizeof e) == -DF_EFORMAT);
    }

    memset(&m, 0, sizeof m);
    m.type = PROTO_ACK;
    m.ack.seq = 77;
    m.ack.status = -DF_ESTATE;
    roundtrip(&m, &d);
    CHECK_INT(d.ack.status, ==, -DF_ESTATE);

    memset(&m, 0, sizeof m);
    m.type = PROTO_ERROR;
    m.error.fatal = 1;
    m.error.code = -DF_ENAN;
    proto_strset(m.error.message, sizeof m.error.message, "loss is NaN at step 12");
    roundtrip(&m, &d);
    CHECK_STR(d.error.message, "loss is NaN at step 12");

    /* a peer's text arrives without control characters (no forged log lines, no terminal
     * escapes in dflashctl's output); other bytes, UTF-8 included, unchanged */
    static const struct { enum proto_type type; size_t off, cap; } texts[] = {
        { PROTO_HELLO, offsetof(struct proto_msg, hello.name), sizeof m.hello.name },
        { PROTO_REFUSE, offsetof(struct proto_msg, refuse.message), sizeof m.refuse.message },
        { PROTO_ERROR, offsetof(struct proto_msg, error.message), sizeof m.error.message },
        { PROTO_CONTROL, offsetof(struct proto_msg, control.reason), sizeof m.control.reason },
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        memset(&m, 0, sizeof m);
        m.type = texts[i].type;
        if (m.type == PROTO_HELLO)
            m.hello = (struct proto_hello){ .role = PROTO_ROLE_CTL, .device = -1, .group_rank = PROTO_NONE32 };
        if (m.type == PROTO_CONTROL)
            m.control.cmd = PROTO_CTL_PAUSE;
        /* (C1's CSI, U+009B, drives a terminal as ESC [ does; a lone lead byte, a stray
         * continuation byte and an overlong '/' are no UTF-8: invalid JSON, a binary journal line) */
        proto_strset((char *)&m + texts[i].off, texts[i].cap,
                     "two\nlines\x1b[31m red\x7f \xc3\xa9t\xc3\xa9\tok \xc2\x9b" "2J \xff\x80\xc0\xaf \xf0\x9f\x98\x80 \xc3");
        char terr[256] = "";
        int64_t tn = proto_encode(&m, buf, sizeof buf, terr, sizeof terr);
        if (tn < 0)
            TEST_FAIL("encode %s: %s", proto_type_name(m.type), terr);
        CHECK_OK(proto_decode(buf, (size_t)tn, &d, terr, sizeof terr));
        CHECK_STR((char *)&d + texts[i].off, "two?lines?[31m red? \xc3\xa9t\xc3\xa9?ok ??2J ???? \xf0\x9f\x98\x80 ?");
    }

    for (int c = 1; c < PROTO_CTL_MAX; c++) {
        memset(&m, 0, sizeof m);
        m.type = PROTO_CONTROL;
        m.control.cmd = (uint32_t)c;
        proto_strset(m.control.reason, sizeof m.control.reason, "operator");
        roundtrip(&m, &d);
        CHECK_INT(proto_control_parse(proto_control_name((unsigned)c)), ==, c);
    }

    memset(&m, 0, sizeof m);
    m.type = PROTO_RESTART;
    m.restart.generation = 5;
    m.restart.ckpt_step = 1000;
    roundtrip(&m, &d);

    for (int q = 1; q < PROTO_Q_MAX; q++) {
        memset(&m, 0, sizeof m);
        m.type = PROTO_QUERY;
        m.query.what = (uint32_t)q;
        roundtrip(&m, &d);
        CHECK_INT(proto_query_parse(proto_query_name((unsigned)q)), ==, q);
    }

    /* AUTH: the token's length is on the wire; bytes past it must be zero. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_AUTH;
    m.auth.len = PROTO_AUTH_TOKEN_MAX;
    for (int i = 0; i < PROTO_AUTH_TOKEN_MAX; i++)
        m.auth.token[i] = (uint8_t)(i * 7 + 3);     /* any bytes, NUL included */
    roundtrip(&m, &d);
    CHECK(!memcmp(d.auth.token, m.auth.token, PROTO_AUTH_TOKEN_MAX));
    memset(&m, 0, sizeof m);
    m.type = PROTO_AUTH;
    m.auth.len = PROTO_AUTH_TOKEN_MIN;
    memcpy(m.auth.token, "0123456789abcdef", PROTO_AUTH_TOKEN_MIN);
    n = roundtrip(&m, &d);
    CHECK_INT(n, ==, (int64_t)(sizeof(struct proto_hdr) + sizeof(struct proto_auth)));
    CHECK_INT(d.auth.len, ==, PROTO_AUTH_TOKEN_MIN);
    struct proto_auth ap;
    memcpy(&ap, buf + sizeof(struct proto_hdr), sizeof ap);
    ap.token[PROTO_AUTH_TOKEN_MIN] = 'x';
    memcpy(buf + sizeof(struct proto_hdr), &ap, sizeof ap);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "token bytes past len must be 0");
    ap.token[PROTO_AUTH_TOKEN_MIN] = 0;
    ap.len = PROTO_AUTH_TOKEN_MIN - 1;
    memcpy(buf + sizeof(struct proto_hdr), &ap, sizeof ap);
    expect_reject(buf, (size_t)n, -DF_ERANGE, "token of 15 bytes");
    ap.len = PROTO_AUTH_TOKEN_MAX + 1;
    memcpy(buf + sizeof(struct proto_hdr), &ap, sizeof ap);
    expect_reject(buf, (size_t)n, -DF_ERANGE, "token of 257 bytes");
    ap.len = PROTO_AUTH_TOKEN_MIN;
    ap.pad = 1;
    memcpy(buf + sizeof(struct proto_hdr), &ap, sizeof ap);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "pad must be 0");
    m.auth.len = 3;
    CHECK(proto_encode(&m, buf, sizeof buf, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "token of 3 bytes");

    const char *json = "{\"state\":\"running\"}";
    memset(&m, 0, sizeof m);
    m.type = PROTO_REPLY;
    m.reply.json_len = (uint32_t)strlen(json);
    m.json = json;
    roundtrip(&m, &d);
    CHECK(!memcmp(d.json, json, strlen(json)));

    /* ---- rejection cases ---- */
    memset(&m, 0, sizeof m);
    m.type = PROTO_LEASE_REQUEST;
    m.lease_request.n = 2;
    n = proto_encode(&m, buf, sizeof buf, err, sizeof err);
    CHECK_INT(n, ==, 20);
    expect_reject(buf, 5, -DF_ETRUNC, "truncated frame");
    expect_reject(buf, (size_t)n - 1, -DF_ETRUNC, "truncated frame");
    expect_reject(buf, (size_t)n + 1, -DF_EFORMAT, "trailing bytes");

    struct proto_hdr *h = (struct proto_hdr *)buf;
    h->version = PROTO_VERSION + 1;
    char want[64];
    snprintf(want, sizeof want, "protocol version %u, expected %u", PROTO_VERSION + 1, PROTO_VERSION);
    expect_reject(buf, (size_t)n, -DF_EVERSION, want);
    h->version = PROTO_VERSION;

    h->len = PROTO_MAX_FRAME;
    expect_reject(buf, (size_t)n, -E2BIG, "exceeds");
    CHECK_INT(proto_frame_size(buf, (size_t)n, err, sizeof err), ==, -E2BIG);
    h->len = 8;

    h->magic ^= 1;
    expect_reject(buf, (size_t)n, -DF_EMAGIC, "bad frame magic");
    CHECK_INT(proto_frame_size(buf, (size_t)n, err, sizeof err), ==, -DF_EMAGIC);
    h->magic ^= 1;

    h->type = 200;
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "unknown message type 200");
    CHECK_INT(proto_frame_size(buf, (size_t)n, err, sizeof err), ==, -DF_EFORMAT);
    h->type = 0;
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "unknown message type 0");
    h->type = PROTO_LEASE_REQUEST;

    /* Framing refuses a length this type cannot have before the payload is read (a 1 MiB
     * LEASE_REQUEST is not buffered); another version's frame is left to proto_decode. */
    uint32_t len0 = h->len;
    h->len = 1u << 20;
    CHECK_INT(proto_frame_size(buf, sizeof *h, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "LEASE_REQUEST: payload of 1048576 bytes, expected");
    h->len = 2;
    CHECK_INT(proto_frame_size(buf, sizeof *h, err, sizeof err), ==, -DF_ETRUNC);
    h->version = PROTO_VERSION + 1;
    CHECK_INT(proto_frame_size(buf, sizeof *h, err, sizeof err), ==, (int64_t)sizeof *h + 2);
    h->version = PROTO_VERSION;
    h->len = len0;
    CHECK_INT(proto_frame_size(buf, sizeof *h, err, sizeof err), ==, n);

    struct proto_lease_request *lr = (struct proto_lease_request *)(buf + sizeof *h);
    lr->n = 0;
    expect_reject(buf, (size_t)n, -DF_ERANGE, "n=0 out of range");
    lr->n = 2;
    lr->pad = 1;
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "pad must be 0");
    lr->pad = 0;
    CHECK_OK(proto_decode(buf, (size_t)n, &d, err, sizeof err));

    /* A payload the wrong size for its type. */
    h->type = PROTO_ACK;
    expect_reject(buf, (size_t)n, -DF_ETRUNC, "ACK: payload of 8 bytes, expected 16");

    /* Garbage: text where a frame should be. */
    const char *garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    expect_reject(garbage, strlen(garbage), -DF_EMAGIC, "bad frame magic");

    /* Strings must be NUL-terminated and canonical. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.hello.role = PROTO_ROLE_DRAFTER;
    proto_strset(m.hello.name, sizeof m.hello.name, "x");
    n = proto_encode(&m, buf, sizeof buf, err, sizeof err);
    CHECK(n > 0);
    /* The payload sits at offset 12: patch it through an aligned copy. */
    struct proto_hello hp;
    uint8_t *payload = buf + sizeof *h;
    memcpy(&hp, payload, sizeof hp);
    memset(hp.name, 'A', sizeof hp.name);
    memcpy(payload, &hp, sizeof hp);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "name is not a NUL-terminated string");
    proto_strset(hp.name, sizeof hp.name, "x");
    hp.name[10] = 'z';
    memcpy(payload, &hp, sizeof hp);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "name is not a NUL-terminated string");
    hp.name[10] = 0;
    hp.role = 9;
    memcpy(payload, &hp, sizeof hp);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "bad role 9");

    /* Grants: sample count must match the payload. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_LEASE_GRANT;
    m.grant.n_samples = 3;
    m.grant.lease = 1;
    m.samples = samples;
    n = proto_encode(&m, buf, sizeof buf, err, sizeof err);
    CHECK(n > 0);
    uint32_t four = 4, zero = 0;
    memcpy(buf + sizeof *h + offsetof(struct proto_lease_grant, n_samples), &four, 4);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "4 samples need");
    memcpy(buf + sizeof *h + offsetof(struct proto_lease_grant, n_samples), &m.grant.n_samples, 4);
    memcpy(buf + sizeof *h + offsetof(struct proto_lease_grant, lease), &zero, 4);
    expect_reject(buf, (size_t)n, -DF_ERANGE, "lease number 0");
    m.grant.n_samples = PROTO_MAX_SAMPLES + 1;
    CHECK(proto_encode(&m, buf, sizeof buf, err, sizeof err) < 0);

    /* Steps and generations past 2^63 - 1 (kept signed in the ledger: one would come back
     * negative, and a CKPT_BAD of it found no earlier checkpoint and failed the run). */
    memset(&m, 0, sizeof m);
    m.type = PROTO_CHECKPOINTED;
    m.checkpointed.step = (uint64_t)INT64_MAX;
    m.checkpointed.generation = 1;
    proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, "/c/step-1");
    n = proto_encode(&m, buf, sizeof buf, err, sizeof err);
    CHECK(n > 0);
    uint64_t big = (uint64_t)INT64_MAX + 1;
    memcpy(buf + sizeof *h + offsetof(struct proto_checkpointed, step), &big, 8);
    expect_reject(buf, (size_t)n, -DF_ERANGE, "CHECKPOINTED: step 9223372036854775808 above 2^63 - 1");
    m.type = PROTO_CKPT_BAD;
    memset(&m.ckpt_bad, 0, sizeof m.ckpt_bad);
    m.ckpt_bad.generation = 1;
    m.ckpt_bad.step = UINT64_MAX;
    m.ckpt_bad.code = -DF_EFORMAT;
    proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, "/c/step-1");
    CHECK_INT(proto_encode(&m, buf, sizeof buf, err, sizeof err), ==, -DF_ERANGE);
    CHECK_CONTAINS(err, "step 18446744073709551615 above");
    m.type = PROTO_TRAINED;
    memset(&m.trained, 0, sizeof m.trained);
    m.trained.lease = 1;
    m.trained.generation = big;
    CHECK_INT(proto_encode(&m, buf, sizeof buf, err, sizeof err), ==, -DF_ERANGE);
    CHECK_CONTAINS(err, "generation 9223372036854775808 above");

    /* Groups: the batch id count must match the payload and stay within its bound. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_GROUP;
    m.group.world_size = 1;
    uint64_t ids[3] = { 1, 2, 3 };
    m.group.n_done = 3;
    m.ids = ids;
    n = proto_encode(&m, buf, sizeof buf, err, sizeof err);
    CHECK(n > 0);
    memcpy(buf + sizeof *h + offsetof(struct proto_group, n_done), &four, 4);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "4 batch ids need");
    memcpy(buf + sizeof *h + offsetof(struct proto_group, n_done), &m.group.n_done, 4);
    memcpy(buf + sizeof *h + offsetof(struct proto_group, pad), &four, 4);
    expect_reject(buf, (size_t)n, -DF_EFORMAT, "pad must be 0");
    uint32_t over = PROTO_MAX_GROUP_IDS + 1;
    memcpy(buf + sizeof *h + offsetof(struct proto_group, pad), &zero, 4);
    memcpy(buf + sizeof *h + offsetof(struct proto_group, n_done), &over, 4);
    expect_reject(buf, (size_t)n, -DF_ERANGE, "n_done=500001 above 500000");
    m.ids = NULL;
    CHECK(proto_encode(&m, buf, sizeof buf, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "no batch id array");

    /* The encoder refuses invalid messages and too-small buffers. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_CONTROL;
    m.control.cmd = 99;
    CHECK(proto_encode(&m, buf, sizeof buf, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "bad command 99");
    m.control.cmd = PROTO_CTL_STOP;
    CHECK_INT(proto_encode(&m, buf, 10, err, sizeof err), ==, -ENOSPC);
    m.type = PROTO_REPLY;
    m.reply.json_len = PROTO_MAX_FRAME;
    m.json = (const char *)buf;
    CHECK_INT(proto_encode(&m, buf, sizeof buf, err, sizeof err), ==, -E2BIG);

    /* Random garbage never crashes and never decodes as valid unless canonical. */
    uint64_t x = 88172645463325252ull;
    int accepted = 0;
    for (int it = 0; it < 200000; it++) {
        size_t len = 12 + (size_t)(x % 400);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        /* Half the time give it a valid header so payload checks run. */
        if (it & 1) {
            struct proto_hdr hh = { PROTO_MAGIC, (uint32_t)(len - 12), PROTO_VERSION, (uint16_t)(1 + x % (PROTO_TYPE_MAX - 1)) };
            memcpy(buf, &hh, sizeof hh);
        }
        if (proto_decode(buf, len, &d, err, sizeof err) == 0) {
            accepted++;
            static uint8_t again[PROTO_MAX_FRAME];
            CHECK_INT(proto_encode(&d, again, sizeof again, err, sizeof err), ==, (int64_t)len);
            CHECK(!memcmp(again, buf, len));
        }
    }
    printf("proto ok (%d random frames accepted, all canonical)\n", accepted);
    return 0;
}
