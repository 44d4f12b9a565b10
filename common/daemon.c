/* daemon.c: command line, config, sd_notify, stop signals and lock file for the daemons.
 * Library code: returns 0 or -errno with a one-line reason, never logs. */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/log.h"
#include "common/mapname.h"
#include "common/progress.h"
#include "common/timeutil.h"

static atomic_int g_stop_count;           /* lock-free: a handler's increment (another thread's too) */
static volatile sig_atomic_t g_last_signal;

static void usage(const struct daemon *d, FILE *out, int need_index)
{
    fprintf(out,
            "usage: %s -c CONFIG%s [-o section.key=value]... [-t]\n"
            "  -c CONFIG   the cluster's INI file (etc/dflash.ini documents every key)\n"
            "%s"
            "  -o S.K=V    override one key after the file is read (repeatable)\n"
            "  -t          check the configuration, print it and exit (0 ok, %d bad)\n",
            d->prog, need_index ? " -i INDEX" : "",
            need_index ? "  -i INDEX    device index of this instance (systemd passes %i)\n" : "",
            DAEMON_EX_CONFIG);
}

int daemon_parse_args(struct daemon *d, const char *prog, const char *role, int need_index,
                      int argc, char **argv, FILE *out, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->prog = prog;
    d->role = role;
    d->index = -1;
    d->lock_fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(d, out, need_index);
            return 1;
        }
        if (!strcmp(a, "-t")) {
            d->check_only = 1;
            continue;
        }
        if (a[0] != '-' || !a[1] || !strchr(need_index ? "cio" : "co", a[1])) {   /* -i: targets and drafters */
            snprintf(err, errlen, "unknown argument '%s' (try -h)", a);
            return -EINVAL;
        }
        if (a[2])
            val = a + 2;
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            snprintf(err, errlen, "option %s needs a value", a);
            return -EINVAL;
        }
        long at = cfg_control_char(val);
        if (at >= 0) {
            snprintf(err, errlen, "option -%c: its value has a control character (0x%02x) at byte %ld", a[1],
                     (unsigned char)val[at], at);
            return -EINVAL;
        }
        switch (a[1]) {
        case 'c':
            if (d->config_path) {
                snprintf(err, errlen, "-c given twice ('%s', '%s')", d->config_path, val);
                return -EINVAL;
            }
            d->config_path = val;
            break;
        case 'i': {
            char *end;
            errno = 0;
            long v = val[0] >= '0' && val[0] <= '9' ? strtol(val, &end, 10) : -1;
            if (v < 0 || errno || *end || v > 1 << 20) {
                snprintf(err, errlen, "-i %s: not a device index (a number from 0)", val);
                return -EINVAL;
            }
            if (d->index >= 0) {
                snprintf(err, errlen, "-i given twice (%d, %ld)", d->index, v);
                return -EINVAL;
            }
            d->index = (int)v;
            break;
        }
        case 'o':
            if (d->n_overrides == DAEMON_MAX_OVERRIDES) {
                snprintf(err, errlen, "more than %d -o overrides", DAEMON_MAX_OVERRIDES);
                return -E2BIG;
            }
            if (!strchr(val, '=') || !strchr(val, '.') || strchr(val, '.') > strchr(val, '=')) {
                snprintf(err, errlen, "-o '%s': expected section.key=value", val);    /* a usage error (64) */
                return -EINVAL;
            }
            d->overrides[d->n_overrides++] = val;
            break;
        }
    }
    if (!d->config_path) {
        snprintf(err, errlen, "missing -c CONFIG (try -h)");
        return -EINVAL;
    }
    if (need_index && d->index < 0) {
        snprintf(err, errlen, "missing -i INDEX (try -h)");
        return -EINVAL;
    }
    if (d->index >= 0)
        snprintf(d->ident, sizeof d->ident, "%s@%d", prog, d->index);
    else
        snprintf(d->ident, sizeof d->ident, "%s", prog);
    return 0;
}

/* <role>.devices from the key table, or 0 when the role has no such key. */
static int64_t role_devices(const struct daemon *d)
{
    for (size_t i = 0; i < cfg_nkeys; i++)
        if (!strcmp(cfg_keys[i].section, d->role) && !strcmp(cfg_keys[i].key, "devices") &&
            cfg_keys[i].type == CFG_INT)
            return *(const int64_t *)((const char *)&d->cfg + cfg_keys[i].offset);
    return 0;
}

