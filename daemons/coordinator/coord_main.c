/* coord_main.c: coordinator-d: config, dataset + ledger recovery, ring, control socket,
 * then the libuv loop; READY only once all of them are up; a clean stop leaves nothing behind. */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/log.h"
#include "common/text.h"
#include "common/timeutil.h"
#include "daemons/coordinator/coord.h"
#include "ipc/net.h"
#include "ipc/stopnote.h"
#include "ipc/ring.h"

static struct coord g_co;

static volatile sig_atomic_t g_early_signal;   /* a stop signal before the loop's handlers */

static void on_early_signal(int sig) { g_early_signal = sig; }

static void on_signal(uv_signal_t *h, int sig)
{
    struct coord *co = h->data;
    static int count;
    count++;
    /* One that comes once the cluster is stopped: the coordinator leaves without waiting for
     * the daemons still writing what they write at the stop. */
    bool ended = co->state == PROTO_STATE_STOPPED || co->state == PROTO_STATE_FAILED;
    if (ended && !co->stop_hurry)
        log_notice("%s received: leaving without waiting for the daemons (%d still connected)", strsignal(sig),
                   coord_daemons_left(co));
    else
        log_notice("%s received%s", strsignal(sig), count > 1 ? " again: stopping now" : "");
    co->stop_hurry = ended;
    coord_signal_stop(co, count > 1);
    coord_flush(co);
}

static void on_tick(uv_timer_t *t)
{
    struct coord *co = t->data;
    daemon_watchdog(&co->d);
    uint64_t t0 = mono_ns();
    coord_tick(co);
    coord_server_tick(co);
    coord_timer_note(&co->check, t0);
    coord_flush(co);
    if (co->state == PROTO_STATE_STOPPED || co->state == PROTO_STATE_FAILED) {
        uint64_t now = mono_ms();
        if (!co->ended_ms && coord_ended(co))
            co->ended_ms = now;
        /* Give daemons the STOP and the time to write what they write at it: dead_after_ms (one
         * that stops heartbeating is closed by coord_tick then), and for a drafter that still
         * heartbeats (writing its stop checkpoint) as long as a drafter waits on a checkpoint write
         * (drafter.checkpoint_timeout_ms) and dead_after_ms more. One still there when its wait
         * is up (or at a stop signal once stopped) is left behind, the stop note says so. Then a
         * dflashctl that asked before the end has a last look (over TCP it has no stop note to
         * read), then leave. */
        int ctl_unseen = 0, drafters = 0;
        for (struct member *m = co->members; m; m = m->next) {
            ctl_unseen += co->ended_ms && m->role == PROTO_ROLE_CTL && !m->closing && m->last_request_ms <= co->ended_ms;
            drafters += m->role == PROTO_ROLE_DRAFTER;
        }
        bool ctl_wait = ctl_unseen && now - co->ended_ms < COORD_CTL_LAST_LOOK_MS;
        uint64_t dead_after = (uint64_t)co->cfg->coordinator.dead_after_ms, waited = now - co->stopped_ms;
        uint64_t wait = dead_after + (drafters ? (uint64_t)co->cfg->drafter.checkpoint_timeout_ms : 0);
        if (!co->ended_ms && !co->stop_hurry && drafters && !co->stop_wait_logged && waited > dead_after) {
            log_notice("waiting for %d drafter%s still heartbeating to leave (a stop checkpoint being written?), "
                       "%" PRIu64 " s at most", drafters, drafters == 1 ? "" : "s", (wait - waited) / 1000);
            co->stop_wait_logged = true;
        }
        if (co->ended_ms ? !ctl_wait : co->stop_hurry || waited > wait)
            uv_stop(co->loop);
    }
}

/* Clean stop: nothing stays half-done in the ledger once the ring is gone. When that cannot be
 * written, the ledger keeps the batches in flight as they were and the next start's recovery
 * queues them again (the daemons have left on the STOP already). */
