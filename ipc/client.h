/* client.h: blocking client of the coordinator's control socket, used by target-d,
 * drafter-d and dflashctl: handshake, events with at-least-once delivery, pushed messages. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "ipc/proto.h"

/*
 * Model: one socket, no threads. The daemon calls client_poll() from its work loop
 * (as often as it can; every call also sends the heartbeat when due) and gets pushed
 * messages one at a time: LEASE_GRANT, LEASE_REVOKE, GROUP, RESTART, CONTROL, and
 * WELCOME after a reconnect (so it can re-apply the cluster state, e.g. paused).
 *
 * Connection loss (coordinator restarted): the client reconnects by itself, at most
 * every reconnect_ms, inside client_poll and the send calls, which never block on it.
 * After a reconnect it says HELLO with the same owner token (and drafter group rank and
 * generation), reconciles leases (a held lease the coordinator did not re-grant is
 * dropped and reported to the daemon as a LEASE_REVOKE), sends again every event the
 * old coordinator did not ACK (PUBLISHED, TRAINED, SKIPPED, CHECKPOINTED), then the errors
 * written while disconnected (held, at most 32, the oldest dropped), and asks again for leases
 * still wanted. Events are therefore delivered at least once; the coordinator
 * applies them idempotently. With client_opts.stop_note, a coordinator that ended the
 * cluster meanwhile shows up as a pushed CONTROL STOP.
 *
 * Targets: lease a batch with client_lease_request(); grants arrive as LEASE_GRANT
 * whose samples stay valid (client-owned) until the lease is published or returned.
 * Before marking a slot READY, check that the lease is still held under the number the slot
 * was packed with (client_lease_find()->lease: a revoked lease, or one revoked and granted
 * anew, must not be published: abort the slot instead); then ring_publish, then
 * client_published().
 * Drafters: client_join_group(), then wait for GROUP with client_poll(). GROUP.ckpt_dir
 * is the checkpoint to load: never a newer one found on disk (it is not in the lineage).
 * On RESTART: abort the step (ring_requeue the slot being read), reload RESTART.ckpt_dir,
 * client_join_group() again.
 */

struct client;

struct client_opts {
    const char *socket_path;
    /* Instead of the socket: the coordinator's TCP listener (cluster.tcp_listen), "host:port"
     * or "[v6]:port", for role CTL only. The first frame is AUTH with auth_token. */
    const char *tcp_address;
    const uint8_t *auth_token;  /* cluster.tcp_token_file's secret (net_token_load) */
    size_t auth_token_len;
    enum proto_role role;
    int device;                 /* GPU / worker index; -1 for dflashctl */
    const char *name;           /* shown by dflashctl; NULL = "<role>@<device>" */
    int connect_timeout_ms;     /* client_open keeps trying this long (0 = one attempt) */
    int reply_timeout_ms;       /* wait for WELCOME / REPLY (0 = 5000) */
    int reconnect_ms;           /* between reconnect attempts (0 = 100) */
    /* Targets and drafters: when a reconnect finds no coordinator but its stop note
     * (ipc/stopnote.h), the cluster ended while this client was away and missed its STOP.
     * The client stops reconnecting and hands the daemon a CONTROL STOP carrying the note. */
    int stop_note;
};

struct client_lease {
    uint64_t batch_id;
    uint32_t epoch;
    uint32_t n_samples;
    uint32_t n_tokens;
    uint32_t max_seq_len;
    uint32_t lease;             /* the batch's lease number: written into its slot (ring_payload.lease) */
    uint32_t *samples;          /* dataset sample indices */
    uint32_t samples_cap;       /* the client's: room in samples (kept for the next grant) */
};

struct client_stats {
    uint64_t reconnects;
    uint64_t events_sent, events_acked, events_replayed;
    uint64_t nacks;             /* ACKs with a non-zero status */
    int32_t last_nack_status;
    uint32_t outbox;            /* events not yet acknowledged */
    int64_t ckpt_accepted_step; /* the newest CHECKPOINTED acknowledged with status 0 (-1: none) */
    uint64_t ckpt_accepted_gen; /* ... and its generation */
    uint64_t ckpt_refusals;     /* CHECKPOINTEDs acknowledged with an error status */
    int64_t ckpt_refused_step;  /* the last of them (-1: none) */
    uint64_t ckpt_refused_gen;  /* ... and its generation */
    uint32_t leases_held, leases_wanted;
};

/* Connect, (AUTH over TCP,) HELLO, WELCOME. -DF_EPEER when refused (err carries the
 * coordinator's reason; -EAGAIN for a refusal of that code, a shortage of the coordinator's that
 * passes), -ECONNREFUSED/-ENOENT/-EACCES/-ETIMEDOUT when it cannot be reached. */
int client_open(struct client **out, const struct client_opts *o, char *err, size_t errlen);
void client_free(struct client *c);         /* NULL is fine */

const struct proto_welcome *client_welcome(const struct client *c);
int client_connected(const struct client *c);
/* 1 once a reconnect found the stop note (client_opts.stop_note): no coordinator will hear from
 * this client again, so events still unacknowledged never will be. */
