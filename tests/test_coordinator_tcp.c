/* test_coordinator_tcp.c: the optional TCP listener (cluster.tcp_listen): absent unless
 * configured; bound to exactly the configured address; dflashctl over TCP with the token;
 * wrong token, no AUTH, a target HELLO, an idle peer refused and logged; idle peers cannot
 * keep dflashctl out; a long name keeps the address; a flood of refusals is logged up to a
 * limit, then counted; config errors
 * (token file mode, short token, bad address) stop the start with one line and exit 78. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "common/daemon.h"
#include "ipc/net.h"
#include "tests/test_coord_util.h"

static const char TOKEN[] = "s3cret-token-of-the-test-cluster";
static char tok_path[400], log_path[400];

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    CHECK_INT(write(fd, text, strlen(text)), ==, (long long)strlen(text));
    close(fd);
    CHECK_OK(chmod(path, mode));
}

static char *slurp(const char *path)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return buf;
}

/* [cluster] lines for a listener on addr with the test token. */
static void setup_tcp(const char *addr, const char *token_file)
{
    char extra[900];
    snprintf(extra, sizeof extra, "tcp_listen = %s\ntcp_token_file = %s\n", addr, token_file);
    tc_setup(extra, NULL);
}

/* Run coordinator-d on TC.ini to its exit; returns the exit code, log in log_path. */
static int run_to_exit(const char *flag)
{
    unlink(log_path);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, (char *)flag, NULL };
    pid_t pid = tc_spawn(argv, log_path);
    int st;
    CHECK_INT(waitpid(pid, &st, 0), ==, pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A start that must fail with exit 78 and exactly one error line naming key and why. */
static void expect_config_error(const char *key, const char *why)
{
    CHECK_INT(run_to_exit(NULL), ==, DAEMON_EX_CONFIG);
    const char *log = slurp(log_path);
    int lines = 0;
    const char *line = NULL;
    for (const char *p = log; (p = strstr(p, key)) != NULL; p++)
        if (strstr(p, ": ") == p + strlen(key)) {
            lines++;
            line = p;
        }
    if (lines != 1)
        TEST_FAIL("want one '%s: ...' line, got %d in:\n%s", key, lines, log);
    while (line > log && line[-1] != '\n')
        line--;
    const char *eol = strchr(line, '\n');
    char text[600];
    snprintf(text, sizeof text, "%.*s", eol ? (int)(eol - line) : (int)strlen(line), line);
    CHECK_CONTAINS(text, why);
    CHECK_CONTAINS(text, TC.ini);    /* file:line of the key */
    printf("  config error: %s\n", text);
}

/* The TCP sockets pid owns, from /proc/<pid>/fd and /proc/net/<table>: "LOCAL ST" lines. */
static int tcp_sockets_of(pid_t pid, const char *table, char out[][64], int max)
{
    char dir[64], path[400], link[128];
    unsigned long inodes[256];
    int ni = 0;
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    CHECK(d);
    for (struct dirent *e; (e = readdir(d)) && ni < 256;) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = 0;
        unsigned long ino;
        if (sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes[ni++] = ino;
    }
    closedir(d);
    snprintf(path, sizeof path, "/proc/net/%s", table);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;   /* no IPv6 in this kernel: nothing can be bound there */
    char line[512];
    int found = 0;
    if (!fgets(line, sizeof line, f)) {}
    while (fgets(line, sizeof line, f)) {
        char local[64], remote[64], st[8];
        unsigned long ino;
        if (sscanf(line, "%*s %63s %63s %7s %*s %*s %*s %*s %*s %lu", local, remote, st, &ino) != 4)
            continue;
        for (int i = 0; i < ni; i++)
            if (inodes[i] == ino && found < max)
                if (snprintf(out[found], 64, "%s %s", local, st) < 64)
                    found++;
    }
    fclose(f);
    return found;
}

static int tcp_connect(int family, int port)
{
    int fd = socket(family, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_storage ss = { 0 };
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *s4;
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        s6->sin6_addr = in6addr_loopback;
        len = sizeof *s6;
    }
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        close(fd);
        return -errno;
    }
    struct timeval tv = { 15 * test_time_scale(), 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* A connection to 127.0.0.1:port from the loopback address 127.0.0.<src>. */
static int tcp_connect_from(int port, int src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + (uint32_t)src) };
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK_OK(bind(fd, (struct sockaddr *)&from, sizeof from));
    CHECK_OK(connect(fd, (struct sockaddr *)&to, sizeof to));
    struct timeval tv = { 15 * test_time_scale(), 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send bytes on fd, expect a WELCOME back. */
static void expect_welcome_fd(int fd, const void *bytes, size_t len)
{
    CHECK_INT(send(fd, bytes, len, MSG_NOSIGNAL), ==, (long long)len);
    uint8_t buf[8192];
    size_t n = 0;
    int64_t fs = 0;
    char err[256];
    while ((fs = proto_frame_size(buf, n, err, sizeof err)) == 0 || (fs > 0 && (size_t)fs > n)) {
        ssize_t k = recv(fd, buf + n, sizeof buf - n, 0);
        if (k <= 0)
            TEST_FAIL("no WELCOME: %s", k == 0 ? "the coordinator closed the connection" : strerror(errno));
        n += (size_t)k;
    }
    CHECK(fs > 0);
    struct proto_msg m;
    CHECK_OK(proto_decode(buf, (size_t)fs, &m, err, sizeof err));
    if (m.type == PROTO_REFUSE)
        TEST_FAIL("refused: %s", m.refuse.message);
    CHECK_INT(m.type, ==, PROTO_WELCOME);
    close(fd);
}

/* Send bytes on fd (may be none), expect a REFUSE containing needle, then EOF. */
static void expect_refused_fd(int fd, const void *bytes, size_t len, const char *needle)
{
    if (len)
        CHECK_INT(send(fd, bytes, len, MSG_NOSIGNAL), ==, (long long)len);
    uint8_t buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf && (k = recv(fd, buf + n, sizeof buf - n, 0)) > 0)
        n += (size_t)k;
    CHECK_INT(k, ==, 0);            /* the coordinator closed the connection */
    close(fd);
    struct proto_msg m;
    char err[256];
    int64_t fs = proto_frame_size(buf, n, err, sizeof err);
    CHECK(fs > 0 && (size_t)fs <= n);
    CHECK_OK(proto_decode(buf, (size_t)fs, &m, err, sizeof err));
    CHECK_INT(m.type, ==, PROTO_REFUSE);
    CHECK_CONTAINS(m.refuse.message, needle);
    printf("  refused: %s\n", m.refuse.message);
}

static size_t frame_auth(uint8_t *out, size_t cap, const char *token)
{
    struct proto_msg a = { .type = PROTO_AUTH, .auth.len = (uint32_t)strlen(token) };
    memcpy(a.auth.token, token, strlen(token));
    int64_t n = proto_encode(&a, out, cap, NULL, 0);
    CHECK(n > 0);
    return (size_t)n;
}

static size_t frame_hello(uint8_t *out, size_t cap, enum proto_role role)
{
    struct proto_msg h = { .type = PROTO_HELLO };
    h.hello.role = role;
    h.hello.device = role == PROTO_ROLE_CTL ? -1 : 0;
    h.hello.pid = (uint32_t)getpid();
    h.hello.group_rank = PROTO_NONE32;
    int64_t n = proto_encode(&h, out, cap, NULL, 0);
    CHECK(n > 0);
    return (size_t)n;
}

static int open_tcp_client(const char *addr, const char *token, struct client **c, char *err, size_t errlen)
{
    struct client_opts o = { .tcp_address = addr, .auth_token = (const uint8_t *)token, .auth_token_len = strlen(token),
                             .role = PROTO_ROLE_CTL, .device = -1, .name = "tcptest", .reply_timeout_ms = 5000 };
    return client_open(c, &o, err, errlen);
}

/* status over TCP; returns the "listen"."tcp" value checked against want. */
static void status_over_tcp(const char *addr, const char *want_tcp)
{
    struct client *c;
    char err[512], *json = NULL;
    int status = -1;
    if (open_tcp_client(addr, TOKEN, &c, err, sizeof err) < 0)
        TEST_FAIL("status over TCP %s: %s", addr, err);
    CHECK_OK(client_query(c, PROTO_Q_STATUS, 0, &json, &status, err, sizeof err));
    CHECK_INT(status, ==, 0);
    cJSON *doc = cJSON_Parse(json);
    CHECK(doc);
    const cJSON *tcp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "listen"), "tcp");
    CHECK(cJSON_IsString(tcp));
    CHECK_STR(tcp->valuestring, want_tcp);
    cJSON_Delete(doc);
    free(json);
    client_free(c);
}

