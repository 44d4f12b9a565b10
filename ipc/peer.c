/* peer.c: see peer.h. */
#include "ipc/peer.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "common/log.h"
#include "common/text.h"
#include "common/timeutil.h"
#include "ipc/proto.h"
#include "ipc/stopnote.h"

/* The coordinator's stop note beside sock: -ESHUTDOWN with err saying why, else 0. */
static int ended(const char *sock, char *err, size_t errlen)
{
    char why[160];
    if (!stop_note_read(sock, why, sizeof why))
        return 0;
    snprintf(err, errlen, "the coordinator has ended the cluster (%s)", why);
    return -ESHUTDOWN;
}

int peer_connect_coordinator(struct daemon *d, const char *sock, int role, struct client **out, char *err,
                             size_t errlen)
{
    char name[PROTO_NAME_MAX];
    snprintf(name, sizeof name, "%s", d->ident);
    struct client_opts o = { .socket_path = sock, .role = role, .device = d->index, .name = name,
                             .connect_timeout_ms = 0, .reply_timeout_ms = 10000, .reconnect_ms = 200,
                             .stop_note = 1 };
    uint64_t deadline = mono_ms() + 5ull * (uint64_t)d->cfg.coordinator.dead_after_ms + 30000;
    int r, warned = 0, silent = 0, busy = 0;
    for (;;) {
        r = client_open(out, &o, err, errlen);
        /* Not there yet, or going away while we said HELLO (a coordinator that is stopping
         * still accepts until it closes): ask again, and look for its stop note meanwhile. A
         * signal that cut a wait short (a stop, while connect() waits for room in a stalled
         * coordinator's queue) is looked at first. */
        if (r == 0 || (r != -ENOENT && r != -ECONNREFUSED && r != -EAGAIN && r != -EPIPE &&
                       r != -ECONNRESET && r != -DF_ETIMEOUT && r != -EINTR))
            return r;
        if (ended(sock, err, errlen))
            return -ESHUTDOWN;
        if (daemon_stop_requested()) {
            snprintf(err, errlen, "stopped while waiting for the coordinator at %s", sock);
            return -ECANCELED;
        }
        if (mono_ms() > deadline)
            return r;
        if (r == -EAGAIN && !busy++)     /* (a refusal that passes, a full queue: said once) */
            log_warn(0, "coordinator %s: %s: asking again", sock, err);
        if (r == -DF_ETIMEOUT && !silent++)
            log_warn(0, "%s accepted the connection but did not answer its HELLO in %d s (a coordinator that hangs, "
                     "or another program's socket?): asking again for up to %" PRIu64 " s", sock,
                     o.reply_timeout_ms / 1000, (deadline - mono_ms()) / 1000);
        if (!warned++)
            log_info("waiting for the coordinator at %s", sock);
        daemon_watchdog(d);
        usleep(200000);
    }
}

int peer_connect_failed(struct daemon *d, const char *sock, int r, const char *err)
{
    if (r != -ESHUTDOWN && r != -ECANCELED) {
        log_error(0, "coordinator %s: %s", sock, err);
        return DAEMON_EX_FAILURE;
    }
    /* Started after the end (what STOP would have said), or stopped (systemctl stop) before
     * there was a cluster to leave: a clean exit either way. */
    const char *what = r == -ESHUTDOWN ? ": nothing to do" : "";
    log_notice("%s%s", err, what);
    daemon_notify_ready(d, "%s%s", err, what);
    daemon_notify_stopping(d, "%s", r == -ESHUTDOWN ? "nothing to do" : "stopped before connecting");
    return DAEMON_EX_OK;
}

void peer_flush_events(struct daemon *d, struct client *cl, uint64_t ms)
{
    uint64_t deadline = mono_ms() + ms;
    struct client_stats st;
    for (;;) {
        client_get_stats(cl, &st);
        if (!st.outbox || client_ended(cl) || mono_ms() > deadline || daemon_stop_requested() > 1)
            return;
        char err[256];
        if (client_idle(cl, 50, err, sizeof err) < 0)
            return;
        daemon_watchdog(d);
    }
}

void peer_bye(struct daemon *d, struct client *cl, int exit_code, int r)
{
    if (!cl || !client_connected(cl))
        return;
    if (r < 0)
        client_bye(cl, exit_code, "%s exits %d: %s", d->ident, exit_code, err_str(r));
    else
        client_bye(cl, exit_code, "%s exits %d", d->ident, exit_code);
}

_Noreturn void peer_abandon(struct daemon *d, struct client *cl, int code, const char *status)
{
    if (cl) {
        peer_flush_events(d, cl, 2000);
        if (client_connected(cl))
            client_bye(cl, code, "%s exits %d at once: %s", d->ident, code, status);
    }
    daemon_notify_stopping(d, "%s", status);
    _exit(code);
}

