/* peer.h: how target-d and drafter-d reach the cluster: connect to the coordinator (waiting for
 * it to come up, the watchdog fed meanwhile) and attach the ring its WELCOME names. */
#pragma once
#include <stddef.h>
#include "common/daemon.h"
#include "ipc/client.h"
#include "ipc/ring.h"

/* Connect as `role` (PROTO_ROLE_*) to the coordinator at sock. While it is not there yet
 * (-ENOENT, -ECONNREFUSED, -EAGAIN) retry every 200 ms for up to 5 x coordinator.dead_after_ms
 * + 30 s or until a stop signal; any other error returns at once. */
int peer_connect_coordinator(struct daemon *d, const char *sock, int role, struct client **out, char *err,
                             size_t errlen);

/* Attach the ring named in the coordinator's WELCOME (any mode), retrying for up to 2 s while
 * it is being created (-EAGAIN). */
int peer_attach_ring(struct client *cl, struct ring **out, char *err, size_t errlen);
