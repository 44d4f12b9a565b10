/* proto.c: encoder and the one pure decoder of the control protocol.
 * Every accepted frame is canonical: decode then encode gives the same bytes. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "common/err.h"
#include "common/text.h"
#include "ipc/proto.h"

#define FAIL(code, ...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); return (code); } while (0)

static const struct {
    const char *name;
    uint32_t size;      /* fixed payload bytes */
    int variable;       /* 1 = a tail follows the fixed part */
} types[PROTO_TYPE_MAX] = {
    [PROTO_HELLO]         = { "HELLO", sizeof(struct proto_hello), 0 },
    [PROTO_WELCOME]       = { "WELCOME", sizeof(struct proto_welcome), 0 },
    [PROTO_REFUSE]        = { "REFUSE", sizeof(struct proto_refuse), 0 },
    [PROTO_HEARTBEAT]     = { "HEARTBEAT", sizeof(struct proto_heartbeat), 0 },
    [PROTO_LEASE_REQUEST] = { "LEASE_REQUEST", sizeof(struct proto_lease_request), 0 },
    [PROTO_LEASE_GRANT]   = { "LEASE_GRANT", sizeof(struct proto_lease_grant), 1 },
    [PROTO_LEASE_REVOKE]  = { "LEASE_REVOKE", sizeof(struct proto_batch_ref), 0 },
    [PROTO_LEASE_RETURN]  = { "LEASE_RETURN", sizeof(struct proto_batch_ref), 0 },
    [PROTO_PUBLISHED]     = { "PUBLISHED", sizeof(struct proto_published), 0 },
    [PROTO_JOIN_GROUP]    = { "JOIN_GROUP", 0, 0 },
    [PROTO_GROUP]         = { "GROUP", sizeof(struct proto_group), 1 },
    [PROTO_TRAINED]       = { "TRAINED", sizeof(struct proto_trained), 0 },
    [PROTO_CHECKPOINTED]  = { "CHECKPOINTED", sizeof(struct proto_checkpointed), 0 },
    [PROTO_ACK]           = { "ACK", sizeof(struct proto_ack), 0 },
    [PROTO_ERROR]         = { "ERROR", sizeof(struct proto_error), 0 },
    [PROTO_CONTROL]       = { "CONTROL", sizeof(struct proto_control), 0 },
    [PROTO_RESTART]       = { "RESTART", sizeof(struct proto_restart), 0 },
    [PROTO_QUERY]         = { "QUERY", sizeof(struct proto_query), 0 },
    [PROTO_REPLY]         = { "REPLY", sizeof(struct proto_reply), 1 },
    [PROTO_AUTH]          = { "AUTH", sizeof(struct proto_auth), 0 },
    [PROTO_SKIPPED]       = { "SKIPPED", sizeof(struct proto_skipped), 0 },
    [PROTO_CKPT_BAD]      = { "CKPT_BAD", sizeof(struct proto_ckpt_bad), 0 },
    [PROTO_BYE]           = { "BYE", sizeof(struct proto_bye), 0 },
};

static const char *const role_names[] = { [PROTO_ROLE_TARGET] = "target", [PROTO_ROLE_DRAFTER] = "drafter", [PROTO_ROLE_CTL] = "ctl" };
static const char *const state_names[] = {
    [PROTO_STATE_STARTING] = "starting", [PROTO_STATE_RUNNING] = "running", [PROTO_STATE_PAUSED] = "paused",
    [PROTO_STATE_DRAINING] = "draining", [PROTO_STATE_STOPPED] = "stopped", [PROTO_STATE_FAILED] = "failed",
};
static const char *const control_names[] = {
    [PROTO_CTL_PAUSE] = "pause", [PROTO_CTL_RESUME] = "resume", [PROTO_CTL_DRAIN] = "drain", [PROTO_CTL_STOP] = "stop",
};
static const char *const query_names[] = {
    [PROTO_Q_STATUS] = "status", [PROTO_Q_RING] = "ring", [PROTO_Q_DAEMONS] = "daemons",
    [PROTO_Q_BATCHES] = "batches", [PROTO_Q_ERRORS] = "errors", [PROTO_Q_CHECKPOINTS] = "checkpoints",
};

const char *proto_type_name(unsigned t) { return t > 0 && t < PROTO_TYPE_MAX ? types[t].name : "?"; }
const char *proto_role_name(unsigned r) { return r >= 1 && r <= 3 ? role_names[r] : "?"; }
const char *proto_state_name(unsigned s) { return s < PROTO_STATE_MAX ? state_names[s] : "?"; }
const char *proto_control_name(unsigned c) { return c >= 1 && c < PROTO_CTL_MAX ? control_names[c] : "?"; }
const char *proto_query_name(unsigned q) { return q >= 1 && q < PROTO_Q_MAX ? query_names[q] : "?"; }