int daemon_load_config(struct daemon *d, char *err, size_t errlen)
{
    int r = cfg_load(&d->cfg, d->config_path, err, errlen);
    if (r < 0)
        return r;
    for (int i = 0; i < d->n_overrides; i++) {
        r = cfg_set(&d->cfg, d->overrides[i], err, errlen);
        if (r < 0)
            return r;
    }
    int64_t devices = role_devices(d);
    if (d->index >= 0 && devices > 0 && d->index >= devices) {
        return daemon_key_error(d, d->role, "devices", err, errlen,
                                "instance index -i %d out of range [0, %lld)", d->index, (long long)devices);
    }
    /* Keys that bound each other. A daemon silent for less than a few of its heartbeats is not
     * dead: with fewer, every daemon would be cut off and reconnect over and over. */
    const struct dflash_cfg *c = &d->cfg;
    if (c->coordinator.dead_after_ms < 3 * c->coordinator.heartbeat_ms)
        return daemon_key_error(d, "coordinator", "dead_after_ms", err, errlen,
                                "%lld is less than three heartbeats (coordinator.heartbeat_ms = %lld)",
                                (long long)c->coordinator.dead_after_ms, (long long)c->coordinator.heartbeat_ms);
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

int daemon_key_line(const struct daemon *d, const char *section, const char *key)
{
    if (!d->config_path)
        return 0;
    _cleanup_fclose_ FILE *f = fopen(d->config_path, "r");
    if (!f)
        return 0;
    char *line = NULL, cur[128] = "";
    size_t cap = 0;
    int lineno = 0, found = 0;
    while (getline(&line, &cap, f) >= 0) {     /* whole lines, however long: the count is the loader's */
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';')
            continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (e) {
                *e = 0;
                snprintf(cur, sizeof cur, "%s", trim(s + 1));
            }
            continue;
        }
        char *eq = strpbrk(s, "=:");
        if (!eq)
            continue;
        *eq = 0;
        if (!strcmp(cur, section) && !strcmp(trim(s), key))
            found = lineno; /* the last one (the loader refuses a key set twice) */
    }
    free(line);
    return found;
}

int daemon_key_error(const struct daemon *d, const char *section, const char *key,
                     char *err, size_t errlen, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    /* An override given on the command line wins over the file: blame it. */
    size_t sl = strlen(section), kl = strlen(key);
    for (int i = d->n_overrides - 1; i >= 0; i--) {
        const char *o = d->overrides[i];
        if (!strncmp(o, section, sl) && o[sl] == '.' && !strncmp(o + sl + 1, key, kl) && o[sl + 1 + kl] == '=') {
            snprintf(err, errlen, "override %s.%s: %s", section, key, why);
            return -EINVAL;
        }
    }
    int line = daemon_key_line(d, section, key);
    if (line > 0)
        snprintf(err, errlen, "%s:%d: %s.%s: %s", d->config_path, line, section, key, why);
    else
        snprintf(err, errlen, "%s: %s.%s (default): %s", d->config_path ? d->config_path : "(defaults)",
                 section, key, why);
    return -EINVAL;
}

