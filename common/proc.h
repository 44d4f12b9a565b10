/* proc.h: process identity that survives pid reuse, and liveness checks.
 * An owner token packs pid + process start time (/proc/<pid>/stat field 22). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Owner token layout (62 bits used, so it fits beside a 2-bit state in a 64-bit word):
 *   bits  0..21  pid (Linux pid_max is at most 2^22)
 *   bits 22..60  start time in clock ticks since boot (39 bits: > 170 years at 100 Hz)
 *   bit  61      1 = lease id issued by the coordinator (bits 0..60 are the id; no pid)
 * Token 0 is never valid. Tokens compare equal only for the same process incarnation within
 * one boot: start times count from the boot, so after a reboot a new process may repeat a token
 * saved before it (the coordinator's ledger replaces those with PROC_TOKEN_GONE). */
#define PROC_TOKEN_BITS      62
#define PROC_TOKEN_PID_BITS  22
#define PROC_TOKEN_TIME_BITS 39
#define PROC_TOKEN_LEASE     (1ull << 61)
#define PROC_TOKEN_MASK      ((1ull << PROC_TOKEN_BITS) - 1)
/* A pid-form token no process has (pid 1, the last start time the field holds): dead to
 * proc_token_alive and equal to no process's token. */
#define PROC_TOKEN_GONE      (1ull | (((1ull << PROC_TOKEN_TIME_BITS) - 1) << PROC_TOKEN_PID_BITS))

/* Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat).
 * Returns 0, -ESRCH when the process is gone or a zombie, -EPERM when it is another user's with
 * its /proc entry hidden from this process (hidepid=2), -EACCES when it runs without an entry
 * here (a /proc of another pid namespace), or another -errno. */
int proc_start_time(pid_t pid, uint64_t *ticks);

/* This boot's id (/proc/sys/kernel/random/boot_id, 36 characters) into buf (>= 37 bytes): 0, or
 * -errno when it cannot be read. */
int proc_boot_id(char *buf, size_t cap);

/* Token for (pid, start time); never 0 for a real process. */
uint64_t proc_token_make(pid_t pid, uint64_t start_ticks);
/* Token for a coordinator-issued lease id (1 .. 2^61-1). */
uint64_t proc_token_lease(uint64_t lease_id);
/* Token of the calling process (cached after the first call; fork-safe). */
int proc_self_token(uint64_t *token);

static inline int proc_token_is_lease(uint64_t t) { return (t & PROC_TOKEN_LEASE) != 0; }
/* pid inside a pid-form token, 0 for a lease token. */
static inline pid_t proc_token_pid(uint64_t t)
{
    return proc_token_is_lease(t) ? 0 : (pid_t)(t & ((1u << PROC_TOKEN_PID_BITS) - 1));
}

/* Is the process behind a pid-form token still running (same incarnation, not a zombie)?
 * Returns 1 alive, 0 dead (also when the pid is another user's process hidden by hidepid: no
 * daemon of the cluster is, the coordinator refuses them), -EINVAL for a lease token or 0
 * (liveness unknown here), or another -errno when /proc cannot be read. kill(pid, 0) alone is not enough: the
 * pid may have been reused. */
int proc_token_alive(uint64_t token);

struct stat;
/* Whether a shared-memory object (its fstat) may be one this cluster made: not writable by every
 * user, and owned by this user, by root, or by `also` (another user trusted, e.g. the one that
 * owns the coordinator's socket; (uid_t)-1 none). 1 yes; 0 no, and why says whose it is.
 * /dev/shm is writable by everyone: any local user can put an object under a name first. */
int proc_trusts_object(const struct stat *st, uid_t also, char *why, size_t whylen);
