/* net.c: "host:port" parsing and resolution, address formatting, connect with a timeout,
 * and the shared-secret token file of the coordinator's TCP listener. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/fileio.h"
#include "common/timeutil.h"
#include "ipc/net.h"

#define FAIL(code, ...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); return (code); } while (0)

int net_split_hostport(const char *spec, char *host, size_t hostlen, unsigned *port, char *err, size_t errlen)
{
    const char *h = spec, *colon;
    size_t hl;
    if (!*spec)
        FAIL(-EINVAL, "empty address, expected host:port");
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');
        if (!close)
            FAIL(-EINVAL, "'%s': no ']' after an IPv6 address", spec);
        h = spec + 1;
        hl = (size_t)(close - h);
        if (close[1] != ':')
            FAIL(-EINVAL, "'%s': expected [IPv6]:port", spec);
        colon = close + 1;
    } else {
        colon = strrchr(spec, ':');
        if (!colon)
            FAIL(-EINVAL, "'%s': expected host:port", spec);
        hl = (size_t)(colon - spec);
        if (memchr(spec, ':', hl))
            FAIL(-EINVAL, "'%s': an IPv6 address goes in brackets, [address]:port", spec);
    }
    if (!hl)
        FAIL(-EINVAL, "'%s': no host before the port (0.0.0.0:PORT is every IPv4 address)", spec);
    if (hl >= hostlen)
        FAIL(-EINVAL, "'%s': host longer than %zu bytes", spec, hostlen - 1);
    const char *p = colon + 1;
    size_t digits = strspn(p, "0123456789");
    if (!digits || p[digits] || digits > 5)
        FAIL(-EINVAL, "'%s': port '%s' is not a number from 0 to 65535", spec, p);
    unsigned long v = 0;
    for (size_t i = 0; i < digits; i++)
        v = v * 10 + (unsigned long)(p[i] - '0');
    if (v > 65535)
        FAIL(-EINVAL, "'%s': port %lu is above 65535", spec, v);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (unsigned)v;
    return 0;
}

/* getaddrinfo for spec; address literals are checked here, never sent to a resolver. */
static int lookup(const char *spec, struct addrinfo **res, char *err, size_t errlen)
{
    char host[256], service[8];
    unsigned port;
    int r = net_split_hostport(spec, host, sizeof host, &port, err, errlen);
    if (r < 0)
        return r;
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct in6_addr a6;
    struct in_addr a4;
    if (spec[0] == '[') {
        if (inet_pton(AF_INET6, host, &a6) != 1)
            FAIL(-EINVAL, "'%s': '%s' is not an IPv6 address", spec, host);
        hints.ai_family = AF_INET6;
        hints.ai_flags |= AI_NUMERICHOST;
    } else if (inet_pton(AF_INET, host, &a4) == 1) {
        hints.ai_family = AF_INET;
        hints.ai_flags |= AI_NUMERICHOST;
    } else if (strspn(host, "0123456789.") == strlen(host)) {
        FAIL(-EINVAL, "'%s': '%s' is not an IPv4 address", spec, host);
    }
    int g = getaddrinfo(host, service, &hints, res);
    if (g)
        FAIL(-EADDRNOTAVAIL, "'%s': cannot resolve '%s': %s", spec, host, g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    return 0;
}

int net_resolve(const char *spec, struct sockaddr_storage *ss, socklen_t *sslen, char *err, size_t errlen)
{
    struct addrinfo *res;
    int r = lookup(spec, &res, err, errlen);
    if (r < 0)
        return r;
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void net_addr_format(const struct sockaddr *sa, char *buf, size_t len)
{
    char a[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
        snprintf(buf, len, "%s:%u", a, ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
        snprintf(buf, len, "[%s]:%u", a, ntohs(s6->sin6_port));
    } else {
        snprintf(buf, len, "(address family %d)", sa->sa_family);
    }
}

/* One non-blocking connect, waited for until deadline. fd stays open on success. */
static int connect_one(const struct addrinfo *ai, uint64_t deadline)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            r = -errno;
            goto fail;
        }
        for (;;) {
            uint64_t now = mono_ms();
            if (now >= deadline) {
                r = -ETIMEDOUT;
                goto fail;
            }
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            int k = poll(&p, 1, (int)(deadline - now));
            if (k < 0 && errno != EINTR) {
                r = -errno;
                goto fail;
            }
            if (k > 0)
                break;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
            soerr = errno;
        if (soerr) {
            r = -soerr;
            goto fail;
        }
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        r = -errno;
        goto fail;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
fail:
    close(fd);
    return r;
}

int net_connect(const char *spec, int timeout_ms, char *err, size_t errlen)
{
    struct addrinfo *res;
    int r = lookup(spec, &res, err, errlen);
    if (r < 0)
        return r;
    uint64_t deadline = mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 5000);
    r = -EADDRNOTAVAIL;
    char where[NET_ADDR_STRLEN] = "";
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET && ((const struct sockaddr_in *)ai->ai_addr)->sin_port == 0) {
            freeaddrinfo(res);
            FAIL(-EINVAL, "'%s': port 0 cannot be connected to", spec);
        }
        if (ai->ai_family == AF_INET6 && ((const struct sockaddr_in6 *)ai->ai_addr)->sin6_port == 0) {
            freeaddrinfo(res);
            FAIL(-EINVAL, "'%s': port 0 cannot be connected to", spec);
        }
        net_addr_format(ai->ai_addr, where, sizeof where);
        r = connect_one(ai, deadline);
        if (r >= 0)
            break;
    }
    freeaddrinfo(res);
    if (r < 0 && !strcmp(spec, where))    /* a numeric address: no need to say it twice */
        FAIL(r, "cannot connect to %s: %s", spec, strerror(-r));
    if (r < 0)
        FAIL(r, "cannot connect to %s (%s): %s", spec, where, strerror(-r));
    return r;
}