int proto_control_parse(const char *s)
{
    for (int i = 1; i < PROTO_CTL_MAX; i++)
        if (!strcmp(s, control_names[i]))
            return i;
    return -EINVAL;
}

int proto_query_parse(const char *s)
{
    for (int i = 1; i < PROTO_Q_MAX; i++)
        if (!strcmp(s, query_names[i]))
            return i;
    return -EINVAL;
}

void proto_strset(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    memset(dst + n, 0, cap - n);
}

void proto_textset(char *dst, size_t cap, const char *src)
{
    proto_strset(dst, cap, src);
    if (!src || cap < 8 || strnlen(src, cap) < cap)
        return;
    size_t n = text_fit(dst, cap - 4);
    memcpy(dst + n, "...", 4);
    memset(dst + n + 4, 0, cap - n - 4);
}

/* A string field must hold a NUL and only zeros after it (canonical form). */
static int field_ok(const char *f, size_t cap)
{
    const char *nul = memchr(f, 0, cap);
    if (!nul)
        return 0;
    for (const char *p = nul; p < f + cap; p++)
        if (*p)
            return 0;
    return 1;
}

#define STR_OK(field, what) do { if (!field_ok((field), sizeof(field))) \
    FAIL(-DF_EFORMAT, "%s: %s is not a NUL-terminated string", tn, what); } while (0)
#define ZERO(field, what) do { if (field) FAIL(-DF_EFORMAT, "%s: %s must be 0", tn, what); } while (0)
/* Steps and generations are signed 64-bit wherever they are kept (ledger, checkpoint names): one
 * past that range would come back negative (a fallback that finds no earlier checkpoint). */
#define COUNT_OK(field, what) do { if ((field) > (uint64_t)INT64_MAX) \
    FAIL(-DF_ERANGE, "%s: %s %llu above 2^63 - 1", tn, what, (unsigned long long)(field)); } while (0)
/* A path a drafter reports (a checkpoint folder): stored in the ledger, sent back to the drafters,
 * shown by dflashctl; a control character in it cannot be replaced (it would name another folder):
 * refused. (Not checked in what the coordinator sends back: a ledger holding such a path from
 * before must not keep it from sending GROUP.) */
#define PATH_OK(field, what) do { if (has_control((field), sizeof(field))) \
    FAIL(-DF_EFORMAT, "%s: %s holds a control character", tn, what); } while (0)

static int is_control(char c) { return (unsigned char)c < 0x20 || c == 0x7f; }

static int has_control(const char *s, size_t cap)
{
    for (size_t i = 0; i < cap && s[i]; i++)
        if (is_control(s[i]))
            return 1;
    return 0;
}

/* Text a peer wrote (a name, a message, a reason) goes into logs, the ledger and dflashctl's
 * output: a control character in it (a newline, an escape sequence, C1's CSI) could forge a log
 * line or drive a terminal, a byte that is no UTF-8 makes the JSON invalid. Each becomes '?' as
 * the frame is read (text_clean; each field holds its NUL: validate). */
static void plain_texts(struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO:
        text_clean(m->hello.name);
        break;
    case PROTO_REFUSE:
        text_clean(m->refuse.message);
        break;
    case PROTO_ERROR:
        text_clean(m->error.message);
        break;
    case PROTO_CONTROL:
        text_clean(m->control.reason);
        break;
    case PROTO_CKPT_BAD:
        text_clean(m->ckpt_bad.reason);
        break;
    case PROTO_BYE:
        text_clean(m->bye.reason);
        break;
    default:
        break;
    }
}

