/* peer.h: how target-d and drafter-d reach the cluster: connect to the coordinator (waiting for
 * it to come up, the watchdog fed meanwhile) and attach the ring its WELCOME names. */
#pragma once
#include <stddef.h>
#include "common/daemon.h"
#include "common/dataset.h"
#include "ipc/client.h"
#include "ipc/ring.h"

/* Connect as `role` (PROTO_ROLE_*) to the coordinator at sock. While it is not there yet
 * (-ENOENT, -ECONNREFUSED, -EAGAIN) or the connection is lost or unanswered during the HELLO
 * (-EPIPE, -ECONNRESET, -DF_ETIMEOUT) retry every 200 ms for up to 5 x coordinator.dead_after_ms
 * + 30 s; any other error returns at once. A stop signal meanwhile: -ECANCELED. -ESHUTDOWN (err says why):
 * there is no coordinator because it stopped the cluster (its stop note is there, ipc/stopnote.h),
 * so a daemon started after the end has nothing to do, as if it had been told STOP. */
int peer_connect_coordinator(struct daemon *d, const char *sock, int role, struct client **out, char *err,
                             size_t errlen);

/* What a daemon does when peer_connect_coordinator returned r < 0 (err its text): -ESHUTDOWN
 * logs "nothing to do", tells systemd READY then STOPPING (a Type=notify unit that exits before
 * READY counts as failed and is restarted) and gives DAEMON_EX_OK; -ECANCELED (stopped while
 * waiting) the same, a clean exit; anything else logs the error
 * and gives DAEMON_EX_FAILURE. The daemon's exit code. */
int peer_connect_failed(struct daemon *d, const char *sock, int r, const char *err);

/* Wait (at most ms) until the coordinator acknowledged every event in cl's outbox, feeding d's
 * watchdog; pushed messages stay queued. Returns early when the cluster has ended (stop note) or
 * on a second stop signal. */
void peer_flush_events(struct daemon *d, struct client *cl, uint64_t ms);

/* A daemon leaving with a failure (code < 0) that it has not reported yet (*reported == 0): while
 * connected, the reason goes to the coordinator as a non-fatal ERROR "<ident> exits: <reason>; its
 * last error: <the last error line it logged>"
 * (systemd restarts the daemon; the error log keeps why), with up to 2 s for it and the outbox to
 * go out, and *reported is set. Disconnected (or cl NULL): only the daemon's own log has it. */
void peer_report_exit(struct daemon *d, struct client *cl, int code, int *reported);

/* The daemon's last word to the coordinator, just before it exits with exit_code (r: the error
 * that ends it, < 0, or 0): BYE "<ident> exits <exit_code>[: <r's text>]", while connected. A
 * daemon gone without one is recorded by the coordinator as having died (a signal, a crash). */
void peer_bye(struct daemon *d, struct client *cl, int exit_code, int r);

/* Leave at once, without the clean exit's waits (a thread or a GPU that never comes back would
 * hold them for ever): what cl has queued (events, an error just sent) gets up to 2 s to go out,
 * systemd is told STOPPING with `status`, then _exit(code). The coordinator takes back what this
 * process held when it sees it gone. */
_Noreturn void peer_abandon(struct daemon *d, struct client *cl, int code, const char *status);

/* On a reconnect the ring the coordinator's WELCOME names must still be the shm object this
 * daemon maps. A coordinator that came back may have made a new one (the old object was
 * removed, e.g. /dev/shm cleaned, or an idle incompatible one replaced); a daemon writing or
 * reading the old mapping would work beside the cluster. peer_watch_ring makes that the
 * client's welcome check (client_set_welcome_check): checked before anything of the old
 * connection is replayed; when it fails, "<ident> exits: <why>" goes to the coordinator, the
 * client gives up (-DF_EPEER) and the daemon exits, to attach the new ring when started again.
 * It cannot be told (e.g. no access to /dev/shm): a warning, and the daemon goes on.
 * ds (a target's; NULL for a drafter): the dataset it reads samples from must still be the
 * coordinator's, by header checksum (a file renamed over the path, then a coordinator restart
 * that scheduled the new one, would have this target pack another dataset's tokens). */
struct peer_ring_watch {
    const struct daemon *d;
    const struct ring *ring;
    const struct dataset *ds;
    uint64_t model_fp;              /* this daemon's weights' fingerprint (0: none to compare) */
    const char *model_config;       /* its config.json's forward settings (hf_config_forward_text) */
};
/* At attach: this daemon's config.json settings (hf_config_forward_text) against the run's in the
 * WELCOME (none there: nothing to compare). 0, or -DF_ELAYOUT and err naming the first setting that
 * differs. */
int peer_check_model_config(const struct proto_welcome *w, const char *model_path, const char *mine, char *err,
                            size_t errlen);
void peer_watch_ring(struct client *cl, struct peer_ring_watch *w, const struct daemon *d, const struct ring *r,
                     const struct dataset *ds, uint64_t model_fp, const char *model_config);

/* Attach the ring named in the coordinator's WELCOME (any mode), retrying for up to 2 s while
 * it is being created (-EAGAIN). A ring that is gone because the cluster has ended (the WELCOME
 * said stopped or failed, or the stop note beside sock is there): -ESHUTDOWN, as from
 * peer_connect_coordinator (a daemon started in the cluster's last moments has nothing to do). */
int peer_attach_ring(struct client *cl, const char *sock, struct ring **out, char *err, size_t errlen);
