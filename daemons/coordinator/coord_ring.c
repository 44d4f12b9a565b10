/* coord_ring.c: the ring's layout from the config (and the model's config.json), create
 * or re-attach at start, and reconciling READY slots with the ledger after a restart. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/log.h"
#include "daemons/coordinator/coord.h"
#include "ipc/ring.h"
#include "model/hfconfig.h"
#include "model/target.h"

/* The layout every target and drafter must agree on (they compute it the same way), into
 * co->lay; a config error names its key (file:line), -EINVAL. Before the ledger is opened: a
 * start that cannot make the ring leaves no ledger behind. */
int coord_ring_layout(struct coord *co, char *err, size_t errlen)
{
    const struct dflash_cfg *cfg = co->cfg;
    const struct daemon *d = &co->d;
    struct ring_layout *lay = &co->lay;
    memset(lay, 0, sizeof *lay);
    int hidden = (int)cfg->coordinator.ring_hidden, n_layers = 0;
    if (cfg->model.path[0]) {
        /* the same reading of config.json as target-d and drafter-d */
        struct hf_config hf;
        char why[400];
        if (hf_config_load(cfg->model.path, &hf, why, sizeof why) < 0)    /* a config error: no restart loop */
            return daemon_key_error(d, "model", "path", err, errlen, "%s", why);
        n_layers = hf.num_layers;
        co->model_vocab = hf.vocab_size;
        _Static_assert(PROTO_CONFIG_MAX == HF_CONFIG_TEXT_MAX, "the WELCOME carries the whole text");
        if (hf_config_forward_text(&hf, co->model_config, sizeof co->model_config) < 0)
            return daemon_key_error(d, "model", "path", err, errlen, "%s/config.json: its settings do not fit in %d "
                                    "bytes (an architecture name that long?)", cfg->model.path, HF_CONFIG_TEXT_MAX);
        if (hidden && hidden != hf.hidden_size)     /* every target and drafter would be refused */
            return daemon_key_error(d, "coordinator", "ring_hidden", err, errlen, "%d is not the hidden_size of "
                                    "%s/config.json (%d): leave it 0 with a model", hidden, cfg->model.path,
                                    hf.hidden_size);
        hidden = hf.hidden_size;
    } else if (!hidden) {
        return daemon_key_error(d, "model", "path", err, errlen,
                                "empty, and coordinator.ring_hidden is 0: cannot size the ring");
    }
    _Static_assert(RING_MAX_LAYERS == TARGET_MAX_CAPTURE, "the ring holds every capture id");
    int ids[RING_MAX_LAYERS];
    const char *key;
    char why[600];
    int n = target_capture_ids(&cfg->model, n_layers, ids, &key, why, sizeof why);
    if (n < 0)
        return daemon_key_error(d, "model", key, err, errlen, "%s", why);
    /* ring_create refuses this too, but the keys' own ranges allow it: refused there, the start
     * would exit 1 and be restarted into the same refusal every second. */
    if (cfg->ring.max_seqs > cfg->ring.max_tokens)
        return daemon_key_error(d, "ring", "max_seqs", err, errlen, "%lld is more than ring.max_tokens %lld: every "
                                "sequence in a slot has a token", (long long)cfg->ring.max_seqs,
                                (long long)cfg->ring.max_tokens);
    lay->nslots = (uint32_t)cfg->ring.slots;
    lay->hidden = (uint32_t)hidden;
    lay->n_layers = (uint32_t)n;
    for (int i = 0; i < n; i++)
        lay->layer_ids[i] = (uint32_t)ids[i];
    if (!cfg->coordinator.ring_hidden)
        daemon_print_resolved("coordinator.ring_hidden", "%d (the hidden_size of %s/config.json)", hidden,
                              cfg->model.path);
    daemon_print_capture_ids(d, ids, n, n_layers);
    lay->dtype = RING_DTYPE_BF16;
    lay->max_tokens = (uint32_t)cfg->ring.max_tokens;
    lay->max_seqs = (uint32_t)cfg->ring.max_seqs;
    return 0;
}