/* Checks of field values that do not depend on the buffer. */
static int validate(const struct proto_msg *m, uint32_t payload, char *err, size_t errlen)
{
    const char *tn = types[m->type].name;
    switch (m->type) {
    case PROTO_HELLO:
        if (m->hello.role < PROTO_ROLE_TARGET || m->hello.role > PROTO_ROLE_CTL)
            FAIL(-DF_EFORMAT, "%s: bad role %u", tn, m->hello.role);
        STR_OK(m->hello.name, "name");
        break;
    case PROTO_WELCOME:
        if (m->welcome.cluster_state >= PROTO_STATE_MAX)
            FAIL(-DF_EFORMAT, "%s: bad cluster state %u", tn, m->welcome.cluster_state);
        ZERO(m->welcome.pad, "pad");
        STR_OK(m->welcome.ring_name, "ring_name");
        STR_OK(m->welcome.dataset_path, "dataset_path");
        STR_OK(m->welcome.model_config, "model_config");
        break;
    case PROTO_REFUSE:
        STR_OK(m->refuse.message, "message");
        break;
    case PROTO_HEARTBEAT:
        if (m->heartbeat.state >= PROTO_STATE_MAX)
            FAIL(-DF_EFORMAT, "%s: bad state %u", tn, m->heartbeat.state);
        COUNT_OK(m->heartbeat.step, "step");
        break;
    case PROTO_LEASE_REQUEST:
        if (m->lease_request.n < 1 || m->lease_request.n > PROTO_MAX_LEASE_REQUEST)
            FAIL(-DF_ERANGE, "%s: n=%u out of range [1, %u]", tn, m->lease_request.n, PROTO_MAX_LEASE_REQUEST);
        ZERO(m->lease_request.pad, "pad");
        break;
    case PROTO_LEASE_GRANT:
        if (m->grant.n_samples < 1 || m->grant.n_samples > PROTO_MAX_SAMPLES)
            FAIL(-DF_ERANGE, "%s: n_samples=%u out of range [1, %u]", tn, m->grant.n_samples, PROTO_MAX_SAMPLES);
        if (m->grant.flags & ~PROTO_GRANT_REGRANT)
            FAIL(-DF_EFORMAT, "%s: unknown flags 0x%x", tn, m->grant.flags);
        if (m->grant.lease < 1)
            FAIL(-DF_ERANGE, "%s: lease number 0 (they start at 1)", tn);
        if (payload != sizeof(struct proto_lease_grant) + 4ull * m->grant.n_samples)
            FAIL(-DF_EFORMAT, "%s: payload %u bytes, %u samples need %llu", tn, payload, m->grant.n_samples,
                 (unsigned long long)(sizeof(struct proto_lease_grant) + 4ull * m->grant.n_samples));
        break;
    case PROTO_GROUP:
        if (m->group.world_size < 1 || m->group.rank >= m->group.world_size)
            FAIL(-DF_ERANGE, "%s: rank %u of world %u", tn, m->group.rank, m->group.world_size);
        COUNT_OK(m->group.generation, "generation");
        COUNT_OK(m->group.ckpt_step, "ckpt_step");
        STR_OK(m->group.coll_name, "coll_name");
        STR_OK(m->group.ckpt_dir, "ckpt_dir");
        if (m->group.n_done > PROTO_MAX_GROUP_IDS)
            FAIL(-DF_ERANGE, "%s: n_done=%u above %u", tn, m->group.n_done, PROTO_MAX_GROUP_IDS);
        ZERO(m->group.pad, "pad");
        if (payload != sizeof(struct proto_group) + 8ull * m->group.n_done)
            FAIL(-DF_EFORMAT, "%s: payload %u bytes, %u batch ids need %llu", tn, payload, m->group.n_done,
                 (unsigned long long)(sizeof(struct proto_group) + 8ull * m->group.n_done));
        break;
    case PROTO_TRAINED:
        if (m->trained.lease < 1)
            FAIL(-DF_ERANGE, "%s: lease number 0 (they start at 1)", tn);
        COUNT_OK(m->trained.step, "step");
        COUNT_OK(m->trained.generation, "generation");
        break;
    case PROTO_SKIPPED:
        if (m->skipped.lease < 1)
            FAIL(-DF_ERANGE, "%s: lease number 0 (they start at 1)", tn);
        ZERO(m->skipped.pad, "pad");
        break;
    case PROTO_CHECKPOINTED:
        STR_OK(m->checkpointed.dir, "dir");
        PATH_OK(m->checkpointed.dir, "dir");
        if (!m->checkpointed.dir[0])
            FAIL(-DF_EFORMAT, "%s: empty dir", tn);
        COUNT_OK(m->checkpointed.step, "step");
        COUNT_OK(m->checkpointed.generation, "generation");
        break;
    case PROTO_CKPT_BAD:
        STR_OK(m->ckpt_bad.dir, "dir");
        PATH_OK(m->ckpt_bad.dir, "dir");
        STR_OK(m->ckpt_bad.reason, "reason");
        if (!m->ckpt_bad.dir[0])
            FAIL(-DF_EFORMAT, "%s: empty dir", tn);
        if (m->ckpt_bad.code >= 0)
            FAIL(-DF_ERANGE, "%s: code %d is not an error", tn, m->ckpt_bad.code);
        COUNT_OK(m->ckpt_bad.step, "step");
        COUNT_OK(m->ckpt_bad.generation, "generation");
        ZERO(m->ckpt_bad.pad, "pad");
        break;
    case PROTO_BYE:
        if (m->bye.exit_status > 255)
            FAIL(-DF_ERANGE, "%s: exit status %u is not one (0..255)", tn, m->bye.exit_status);
        STR_OK(m->bye.reason, "reason");
        ZERO(m->bye.pad, "pad");
        break;
    case PROTO_ACK:
        ZERO(m->ack.pad, "pad");
        break;
    case PROTO_ERROR:
        if (m->error.fatal > 1)
            FAIL(-DF_EFORMAT, "%s: fatal=%u is not 0 or 1", tn, m->error.fatal);
        STR_OK(m->error.message, "message");
        COUNT_OK(m->error.step, "step");
        break;
    case PROTO_CONTROL:
        if (m->control.cmd < 1 || m->control.cmd >= PROTO_CTL_MAX)
            FAIL(-DF_EFORMAT, "%s: bad command %u", tn, m->control.cmd);
        STR_OK(m->control.reason, "reason");
        break;
    case PROTO_RESTART:
        STR_OK(m->restart.ckpt_dir, "ckpt_dir");
        COUNT_OK(m->restart.generation, "generation");
        COUNT_OK(m->restart.ckpt_step, "ckpt_step");
        break;
    case PROTO_QUERY:
        if (m->query.what < 1 || m->query.what >= PROTO_Q_MAX)
            FAIL(-DF_EFORMAT, "%s: bad query %u", tn, m->query.what);
        break;
    case PROTO_REPLY:
        if (payload != sizeof(struct proto_reply) + (uint64_t)m->reply.json_len)
            FAIL(-DF_EFORMAT, "%s: payload %u bytes, json_len %u", tn, payload, m->reply.json_len);
        break;
    case PROTO_AUTH:
        if (m->auth.len < PROTO_AUTH_TOKEN_MIN || m->auth.len > PROTO_AUTH_TOKEN_MAX)
            FAIL(-DF_ERANGE, "%s: token of %u bytes, must be %u to %u", tn, m->auth.len, PROTO_AUTH_TOKEN_MIN,
                 PROTO_AUTH_TOKEN_MAX);
        ZERO(m->auth.pad, "pad");
        for (uint32_t i = m->auth.len; i < PROTO_AUTH_TOKEN_MAX; i++)
            ZERO(m->auth.token[i], "token bytes past len");
        break;
    default:
        break;
    }
    return 0;
}

