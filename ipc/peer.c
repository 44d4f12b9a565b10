/* peer.c: see peer.h. */
#include "ipc/peer.h"
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include "common/log.h"
#include "common/timeutil.h"
#include "ipc/proto.h"

int peer_connect_coordinator(struct daemon *d, const char *sock, int role, struct client **out, char *err,
                             size_t errlen)
{
    char name[PROTO_NAME_MAX];
    snprintf(name, sizeof name, "%s", d->ident);
    struct client_opts o = { .socket_path = sock, .role = role, .device = d->index, .name = name,
                             .connect_timeout_ms = 0, .reply_timeout_ms = 10000, .reconnect_ms = 200 };
    uint64_t deadline = mono_ms() + 5ull * (uint64_t)d->cfg.coordinator.dead_after_ms + 30000;
    int r, warned = 0;
    for (;;) {
        r = client_open(out, &o, err, errlen);
        if (r == 0 || (r != -ENOENT && r != -ECONNREFUSED && r != -EAGAIN))
            return r;
        if (mono_ms() > deadline || daemon_stop_requested())
            return r;
        if (!warned++)
            log_info("waiting for the coordinator at %s", sock);
        daemon_watchdog(d);
        usleep(200000);
    }
}

int peer_attach_ring(struct client *cl, struct ring **out, char *err, size_t errlen)
{
    const struct proto_welcome *w = client_welcome(cl);
    int r = -EAGAIN;
    for (int i = 0; i < 100; i++) {
        r = ring_attach(out, w->ring_name, NULL, RING_ATTACH_ANY, err, errlen);
        if (r != -EAGAIN)
            break;
        usleep(20000);
    }
    return r;
}
