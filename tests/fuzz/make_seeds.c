/* make_seeds.c: writes the seed corpora of the fuzz targets (small valid inputs made with the
 * project's own writers) under <out>/<target>/seed-*. Run by `tools/fuzz.sh --seeds`. */
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include "common/dataset.h"
#include "ipc/proto.h"
#include "model/st_writer.h"
#include "tests/fuzz/fuzz_ckpt.c"
#include "tests/fuzz/fuzz_ring.c"

static const char *out_root;

static void die(const char *what, const char *err)
{
    fprintf(stderr, "make_seeds: %s: %s\n", what, err);
    exit(1);
}

static void seed_path(char *p, size_t n, const char *target, const char *name)
{
    snprintf(p, n, "%s/%s", out_root, target);
    mkdir(p, 0755);
    snprintf(p, n, "%s/%s/seed-%s", out_root, target, name);
}

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char p[PATH_MAX];
    seed_path(p, sizeof p, target, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        die(p, strerror(errno));
}

static void put_str(const char *target, const char *name, const char *s)
{
    put(target, name, s, strlen(s));
}

/* Copy a file, or only its first `max` bytes. */
static void put_file(const char *target, const char *name, const char *src, size_t max)
{
    FILE *f = fopen(src, "rb");
    if (!f)
        die(src, strerror(errno));
    uint8_t *b = malloc(max);
    size_t n = fread(b, 1, max, f);
    fclose(f);
    put(target, name, b, n);
    free(b);
}

static void seeds_config(const char *src)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/etc/dflash.ini", src);
    put_file("config", "dflash.ini", p, 1 << 20);
    put_str("config", "small.ini",
            "; a few keys\n[cluster]\nname = fuzz\n[ring]\nslots = 4\nmax_tokens = 64\n"
            "[model]\ncapture_layers = 1, 5,9\n[drafter]\ngamma = 4.5\npick = random\n");
    put_str("config", "overrides",
            "ring.slots=8\ndrafter.lr=1e-3\ncluster.name=x\nmodel.capture_layers=0,2\ndata.seed=0x10\n");
}

static void seeds_dataset(void)
{
    char p[PATH_MAX], err[256];
    static const struct { uint32_t n; uint32_t first; } samples[] = { { 3, 1 }, { 1, 7 }, { 5, 2 } };
    for (int variant = 0; variant < 2; variant++) {
        struct dataset_writer *w;
        seed_path(p, sizeof p, "dataset", variant ? "vocab16.dfd" : "tiny.dfd");
        if (dataset_writer_open(&w, p, variant ? 16 : 0, err, sizeof err) < 0)
            die(p, err);
        for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
            uint32_t tok[8];
            uint8_t mask[8];
            for (uint32_t j = 0; j < samples[i].n; j++) {
                tok[j] = (samples[i].first + 3 * j) % 16;
                mask[j] = (j + variant) & 1;
            }
            if (dataset_writer_add(w, tok, mask, samples[i].n, err, sizeof err) < 0)
                die(p, err);
        }
        if (dataset_writer_finish(w, err, sizeof err) < 0)
            die(p, err);
        dataset_writer_free(w);
    }
}