/* A known type, and a payload length that type can have. */
static int check_type_len(const struct proto_hdr *h, char *err, size_t errlen)
{
    if (h->type == 0 || h->type >= PROTO_TYPE_MAX)
        FAIL(-DF_EFORMAT, "unknown message type %u", h->type);
    uint32_t fixed = types[h->type].size;
    if (types[h->type].variable ? h->len < fixed : h->len != fixed)
        FAIL(h->len < fixed ? -DF_ETRUNC : -DF_EFORMAT, "%s: payload of %u bytes, expected %s%u",
             types[h->type].name, h->len, types[h->type].variable ? "at least " : "", fixed);
    return 0;
}

/* What the header alone tells, for the framing and the decoder alike: the magic, the size
 * limit and, in this version's frames, the type and its payload length (refused before the
 * payload is buffered; another version's sizes may differ, and proto_decode names it). */
static int check_header(const struct proto_hdr *h, char *err, size_t errlen)
{
    if (h->magic != PROTO_MAGIC)
        FAIL(-DF_EMAGIC, "bad frame magic 0x%08x (not a dflash peer?)", h->magic);
    if (h->len > PROTO_MAX_FRAME - sizeof *h)
        FAIL(-E2BIG, "frame of %zu+%u bytes exceeds the %u byte maximum", sizeof *h, h->len, PROTO_MAX_FRAME);
    return h->version == PROTO_VERSION ? check_type_len(h, err, errlen) : 0;
}

int64_t proto_frame_size(const void *buf, size_t len, char *err, size_t errlen)
{
    struct proto_hdr h;
    if (len < sizeof h)
        return 0;
    memcpy(&h, buf, sizeof h);
    int r = check_header(&h, err, errlen);
    return r < 0 ? r : (int64_t)sizeof h + h.len;
}

