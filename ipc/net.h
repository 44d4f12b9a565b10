/* net.h: what the coordinator's optional TCP listener and its clients share: "host:port"
 * parsing and resolution, address formatting, connect with a timeout, the token file. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NET_ADDR_STRLEN 64          /* "[v6 address]:port" and its NUL */

/* Split "host:port" or "[v6]:port" (port 0..65535). -EINVAL with the reason in err. */
int net_split_hostport(const char *spec, char *host, size_t hostlen, unsigned *port, char *err, size_t errlen);

/* Resolve spec (an IPv4 literal, "[IPv6]:port" or a host name, looked up now) to its first
 * stream address. -EINVAL (does not parse) or -EADDRNOTAVAIL (does not resolve), reason in err. */
int net_resolve(const char *spec, struct sockaddr_storage *ss, socklen_t *sslen, char *err, size_t errlen);

/* "a.b.c.d:port" or "[v6]:port" into buf (NET_ADDR_STRLEN is enough). */
void net_addr_format(const struct sockaddr *sa, char *buf, size_t len);

/* Connect a stream socket to spec within timeout_ms (<= 0: 5000). Returns a blocking fd
 * (close-on-exec, TCP_NODELAY) or <0 with the reason in err. */
int net_connect(const char *spec, int timeout_ms, char *err, size_t errlen);

/* Read a shared-secret file: a regular file no one but its owner may read or write (mode & 077
 * == 0), holding min..cap bytes once one trailing newline ("\n" or "\r\n") is dropped.
 * *len = the token's length; the rest of token[cap] is zeroed. <0 with the reason in err. */
int net_token_load(const char *path, uint8_t *token, size_t cap, size_t min, size_t *len, char *err, size_t errlen);

/* 1 when the n bytes of a and b are equal; the time taken does not depend on where they differ. */
int net_token_equal(const uint8_t *a, const uint8_t *b, size_t n);