static void seeds_safetensors(const char *src)
{
    char p[PATH_MAX], err[256];
    static const float f32[6] = { 1, -2, 3.5f, 0, 1e-3f, 6 };
    static const uint16_t b16[4] = { 0x3f80, 0x4000, 0xbf80, 0x7f80 };
    static const uint16_t f16[4] = { 0x3c00, 0x4000, 0xbc00, 0x7c00 };
    static const int64_t i64[2] = { 1, -1 };
    static const uint8_t u8[3] = { 1, 2, 3 };
    const struct st_out t[] = {
        { "model.embed_tokens.weight", ST_BF16, 2, { 2, 2 }, b16 },
        { "model.layers.0.mlp.up_proj.weight", ST_F32, 2, { 3, 2 }, f32 },
        { "model.norm.weight", ST_F16, 1, { 4 }, f16 },
        { "position_ids", ST_I64, 1, { 2 }, i64 },
        { "flags", ST_U8, 1, { 3 }, u8 },
        { "scalar", ST_F32, 0, { 0 }, f32 },
        { "empty", ST_BF16, 2, { 0, 4 }, b16 },
    };
    static const char *const meta[] = { "format", "pt" };
    seed_path(p, sizeof p, "safetensors", "mixed.safetensors");
    if (st_write_file(p, t, sizeof t / sizeof t[0], meta, 1, err, sizeof err) < 0)
        die(p, err);
    seed_path(p, sizeof p, "safetensors", "one.safetensors");
    if (st_write_file(p, t, 1, NULL, 0, err, sizeof err) < 0)
        die(p, err);
    /* The golden Qwen3 checkpoint's header alone: real tensor names, data cut off. */
    snprintf(p, sizeof p, "%s/tests/data/golden/qwen3/model.safetensors", src);
    FILE *f = fopen(p, "rb");
    uint8_t len8[8];
    if (!f || fread(len8, 1, 8, f) != 8)
        die(p, "cannot read");
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    put_file("safetensors", "golden-qwen3-header", p, 8 + hlen);
}

static void seeds_st_index(const char *src)
{
    put_str("st_index", "two-shards.json",
            "{\"metadata\": {\"total_size\": 72},\n \"weight_map\": {\n"
            "  \"a.weight\": \"" ST_INDEX_SHARD1 "\",\n  \"b.bias\": \"" ST_INDEX_SHARD1 "\",\n"
            "  \"c.weight\": \"" ST_INDEX_SHARD2 "\",\n  \"d.ids\": \"" ST_INDEX_SHARD2 "\"}}\n");
    put_str("st_index", "one-shard.json",
            "{\"weight_map\": {\"a.weight\": \"" ST_INDEX_SHARD1 "\", \"b.bias\": \"" ST_INDEX_SHARD1 "\"}}");
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/tests/data/golden/llama/model.safetensors.index.json", src);
    put_file("st_index", "golden-llama-index.json", p, 1 << 20);
}

static void seeds_hfconfig(const char *src)
{
    static const char *const dirs[] = { "qwen3", "llama", "llama-hub" };
    char p[PATH_MAX], name[64];
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(p, sizeof p, "%s/tests/data/golden/%s/config.json", src, dirs[i]);
        snprintf(name, sizeof name, "golden-%s.json", dirs[i]);
        put_file("hfconfig", name, p, 1 << 20);
    }
}

/* A ring made by ring_create, as the first `keep` bytes of the object behind a fuzz_ring
 * prefix that restores the object's full size. */
static void seed_ring(const char *name, const struct ring_layout *l, unsigned flags, size_t keep)
{
    char shm[64], err[256];
    snprintf(shm, sizeof shm, "/dflash-fuzz-seed-%d", (int)getpid());
    struct ring *r;
    struct ring_create_opts o = { .mode = 0600, .gid = -1, .flags = RING_CREATE_REPLACE };
    if (ring_create(&r, shm, l, &o, err, sizeof err) < 0)
        die(shm, err);
    size_t size = ring_map_size(r);
    if (size % 4096 || size / 4096 > 4096)
        die(name, "ring seed layout too large for the fuzz size field");
    if (keep > size)
        keep = size;
    uint8_t *b = malloc(3 + keep);
    b[0] = (uint8_t)(flags | RING_FUZZ_SIZE_FROM_INPUT);
    b[1] = (uint8_t)((size / 4096 - 1) & 0xff);
    b[2] = (uint8_t)((size / 4096 - 1) >> 8);
    memcpy(b + 3, ring_base(r), keep);
    put("ring", name, b, 3 + keep);
    free(b);
    ring_detach(r);
    ring_unlink(shm);
}