static void finalize_ledger(struct coord *co)
{
    static const int in_flight[] = { BATCH_LEASED, BATCH_PUBLISHED, BATCH_TRAINED };
    for (size_t k = 0; k < sizeof in_flight / sizeof in_flight[0]; k++) {
        struct batch **list = coord_state_list(co, in_flight[k]);
        while (*list) {
            struct batch *b = *list;
            coord_list_unlink(list, b);
            co->counts[b->row.state]--;
            co->counts[BATCH_PENDING]++;
            b->row.state = BATCH_PENDING;
            b->row.owner = 0;
            b->row.slot = -1;
            b->row.updated_ms = wall_ms();
            ledger_batch_update(co->ledger, &b->row);
        }
    }
    coord_group_close(co);
    /* Failed and left: the next start runs on (the fatal error stays in the errors table). A
     * failed_open found at a start means this clean exit was not recorded. */
    ledger_meta_set_u64(co->ledger, "failed_open", 0);
    char err[512];
    if (ledger_commit(co->ledger, err, sizeof err) < 0)
        log_error(0, "the batches in flight at the stop are not settled in the ledger (the next start's recovery "
                  "does it): %s", err);
}

/* The rules between keys that each key's own range cannot express: checked by -t as at a start,
 * named by file:line (a start refused on them would be restarted into the same refusal). */
static int check_key_pairs(struct coord *co, char *err, size_t errlen)
{
    const struct dflash_cfg *cfg = co->cfg;
    if (cfg->data.max_seq_len > cfg->data.token_budget)
        return daemon_key_error(&co->d, "data", "max_seq_len", err, errlen,
                                "%lld is larger than data.token_budget (%lld): a sample would not fit a batch",
                                (long long)cfg->data.max_seq_len, (long long)cfg->data.token_budget);
    if (cfg->data.token_budget > cfg->ring.max_tokens)
        return daemon_key_error(&co->d, "data", "token_budget", err, errlen,
                                "%lld is larger than ring.max_tokens (%lld): a batch would not fit a slot",
                                (long long)cfg->data.token_budget, (long long)cfg->ring.max_tokens);
    /* cluster.group: the group the socket, the ring and the stop note are given to */
    co->allowed_gid = (gid_t)-1;
    if (cfg->cluster.group[0]) {
        errno = 0;
        struct group *g = getgrnam(cfg->cluster.group);
        int e = errno;
        if (!g && (e == 0 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM))    /* "not found" */
            return daemon_key_error(&co->d, "cluster", "group", err, errlen, "no such group '%s'", cfg->cluster.group);
        if (!g) {   /* the lookup failed (the directory service down at boot): a restart may pass */
            daemon_key_error(&co->d, "cluster", "group", err, errlen, "'%s': the lookup failed: %s", cfg->cluster.group,
                             strerror(e));
            return err_may_pass(-e) ? -e : -EAGAIN;
        }
        co->allowed_gid = g->gr_gid;
    }
    return 0;
}

/* cluster.tcp_listen + cluster.tcp_token_file: the address resolved once, the token read
 * and its file's mode checked. 0 (listener off or ready to bind) or -EINVAL, reason in err. */
static int tcp_config(struct coord *co, char *err, size_t errlen)
{
    const char *spec = co->cfg->cluster.tcp_listen, *token_path = co->cfg->cluster.tcp_token_file;
    char why[512];
    if (!spec[0]) {
        if (token_path[0])
            log_warn(0, "cluster.tcp_token_file is set but cluster.tcp_listen is empty: no TCP listener");
        return 0;
    }
    socklen_t len;
    if (net_resolve(spec, &co->tcp_sa, &len, why, sizeof why) < 0)
        return daemon_key_error(&co->d, "cluster", "tcp_listen", err, errlen, "%s", why);
    if (!token_path[0])
        return daemon_key_error(&co->d, "cluster", "tcp_token_file", err, errlen,
                                "required with cluster.tcp_listen: TCP peers have no credentials to check");
    size_t n = 0;
    if (net_token_load(token_path, co->tcp_token, sizeof co->tcp_token, PROTO_AUTH_TOKEN_MIN, &n, why, sizeof why) < 0)
        return daemon_key_error(&co->d, "cluster", "tcp_token_file", err, errlen, "%s", why);
    co->tcp_token_len = (uint32_t)n;
    co->tcp_on = true;
    char addr[NET_ADDR_STRLEN];
    net_addr_format((const struct sockaddr *)&co->tcp_sa, addr, sizeof addr);
    if (strcmp(addr, spec))
        log_info("cluster.tcp_listen %s resolved to %s", spec, addr);
    return 0;
}