int daemon_socket_path(const struct daemon *d, char *buf, size_t len)
{
    const struct cfg_cluster *c = &d->cfg.cluster;
    size_t cap = len < 108 ? len : 108;
    int n = c->socket[0] ? snprintf(buf, cap, "%s", c->socket)
                         : snprintf(buf, cap, "%s/%s.sock", c->runtime_dir, c->name);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

void daemon_print_config(const struct daemon *d, FILE *f)
{
    char *abs = d->config_path ? realpath(d->config_path, NULL) : NULL;
    fprintf(f, "# %s effective configuration (file %s, %d override%s)\n", d->ident,
            abs ? abs : d->config_path ? d->config_path : "(none)", d->n_overrides, d->n_overrides == 1 ? "" : "s");
    free(abs);
    const struct dflash_cfg *c = &d->cfg;
    cfg_print(c, f, NULL);
    /* the paths an empty key stands for (comments: the lines above read back as the file) */
    char path[CFG_STR_MAX + 80];
    if (!c->cluster.socket[0] && daemon_socket_path(d, path, sizeof path) == 0)
        fprintf(f, "# cluster.socket is %s\n", path);
    if (!c->coordinator.ledger[0] && cfg_ledger_path(c, path, sizeof path) == 0)
        fprintf(f, "# coordinator.ledger is %s\n", path);
    if (!c->drafter.checkpoint_dir[0] && cfg_checkpoint_dir(c, path, sizeof path) == 0)
        fprintf(f, "# drafter.checkpoint_dir is %s\n", path);
    if (!c->drafter.metrics_path[0])
        fprintf(f, "# drafter.metrics_path is %s/metrics-rank<N>.jsonl (N: the drafter's rank)\n", c->cluster.state_dir);
    fflush(f);
}

void daemon_print_resolved(const char *key, const char *fmt, ...)
{
    printf("# %s is ", key);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

void daemon_print_from_coordinator(const char *keys)
{
    printf("# in effect here as the coordinator sends them: %s\n", keys);
    fflush(stdout);
}

void daemon_print_capture_ids(const struct daemon *d, const int *ids, int n, int target_layers)
{
    if (d->cfg.model.capture_layers[0])
        return;
    char list[1024] = "";
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? "," : "", ids[i]);
    daemon_print_resolved("model.capture_layers", "%s (the DFlash default for %lld drafter layer%s over %d target "
                          "layers)", list, (long long)d->cfg.model.draft_layers, d->cfg.model.draft_layers == 1 ? "" : "s",
                          target_layers);
}

static void on_stop_signal(int sig)
{
    g_last_signal = sig;
    atomic_fetch_add(&g_stop_count, 1);
}

int daemon_signals_init(void)
{
    struct sigaction sa = { 0 };
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);    /* one stop handler at a time in a thread */
    sigaddset(&sa.sa_mask, SIGINT);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = 0; /* no SA_RESTART: blocking waits return EINTR and see the flag */
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
        return -errno;
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGPIPE, &sa, NULL) < 0 || sigaction(SIGHUP, &sa, NULL) < 0)
        return -errno;
    return 0;
}

int daemon_stop_requested(void) { return atomic_load(&g_stop_count); }
int daemon_last_signal(void) { return g_last_signal; }

/* What a restart may clear (the folder above not there yet: storage not mounted; an I/O error,
 * a shortage) keeps its code (exit 1); the rest (a loop of links, no permission, a file on the
 * path) is the operator's to mend: -ENOTDIR, which the callers exit 78 for. */
static int dir_code(int r)
{
    return r == -ENOENT || err_may_pass(r) ? r : -ENOTDIR;
}

int daemon_dir(const char *key, const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0750) == 0)
        return 0;
    int r = -errno;
    struct stat st;
    if (r == -EEXIST) {
        if (stat(dir, &st) < 0) {
            r = -errno;
            if (r == -ENOENT)   /* a link to storage not mounted yet, perhaps: a restart may find it */
                snprintf(err, errlen, "%s: %s is a link to nothing (its storage not mounted?)", key, dir);
            else
                snprintf(err, errlen, "%s: %s: %s", key, dir, strerror(-r));
            return dir_code(r);
        }
        if (S_ISDIR(st.st_mode))
            return 0;
        snprintf(err, errlen, "%s: %s is not a folder (%s is there)", key, dir, S_ISREG(st.st_mode) ? "a file" : "no folder");
        return -ENOTDIR;
    }
    snprintf(err, errlen, "%s: %s cannot be made: %s%s", key, dir, strerror(-r),
             r == -ENOENT ? " (the folder above it is missing)" : "");
    return dir_code(r);
}