int client_ended(const struct client *c);
int client_fd(const struct client *c);      /* -1 while disconnected */
/* PROTO_RESTART or PROTO_CONTROL (a STOP) when such a pushed message waits unread in the queue
 * (the first of them), else 0: a daemon blocked in a long wait (a collective of its group) may
 * give that wait up and read it. */
int client_interrupt_queued(const struct client *c);
void client_get_stats(const struct client *c, struct client_stats *st);

/* Sending. All return 0 (sent, or queued while disconnected) or <0. */
void client_set_heartbeat(struct client *c, const struct proto_heartbeat *hb);  /* sent every period */
/* On each reconnect, fn(arg, WELCOME) runs before anything is replayed or asked; a value < 0
 * (why in its buffer) ends the client: why goes to the coordinator as a non-fatal ERROR and a
 * BYE (exit status 1: the daemon exits to be restarted), the connection is closed and the poll
 * returns -DF_EPEER (e.g. the ring is not the one mapped). */
typedef int (*client_welcome_check_fn)(void *arg, const struct proto_welcome *w, char *why, size_t len);
void client_set_welcome_check(struct client *c, client_welcome_check_fn fn, void *arg);
int client_heartbeat_now(struct client *c);
/* The heartbeat if its period is over: one send, no read, no reconnect (a failed send does
 * disconnect; the next poll reconnects). For the progress hooks of a long host computation (a
 * CPU forward or training step), between its layers. */
void client_heartbeat_due(struct client *c);
int client_lease_request(struct client *c, uint32_t n);
int client_lease_return(struct client *c, uint64_t batch_id);
/* Targets leaving (nothing in a forward any more): hand back every lease still held, its grant
 * read or still queued, and from now on every grant as it arrives (a request answered late, a
 * reconnect's re-grant), asking for no more. Returns how many went back now. */
int client_return_leases(struct client *c);
/* Drafters: the copy of the batch with lease number `lease` (its slot's ring_payload.lease) was
 * taken from its slot but not trained (e.g. a skipped non-finite step); the coordinator queues
 * the batch to be published again unless it already moved on. An event: kept until ACKed. */
int client_batch_skipped(struct client *c, uint64_t batch_id, uint32_t lease);
int client_published(struct client *c, uint64_t batch_id, uint32_t slot, uint32_t n_tokens);
int client_join_group(struct client *c);
int client_trained(struct client *c, uint64_t batch_id, uint32_t lease, uint64_t step, uint32_t rank,
                   uint64_t generation);
int client_checkpointed(struct client *c, uint64_t step, uint64_t generation, const char *dir);
/* CKPT_BAD: the checkpoint of GROUP generation (step, dir) does not load (code, reason); held
 * for the next connection like an error, so a coordinator restart does not lose it. */
int client_ckpt_bad(struct client *c, uint64_t generation, uint64_t step, const char *dir, int code,
                    const char *reason);
int client_error(struct client *c, int fatal, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Drafters: a non-finite loss or norm (-DF_ENAN) made this rank skip `step`. */
int client_error_nan(struct client *c, uint64_t step, const char *text);
/* The daemon's last word before it exits: BYE(exit_status, reason), sent now if connected (not
 * held: a reconnect will not happen). Without it the coordinator records the exit as a death. */
int client_bye(struct client *c, int exit_status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Leases currently held (granted, not published/returned/revoked). */
const struct client_lease *client_lease_find(const struct client *c, uint64_t batch_id);
int client_lease_held(const struct client *c, uint64_t batch_id);
uint32_t client_leases_held(const struct client *c);

/* Wait up to timeout_ms (-1 = forever) for one pushed message. Returns 1 and *msg,
 * 0 on timeout, or <0: -DF_EPEER (refused after a reconnect, err says why). Pointers
 * in *msg (grant samples: until the lease ends; json, GROUP batch ids) stay valid at least
 * until the next client call. While disconnected it keeps trying to reconnect and returns 0. */
int client_poll(struct client *c, int timeout_ms, struct proto_msg *msg, char *err, size_t errlen);

/* For a daemon busy with something else (waiting for a checkpoint write): spend up to
 * timeout_ms keeping the connection alive (heartbeat, ACKs, reconnect) without taking pushed
 * messages: they stay queued for the next client_poll. 0, or <0 as client_poll. */
int client_idle(struct client *c, int timeout_ms, char *err, size_t errlen);

/* Request/reply (dflashctl). *json is malloc'd NUL-terminated JSON text; *status is the
 * coordinator's status (0 ok, <0 refused, then the JSON has "error"). Pushed messages
 * arriving meanwhile are kept for client_poll. */
int client_query(struct client *c, enum proto_query_what what, uint32_t limit, char **json, int *status,
                 char *err, size_t errlen);
int client_control(struct client *c, enum proto_control_cmd cmd, const char *reason, char **json, int *status,
                   char *err, size_t errlen);