void peer_report_exit(struct daemon *d, struct client *cl, int code, int *reported)
{
    if (!cl || code >= 0 || *reported || !client_connected(cl))
        return;
    *reported = 1;
    char last[PROTO_TEXT_MAX];
    log_last_error(last, sizeof last);
    if (last[0])
        client_error(cl, 0, code, "%s exits: %s; its last error: %s", d->ident, err_str(code), last);
    else
        client_error(cl, 0, code, "%s exits: %s (its log says more)", d->ident, err_str(code));
    peer_flush_events(d, cl, 2000);
}

static int check_ring(void *arg, const struct proto_welcome *w, char *why, size_t len)
{
    const struct peer_ring_watch *pw = arg;
    const struct ring *r = pw->ring;
    if (strcmp(w->ring_name, ring_name(r)) || w->ring_slots != ring_layout(r)->nslots) {
        snprintf(why, len, "%s exits: the coordinator's ring is now %s (%u slots), this daemon maps %s (%u slots)",
                 pw->d->ident, w->ring_name, w->ring_slots, ring_name(r), ring_layout(r)->nslots);
        return -DF_EPEER;
    }
    if (pw->ds && w->dataset_checksum != pw->ds->checksum) {
        snprintf(why, len, "%s exits: the coordinator now schedules dataset %s of checksum %016" PRIx64 ", this daemon "
                 "reads %s of checksum %016" PRIx64, pw->d->ident, w->dataset_path, w->dataset_checksum, pw->ds->path,
                 pw->ds->checksum);
        return -DF_EPEER;
    }
    if (pw->model_fp && w->model_fingerprint && w->model_fingerprint != pw->model_fp) {
        /* (a coordinator that could not read its weights at the first WELCOME sent none) */
        snprintf(why, len, "%s exits: the run's target weights have fingerprint %016" PRIx64 " now, this daemon's "
                 "model.path %016" PRIx64 " (other weights)", pw->d->ident, w->model_fingerprint, pw->model_fp);
        return -DF_EPEER;
    }
    char diff[400];
    if (pw->model_config && w->model_config[0] && text_kv_diff(pw->model_config, w->model_config, diff, sizeof diff)) {
        snprintf(why, len, "%s exits: the run's target config.json has other settings now: %s", pw->d->ident, diff);
        return -DF_EPEER;
    }
    int same = ring_same_object(r, w->ring_name);
    if (same < 0) {
        log_warn(same, "ring %s: cannot tell whether it is still the object this daemon maps", w->ring_name);
        return 0;
    }
    if (!same) {
        snprintf(why, len, "%s exits: ring %s was made anew while the coordinator was away (or cut short): this daemon maps the old one",
                 pw->d->ident, w->ring_name);
        return -DF_EPEER;
    }
    return 0;
}

int peer_check_model_config(const struct proto_welcome *w, const char *model_path, const char *mine, char *err,
                            size_t errlen)
{
    char diff[400];
    if (!w->model_config[0] || !text_kv_diff(mine, w->model_config, diff, sizeof diff))
        return 0;
    snprintf(err, errlen, "%s/config.json (model.path): %s (other settings): point model.path at the run's model",
             model_path, diff);
    return -DF_ELAYOUT;
}

void peer_watch_ring(struct client *cl, struct peer_ring_watch *w, const struct daemon *d, const struct ring *r,
                     const struct dataset *ds, uint64_t model_fp, const char *model_config)
{
    *w = (struct peer_ring_watch){ d, r, ds, model_fp, model_config };
    client_set_welcome_check(cl, check_ring, w);
}

int peer_attach_ring(struct client *cl, const char *sock, struct ring **out, char *err, size_t errlen)
{
    const struct proto_welcome *w = client_welcome(cl);
    struct stat st;
    if (stat(sock, &st) == 0)
        ring_trust_user(st.st_uid);     /* the coordinator's user made the ring */
    int r = -EAGAIN;
    for (int i = 0; i < 100; i++) {
        r = ring_attach(out, w->ring_name, NULL, RING_ATTACH_ANY, err, errlen);
        if (r != -EAGAIN)
            break;
        usleep(20000);
    }
    if (r != -ENOENT)
        return r;
    /* Welcomed by a coordinator that was ending the cluster, which removed the ring as it left. */
    if (ended(sock, err, errlen))
        return -ESHUTDOWN;
    if (w->cluster_state == PROTO_STATE_STOPPED || w->cluster_state == PROTO_STATE_FAILED) {
        snprintf(err, errlen, "the coordinator has ended the cluster (%s; its ring %s is gone)",
                 proto_state_name(w->cluster_state), w->ring_name);
        return -ESHUTDOWN;
    }
    return r;
}
