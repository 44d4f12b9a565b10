/* config.h: the dflash configuration (one INI file, etc/dflash.ini) and its loader.
 * Every key lives in one table in config.c: {section, key, type, min, max, default}. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CFG_STR_MAX 256
#define CFG_MAX_EPOCHS 100000   /* data.epochs at most */
/* cluster.name: the longest name that still fits every name built from it; the ring's
 * "/dflash-<name>" must leave 8 bytes of its 64 (PROTO_NAME_MAX) free, so 64 - 8 - 8 - 1. */
#define CFG_CLUSTER_NAME_MAX 47
/* model.capture_layers: at most this many ids (the ring, target and drafter all take 64). */
#define CFG_MAX_LAYER_IDS 64

struct cfg_cluster {
    char name[64];              /* cluster id: names the shm ring and socket */
    char runtime_dir[CFG_STR_MAX];
    char state_dir[CFG_STR_MAX];
    char socket[CFG_STR_MAX];   /* control socket path; empty = runtime_dir/<name>.sock */
    char group[64];             /* group allowed on the socket and ring (empty = owner only) */
    char tcp_listen[128];       /* "host:port" / "[v6]:port" or empty: no network listener */
    char tcp_token_file[CFG_STR_MAX]; /* shared secret TCP peers must present (mode 0600) */
    char log_level[16];
};

struct cfg_ring {
    int64_t slots;
    int64_t max_tokens;         /* tokens per slot */
    int64_t max_seqs;           /* sequences per slot */
    int64_t stuck_writing_ms;   /* WRITING longer than this with a live owner is reported */
};

struct cfg_model {
    char path[CFG_STR_MAX];     /* Hugging Face model dir: config.json + *.safetensors */
    char capture_layers[CFG_STR_MAX]; /* comma list of layer ids; empty = DFlash default */
    int64_t draft_layers;       /* drafter depth; also picks default capture layers */
};

struct cfg_data {
    char path[CFG_STR_MAX];     /* dataset file made by dflash-data */
    int64_t token_budget;       /* tokens per packed batch */
    int64_t max_seq_len;        /* longer samples are truncated */
    int64_t epochs;
    int64_t seed;
    int64_t bucket_width;       /* tokens per length bucket */
};

struct cfg_coordinator {
    int64_t heartbeat_ms;
    int64_t dead_after_ms;      /* no heartbeat this long = dead */
    int64_t watchdog_ms;        /* ignored (older files set it); systemd's WatchdogSec= rules */
    char ledger[CFG_STR_MAX];   /* SQLite ledger; empty = <state_dir>/<name>-ledger.db */
    int64_t ring_hidden;        /* slot hidden size without a model (with one: 0 or its size) */
    int64_t recovery_ms;        /* after a restart: wait this long for peers before re-leasing */
    int64_t min_free_mb;        /* pause below this much free space for the ledger or checkpoints (0 = off) */
};

struct cfg_target {
    char backend[16];           /* cpu | cuda */
    int64_t prefetch;           /* leases held ahead */
    int64_t threads;            /* CPU backend threads */
    int64_t devices;            /* highest valid instance index + 1 */
    int64_t gpu_timeout_ms;     /* CUDA: a batch on the GPU this long: the GPU hangs, exit 1 */
    int64_t debug_nan_batch;    /* inject NaN into this batch id's states (-1 = off) */
    int64_t debug_stall_batch;  /* CUDA: a kernel that never ends before this batch's forward (-1 = off) */
};