int daemon_lock(struct daemon *d, char *err, size_t errlen)
{
    const char *dir = d->cfg.cluster.runtime_dir;
    int rd = daemon_dir("cluster.runtime_dir", dir, err, errlen);
    if (rd < 0)
        return rd;
    if (d->index >= 0)
        snprintf(d->lock_path, sizeof d->lock_path, "%s/%s-%s-%d.lock", dir, d->cfg.cluster.name, d->role, d->index);
    else
        snprintf(d->lock_path, sizeof d->lock_path, "%s/%s-%s.lock", dir, d->cfg.cluster.name, d->role);
    int fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        int r = -errno;
        snprintf(err, errlen, "%s: %s", d->lock_path, strerror(-r));
        return r;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int r = -errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        if (n > 0)
            pid[n] = 0;
        close(fd);
        if (r == -EWOULDBLOCK) {
            snprintf(err, errlen, "%s is held by another %s (pid %s): one instance %s", d->lock_path, d->prog,
                     n > 0 ? trim(pid) : "?", d->index >= 0 ? "per index" : "per cluster (cluster.name)");
            return -EBUSY;
        }
        snprintf(err, errlen, "flock %s: %s", d->lock_path, strerror(-r));
        return r;
    }
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        int r = -errno;
        close(fd);
        snprintf(err, errlen, "%s: cannot write pid: %s", d->lock_path, strerror(-r));
        return r;
    }
    d->lock_fd = fd;
    return 0;
}

void daemon_unlock(struct daemon *d)
{
    /* The file stays: unlinking it would let a successor that opened it just before
     * lock an orphan while a third instance creates and locks a new one. */
    if (d->lock_fd >= 0) {
        close(d->lock_fd);
        d->lock_fd = -1;
    }
}

static void progress_watchdog(void *arg)
{
    struct daemon *d = arg;
    if (d->leave_on_stop && daemon_stop_requested()) {
        log_notice("stop asked for while %s: leaving", d->leave_on_stop);
        daemon_notify_stopping(d, "stop asked for while %s", d->leave_on_stop);
        fflush(NULL);
        _exit(DAEMON_EX_OK);    /* (the lock goes with the process; nothing else is held) */
    }
    daemon_watchdog(d);
}

void daemon_leave_on_stop(struct daemon *d, const char *what) { d->leave_on_stop = what; }

void daemon_notify_init(struct daemon *d)
{
    uint64_t usec = 0;
    d->notify = getenv("NOTIFY_SOCKET") != NULL;
    /* unset_environment = 0: children (none) would inherit; keep it for re-reads. */
    if (sd_watchdog_enabled(0, &usec) > 0)
        d->watchdog_usec = usec;
    d->watchdog_last_ns = 0;
    /* The long loops of the start (the dataset's hash, the weights read) tick this thread's
     * watchdog: more start time while they move, none when they hang. */
    progress_set(progress_watchdog, d);
}

static void notify_fmt(struct daemon *d, const char *prefix, const char *fmt, va_list ap)
{
    if (!d->notify)
        return;
    char msg[512];
    int n = snprintf(msg, sizeof msg, "%s", prefix);
    if (fmt) {
        n += snprintf(msg + n, sizeof msg - (size_t)n, "STATUS=");
        vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    }
    sd_notify(0, msg);
}

void daemon_notify_ready(struct daemon *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    notify_fmt(d, "READY=1\n", fmt, ap);
    va_end(ap);
    d->ready = 1;
    d->watchdog_last_ns = mono_ns();
}

void daemon_notify_status(struct daemon *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    notify_fmt(d, "", fmt, ap);
    va_end(ap);
}

void daemon_notify_stopping(struct daemon *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    notify_fmt(d, "STOPPING=1\n", fmt, ap);
    va_end(ap);
}

void daemon_notify_extend(struct daemon *d, uint64_t ms)
{
    if (d->notify)
        sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)ms * 1000ull);
}

void daemon_watchdog(struct daemon *d)
{
    if (!d->notify)
        return;
    uint64_t now = mono_ns();
    if (!d->ready) {
        /* (not once a stop is asked for: systemd extends whichever timeout runs, the stop's
         * then, and the stop would wait out the whole load) */
        if (daemon_stop_requested())
            return;
        if (!d->watchdog_last_ns || now - d->watchdog_last_ns >= 10000000000ull) {
            daemon_notify_extend(d, DAEMON_START_EXTEND_MS);
            d->watchdog_last_ns = now;
        }
        return;
    }
    if (!d->watchdog_usec)
        return;
    if (now - d->watchdog_last_ns >= d->watchdog_usec * 1000ull / 4) {
        sd_notify(0, "WATCHDOG=1");
        d->watchdog_last_ns = now;
    }
}

uint64_t daemon_wait_slice_ms(const struct daemon *d, uint64_t cap_ms)
{
    if (!d->watchdog_usec)
        return cap_ms;
    uint64_t q = d->watchdog_usec / 4000ull;
    if (q < 1)
        q = 1;
    return q < cap_ms ? q : cap_ms;
}

