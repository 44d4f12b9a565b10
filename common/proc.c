/* proc.c: process start times from /proc and owner tokens built from them.
 * pid + start time names one process incarnation, so a reused pid is never mistaken. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/proc.h"

/* Reads /proc/<pid>/stat; fields after the command name (which may hold spaces and
 * parentheses) are located from the last ')'. */
static int read_stat(pid_t pid, char *state, long *threads, uint64_t *ticks)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        /* Gone, or hidden: /proc mounted hidepid=2 hides other users' processes from one without
         * CAP_SYS_PTRACE (kill says EPERM). One that could be signalled but has no entry (a /proc
         * of another pid namespace) is unknown. */
        if (kill(pid, 0) == 0)
            return -EACCES;
        return errno == EPERM ? -EPERM : -ESRCH;
    }
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int e = errno;
    close(fd);
    if (n < 0)
        return e == ESRCH ? -ESRCH : -e;
    if (n == 0)   /* the process went away between open and read */
        return -ESRCH;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -EIO;
    p += 2;                 /* field 3: state */
    *state = *p;
    /* field 20 (num_threads) and field 22 (starttime), counted from field 3 */
    char *end;
    for (int f = 3; f < 22; f++) {
        p = strchr(p, ' ');
        if (!p)
            return -EIO;
        p++;
        if (f + 1 == 20) {
            errno = 0;
            *threads = strtol(p, &end, 10);
            if (errno || end == p)
                return -EIO;
        }
    }
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || end == p)
        return -EIO;
    *ticks = v;
    return 0;
}

int proc_start_time(pid_t pid, uint64_t *ticks)
{
    char state = 0;
    long threads = 0;
    if (pid <= 0)
        return -EINVAL;
    int r = read_stat(pid, &state, &threads, ticks);
    if (r < 0)
        return r;
    /* A zombie whose threads are all gone has released its memory and mappings (and its device
     * contexts): for ownership it is gone. A leader that exited before its other threads shows
     * 'Z' too while they still run (or still tear down a GPU context that may be copying into a
     * slot): alive until the count of threads falls to its own. */
    if (state == 'X' || state == 'x' || (state == 'Z' && threads <= 1))
        return -ESRCH;
    return 0;
}

int proc_boot_id(char *buf, size_t cap)
{
    if (cap < 37)
        return -ENOSPC;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, cap - 1);
    int e = errno;
    close(fd);
    if (n < 0)
        return -e;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = 0;
    return n == 36 ? 0 : -EIO;      /* a uuid: 8-4-4-4-12 */
}

uint64_t proc_token_make(pid_t pid, uint64_t start_ticks)
{
    uint64_t t = (uint64_t)(uint32_t)pid & ((1u << PROC_TOKEN_PID_BITS) - 1);
    t |= (start_ticks & ((1ull << PROC_TOKEN_TIME_BITS) - 1)) << PROC_TOKEN_PID_BITS;
    return t;
}

uint64_t proc_token_lease(uint64_t lease_id)
{
    return PROC_TOKEN_LEASE | (lease_id & (PROC_TOKEN_LEASE - 1));
}

static uint64_t g_self_token;
static pid_t g_self_pid;
static pthread_mutex_t g_self_lock = PTHREAD_MUTEX_INITIALIZER;

int proc_self_token(uint64_t *token)
{
    pid_t pid = getpid();
    pthread_mutex_lock(&g_self_lock);
    if (g_self_pid != pid) {   /* first call, or we are a fork child */
        uint64_t st;
        int r = proc_start_time(pid, &st);
        if (r < 0) {
            pthread_mutex_unlock(&g_self_lock);
            return r;
        }
        g_self_token = proc_token_make(pid, st);
        g_self_pid = pid;
    }
    *token = g_self_token;
    pthread_mutex_unlock(&g_self_lock);
    return 0;
}

int proc_token_alive(uint64_t token)
{
    if (!token || proc_token_is_lease(token))
        return -EINVAL;
    if (token == PROC_TOKEN_GONE)
        return 0;
    pid_t pid = proc_token_pid(token);
    uint64_t st;
    int r = proc_start_time(pid, &st);
    /* Another user's process hidden by hidepid is no daemon of this cluster (the coordinator
     * refuses one it cannot see): the token's process is gone, its pid taken by that one. */
    if (r == -ESRCH || r == -EPERM)
        return 0;
    if (r < 0)
        return r;
    return proc_token_make(pid, st) == token;
}

int proc_trusts_object(const struct stat *st, uid_t also, char *why, size_t whylen)
{
    if (st->st_mode & S_IWOTH) {
        snprintf(why, whylen, "it is writable by every user (mode %04o, owner uid %u): not one dflash made",
                 (unsigned)(st->st_mode & 07777), (unsigned)st->st_uid);
        return 0;
    }
    if (st->st_uid == geteuid() || st->st_uid == 0 || (also != (uid_t)-1 && st->st_uid == also))
        return 1;
    snprintf(why, whylen, "it belongs to uid %u: neither this user, root nor the coordinator's", (unsigned)st->st_uid);
    return 0;
}