int net_token_load(const char *path, uint8_t *token, size_t cap, size_t min, size_t *len, char *err, size_t errlen)
{
    if (!path || !*path)
        FAIL(-EINVAL, "no token file given");
    struct stat st;
    int fd = fileio_open_regular(path, &st);
    if (fd == -EINVAL)
        FAIL(-EINVAL, "%s: not a regular file", path);
    if (fd < 0)
        FAIL(fd, "%s: %s", path, strerror(-fd));
    if (st.st_mode & 077) {
        close(fd);
        FAIL(-EPERM, "%s: mode %04o lets group or others at the secret (chmod 600 it)", path,
             (unsigned)(st.st_mode & 07777));
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        /* (its owner could change the token under this process: read as root, say) */
        close(fd);
        FAIL(-EPERM, "%s: owned by uid %u, not by this user (uid %u) or root", path, (unsigned)st.st_uid,
             (unsigned)geteuid());
    }
    memset(token, 0, cap);
    uint8_t buf[1024];
    long got = fileio_read_upto(fd, buf, sizeof buf);
    close(fd);
    if (got < 0)
        FAIL((int)got, "%s: %s", path, strerror((int)-got));
    size_t n = (size_t)got;
    if (n && buf[n - 1] == '\n') {
        n--;
        if (n && buf[n - 1] == '\r')
            n--;
    }
    if (n < min) {
        explicit_bzero(buf, sizeof buf);
        FAIL(-EINVAL, "%s: the token is %zu bytes, at least %zu are needed", path, n, min);
    }
    if (n > cap) {
        explicit_bzero(buf, sizeof buf);
        FAIL(-EINVAL, "%s: the token is longer than %zu bytes", path, cap);
    }
    /* A file of one byte repeated (zeros from a botched dd, a placeholder) is no secret. */
    size_t same = 1;
    while (same < n && buf[same] == buf[0])
        same++;
    if (same == n) {
        explicit_bzero(buf, sizeof buf);
        FAIL(-EINVAL, "%s: the token is one byte repeated: not a secret (make one with `head -c 32 /dev/urandom | "
             "base64 > FILE`)", path);
    }
    memcpy(token, buf, n);
    explicit_bzero(buf, sizeof buf);
    *len = n;
    return 0;
}

int net_token_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}