void daemon_done(struct daemon *d)
{
    if (!d)
        return;
    progress_set(NULL, NULL);
    daemon_unlock(d);
}

static char g_bus_msg[3][320];
static size_t g_bus_len[3];
static char g_bus_prefix[128];      /* "<2>ident: SIGBUS: " */

static size_t bus_put(char *buf, size_t n, size_t cap, const char *s)
{
    while (*s && n < cap)
        buf[n++] = *s++;
    return n;
}

/* A page of a mapping is gone (BUS_ADRERR): a file (the dataset, the model's weights, a
 * checkpoint) or shm object (the ring) shrank under this process. Say so, naming the mapping
 * where mapname knows it (the default action prints nothing useful); the handler is reset, so
 * the access faults again and the process dies of SIGBUS, a failure systemd restarts (the files
 * are checked again at load, a cut-short ring is made anew by the coordinator). */
static void on_bus_error(int sig, siginfo_t *si, void *uctx)
{
    int saved = errno, k = !si || si->si_code <= 0 ? 2 : si->si_code == BUS_ADRERR ? 0 : 1;
    char line[640];
    size_t n = 0;
    if (k == 0) {       /* the prefix, then the mapping's name straight after it, where it is known */
        size_t p = bus_put(line, 0, sizeof line - 1, g_bus_prefix);
        size_t named = mapname_find(si->si_addr, line + p, sizeof line - 1 - p);
        if (named) {
            n = bus_put(line, p + named, sizeof line - 1, " shrank under this process (cut short in place: replace a "
                        "file by renaming a new one over it; a ring is made anew when the coordinator restarts)");
            line[n++] = '\n';
        }
    }
    ssize_t w = n ? write(STDERR_FILENO, line, n) : write(STDERR_FILENO, g_bus_msg[k], g_bus_len[k]);
    (void)w;
    (void)uctx;
    if (k == 2)
        raise(sig);     /* sent, not a fault: nothing recurs, the default action comes this way */
    errno = saved;
}

void daemon_bus_report_init(const char *ident)
{
    static const char *const why[3] = {
        "a file or shared-memory object mapped by this process shrank under it (a dataset or model rewritten "
        "in place? replace a file by renaming a new one over it)",
        "a bus error (a hardware memory error, or an access the CPU cannot make)",
        "sent by another process",
    };
    int journal = getenv("JOURNAL_STREAM") != NULL || !isatty(STDERR_FILENO);     /* as log.c */
    snprintf(g_bus_prefix, sizeof g_bus_prefix, "%s%s: SIGBUS: ", journal ? "<2>" : "", ident);
    for (int k = 0; k < 3; k++) {
        int n = snprintf(g_bus_msg[k], sizeof g_bus_msg[k], "%s%s\n", g_bus_prefix, why[k]);
        g_bus_len[k] = n < 0 ? 0 : (size_t)n < sizeof g_bus_msg[k] ? (size_t)n : sizeof g_bus_msg[k] - 1;
    }
    struct sigaction sa = { 0 };
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = on_bus_error;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGBUS, &sa, NULL);
}

int daemon_start(struct daemon *d, const char *prog, const char *role, int need_index,
                 int argc, char **argv, char *err, size_t errlen)
{
    err[0] = 0;
    int r = daemon_parse_args(d, prog, role, need_index, argc, argv, stdout, err, errlen);
    if (r == 1)
        return DAEMON_EX_OK;
    log_init(prog, LOG_LVL_INFO);
    if (r < 0)
        return DAEMON_EX_USAGE;
    log_init(d->ident, LOG_LVL_INFO);
    daemon_bus_report_init(d->ident);
    /* a file that is wrong is the operator's (78); one that could not be read for want of
     * memory or descriptors, or an I/O error, may read at the restart (1) */
    if ((r = daemon_load_config(d, err, errlen)) < 0)
        return err_may_pass(r) ? DAEMON_EX_FAILURE : DAEMON_EX_CONFIG;
    enum log_level lvl = LOG_LVL_INFO;
    log_level_parse(d->cfg.cluster.log_level, &lvl);    /* (the loader checked the word) */
    log_set_level(lvl);
    daemon_print_config(d, stdout);
    return -1;
}
