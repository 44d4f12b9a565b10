/* test_daemon.c: common/daemon: argument parsing, config errors with file:line, index range,
 * the effective-config print, the lock file (second holder refused, freed on death), sd_notify,
 * a stop during a start phase that holds nothing. */
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/daemon.h"
#include "common/progress.h"
#include "common/timeutil.h"
#include "tests/test.h"

static char tmpdir[256];

static void *tick_thread(void *arg)
{
    (void)arg;
    progress_tick();    /* not the hook's thread: ignored */
    return NULL;
}

static const char *write_tmp(const char *name, const char *text)
{
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static int parse(struct daemon *d, int need_index, char *err, const char *a1, const char *a2,
                 const char *a3, const char *a4, const char *a5, const char *a6)
{
    char *argv[8] = { "x", (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5, (char *)a6, NULL };
    int argc = 1;
    while (argc < 7 && argv[argc])
        argc++;
    FILE *null = fopen("/dev/null", "w");
    int r = daemon_parse_args(d, "target-d", "target", need_index, argc, argv, null, err, 512);
    fclose(null);
    return r;
}

int main(void)
{
    struct daemon d;
    char err[512] = "";
    snprintf(tmpdir, sizeof tmpdir, "%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");

    /* Arguments. */
    CHECK(parse(&d, 1, err, "-c", "x.ini", NULL, NULL, NULL, NULL) < 0);
    CHECK_CONTAINS(err, "missing -i");
    CHECK(parse(&d, 1, err, "-i", "0", NULL, NULL, NULL, NULL) < 0);
    CHECK_CONTAINS(err, "missing -c");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", "zero", NULL, NULL) < 0);
    CHECK_CONTAINS(err, "not a device index");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", " 1", NULL, NULL) < 0);    /* what strtol takes, not an index */
    CHECK_CONTAINS(err, "-i  1: not a device index");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", "+1", NULL, NULL) < 0);
    CHECK_CONTAINS(err, "-i +1: not a device index");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", "0", "-i", "1") < 0);
    CHECK_CONTAINS(err, "-i given twice (0, 1)");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-c", "y.ini", "-i", "1") < 0);
    CHECK_CONTAINS(err, "-c given twice");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", "0", "-o", "ring.slots=8\n9") < 0);
    CHECK_CONTAINS(err, "option -o: its value has a control character (0x0a) at byte 12");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-q", NULL, NULL, NULL) < 0);
    CHECK_CONTAINS(err, "unknown argument");
    CHECK(parse(&d, 0, err, "-c", "x.ini", "-i", "0", NULL, NULL) < 0);      /* the coordinator has no index */
    CHECK_CONTAINS(err, "unknown argument '-i'");
    CHECK(parse(&d, 1, err, "-c", "x.ini", "-i", "0", "-o", "ring.slots 3") < 0);
    CHECK_CONTAINS(err, "-o 'ring.slots 3': expected section.key=value");
    CHECK(parse(&d, 1, err, "-c", NULL, NULL, NULL, NULL, NULL) < 0);
    CHECK_CONTAINS(err, "needs a value");
    CHECK_INT(parse(&d, 1, err, "-h", NULL, NULL, NULL, NULL, NULL), ==, 1);
    CHECK_OK(parse(&d, 1, err, "-c", "x.ini", "-i3", "-o", "ring.slots=4", "-t"));
    CHECK_INT(d.index, ==, 3);
    CHECK_INT(d.n_overrides, ==, 1);
    CHECK_INT(d.check_only, ==, 1);
    CHECK_STR(d.ident, "target-d@3");

    /* Config: file:line errors, overrides, index range against target.devices. */
    const char *ini = write_tmp("a.ini", "[cluster]\nname = t1\n\n[target]\n# comment\ndevices = 2\nprefetch = 3\n");
    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "1", "-o", "target.prefetch=5"));
    CHECK_OK(daemon_load_config(&d, err, sizeof err));
    CHECK_INT(d.cfg.target.prefetch, ==, 5);
    CHECK_STR(d.cfg.cluster.name, "t1");
    CHECK_INT(daemon_key_line(&d, "target", "devices"), ==, 6);
    CHECK_INT(daemon_key_line(&d, "target", "threads"), ==, 0);
    CHECK_INT(daemon_key_line(&d, "cluster", "name"), ==, 2);

    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "2", NULL, NULL));
    CHECK(daemon_load_config(&d, err, sizeof err) < 0);
    CHECK_CONTAINS(err, ":6: target.devices: instance index -i 2 out of range [0, 2)");

    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "0", "-o", "target.nope=1"));
    CHECK(daemon_load_config(&d, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "target.nope: unknown key");

    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "0", "-o", "target.prefetch=x"));
    CHECK_OK(daemon_load_config(&d, err, sizeof err) < 0 ? 0 : -1);
    CHECK_CONTAINS(err, "not an integer");

    const char *bad = write_tmp("b.ini", "[target]\nprefetch = many\n");
    CHECK_OK(parse(&d, 1, err, "-c", bad, "-i", "0", NULL, NULL));
    CHECK(daemon_load_config(&d, err, sizeof err) < 0);
    CHECK_CONTAINS(err, bad);
    CHECK_CONTAINS(err, ":2: target.prefetch: not an integer");

    /* Errors found after loading name the key's line, or the override that set it. */
    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "0", "-o", "target.threads=2"));
    CHECK_OK(daemon_load_config(&d, err, sizeof err));
    daemon_key_error(&d, "target", "prefetch", err, sizeof err, "too %s", "deep");
    CHECK_CONTAINS(err, ":7: target.prefetch: too deep");
    daemon_key_error(&d, "target", "threads", err, sizeof err, "bad");
    CHECK_CONTAINS(err, "override target.threads: bad");
    daemon_key_error(&d, "model", "path", err, sizeof err, "missing");
    CHECK_CONTAINS(err, "model.path (default): missing");

    /* The printed config is cfg_print's, behind one header line. */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    daemon_print_config(&d, m);
    fclose(m);
    CHECK_CONTAINS(buf, "# target-d@0 effective configuration");
    CHECK_CONTAINS(buf, "\ntarget.prefetch = 3\n");
    CHECK_CONTAINS(buf, "\ntarget.threads = 2\n");
    CHECK_CONTAINS(buf, "\ncluster.name = t1\n");
    free(buf);

    /* Lock: a second holder is refused; a dead holder's lock is free again. */
    char rt[512];
    snprintf(rt, sizeof rt, "runtime_dir=%s/rt", tmpdir);
    char ov[600];
    snprintf(ov, sizeof ov, "cluster.%s", rt);
    CHECK_OK(parse(&d, 1, err, "-c", ini, "-i", "0", "-o", ov));
    CHECK_OK(daemon_load_config(&d, err, sizeof err));
    int p[2];
    CHECK_OK(pipe(p));
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        struct daemon c = d;
        c.lock_fd = -1;
        if (daemon_lock(&c, err, sizeof err) < 0)
            _exit(2);
        if (write(p[1], "x", 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    char ch;
    CHECK_INT(read(p[0], &ch, 1), ==, 1);
    CHECK_INT(daemon_lock(&d, err, sizeof err), ==, -EBUSY);
    CHECK_CONTAINS(err, "held by another target-d");
    kill(child, SIGKILL);
    int st;
    CHECK_INT(waitpid(child, &st, 0), ==, child);
    CHECK_OK(daemon_lock(&d, err, sizeof err));
    CHECK_CONTAINS(d.lock_path, "/rt/t1-target-0.lock");
    daemon_done(&d);
    daemon_done(&d);

    /* A runtime or state folder that cannot be one: a file (78), a loop of links (78, it said
     * "not a folder" from a stat it never made), a link to nothing (1: storage not mounted yet). */
    char path[600], loop2[600];
    snprintf(path, sizeof path, "%s/afile", tmpdir);
    fclose(fopen(path, "w"));
    CHECK_INT(daemon_dir("cluster.state_dir", path, err, sizeof err), ==, -ENOTDIR);
    CHECK_CONTAINS(err, "is not a folder (a file is there)");
    snprintf(path, sizeof path, "%s/loop1", tmpdir);
    snprintf(loop2, sizeof loop2, "%s/loop2", tmpdir);
    CHECK_OK(symlink(loop2, path));
    CHECK_OK(symlink(path, loop2));
    CHECK_INT(daemon_dir("cluster.state_dir", path, err, sizeof err), ==, -ENOTDIR);
    CHECK_CONTAINS(err, "loop1: Too many levels of symbolic links");
    snprintf(path, sizeof path, "%s/loop1/sub", tmpdir);       /* the loop above it: mkdir says so */
    CHECK_INT(daemon_dir("cluster.state_dir", path, err, sizeof err), ==, -ENOTDIR);
    CHECK_CONTAINS(err, "loop1/sub cannot be made: Too many levels of symbolic links");
    snprintf(path, sizeof path, "%s/dangling", tmpdir);
    CHECK_OK(symlink("/nonexistent/storage", path));
    CHECK_INT(daemon_dir("cluster.state_dir", path, err, sizeof err), ==, -ENOENT);
    CHECK_CONTAINS(err, "is a link to nothing (its storage not mounted?)");

    /* Stop signals set the flag and interrupt blocking calls. */
    CHECK_OK(daemon_signals_init());
    CHECK_INT(daemon_stop_requested(), ==, 0);

    /* sd_notify: READY/STATUS/WATCHDOG reach NOTIFY_SOCKET; the watchdog is rate limited. */
    char sock[sizeof ((struct sockaddr_un *)0)->sun_path];
    if (snprintf(sock, sizeof sock, "%.80s/notify.sock", tmpdir) >= (int)sizeof sock)
        SKIP("TMPDIR too long for a unix socket");
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memcpy(sa.sun_path, sock, sizeof sock);
    CHECK_OK(bind(fd, (struct sockaddr *)&sa, sizeof sa));
    struct timeval rcv_to = { .tv_sec = 10 };   /* a message that never comes fails the test */
    CHECK_OK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv_to, sizeof rcv_to));
    setenv("NOTIFY_SOCKET", sock, 1);
    setenv("WATCHDOG_USEC", "400000", 1);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", getpid());
    setenv("WATCHDOG_PID", pid, 1);
    daemon_notify_init(&d);
    CHECK_INT(d.watchdog_usec, ==, 400000);
    CHECK_INT(daemon_wait_slice_ms(&d, 1000), ==, 100);
    CHECK_INT(daemon_wait_slice_ms(&d, 50), ==, 50);
    /* Before READY a tick of the start's long loops (progress.h) asks for more start time, at
     * most every 10 s, and only from the thread that installed the hook (daemon_notify_init). */
    char msg[600];
    ssize_t n;
    progress_tick();
    n = recv(fd, msg, sizeof msg - 1, 0);
    CHECK(n > 0);
    msg[n] = 0;
    CHECK_STR(msg, "EXTEND_TIMEOUT_USEC=120000000");
    progress_tick();
    pthread_t th;
    CHECK_INT(pthread_create(&th, NULL, tick_thread, NULL), ==, 0);
    CHECK_INT(pthread_join(th, NULL), ==, 0);
    d.watchdog_last_ns -= 11000000000ull;   /* 11 s ago: the next tick asks again */
    CHECK_INT(pthread_create(&th, NULL, tick_thread, NULL), ==, 0);
    CHECK_INT(pthread_join(th, NULL), ==, 0);
    CHECK(recv(fd, msg, sizeof msg - 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);   /* neither sent */
    progress_tick();
    n = recv(fd, msg, sizeof msg - 1, 0);
    CHECK(n > 0);
    msg[n] = 0;
    CHECK_STR(msg, "EXTEND_TIMEOUT_USEC=120000000");
    daemon_notify_ready(&d, "serving %d", 7);
    n = recv(fd, msg, sizeof msg - 1, 0);
    CHECK(n > 0);
    msg[n] = 0;
    CHECK_STR(msg, "READY=1\nSTATUS=serving 7");
    daemon_watchdog(&d); /* right after READY: too early, nothing sent */
    usleep(120000);
    daemon_watchdog(&d);
    daemon_notify_stopping(&d, "bye");
    n = recv(fd, msg, sizeof msg - 1, 0);
    msg[n] = 0;
    CHECK_STR(msg, "WATCHDOG=1");
    n = recv(fd, msg, sizeof msg - 1, 0);
    msg[n] = 0;
    CHECK_STR(msg, "STOPPING=1\nSTATUS=bye");

    /* A stop during a start phase that holds nothing (the weights read): the phase's next
     * progress tick ends the process with 0, instead of the whole load later; without a stop, or
     * outside the phase, it goes on. */
    pid_t loader = fork();
    CHECK(loader >= 0);
    if (loader == 0) {
        unsetenv("NOTIFY_SOCKET");
        struct daemon s = d;
        s.ready = 0;
        daemon_notify_init(&s);
        daemon_leave_on_stop(&s, "loading the model");
        progress_tick();
        raise(SIGTERM);
        daemon_leave_on_stop(&s, NULL);
        progress_tick();
        daemon_leave_on_stop(&s, "loading the model");
        if (daemon_stop_requested() != 1)
            _exit(4);
        progress_tick();
        _exit(3);
    }
    int status;
    CHECK_INT(waitpid(loader, &status, 0), ==, loader);
    CHECK(WIFEXITED(status));
    CHECK_INT(WEXITSTATUS(status), ==, 0);

    raise(SIGTERM);
    CHECK_INT(daemon_stop_requested(), ==, 1);
    CHECK_INT(daemon_last_signal(), ==, SIGTERM);
    raise(SIGPIPE); /* ignored */
    /* A stop during the start: no more start time asked for (systemd applies an extension to
     * the timeout running, the stop's then: the stop would wait out the whole load). */
    struct daemon starting = d;
    starting.ready = 0;
    starting.watchdog_last_ns = 0;
    daemon_watchdog(&starting);
    CHECK(recv(fd, msg, sizeof msg - 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    close(fd);
    printf("daemon ok\n");
    return 0;
}