/* Hold the object now named by the ring into co->ring_lock (-1 when there is none or it cannot be
 * opened: the attach says why). -EINVAL naming cluster.name when another coordinator holds it: a
 * cluster of the same name beside this one, with its own runtime_dir (their locks there never
 * meet) and the same ring, which this one would otherwise take over or replace under it, the two
 * runs training on each other's batches. */
static int hold_ring(struct coord *co, char *err, size_t errlen)
{
    char why[300];
    int fd = ring_hold(co->ring_name, why, sizeof why);
    co->ring_lock = fd < 0 ? -1 : fd;
    if (fd == -EBUSY)
        return daemon_key_error(&co->d, "cluster", "name", err, errlen, "ring %s is held by another coordinator: a "
                                "cluster of the same name runs beside this one (each needs a name of its own)",
                                co->ring_name);
    return 0;
}

/* The ring's access as cluster.group says: 0660 and that group, else 0600, the user's alone as the
 * socket is (SO_PEERCRED): 0660 would give it to the coordinator's primary group, on some systems
 * every user's. */
static unsigned ring_mode(const struct coord *co)
{
    return co->allowed_gid != (gid_t)-1 ? 0660 : 0600;
}

/* A re-attached ring was made under the cluster.group of an earlier start: it gets this one's. */
static void ring_set_access(const struct coord *co)
{
    if (co->ring_lock < 0)
        return;
    /* the group first: the old one never has the new mode */
    if ((co->allowed_gid != (gid_t)-1 && fchown(co->ring_lock, (uid_t)-1, co->allowed_gid) < 0) ||
        fchmod(co->ring_lock, ring_mode(co)) < 0)
        log_warn(-errno, "ring %s: cannot give it mode %o%s%s", co->ring_name, ring_mode(co),
                 co->cfg->cluster.group[0] ? " and group " : "", co->cfg->cluster.group);
}

/* Another program's object under the ring's name (why): kept as it is, the start refused. */
static int leave_alone(const struct coord *co, const char *why, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: left alone; remove /dev/shm%s or give cluster.name another value", why, co->ring_name);
    return -DF_EMAGIC;
}

/* An incompatible ring (why) is replaced only if it holds nothing: 0, else -DF_ELAYOUT. */
static int replaceable(const struct coord *co, const char *why, char *err, size_t errlen)
{
    struct ring *old = NULL;
    char why2[512];
    if (ring_attach(&old, co->ring_name, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, why2, sizeof why2) < 0)
        return 0;               /* another version or a broken header: nothing any daemon maps */
    struct ring_stats st;
    ring_stats(old, &st, NULL);
    ring_detach(old);
    if (st.count[RING_FREE] == st.nslots)
        return 0;
    snprintf(err, errlen, "ring %s exists, is not compatible (%s) and holds %u non-free slots: stop its users"
             " or remove /dev/shm%s", co->ring_name, why, st.nslots - st.count[RING_FREE], co->ring_name);
    return -DF_ELAYOUT;
}