static void start_coord(void)
{
    unlink(log_path);
    tc_start_coord();
}

static void stop_coord(void)
{
    CHECK_OK(kill(TC.coord, SIGTERM));
    int st;
    CHECK_INT(waitpid(TC.coord, &st, 0), ==, TC.coord);
    TC.coord = 0;
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), ==, 0);
}

static int logged_port(const char *prefix)
{
    const char *p = strstr(slurp(log_path), "TCP listener on ");
    CHECK(p);
    p += strlen("TCP listener on ");
    CHECK(!strncmp(p, prefix, strlen(prefix)));
    int port = atoi(p + strlen(prefix));
    CHECK(port > 0 && port < 65536);
    return port;
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    snprintf(tok_path, sizeof tok_path, "%s/tcp.token", TC.dir);
    snprintf(log_path, sizeof log_path, "%s/coordinator.log", TC.dir);
    tc_dataset(TC.data, 100, 8, 100, 500);
    char found[16][64];

    /* 1. Not configured: no TCP socket at all, status says so. */
    start_coord();
    CHECK_INT(tcp_sockets_of(TC.coord, "tcp", found, 16), ==, 0);
    CHECK_INT(tcp_sockets_of(TC.coord, "tcp6", found, 16), ==, 0);
    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "listen"), "tcp")));
    cJSON_Delete(s);
    CHECK(!strstr(slurp(log_path), "TCP listener"));
    stop_coord();
    printf("no listener unless configured: ok\n");

    /* 2. Config errors: one line naming the key, exit 78, nothing bound. */
    write_file(tok_path, "s3cret-token-of-the-test-cluster\n", 0644);
    setup_tcp("127.0.0.1:0", tok_path);
    expect_config_error("cluster.tcp_token_file", "mode 0644");
    write_file(tok_path, "short\n", 0600);
    expect_config_error("cluster.tcp_token_file", "the token is 5 bytes, at least 16");
    write_file(tok_path, "xxxxxxxxxxxxxxxxxxxxxxxx\n", 0600);
    expect_config_error("cluster.tcp_token_file", "the token is one byte repeated: not a secret");
    if (geteuid() == 0) {       /* another user's file: its owner could change the token */
        write_file(tok_path, TOKEN, 0600);
        CHECK_OK(chown(tok_path, 65534, (gid_t)-1));
        expect_config_error("cluster.tcp_token_file", "owned by uid 65534, not by this user (uid 0) or root");
    }
    unlink(tok_path);
    expect_config_error("cluster.tcp_token_file", "No such file");
    setup_tcp("127.0.0.1:0", "");
    expect_config_error("cluster.tcp_token_file", "required with cluster.tcp_listen");
    write_file(tok_path, TOKEN, 0600);
    setup_tcp("127.0.0.1", tok_path);
    expect_config_error("cluster.tcp_listen", "expected host:port");
    setup_tcp("127.0.0.1:70000", tok_path);
    expect_config_error("cluster.tcp_listen", "above 65535");
    setup_tcp("[::1:80", tok_path);
    expect_config_error("cluster.tcp_listen", "no ']'");
    setup_tcp("::1:80", tok_path);
    expect_config_error("cluster.tcp_listen", "in brackets");
    setup_tcp("300.1.2.3:80", tok_path);
    expect_config_error("cluster.tcp_listen", "not an IPv4 address");
    /* A host name is resolved once at start (-t: check only). */
    setup_tcp("localhost:0", tok_path);
    CHECK_INT(run_to_exit("-t"), ==, 0);
    printf("config errors: ok\n");

    /* 3. On 127.0.0.1:0: one LISTEN socket, on 127.0.0.1 at the logged port, nothing else. */
    write_file(tok_path, "s3cret-token-of-the-test-cluster\n", 0600);
    setup_tcp("127.0.0.1:0", tok_path);
    start_coord();
    int port = logged_port("127.0.0.1:");
    int n = tcp_sockets_of(TC.coord, "tcp", found, 16);
    char want[64];
    snprintf(want, sizeof want, "0100007F:%04X 0A", port);
    if (n != 1 || strcmp(found[0], want))
        TEST_FAIL("coordinator TCP sockets: %d, first '%s', want one '%s'", n, n ? found[0] : "", want);
    CHECK_INT(tcp_sockets_of(TC.coord, "tcp6", found, 16), ==, 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    status_over_tcp(addr, addr);

    /* dflashctl over TCP: the same document, and control works. */
    char cmd[1600], out[400];
    snprintf(out, sizeof out, "%s/ctl.out", TC.dir);
    snprintf(cmd, sizeof cmd, "%s --connect %s --token-file %s --json status >%s 2>&1", tc_bin("bin/dflashctl"), addr,
             tok_path, out);
    CHECK_INT(system(cmd), ==, 0);
    char want_json[128];
    snprintf(want_json, sizeof want_json, "\"tcp\":\"%s\"", addr);
    CHECK_CONTAINS(slurp(out), want_json);
    snprintf(cmd, sizeof cmd, "%s --connect %s --token-file %s pause over-tcp >%s 2>&1", tc_bin("bin/dflashctl"), addr,
             tok_path, out);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_CONTAINS(slurp(out), "paused");
    snprintf(cmd, sizeof cmd, "%s -s %s resume >%s 2>&1", tc_bin("bin/dflashctl"), TC.sock, out);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_CONTAINS(slurp(log_path), "pause by dflashctl@127.0.0.1:");
    /* dflashctl checks the token file's mode too. */
    char loose[400];
    snprintf(loose, sizeof loose, "%s/loose.token", TC.dir);
    write_file(loose, TOKEN, 0640);
    snprintf(cmd, sizeof cmd, "%s --connect %s --token-file %s status >%s 2>&1", tc_bin("bin/dflashctl"), addr, loose,
             out);
    CHECK(system(cmd) != 0);
    CHECK_CONTAINS(slurp(out), "mode 0640");
    printf("dflashctl over TCP: ok\n");

    /* Wrong token: refused, logged with the peer's address. */
    struct client *c = NULL;
    char err[512];
    CHECK_INT(open_tcp_client(addr, "not-the-token-of-this-cluster", &c, err, sizeof err), ==, -DF_EPEER);
    CHECK_CONTAINS(err, "wrong token");
    CHECK_CONTAINS(slurp(log_path), "refused TCP peer 127.0.0.1:");
    CHECK(strstr(slurp(log_path), ": wrong token"));
    /* The right token with one byte more or less is wrong too. */
    char longer[64];
    snprintf(longer, sizeof longer, "%sX", TOKEN);
    CHECK_INT(open_tcp_client(addr, longer, &c, err, sizeof err), ==, -DF_EPEER);
    snprintf(longer, sizeof longer, "%.*s", (int)strlen(TOKEN) - 1, TOKEN);
    CHECK_INT(open_tcp_client(addr, longer, &c, err, sizeof err), ==, -DF_EPEER);

    /* A target HELLO over TCP, even with the right token: refused and logged. */
    uint8_t buf[2048];
    size_t len = frame_auth(buf, sizeof buf, TOKEN);
    len += frame_hello(buf + len, sizeof buf - len, PROTO_ROLE_TARGET);
    expect_refused_fd(tcp_connect(AF_INET, port), buf, len, "a target may not connect over TCP");
    CHECK_CONTAINS(slurp(log_path), "a target may not connect over TCP");
    len = frame_auth(buf, sizeof buf, TOKEN);
    len += frame_hello(buf + len, sizeof buf - len, PROTO_ROLE_DRAFTER);
    expect_refused_fd(tcp_connect(AF_INET, port), buf, len, "a drafter may not connect over TCP");
    /* The client library does not even try. */
    struct client_opts to = { .tcp_address = addr, .auth_token = (const uint8_t *)TOKEN, .auth_token_len = strlen(TOKEN),
                              .role = PROTO_ROLE_TARGET, .device = 0 };
    CHECK_INT(client_open(&c, &to, err, sizeof err), ==, -EINVAL);

    /* No AUTH first: refused before anything else is read. */
    len = frame_hello(buf, sizeof buf, PROTO_ROLE_CTL);
    expect_refused_fd(tcp_connect(AF_INET, port), buf, len, "must be AUTH");
    /* A big frame header before AUTH gets no buffer. */
    struct proto_hdr big = { PROTO_MAGIC, PROTO_MAX_FRAME / 2, PROTO_VERSION, PROTO_REPLY };
    expect_refused_fd(tcp_connect(AF_INET, port), &big, sizeof big, "must be AUTH");
    /* AUTH on the unix socket: not a thing. */
    int ufd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    CHECK(strlen(TC.sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, TC.sock, strlen(TC.sock) + 1);
    CHECK_OK(connect(ufd, (struct sockaddr *)&sa, sizeof sa));
    len = frame_auth(buf, sizeof buf, TOKEN);
    expect_refused_fd(ufd, buf, len, "AUTH is for TCP peers");

    /* An idle peer is dropped after the auth timeout. */
    uint64_t t0 = mono_ms();
    expect_refused_fd(tcp_connect(AF_INET, port), NULL, 0, "no AUTH and HELLO within");
    uint64_t took = mono_ms() - t0;
    printf("  idle peer dropped after %llu ms\n", (unsigned long long)took);
    CHECK(took >= 4000);
    /* Idle peers (no AUTH) cannot keep dflashctl out: of 6 held open from one address the two
     * waiting longest are closed, and a peer with the token (a 7th) still gets in. */
    int idle[6];
    for (int i = 0; i < 6; i++) {
        idle[i] = tcp_connect(AF_INET, port);
        CHECK(idle[i] >= 0);
        tc_sleep_ms(30);
    }
    expect_refused_fd(idle[0], NULL, 0, "from one address waiting to authenticate: the one waiting longest is closed");
    expect_refused_fd(idle[1], NULL, 0, "the one waiting longest is closed");
    status_over_tcp(addr, addr);
    for (int i = 2; i < 6; i++)
        close(idle[i]);
    /* Nor idle peers of several addresses that fill the whole table (16): a dflashctl that
     * connected before them, its AUTH not read yet, is not the one closed for them. */
    {
        int ctl = tcp_connect_from(port, 1), many[16];
        tc_sleep_ms(30);
        for (int i = 0; i < 16; i++) {
            many[i] = tcp_connect_from(port, 2 + i / 4);     /* 127.0.0.2-5, four each */
            tc_sleep_ms(10);
        }
        tc_sleep_ms(100);
        uint8_t hb[2048];
        size_t hn = frame_auth(hb, sizeof hb, TOKEN);
        hn += frame_hello(hb + hn, sizeof hb - hn, PROTO_ROLE_CTL);
        expect_welcome_fd(ctl, hb, hn);
        expect_refused_fd(many[0], NULL, 0, "the one waiting longest of the address with the most is closed");
        for (int i = 1; i < 16; i++)
            close(many[i]);
        printf("  16 idle peers of 4 addresses: the dflashctl before them still gets in\n");
    }
    /* A name that fills the HELLO's field still leaves the peer's address in what it does. */
    char longname[PROTO_NAME_MAX];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    struct client_opts lo = { .tcp_address = addr, .auth_token = (const uint8_t *)TOKEN, .auth_token_len = strlen(TOKEN),
                              .role = PROTO_ROLE_CTL, .device = -1, .name = longname, .reply_timeout_ms = 5000 };
    CHECK_OK(client_open(&c, &lo, err, sizeof err));
    char *json = NULL;
    int st = -1;
    CHECK_OK(client_control(c, PROTO_CTL_PAUSE, "named long", &json, &st, err, sizeof err));
    free(json);
    CHECK_OK(client_control(c, PROTO_CTL_RESUME, "", &json, &st, err, sizeof err));
    free(json);
    client_free(c);
    CHECK_CONTAINS(slurp(log_path), "nnnn@127.0.0.1:");
    /* ... cut between two characters (one of 2 bytes each): no half of one before the '@' */
    char wide[PROTO_NAME_MAX] = "";
    for (int i = 0; i < 31; i++)
        strcat(wide, "\xc3\xa9");
    lo.name = wide;
    CHECK_OK(client_open(&c, &lo, err, sizeof err));
    CHECK_OK(client_control(c, PROTO_CTL_PAUSE, "named wide", &json, &st, err, sizeof err));
    const char *at = strstr(json, "@127.0.0.1:");
    CHECK(at && at - json >= 2);
    if (memcmp(at - 2, "\xc3\xa9", 2))
        TEST_FAIL("the name is cut inside a character: %s", json);
    free(json);
    CHECK_OK(client_control(c, PROTO_CTL_RESUME, "", &json, &st, err, sizeof err));
    free(json);
    client_free(c);
    /* Wrong tokens in a flood: logged one by one up to a limit a window, then counted. */
    const char *before = slurp(log_path);
    size_t lines_before = 0;
    for (const char *q = before; (q = strstr(q, ": wrong token")); q++)
        lines_before++;
    for (int i = 0; i < 40; i++)
        CHECK_INT(open_tcp_client(addr, "not-the-token-of-this-cluster", &c, err, sizeof err), ==, -DF_EPEER);
    size_t lines = 0;
    for (const char *q = slurp(log_path); (q = strstr(q, ": wrong token")); q++)
        lines++;
    printf("  40 wrong tokens: %zu logged one by one\n", lines - lines_before);
    CHECK(lines - lines_before <= 20);
    tc_sleep_ms(10500);         /* the window turns: the next refusal says how many were not logged */
    CHECK_INT(open_tcp_client(addr, "not-the-token-of-this-cluster", &c, err, sizeof err), ==, -DF_EPEER);
    CHECK_CONTAINS(slurp(log_path), "more peers refused in the last 10 s (not logged one by one)");
    /* Still serving, over both. */
    status_over_tcp(addr, addr);
    s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    cJSON_Delete(s);
    stop_coord();
    printf("refusals: ok\n");

    /* 4. IPv6 loopback, when this host has one: bound there only, no IPv4 twin. */
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 s6 = { .sin6_family = AF_INET6, .sin6_addr = in6addr_loopback };
    if (probe >= 0 && bind(probe, (struct sockaddr *)&s6, sizeof s6) == 0) {
        close(probe);
        setup_tcp("[::1]:0", tok_path);
        start_coord();
        port = logged_port("[::1]:");
        CHECK_INT(tcp_sockets_of(TC.coord, "tcp", found, 16), ==, 0);
        CHECK_INT(tcp_sockets_of(TC.coord, "tcp6", found, 16), ==, 1);
        snprintf(want, sizeof want, "00000000000000000000000001000000:%04X 0A", port);
        CHECK_STR(found[0], want);
        snprintf(addr, sizeof addr, "[::1]:%d", port);
        status_over_tcp(addr, addr);
        CHECK_INT(tcp_connect(AF_INET, port), ==, -ECONNREFUSED);
        stop_coord();
        printf("IPv6 listener: ok\n");
    } else {
        if (probe >= 0)
            close(probe);
        printf("IPv6 listener: skipped (no ::1 here)\n");
    }
    printf("coordinator tcp ok\n");
    return 0;
}