/* A ledger this start made and left before anything ran on it (its checks failed): removed, so
 * the next start, its config mended (and perhaps changed), makes its own instead of refusing
 * this one as written for another schedule. */
static void remove_new_ledger(const char *path)
{
    char p[sizeof g_co.ledger_path + 8];
    if (unlink(path) < 0)
        return;     /* (never made: its folder missing, say) */
    snprintf(p, sizeof p, "%.*s-wal", (int)sizeof p - 5, path);
    unlink(p);
    snprintf(p, sizeof p, "%.*s-shm", (int)sizeof p - 5, path);
    unlink(p);
    log_notice("removed %s: this start made it and stopped before anything ran", path);
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    coord_close_handle(h);
}

/* Every peer holds a descriptor: the soft limit (1024 under systemd) goes up to the hard one
 * (the loop is epoll, no select), and what is left is told when it runs low (coord_server.c). */
static void raise_fd_limit(struct coord *co)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        co->fd_limit = 1024;
        return;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = { rl.rlim_max, rl.rlim_max };
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    co->fd_limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    log_info("open files: up to %" PRIu64 " (RLIMIT_NOFILE; LimitNOFILE= in the unit)", co->fd_limit);
}

int main(int argc, char **argv)
{
    struct coord *co = &g_co;
    char err[1024];
    int r = daemon_start(&co->d, "coordinator-d", "coordinator", 0, argc, argv, err, sizeof err);
    if (r >= 0) {
        if (err[0])
            log_error(0, "%s", err);
        return r;
    }
    co->cfg = &co->d.cfg;
    const struct dflash_cfg *cfg = co->cfg;
    if (cfg->coordinator.watchdog_ms)
        log_warn(0, "coordinator.watchdog_ms = %" PRId64 " is ignored: the watchdog interval is the unit's WatchdogSec=",
                 cfg->coordinator.watchdog_ms);
    if (tcp_config(co, err, sizeof err) < 0) {
        log_error(0, "%s", err);
        return DAEMON_EX_CONFIG;
    }
    const char *too_long = NULL;
    if (cfg->cluster.socket[0]) {
        if (snprintf(co->socket_path, sizeof co->socket_path, "%s", cfg->cluster.socket) >= (int)sizeof co->socket_path)
            too_long = "cluster.socket";
    } else if (snprintf(co->socket_path, sizeof co->socket_path, "%s/%s.sock", cfg->cluster.runtime_dir,
                        cfg->cluster.name) >= (int)sizeof co->socket_path) {
        too_long = "the socket path <cluster.runtime_dir>/<cluster.name>.sock";
    }
    if (snprintf(co->ring_name, sizeof co->ring_name, "/dflash-%s", cfg->cluster.name) >= (int)sizeof co->ring_name - 8)
        too_long = "cluster.name";
    if (!too_long && cfg_ledger_path(cfg, co->ledger_path, sizeof co->ledger_path) < 0)
        too_long = "the ledger path";
    if (too_long) {
        if (strstr(too_long, "socket"))
            log_error(0, "%s is too long (a unix socket's path has at most %zu bytes)", too_long,
                      sizeof co->socket_path - 1);
        else
            log_error(0, "%s is too long", too_long);
        return DAEMON_EX_CONFIG;
    }
    /* where check_space looks: the ledger's folder and the drafters' checkpoint folder */
    _Static_assert(sizeof co->space.ledger_dir == sizeof co->ledger_path, "ledger_dir holds ledger_path");
    memcpy(co->space.ledger_dir, co->ledger_path, sizeof co->ledger_path);
    char *slash = strrchr(co->space.ledger_dir, '/');
    if (!slash)
        snprintf(co->space.ledger_dir, sizeof co->space.ledger_dir, ".");
    else
        slash[slash == co->space.ledger_dir] = 0;   /* "/x.db": "/" */
    cfg_checkpoint_dir(cfg, co->space.ckpt_dir, sizeof co->space.ckpt_dir);   /* (cut to fit: the drafters refuse it) */
    co->space.free_mb = UINT64_MAX;
    /* The model's config.json and the ring's layout, and (for -t: the start hashes it in full
     * below) the dataset's header: before the ledger exists, so a start that fails on them leaves
     * none behind (it would hold the schedule of a config the operator is about to change). */
    if ((r = check_key_pairs(co, err, sizeof err)) < 0 || (r = coord_ring_layout(co, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        return err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
    }
    if (co->d.check_only) {
        struct dataset ds;
        if ((r = coord_dataset_open(co, &ds, DATASET_OPEN_NO_CHECKSUM, err, sizeof err)) < 0) {
            log_error(0, "%s", err);
            return err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
        }
        dataset_close(&ds);
        return 0;
    }

    /* A stop signal during the checks at start (the dataset, the ledger: seconds on a large run)
     * is noted and taken once they are done, by the loop's handler as at any other time (a drain,
     * the stop note), instead of the default action killing the process half-way. (Not blocked:
     * threads of the libraries, already running, would take it with the default action.) */
    struct sigaction sa = { .sa_handler = on_early_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    daemon_notify_init(&co->d);
    co->start_wall_ms = wall_ms();
    co->start_mono_ms = mono_ms();
    co->next_member_id = 1;
    co->signal_drain_from = -1;
    co->exit_code = DAEMON_EX_FAILURE;
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(co);
    if ((r = daemon_lock(&co->d, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        return r == -ENOTDIR ? DAEMON_EX_CONFIG : DAEMON_EX_FAILURE;
    }
    /* The lock says no other coordinator runs: the last one's stop note is stale from here on
     * (daemons that find no socket now wait for this one). */
    stop_note_clear(co->socket_path);
    if ((r = daemon_dir("cluster.state_dir", cfg->cluster.state_dir, err, sizeof err)) < 0) {
        /* a file there: the operator's to mend; a folder that cannot be made yet (its storage
         * not mounted) may be there at the restart */
        log_error(0, "%s", err);
        return r == -ENOTDIR ? DAEMON_EX_CONFIG : DAEMON_EX_FAILURE;
    }

    daemon_notify_status(&co->d, "checking the dataset and the ledger");
    daemon_watchdog(&co->d);    /* start time; the dataset's hash ticks for more as it goes (progress.h) */
    struct stat lst;
    bool have_ledger = stat(co->ledger_path, &lst) == 0;
    bool ledger_new = !have_ledger && errno == ENOENT, ready = false, settled = false;
    if (have_ledger && S_ISREG(lst.st_mode) && lst.st_size == 0)
        log_warn(0, "%s is there but empty (0 bytes): a new run starts in it (a run's ledger is never empty: if one "
                 "was there, it was cut; its checkpoints will not be taken up)", co->ledger_path);
    if ((r = coord_cluster_init(co, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        coord_cluster_done(co);
        if (ledger_new)
            remove_new_ledger(co->ledger_path);
        daemon_done(&co->d);
        /* What a restart may clear (memory, I/O, the disk full, the ledger locked by another
         * process) exits 1; the rest (a foreign ledger, bad data, no permission) is the operator's. */
        return r == -ENOMEM || r == -EIO || r == -ENOSPC || r == -EBUSY ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
    }
    co->loop = uv_default_loop();
    daemon_notify_status(&co->d, "opening the control socket");
    if ((r = coord_server_start(co, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        /* cluster.socket a path that cannot be one or is taken,
         * a folder it may not write, an address not this host's: a config error, not restarted
         * (what a restart may clear, out of memory or descriptors, exits 1) */
        if (!err_may_pass(r))
            co->exit_code = DAEMON_EX_CONFIG;
        goto out;
    }
    daemon_notify_status(&co->d, "opening the ring");
    daemon_watchdog(&co->d);
    if ((r = coord_ring_open(co, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        /* (another user's object under the name: the operator's to remove, as a foreign one) */
        bool config = r == -DF_ELAYOUT || r == -EINVAL || r == -DF_EMAGIC || r == -EACCES || r == -EPERM;
        co->exit_code = config ? DAEMON_EX_CONFIG : DAEMON_EX_FAILURE;
        goto out;
    }
    coord_ring_reconcile(co);
    if ((r = ledger_commit(co->ledger, err, sizeof err)) < 0) {
        log_error(0, "%s", err);
        goto out;
    }

    uv_signal_init(co->loop, &co->sigterm);
    uv_signal_init(co->loop, &co->sigint);
    co->sigterm.data = co->sigint.data = co;
    uv_signal_start(&co->sigterm, on_signal, SIGTERM);
    uv_signal_start(&co->sigint, on_signal, SIGINT);
    if (g_early_signal)
        raise(g_early_signal);  /* one sent meanwhile goes to the loop's handler now */
    uv_timer_init(co->loop, &co->tick);
    co->tick.data = co;
    uint64_t period = (uint64_t)cfg->coordinator.heartbeat_ms / 2;
    if (period > 250)
        period = 250;
    if (period < 5)
        period = 5;
    if (co->d.watchdog_usec && co->d.watchdog_usec / 4000 < period)
        period = co->d.watchdog_usec / 4000 ? co->d.watchdog_usec / 4000 : 1;
    uv_timer_start(&co->tick, on_tick, period, period);

    if (!co->recovering)
        coord_set_state(co, PROTO_STATE_RUNNING, "");
    coord_flush(co);
    log_notice("ready: socket %s%s%s, ring %s, ledger %s, %" PRIu64 " samples, %u epochs", co->socket_path,
               co->tcp_on ? ", TCP " : "", co->tcp_on ? co->tcp_addr : "", co->ring_name, co->ledger_path,
               co->ds.n_samples, co->epochs);
    daemon_notify_ready(&co->d, "%s: socket %s, ring %s", proto_state_name((unsigned)co->state), co->socket_path,
                        co->ring_name);
    ready = true;
    if ((r = coord_space_start(co)) < 0)
        log_warn(r, "no thread to watch the free space: coordinator.min_free_mb is not applied");
    uv_run(co->loop, UV_RUN_DEFAULT);

    daemon_notify_stopping(&co->d, "%s%s%s", proto_state_name((unsigned)co->state), co->reason[0] ? ": " : "", co->reason);
    bool clean = co->state == PROTO_STATE_STOPPED || co->state == PROTO_STATE_FAILED;
    if (clean) {
        coord_ring_settle(co);
        finalize_ledger(co);
        settled = true;
    }
    co->exit_code = co->state == PROTO_STATE_FAILED ? DAEMON_EX_CONFIG : DAEMON_EX_OK;
    log_notice("exiting: %s%s%s", proto_state_name((unsigned)co->state), co->reason[0] ? ": " : "", co->reason);
    /* A daemon (re)started from now on finds the note and exits 0 instead of waiting for us. */
    if (clean) {
        char note[sizeof co->reason + 128];
        int left = co->ended_ms ? 0 : coord_daemons_left(co);   /* (one come since the end: not left behind) */
        char behind[80] = "";
        if (left)
            snprintf(behind, sizeof behind, "; %d daemon%s " STOP_NOTE_NOT_LEFT, left, left == 1 ? "" : "s");
        /* the reason cut where the note would be (at STOP_NOTE_MAX): the suffix is what
         * dflashctl --wait reads */
        const char *state = proto_state_name((unsigned)co->state);
        int room = STOP_NOTE_MAX - (int)strlen(state) - 2 - (int)strlen(behind);
        snprintf(note, sizeof note, "%.32s%s%.*s%s", state, co->reason[0] ? ": " : "",
                 (int)text_fit(co->reason, room > 0 ? (size_t)room : 0), co->reason, behind);
        if ((r = stop_note_write(co->socket_path, note, co->allowed_gid)) < 0)
            log_warn(r, "stop note beside %s", co->socket_path);
    }
out:
    coord_server_close(co);
    if (settled) {
        /* what closing the members found (a daemon watched since it left, dead now: an error);
         * not after an exit on an error: the leases of daemons that will come back stay theirs */
        char cerr[512];
        if (ledger_commit(co->ledger, cerr, sizeof cerr) < 0)
            log_error(0, "the errors found while closing are not in the ledger: %s", cerr);
    }
    uv_walk(co->loop, close_walk, NULL);
    uv_run(co->loop, UV_RUN_DEFAULT);
    uv_loop_close(co->loop);
    if (co->ring) {
        ring_detach(co->ring);
        if (co->exit_code == DAEMON_EX_OK || co->state == PROTO_STATE_FAILED)
            ring_unlink(co->ring_name);
    }
    coord_cluster_done(co);
    if (!ready && ledger_new)
        remove_new_ledger(co->ledger_path);
    daemon_done(&co->d);
    return co->exit_code;
}