int coord_ring_open(struct coord *co, char *err, size_t errlen)
{
    const struct ring_layout lay = co->lay;     /* coord_ring_layout */
    int r;
    char why[512];
    /* Before anything is looked at: a coordinator that holds the ring it maps is the one using it. */
    if ((r = hold_ring(co, err, errlen)) < 0)
        return r;
    for (int attempt = 0; attempt < 50; attempt++) {
        r = ring_attach(&co->ring, co->ring_name, &lay, 0, why, sizeof why);
        if (r != -EAGAIN)
            break;
        usleep(20000);
    }
    if (r == 0 && co->ring_lock < 0 && (r = hold_ring(co, err, errlen)) < 0) {
        ring_detach(co->ring);      /* made by another coordinator since this one looked */
        co->ring = NULL;
        return r;
    }
    /* A ring left by another run (its coordinator died without removing it; the ledger moved
     * away since): its READY batches carry this run's batch ids, (epoch, index), with another
     * schedule's or dataset's samples. Replaced, never adopted. */
    struct ring_stats st;
    if (r == 0 && ring_stats(co->ring, &st, NULL) == 0 && st.tag != co->run_id) {
        snprintf(why, sizeof why, "ring %s is of another run (%016" PRIx64 ", this one is %016" PRIx64 "): "
                 "its %u READY or READING batches are not this run's", co->ring_name, st.tag, co->run_id,
                 st.count[RING_READY] + st.count[RING_READING]);
        ring_detach(co->ring);
        co->ring = NULL;
        r = -ESTALE;
    }
    if (r == 0) {
        ring_set_access(co);
        struct ring_reclaim rc = { 0 };
        ring_reclaim_dead(co->ring, &rc);
        log_notice("re-attached ring %s (%u slots); slots of dead owners: %u WRITING freed, %u READING requeued",
                   co->ring_name, lay.nslots, rc.writing_freed, rc.reading_requeued);
        co->ring_created = false;
        return 0;
    }
    unsigned flags = RING_CREATE_REPLACE;
    switch (r) {
    case -ENOENT:
        flags = 0;
        break;
    case -ESTALE:               /* another run's */
        log_warn(0, "replacing %s", why);
        break;
    case -DF_EDEAD:             /* a creation cut short: dflash's own, holding nothing */
        log_warn(0, "replacing %s", why);
        break;
    case -EPERM:                /* not to be trusted (another user's, or every user's to write): */
        if (ring_is_dflash_object(co->ring_name) == 0) {   /* replaced if a ring, or unreadable */
            size_t n = strlen(why);
            snprintf(why + n, sizeof why - n, ", and is not a dflash ring");
            return leave_alone(co, why, err, errlen);
        }
        /* fall through */
    case -DF_ELAYOUT: case -DF_EVERSION: case -DF_ETRUNC: case -DF_EFORMAT:
    case -EINVAL:               /* not a file (a FIFO) */
        if ((r = replaceable(co, why, err, errlen)) < 0)
            return r;
        log_warn(0, "replacing incompatible ring %s: %s", co->ring_name, why);
        break;
    case -DF_EMAGIC:            /* a file of this user's that is no ring: another program's data */
        return leave_alone(co, why, err, errlen);
    default:
        snprintf(err, errlen, "%s%s", why,
                 r == -EAGAIN ? " for over a second: another coordinator of this name starting?"
                 : r == -EACCES ? " (another user's object under the ring's name? its owner or root must remove it, "
                                  "or give cluster.name another value)" : "");
        return r;
    }
    struct ring_create_opts opts = { .mode = ring_mode(co),
                                     .gid = co->allowed_gid == (gid_t)-1 ? -1 : (int)co->allowed_gid,
                                     .stuck_writing_ms = (uint32_t)co->cfg->ring.stuck_writing_ms, .flags = flags,
                                     .tag = co->run_id };
    r = ring_create(&co->ring, co->ring_name, &lay, &opts, err, errlen);
    if (r < 0)
        return r;
    if (co->ring_lock >= 0)
        close(co->ring_lock);       /* the object replaced */
    if ((r = hold_ring(co, err, errlen)) < 0) {
        ring_detach(co->ring);      /* taken by another coordinator as soon as it was made */
        co->ring = NULL;
        return r;
    }
    co->ring_created = true;
    log_notice("created ring %s: %u slots of %u tokens, hidden %u x %u layers", co->ring_name, lay.nslots,
               lay.max_tokens, lay.hidden, lay.n_layers);
    return 0;
}

/* Every target and drafter that starts finds the ring by its name. An object removed from
 * /dev/shm while the cluster runs (a cleanup of /dev/shm, systemd's RemoveIPC=), or replaced,
 * goes on working for the daemons that map it and fails every one started later. 0 while the
 * name names the object mapped (or it cannot be told: logged once), else -ENOENT with the reason
 * in why: the caller exits so that systemd starts it again to make the ring anew. */
int coord_ring_check(struct coord *co, char *why, size_t len)
{
    int same = ring_same_object(co->ring, co->ring_name);
    if (same > 0)
        return 0;
    if (same < 0) {
        if (!co->ring_check_warned)
            log_warn(same, "ring %s: cannot tell whether /dev/shm%s is still the object mapped", co->ring_name,
                     co->ring_name);
        co->ring_check_warned = true;
        return 0;
    }
    snprintf(why, len, "ring %s was removed from /dev/shm, replaced or cut short while the cluster ran (RemoveIPC=? a cleanup?): "
             "exiting 1 to make it anew when restarted; the daemons on the old one follow", co->ring_name);
    return -ENOENT;
}
