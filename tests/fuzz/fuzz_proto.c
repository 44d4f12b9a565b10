/* fuzz_proto.c: fuzz target for the control protocol decoder (ipc/proto.c proto_decode,
 * proto_frame_size): accepted frames re-encode to the same bytes (what a peer's text may not hold,
 * controls and bytes that are no UTF-8, as '?'), its text is plain UTF-8; a stream splits cleanly. */
#include <string.h>
#include "common/text.h"
#include "ipc/proto.h"
#include "tests/fuzz/fuzz.h"

static void proto_check_decoded(const struct proto_msg *m, const uint8_t *data, size_t size)
{
    char err[512];
    FUZZ_ASSERT(m->type >= 1 && m->type < PROTO_TYPE_MAX);
    FUZZ_ASSERT(proto_type_name(m->type) != NULL);
    volatile uint32_t acc = 0;
    if (m->type == PROTO_LEASE_GRANT) {
        FUZZ_ASSERT(m->samples != NULL);
        for (uint32_t i = 0; i < m->grant.n_samples; i++)
            acc += proto_grant_sample(m, i);
    } else if (m->type == PROTO_GROUP) {
        FUZZ_ASSERT(m->ids != NULL);
        for (uint32_t i = 0; i < m->group.n_done; i++)
            acc += (uint32_t)proto_group_id(m, i);
    } else if (m->type == PROTO_REPLY) {
        FUZZ_ASSERT(m->json != NULL || m->reply.json_len == 0);
        for (uint32_t i = 0; i < m->reply.json_len; i++)
            acc += (uint8_t)m->json[i];
    }
    (void)acc;
    /* a peer's text is plain UTF-8 once read */
    const char *text = m->type == PROTO_HELLO ? m->hello.name : m->type == PROTO_REFUSE ? m->refuse.message
                     : m->type == PROTO_ERROR ? m->error.message : m->type == PROTO_CONTROL ? m->control.reason
                     : m->type == PROTO_CKPT_BAD ? m->ckpt_bad.reason : m->type == PROTO_BYE ? m->bye.reason : NULL;
    if (text)
        FUZZ_ASSERT(!text[text_plain_len(text)]);
    /* The decoder defines the canonical form: encoding what it accepted gives the same
     * frame (REFUSE from another version comes back with ours). */
    int64_t n = proto_encoded_size(m);
    FUZZ_ASSERT(n == (int64_t)size);
    uint8_t *buf = malloc((size_t)n);
    if (!buf)
        return;
    err[0] = 0;
    int64_t w = proto_encode(m, buf, (size_t)n, err, sizeof err);
    FUZZ_ASSERT(w == n);
    if (m->version == PROTO_VERSION) {
        /* byte for byte, but for what a peer's text may not hold (controls, C1's included, and
         * bytes that are no UTF-8), which arrives as '?' */
        for (size_t i = 0; i < size; i++)
            FUZZ_ASSERT(buf[i] == data[i] ||
                        (buf[i] == '?' && data[i] && (data[i] < 0x20 || data[i] == 0x7f || data[i] >= 0x80)));
    } else {
        struct proto_msg again;
        FUZZ_ASSERT(m->type == PROTO_REFUSE);
        FUZZ_ASSERT(proto_decode(buf, (size_t)w, &again, err, sizeof err) == 0);
        FUZZ_ASSERT(memcmp(&again.refuse, &m->refuse, sizeof m->refuse) == 0);
    }
    if (n > 0)
        FUZZ_ASSERT(proto_encode(m, buf, (size_t)n - 1, err, sizeof err) == -ENOSPC);
    free(buf);
}

int fuzz_proto(const uint8_t *data, size_t size)
{
    char err[512];
    struct proto_msg m;

    /* 1. The input as exactly one frame. */
    err[0] = 0;
    int r = proto_decode(data, size, &m, err, sizeof err);
    if (r < 0)
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
    int64_t fs = proto_frame_size(data, size, err, sizeof err);
    if (r == 0) {
        FUZZ_ASSERT(fs == (int64_t)size);
        proto_check_decoded(&m, data, size);
    }

    /* 2. The input as a byte stream, split the way a reader does. */
    size_t off = 0;
    while (off < size) {
        err[0] = 0;
        fs = proto_frame_size(data + off, size - off, err, sizeof err);
        if (fs < 0)
            FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        if (fs <= 0 || (uint64_t)fs > size - off)
            break;
        FUZZ_ASSERT(fs >= (int64_t)sizeof(struct proto_hdr) && fs <= PROTO_MAX_FRAME);
        err[0] = 0;
        if (proto_decode(data + off, (size_t)fs, &m, err, sizeof err) == 0)
            proto_check_decoded(&m, data + off, (size_t)fs);
        else
            FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        off += (size_t)fs;
    }
    return 0;
}