static void seeds_ring(void)
{
    /* Header page + control blocks; everything after is zero, as in a fresh ring. */
    seed_ring("expect", &ring_fuzz_layout, 0, 4096 + 64 * ring_fuzz_layout.nslots);
    seed_ring("expect-publish", &ring_fuzz_layout, RING_FUZZ_PUBLISH, 4096 + 64 * ring_fuzz_layout.nslots);
    seed_ring("any-rdonly", &ring_fuzz_layout, RING_FUZZ_ANY | RING_FUZZ_RDONLY, 4096 + 64 * ring_fuzz_layout.nslots);
    struct ring_layout one = { .nslots = 1, .hidden = 1, .n_layers = 1, .dtype = RING_DTYPE_BF16,
                               .max_tokens = 1, .max_seqs = 1 };
    seed_ring("any-minimal", &one, RING_FUZZ_ANY | RING_FUZZ_PUBLISH, 4096 + 64);
    struct ring_layout wide = { .nslots = 5, .hidden = 64, .n_layers = 3, .layer_ids = { 2, 9, 17 },
                                .dtype = RING_DTYPE_BF16, .max_tokens = 32, .max_seqs = 32 };
    seed_ring("any-wide", &wide, RING_FUZZ_ANY, 4096 + 64 * 5);
}

static size_t frame(uint8_t *out, size_t cap, struct proto_msg *m)
{
    char err[256];
    int64_t n = proto_encode(m, out, cap, err, sizeof err);
    if (n < 0)
        die(proto_type_name(m->type), err);
    return (size_t)n;
}

