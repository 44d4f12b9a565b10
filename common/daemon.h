/* daemon.h: plumbing shared by the dflash daemons: command line, config load and print,
 * sd_notify helpers (READY/STATUS/WATCHDOG/STOPPING), stop signals, a per-daemon lock file. */
#pragma once
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "common/config.h"

/* Exit codes. A bad configuration exits DAEMON_EX_CONFIG (sysexits EX_CONFIG); the units
 * list it in RestartPreventExitStatus= so systemd does not restart a daemon that cannot
 * start. Any other failure exits DAEMON_EX_FAILURE and systemd restarts it. */
#define DAEMON_EX_OK      0
#define DAEMON_EX_FAILURE 1
#define DAEMON_EX_USAGE   64
#define DAEMON_EX_CONFIG  78

#define DAEMON_MAX_OVERRIDES 64

struct daemon {
    const char *prog;           /* "target-d" */
    const char *role;           /* "target", "drafter", "coordinator" */
    const char *config_path;    /* -c; NULL = built-in defaults only */
    int index;                  /* -i INDEX (device index of a template instance); -1 = none */
    int check_only;             /* -t: load, validate, print the config, exit */
    const char *overrides[DAEMON_MAX_OVERRIDES]; /* -o section.key=value, in order */
    int n_overrides;
    char ident[64];             /* "target-d@0": log ident and STATUS prefix */
    struct dflash_cfg cfg;

    int lock_fd;
    char lock_path[CFG_STR_MAX + 128];

    uint64_t watchdog_usec;     /* 0 = no watchdog requested */
    uint64_t watchdog_last_ns;
    int ready;                  /* READY=1 sent */
    int notify;                 /* NOTIFY_SOCKET is set: we run under systemd Type=notify */
    const char *leave_on_stop;  /* daemon_leave_on_stop's phase, or NULL */
};

/* Parse "-c CONFIG [-i INDEX] [-o section.key=value]... [-t] [-h]" into *d (no config load).
 * need_index: -i is required. Returns 0, 1 when -h asked for usage (usage already printed to
 * `out`), or -EINVAL with the reason in err. */
int daemon_parse_args(struct daemon *d, const char *prog, const char *role, int need_index,
                      int argc, char **argv, FILE *out, char *err, size_t errlen);

/* Load the config file, apply the -o overrides in order and check the instance index
 * against <role>.devices (when the config has that key). Errors name file:line. */
int daemon_load_config(struct daemon *d, char *err, size_t errlen);

/* Line of `section.key` in the config file (0 when absent or no file), so checks done
 * after loading (model dir missing, bad enum value) can still report file:line. */
int daemon_key_line(const struct daemon *d, const char *section, const char *key);

/* Format "file:line: section.key: reason" (or "file: ..." / "override: ..." when the key
 * is not in the file) into err; returns -EINVAL for convenience. */
int daemon_key_error(const struct daemon *d, const char *section, const char *key,
                     char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The control socket path: cluster.socket, or <runtime_dir>/<name>.sock. -ENAMETOOLONG when it
 * does not fit a unix socket address (108 bytes). */
int daemon_socket_path(const struct daemon *d, char *buf, size_t len);

/* Print the effective configuration: a header line then every key as "section.key = value". */
void daemon_print_config(const struct daemon *d, FILE *f);
/* After the daemon's own checks: one comment line "# section.key is VALUE" under the printed
 * configuration, for a key whose printed value stands for another (0, -1, empty: automatic). */
void daemon_print_resolved(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One comment line naming the keys whose values this daemon takes from the coordinator. */
void daemon_print_from_coordinator(const char *keys);
/* The same for model.capture_layers when it is empty (the DFlash default): the ids in use. */
void daemon_print_capture_ids(const struct daemon *d, const int *ids, int n, int target_layers);
/* The start every daemon shares: parse arguments, set up logging, load the config, apply
 * cluster.log_level, print the effective config to stdout. Returns -1 to go on, else the
 * exit code for main (DAEMON_EX_OK after -h, _USAGE, _CONFIG) with the reason in err
 * (empty when there is nothing to log). */
int daemon_start(struct daemon *d, const char *prog, const char *role, int need_index,
                 int argc, char **argv, char *err, size_t errlen);
/* The SIGBUS report daemon_start installs: one line on stderr, prefixed with ident, naming the
 * mapping that shrank where common/mapname knows it, then the default action (death by SIGBUS). */
void daemon_bus_report_init(const char *ident);

/* Install SIGTERM/SIGINT (request stop), SIGHUP (ignored: no reload) and SIGPIPE (ignored)
 * handlers without SA_RESTART, so blocking waits return EINTR and the loop sees the flag. */
int daemon_signals_init(void);
/* Number of stop signals received so far (0 = none). A second one means "hurry". */
int daemon_stop_requested(void);
/* Signal that arrived last (SIGTERM, SIGINT) or 0. */
int daemon_last_signal(void);

/* Take <runtime_dir>/<cluster>-<role>[-<index>].lock with flock (creating runtime_dir when
 * missing). The kernel drops the lock when the process dies, which is how peers can tell
 * a crashed daemon from a slow one. -EBUSY: another live instance holds it. */
int daemon_lock(struct daemon *d, char *err, size_t errlen);
/* The folder of config key KEY: made (its last part, mode 0750) when missing. -ENOTDIR where a
 * file or another non-folder is there (a config error), another -errno where it cannot be made;
 * err names the key, the folder and why. */
int daemon_dir(const char *key, const char *dir, char *err, size_t errlen);
void daemon_unlock(struct daemon *d);

/* sd_notify wrappers; no-ops outside systemd. Read the watchdog interval at init. */
void daemon_notify_init(struct daemon *d);
void daemon_notify_ready(struct daemon *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void daemon_notify_status(struct daemon *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void daemon_notify_stopping(struct daemon *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ask systemd for more start time (a long model load, the dataset's hash): EXTEND_TIMEOUT_USEC. */
void daemon_notify_extend(struct daemon *d, uint64_t ms);
/* Send WATCHDOG=1 when a quarter of the interval has passed since the last one; cheap to
 * call from every iteration of the loop that does the work (never from a helper thread:
 * a hung loop must stop the pings). Before READY it asks for DAEMON_START_EXTEND_MS more
 * start time instead (at most every 10 s): a start that makes progress (a wait that pings)
 * is not cut off by TimeoutStartSec, and the watchdog is not armed before the loop runs.
 * daemon_notify_init() makes it the calling thread's progress hook (common/progress.h): the
 * long loops of the start (the dataset's hash, the weights read) tick it. */
void daemon_watchdog(struct daemon *d);
#define DAEMON_START_EXTEND_MS 120000
/* A start phase that holds nothing of the cluster yet (reading the weights, before the
 * coordinator is asked): named `what`, a stop asked for meanwhile ends the process (exit 0) at the
 * phase's next progress tick, on the thread of daemon_notify_init, instead of after the whole load
 * (minutes: `systemctl stop` would wait, and past TimeoutStopSec end in SIGKILL). NULL ends it. */
void daemon_leave_on_stop(struct daemon *d, const char *what);
/* Milliseconds a blocking wait in the work loop may last before it must come back to ping
 * the watchdog (a quarter of the interval, at most `cap_ms`). */
uint64_t daemon_wait_slice_ms(const struct daemon *d, uint64_t cap_ms);

/* Release the lock; safe on a half-initialised daemon. */
void daemon_done(struct daemon *d);