struct cfg_drafter {
    char backend[16];
    int64_t min_ready;
    char pick[16];              /* oldest | random */
    int64_t ready_timeout_ms;
    int64_t world_size;
    int64_t block_size;
    int64_t num_anchors;
    double gamma;
    int64_t mask_token_id;      /* -1 = pick from the target vocab */
    int64_t num_heads;
    int64_t num_kv_heads;
    int64_t head_dim;
    int64_t intermediate_size;
    double lr;
    double min_lr_ratio;
    int64_t warmup_steps;
    int64_t total_steps;        /* 0 = derive from dataset and epochs */
    double weight_decay;
    double beta1, beta2, adam_eps;
    double grad_clip;
    int64_t checkpoint_every;
    int64_t checkpoint_timeout_ms; /* a checkpoint write waited on this long: the storage hangs, exit 1 */
    char checkpoint_dir[CFG_STR_MAX]; /* empty = state_dir/checkpoints */
    char metrics_path[CFG_STR_MAX];   /* empty = state_dir/metrics-rankN.jsonl */
    int64_t seed;
    int64_t threads;
    int64_t devices;
    int64_t debug_nan_step;     /* make the loss NaN at this step (-1 = off) */
    int64_t collective_timeout_ms; /* a peer silent this long in an all-reduce fails the group */
    int64_t keep_checkpoints;   /* newest checkpoints kept on disk (0 = all) */
    int64_t debug_ckpt_delay_ms;/* a background checkpoint write waits this long first (0 = off) */
};

struct dflash_cfg {
    struct cfg_cluster cluster;
    struct cfg_ring ring;
    struct cfg_model model;
    struct cfg_data data;
    struct cfg_coordinator coordinator;
    struct cfg_target target;
    struct cfg_drafter drafter;
};

enum cfg_type { CFG_INT, CFG_DOUBLE, CFG_BOOL, CFG_STR };

struct cfg_key {
    const char *section;
    const char *key;
    enum cfg_type type;
    double min, max;            /* numeric range; for CFG_STR: max = buffer size */
    const char *def;
    size_t offset;
    const char *help;
    int path;                   /* CFG_STR naming a file or folder: a relative one is made absolute */
};

extern const struct cfg_key cfg_keys[];
extern const size_t cfg_nkeys;

/* Fill *cfg with defaults, then apply `path` (NULL = defaults only). A relative path value
 * (model.path, data.path, ...) is taken from the file's folder, so every daemon reads the same
 * one wherever it was started. On error returns <0 and writes "file:line: section.key: reason"
 * into err. */
int cfg_load(struct dflash_cfg *cfg, const char *path, char *err, size_t errlen);
/* cfg_load reading one section alone (the rest keeps its defaults): errors elsewhere in the
 * file are passed over, its own are errors as in cfg_load. For a tool that needs a few keys of
 * a file that may hold a mistake it has nothing to do with (dflashctl: the socket). *present
 * (when not NULL): whether the file has that section's header at all. */
int cfg_load_section(struct dflash_cfg *cfg, const char *path, const char *section, bool *present, char *err,
                     size_t errlen);
/* Apply one "section.key=value" override (command line); same checks. A relative path value
 * is taken from the current folder. */
int cfg_set(struct dflash_cfg *cfg, const char *assignment, char *err, size_t errlen);
/* The offset of s's first control character (below 0x20, or 0x7f), or -1: a value quoted in a
 * message must not break its line. */
long cfg_control_char(const char *s);
/* Print every key with its effective value, one per line ("section.key = value"). */
void cfg_print(const struct dflash_cfg *cfg, FILE *f, const char *section /* NULL = all */);

/* The ledger's file: coordinator.ledger, or <state_dir>/<name>-ledger.db. 0, or -ENAMETOOLONG
 * when it does not fit in len bytes. */
int cfg_ledger_path(const struct dflash_cfg *cfg, char *buf, size_t len);
/* The drafters' checkpoint folder: drafter.checkpoint_dir, or <state_dir>/checkpoints. 0, or
 * -ENAMETOOLONG when it does not fit in len bytes. */
int cfg_checkpoint_dir(const struct dflash_cfg *cfg, char *buf, size_t len);
/* Parse a comma list of layer ids (capture_layers) into out[]: decimal ids in [0, 2^20], no empty
 * items, no id twice. Returns the count, -E2BIG for more than max ids, or -EINVAL / -ERANGE. */
int cfg_parse_int_list(const char *s, int *out, int max);