int proto_decode(const void *buf, size_t len, struct proto_msg *m, char *err, size_t errlen)
{
    struct proto_hdr h;
    memset(m, 0, sizeof *m);
    if (len > PROTO_MAX_FRAME)
        FAIL(-E2BIG, "frame of %zu bytes exceeds the %u byte maximum", len, PROTO_MAX_FRAME);
    if (len < sizeof h)
        FAIL(-DF_ETRUNC, "truncated frame: %zu bytes, header needs %zu", len, sizeof h);
    memcpy(&h, buf, sizeof h);
    int r = check_header(&h, err, errlen);
    if (r < 0)
        return r;
    if (len < sizeof h + h.len)
        FAIL(-DF_ETRUNC, "truncated frame: %zu of %zu bytes", len, sizeof h + h.len);
    if (len > sizeof h + h.len)
        FAIL(-DF_EFORMAT, "%zu trailing bytes after the frame", len - sizeof h - h.len);
    if (h.version != PROTO_VERSION) {
        /* only a REFUSE is read from another version (it says why), at this version's size */
        if (h.type != PROTO_REFUSE)
            FAIL(-DF_EVERSION, "protocol version %u, expected %u", h.version, PROTO_VERSION);
        if ((r = check_type_len(&h, err, errlen)) < 0)
            return r;
    }
    uint32_t fixed = types[h.type].size;
    const uint8_t *payload = (const uint8_t *)buf + sizeof h;
    m->type = h.type;
    m->version = h.version;
    if (fixed)
        memcpy(&m->hello, payload, fixed);  /* every member starts at the union's start */
    r = validate(m, h.len, err, errlen);
    if (r < 0)
        return r;
    plain_texts(m);
    if (m->type == PROTO_LEASE_GRANT)
        m->samples = payload + fixed;
    else if (m->type == PROTO_GROUP)
        m->ids = payload + fixed;
    else if (m->type == PROTO_REPLY)
        m->json = (const char *)payload + fixed;
    return 0;
}

int64_t proto_encoded_size(const struct proto_msg *m)
{
    if (m->type == 0 || m->type >= PROTO_TYPE_MAX)
        return -DF_EFORMAT;
    uint64_t n = sizeof(struct proto_hdr) + types[m->type].size;
    if (m->type == PROTO_LEASE_GRANT)
        n += 4ull * m->grant.n_samples;
    else if (m->type == PROTO_GROUP)
        n += 8ull * m->group.n_done;
    else if (m->type == PROTO_REPLY)
        n += m->reply.json_len;
    return n > PROTO_MAX_FRAME ? -E2BIG : (int64_t)n;
}

int64_t proto_encode(const struct proto_msg *m, void *buf, size_t cap, char *err, size_t errlen)
{
    int64_t n = proto_encoded_size(m);
    if (n == -E2BIG)
        FAIL(-E2BIG, "%s: frame would exceed the %u byte maximum", proto_type_name(m->type), PROTO_MAX_FRAME);
    if (n < 0)
        FAIL((int)n, "unknown message type %u", m->type);
    if ((size_t)n > cap)
        FAIL(-ENOSPC, "%s: %lld bytes do not fit in %zu", proto_type_name(m->type), (long long)n, cap);
    uint32_t fixed = types[m->type].size;
    int r = validate(m, (uint32_t)(n - (int64_t)sizeof(struct proto_hdr)), err, errlen);
    if (r < 0)
        return r;
    struct proto_hdr h = { PROTO_MAGIC, (uint32_t)(n - (int64_t)sizeof h), PROTO_VERSION, m->type };
    uint8_t *p = buf;
    memcpy(p, &h, sizeof h);
    if (fixed)
        memcpy(p + sizeof h, &m->hello, fixed);
    if (m->type == PROTO_LEASE_GRANT) {
        if (m->grant.n_samples && !m->samples)
            FAIL(-DF_EFORMAT, "LEASE_GRANT: no sample array");
        memcpy(p + sizeof h + fixed, m->samples, 4ull * m->grant.n_samples);
    } else if (m->type == PROTO_GROUP && m->group.n_done) {
        if (!m->ids)
            FAIL(-DF_EFORMAT, "GROUP: no batch id array");
        memcpy(p + sizeof h + fixed, m->ids, 8ull * m->group.n_done);
    } else if (m->type == PROTO_REPLY && m->reply.json_len) {
        if (!m->json)
            FAIL(-DF_EFORMAT, "REPLY: no json text");
        memcpy(p + sizeof h + fixed, m->json, m->reply.json_len);
    }
    /* The decoder is the one definition of a valid frame: never send what it refuses. */
    struct proto_msg check;
    r = proto_decode(buf, (size_t)n, &check, err, errlen);
    return r < 0 ? r : n;
}