static void seeds_proto(void)
{
    static uint8_t buf[8192], stream[16384];
    size_t slen = 0;
    struct proto_msg m;
    uint32_t samples[3] = { 5, 0, 77 };
    uint64_t done[2] = { 7, (1ull << 32) | 3 };
    static const char json[] = "{\"state\":\"running\",\"n\":[1,2]}";
    for (unsigned t = 1; t < PROTO_TYPE_MAX; t++) {
        memset(&m, 0, sizeof m);
        m.type = (uint16_t)t;
        switch (t) {
        case PROTO_HELLO:
            m.hello = (struct proto_hello){ .role = PROTO_ROLE_DRAFTER, .device = 1, .pid = 42,
                                            .group_rank = PROTO_NONE32, .start_ticks = 9, .token = 0x1234 };
            proto_strset(m.hello.name, sizeof m.hello.name, "drafter@1");
            break;
        case PROTO_WELCOME:
            m.welcome = (struct proto_welcome){ .member_id = 3, .heartbeat_ms = 500, .dead_after_ms = 5000,
                                                .cluster_state = PROTO_STATE_RUNNING, .ring_slots = 16,
                                                .world_size = 2, .max_seq_len = 4096, .epochs = 1 };
            proto_strset(m.welcome.ring_name, sizeof m.welcome.ring_name, "/dflash-x");
            proto_strset(m.welcome.dataset_path, sizeof m.welcome.dataset_path, "/data/x.dfd");
            break;
        case PROTO_REFUSE:
            m.refuse.code = -22;
            m.refuse.server_version = PROTO_VERSION;
            proto_strset(m.refuse.message, sizeof m.refuse.message, "version mismatch");
            break;
        case PROTO_HEARTBEAT:
            m.heartbeat = (struct proto_heartbeat){ .state = PROTO_STATE_RUNNING, .step = 7, .loss = 2.5 };
            break;
        case PROTO_LEASE_REQUEST: m.lease_request.n = 2; break;
        case PROTO_LEASE_GRANT:
            m.grant = (struct proto_lease_grant){ .batch_id = 11, .epoch = 1, .n_samples = 3, .n_tokens = 40,
                                                  .max_seq_len = 4096, .lease = 1 };
            m.samples = samples;
            break;
        case PROTO_LEASE_REVOKE: case PROTO_LEASE_RETURN: m.batch.batch_id = 11; break;
        case PROTO_PUBLISHED: m.published = (struct proto_published){ .seq = 1, .batch_id = 11, .slot = 3, .n_tokens = 40 }; break;
        case PROTO_GROUP:
            m.group = (struct proto_group){ .generation = 2, .rank = 1, .world_size = 2, .ckpt_step = 100,
                                            .n_done = 2, .run_id = 0x5eed5eed5eed5eedull };
            m.ids = done;
            proto_strset(m.group.coll_name, sizeof m.group.coll_name, "/dflash-x-coll-2");
            proto_strset(m.group.ckpt_dir, sizeof m.group.ckpt_dir, "/var/lib/dflash/checkpoints/step-0000000100");
            break;
        case PROTO_TRAINED:
            m.trained = (struct proto_trained){ .seq = 2, .batch_id = 11, .step = 101, .generation = 2, .lease = 1 };
            break;
        case PROTO_SKIPPED: m.skipped = (struct proto_skipped){ .seq = 4, .batch_id = 11, .lease = 2 }; break;
        case PROTO_CKPT_BAD:
            m.ckpt_bad = (struct proto_ckpt_bad){ .generation = 2, .step = 100, .code = -10003 };
            proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, "/ckpt/step-0000000100");
            proto_strset(m.ckpt_bad.reason, sizeof m.ckpt_bad.reason, "model.safetensors: truncated");
            break;
        case PROTO_BYE:
            m.bye.exit_status = 1;
            proto_strset(m.bye.reason, sizeof m.bye.reason, "drafter-d@1 exits 1: CUDA error");
            break;
        case PROTO_CHECKPOINTED:
            m.checkpointed = (struct proto_checkpointed){ .seq = 3, .step = 200, .generation = 2 };
            proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, "/ckpt/step-0000000200");
            break;
        case PROTO_ACK: m.ack.seq = 3; break;
        case PROTO_ERROR:
            m.error.fatal = 0;
            m.error.code = -1;
            proto_strset(m.error.message, sizeof m.error.message, "loss is NaN");
            break;
        case PROTO_CONTROL:
            m.control.cmd = PROTO_CTL_PAUSE;
            proto_strset(m.control.reason, sizeof m.control.reason, "operator");
            break;
        case PROTO_RESTART:
            m.restart.generation = 3;
            proto_strset(m.restart.ckpt_dir, sizeof m.restart.ckpt_dir, "/ckpt/step-0000000200");
            break;
        case PROTO_QUERY: m.query.what = PROTO_Q_STATUS; break;
        case PROTO_REPLY:
            m.reply.json_len = sizeof json - 1;
            m.json = json;
            break;
        case PROTO_AUTH:
            m.auth.len = 20;
            memcpy(m.auth.token, "seed-token-0123456789", 20);
            break;
        default: break;
        }
        size_t n = frame(buf, sizeof buf, &m);
        put("proto", proto_type_name(t), buf, n);
        if (slen + n <= sizeof stream) {
            memcpy(stream + slen, buf, n);
            slen += n;
        }
    }
    put("proto", "stream-all-types", stream, slen);
}

/* The tiny drafter's checkpoint files, each behind the byte that makes fuzz_ckpt replace it. */
static void seeds_ckpt(void)
{
    static const char *const names[] = { "config.json", "optimizer.bin", "model.safetensors" };
    if (ckpt_fuzz_setup() < 0)
        die("ckpt", "cannot make the tiny drafter's checkpoint");
    for (int i = 0; i < 3; i++) {
        uint8_t *b = malloc(1 + ckpt_fuzz.good_len[i]);
        b[0] = (uint8_t)i;
        memcpy(b + 1, ckpt_fuzz.good[i], ckpt_fuzz.good_len[i]);
        put("ckpt", names[i], b, 1 + ckpt_fuzz.good_len[i]);
        free(b);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: make_seeds SRC_DIR OUT_DIR\n");
        return 64;
    }
    out_root = argv[2];
    mkdir(out_root, 0755);
    seeds_config(argv[1]);
    seeds_dataset();
    seeds_safetensors(argv[1]);
    seeds_st_index(argv[1]);
    seeds_hfconfig(argv[1]);
    seeds_ring();
    seeds_proto();
    seeds_ckpt();
    return 0;
}
