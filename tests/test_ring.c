/* test_ring.c: ring creation, header validation, posix_fallocate on a full /dev/shm,
 * single-process transitions, pick policies, blocking waits, reclaim and stats. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/daemon.h"
#include "common/err.h"
#include "common/proc.h"
#include "common/timeutil.h"
#include "ipc/ring.h"
#include "tests/test.h"

static char g_name[64];
static char err[512];

static struct ring_layout small_layout(uint32_t nslots)
{
    struct ring_layout l = { .nslots = nslots, .hidden = 16, .n_layers = 3, .dtype = RING_DTYPE_BF16,
                             .max_tokens = 64, .max_seqs = 4 };
    l.layer_ids[0] = 1; l.layer_ids[1] = 9; l.layer_ids[2] = 17;
    return l;
}

/* A thread that returns once a byte arrives on *(int *)fd. */
static void *wait_for_byte(void *fd)
{
    char b;
    if (read(*(int *)fd, &b, 1) != 1)
        return NULL;
    return NULL;
}

/* The state letter of /proc/<pid>/stat, 0 when unreadable. */
static char stat_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

static void test_proc_tokens(void)
{
    uint64_t me, st;
    CHECK_OK(proc_self_token(&me));
    CHECK(me != 0);
    CHECK_INT(proc_token_pid(me), ==, getpid());
    CHECK_INT(proc_token_alive(me), ==, 1);
    CHECK_OK(proc_start_time(getpid(), &st));
    /* same pid, another start time: a reused pid is not us */
    CHECK_INT(proc_token_alive(proc_token_make(getpid(), st + 1)), ==, 0);
    CHECK_INT(proc_token_alive(proc_token_lease(7)), ==, -EINVAL);
    CHECK(proc_token_is_lease(proc_token_lease(7)) && proc_token_pid(proc_token_lease(7)) == 0);
    /* the token that stands for an owner of another boot: dead, a pid form, nobody's */
    CHECK_INT(proc_token_alive(PROC_TOKEN_GONE), ==, 0);
    CHECK(!proc_token_is_lease(PROC_TOKEN_GONE) && (PROC_TOKEN_GONE & ~PROC_TOKEN_MASK) == 0);
    CHECK(PROC_TOKEN_GONE != me && PROC_TOKEN_GONE != proc_token_make(1, 0));
    char boot[64], again[64];
    if (access("/proc/sys/kernel/random/boot_id", R_OK) == 0) {
        CHECK_OK(proc_boot_id(boot, sizeof boot));
        CHECK_INT(strlen(boot), ==, 36);
        CHECK(boot[8] == '-' && boot[13] == '-' && boot[18] == '-' && boot[23] == '-');
        CHECK_OK(proc_boot_id(again, sizeof again));
        CHECK(!strcmp(boot, again));
    }
    CHECK_INT(proc_boot_id(boot, 36), ==, -ENOSPC);

    int pfd[2];
    CHECK_OK(pipe(pfd));
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t t;
        proc_self_token(&t);   /* fork child: must not inherit the parent's token */
        if (write(pfd[1], &t, sizeof t) != sizeof t)
            _exit(2);
        _exit(0);
    }
    uint64_t child;
    CHECK_INT(read(pfd[0], &child, sizeof child), ==, sizeof child);
    CHECK(child != me && proc_token_pid(child) == pid);
    /* wait until it is a zombie (exited, not reaped): it already counts as dead */
    siginfo_t si;
    CHECK_OK(waitid(P_PID, pid, &si, WEXITED | WNOWAIT));
    CHECK_INT(proc_token_alive(child), ==, 0);
    CHECK_INT(waitpid(pid, NULL, 0), ==, pid);
    CHECK_INT(proc_token_alive(child), ==, 0);

    /* A leader that exited while another thread runs shows 'Z': still alive, until that thread
     * is gone too. Not under ThreadSanitizer: its runtime thread never ends, so neither would
     * the child. */
#if defined(__SANITIZE_THREAD__)
    close(pfd[0]);
    close(pfd[1]);
    fprintf(stderr, "proc tokens: the zombie-leader part is left out under ThreadSanitizer\n");
    return;
#endif
    int go[2];
    CHECK_OK(pipe(go));
    pid = fork();
    if (pid == 0) {
        uint64_t t;
        pthread_t th;
        proc_self_token(&t);
        close(go[1]);       /* the parent gone without its byte (a failed CHECK): EOF ends the thread */
        if (write(pfd[1], &t, sizeof t) != sizeof t || pthread_create(&th, NULL, wait_for_byte, &go[0]) != 0)
            _exit(2);
        pthread_exit(NULL);
    }
    CHECK_INT(read(pfd[0], &child, sizeof child), ==, sizeof child);
    char state = 0;
    for (int i = 0; i < 500 && state != 'Z'; i++) {
        state = stat_state(pid);
        if (state != 'Z')
            usleep(10000);
    }
    CHECK_INT(state, ==, 'Z');
    CHECK_INT(proc_token_alive(child), ==, 1);
    CHECK_INT(write(go[1], "g", 1), ==, 1);
    CHECK_OK(waitid(P_PID, pid, &si, WEXITED | WNOWAIT));
    CHECK_INT(proc_token_alive(child), ==, 0);
    CHECK_INT(waitpid(pid, NULL, 0), ==, pid);
    close(go[0]);
    close(go[1]);
    close(pfd[0]);
    close(pfd[1]);
}

/* Rewrite bytes of the shm object directly, as a foreign or damaged writer would. */
static void poke(const char *name, off_t off, const void *bytes, size_t n)
{
    int fd = shm_open(name, O_RDWR, 0);
    CHECK(fd >= 0);
    CHECK_INT(pwrite(fd, bytes, n, off), ==, (ssize_t)n);
    close(fd);
}

static void test_validation(void)
{
    struct ring *r = NULL, *a = NULL;
    struct ring_layout l = small_layout(4), want;
    int rc;

    rc = ring_attach(&a, g_name, &l, 0, err, sizeof err);
    CHECK_INT(rc, ==, -ENOENT);
    CHECK_CONTAINS(err, g_name);

    CHECK_OK(ring_create(&r, g_name, &l, &(struct ring_create_opts){ .mode = 0640, .gid = -1 }, err, sizeof err));
    struct stat st;
    int fd = shm_open(g_name, O_RDONLY, 0);
    CHECK(fd >= 0 && fstat(fd, &st) == 0);
    CHECK_INT(st.st_mode & 0777, ==, 0640);
    CHECK_INT(st.st_size, ==, ring_map_size(r));
    close(fd);

    /* a second create of the same name fails unless asked to replace */
    struct ring *r2 = NULL;
    CHECK_INT(ring_create(&r2, g_name, &l, NULL, err, sizeof err), ==, -EEXIST);
    CHECK_CONTAINS(err, g_name);
    CHECK(r2 == NULL);

    CHECK_OK(ring_attach(&a, g_name, &l, 0, err, sizeof err));
    ring_detach(a);

    /* an object any user may write, or one of another user, is refused (any local user can put
     * one under the name first), unless that user is trusted (a daemon: the coordinator's) */
    fd = shm_open(g_name, O_RDWR, 0);
    CHECK(fd >= 0 && fchmod(fd, 0666) == 0);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -EPERM);
    CHECK_CONTAINS(err, "writable by every user");
    CHECK(fchmod(fd, 0640) == 0);
    if (geteuid() == 0) {
        CHECK(fchown(fd, 65534, 65534) == 0);
        CHECK_INT(ring_attach(&a, g_name, &l, RING_ATTACH_RDONLY, err, sizeof err), ==, -EPERM);
        CHECK_CONTAINS(err, "belongs to uid 65534");
        CHECK(fchmod(fd, 0660) == 0 && fchown(fd, 65534, 0) == 0);  /* root's group is no excuse */
        CHECK_INT(ring_attach(&a, g_name, &l, RING_ATTACH_RDONLY, err, sizeof err), ==, -EPERM);
        ring_trust_user(65534);
        CHECK_OK(ring_attach(&a, g_name, &l, RING_ATTACH_RDONLY, err, sizeof err));
        ring_detach(a);
        ring_trust_user((uid_t)-1);
        CHECK(fchmod(fd, 0640) == 0 && fchown(fd, 0, 0) == 0);
    }
    close(fd);
    CHECK_OK(ring_attach(&a, g_name, &l, 0, err, sizeof err));
    ring_detach(a);

    /* each layout field that differs is named */
    want = l; want.nslots = 8;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "slots 4, expected 8");
    CHECK_CONTAINS(err, g_name);
    want = l; want.hidden = 32;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "hidden size");
    want = l; want.n_layers = 2;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "captured layers");
    want = l; want.layer_ids[2] = 18;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "captured layer #2 is 17, expected 18");
    want = l; want.max_tokens = 128;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "max tokens");
    want = l; want.max_seqs = 8;
    CHECK_INT(ring_attach(&a, g_name, &want, 0, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK_CONTAINS(err, "max seqs");
    CHECK(a == NULL);

    /* "accept what is there" learns the layout, read-only */
    CHECK_OK(ring_attach(&a, g_name, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err));
    CHECK_INT(ring_layout(a)->nslots, ==, 4);
    CHECK_INT(ring_layout(a)->layer_ids[1], ==, 9);
    unsigned s;
    CHECK_INT(ring_claim_write(a, 0, &s), ==, -EROFS);
    CHECK_INT(ring_claim_read(a, NULL, 0, &s), ==, -EROFS);
    struct ring_stats rs;
    CHECK_OK(ring_stats(a, &rs, NULL));
    CHECK_INT(rs.count[RING_FREE], ==, 4);
    CHECK_INT(rs.creator_pid, ==, getpid());
    ring_detach(a);
    CHECK_INT(ring_attach(&a, g_name, NULL, 0, err, sizeof err), ==, -EINVAL);

    /* wrong version */
    uint32_t v = RING_VERSION + 1, good = RING_VERSION;
    poke(g_name, 8, &v, 4);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EVERSION);
    CHECK_CONTAINS(err, g_name);
    CHECK_CONTAINS(err, "version");
    poke(g_name, 8, &good, 4);

    /* header that contradicts itself (slot stride at offset 40) */
    uint64_t stride, bad = 12345;
    fd = shm_open(g_name, O_RDONLY, 0);
    CHECK_INT(pread(fd, &stride, 8, 40), ==, 8);
    close(fd);
    CHECK_INT(stride, ==, ring_slot_stride(r));
    poke(g_name, 40, &bad, 8);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "corrupt header: its slot stride does not follow");
    poke(g_name, 40, &stride, 8);
    /* a layout field out of range (the slot count, the layout's first field at offset 64) */
    uint32_t nslots, zero = 0;
    fd = shm_open(g_name, O_RDONLY, 0);
    CHECK_INT(pread(fd, &nslots, 4, 64), ==, 4);
    close(fd);
    CHECK_INT(nslots, ==, l.nslots);
    poke(g_name, 64, &zero, 4);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "corrupt header: slots 0 out of range");
    poke(g_name, 64, &nslots, 4);
    CHECK_OK(ring_attach(&a, g_name, &l, 0, err, sizeof err));

    /* The header spoiled after attach (a writer gone astray): addresses and bounds come from
     * what was checked at attach, not from the shared bytes. Layout at offset 64: nslots, hidden,
     * n_layers, layer_ids[RING_MAX_LAYERS], dtype, max_tokens, max_seqs. */
    unsigned char *slot1 = (unsigned char *)ring_slot_header(a, 1), *hid1 = ring_slot_hidden(a, 1);
    uint32_t slots_at = 64, max_tokens_at = 64 + 4 * (4 + RING_MAX_LAYERS), huge = 1u << 30;
    uint64_t wild = 1ull << 40;
    poke(g_name, 40, &wild, 8);
    poke(g_name, slots_at, &huge, 4);
    poke(g_name, max_tokens_at, &huge, 4);
    CHECK_INT(ring_layout(a)->nslots, ==, l.nslots);
    CHECK_INT(ring_layout(a)->max_tokens, ==, l.max_tokens);
    CHECK_INT(ring_slot_stride(a), ==, stride);
    CHECK((unsigned char *)ring_slot_header(a, 1) == slot1 && ring_slot_hidden(a, 1) == hid1);
    struct ring_stats spoiled;
    CHECK_OK(ring_stats(a, &spoiled, NULL));
    CHECK_INT(spoiled.nslots, ==, l.nslots);
    poke(g_name, 40, &stride, 8);
    poke(g_name, slots_at, &l.nslots, 4);
    poke(g_name, max_tokens_at, &l.max_tokens, 4);
    ring_detach(a);

    /* truncated: header intact but slots cut off; then cut inside the header */
    size_t full = ring_map_size(r);
    ring_detach(r);
    fd = shm_open(g_name, O_RDWR, 0);
    CHECK_OK(ftruncate(fd, (off_t)full / 2));
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_ETRUNC);
    CHECK_CONTAINS(err, "truncated");
    CHECK_CONTAINS(err, g_name);
    CHECK_OK(ftruncate(fd, 100));
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_ETRUNC);
    CHECK_CONTAINS(err, "header alone");
    close(fd);

    /* wrong magic: a foreign object of the same name, large and tiny */
    CHECK_OK(ring_unlink(g_name));
    fd = shm_open(g_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    CHECK_INT(write(fd, junk, sizeof junk), ==, (ssize_t)sizeof junk);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EMAGIC);
    CHECK_CONTAINS(err, "not a dflash ring");
    CHECK_CONTAINS(err, g_name);
    CHECK_OK(ftruncate(fd, 3));
    CHECK_INT(ring_attach(&a, g_name, NULL, RING_ATTACH_ANY, err, sizeof err), ==, -DF_EMAGIC);
    close(fd);
    /* ... and create replaces it only when asked */
    CHECK_INT(ring_create(&r, g_name, &l, NULL, err, sizeof err), ==, -EEXIST);
    CHECK_OK(ring_create(&r, g_name, &l, &(struct ring_create_opts){ .gid = -1, .flags = RING_CREATE_REPLACE },
                         err, sizeof err));
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));

    /* bad layouts and names are refused before anything is created */
    want = l; want.n_layers = 0;
    CHECK_INT(ring_create(&r, g_name, &want, NULL, err, sizeof err), ==, -DF_ERANGE);
    CHECK_CONTAINS(err, "captured layers");
    want = l; want.dtype = 7;
    CHECK_INT(ring_create(&r, g_name, &want, NULL, err, sizeof err), ==, -DF_EUNSUPPORTED);
    CHECK_INT(ring_create(&r, "no-slash", &l, NULL, err, sizeof err), ==, -EINVAL);
    CHECK_INT(ring_attach(&a, "/a/b", &l, 0, err, sizeof err), ==, -EINVAL);
    CHECK_INT(shm_open(g_name, O_RDONLY, 0), <, 0);
    ring_detach(NULL);
}

/* The index of the 8-byte word holding `value` in the first 8 KiB of the ring's object (the
 * header's private layout is found by content), -1 when it is not there. */
static int word_of(uint64_t value)
{
    uint64_t head[8192 / 8];
    int fd = shm_open(g_name, O_RDONLY, 0);
    CHECK(fd >= 0);
    CHECK_INT(pread(fd, head, sizeof head, 0), ==, (ssize_t)sizeof head);
    close(fd);
    for (int i = 1; i < (int)(sizeof head / 8); i++)
        if (head[i] == value)
            return i;
    return -1;
}

/* A header whose magic is not stored yet is one being made: -EAGAIN while its creator (named in
 * the header before the object is sized) lives, else not a ring. The attach side only: a
 * finished ring with its magic taken away stands in for one being made. */
static void test_being_made(void)
{
    struct ring *r = NULL, *a = NULL;
    struct ring_layout l = small_layout(4);
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    uint64_t me;
    CHECK_OK(proc_self_token(&me));
    int at = word_of(me);
    CHECK(at > 0 && at < 64);                           /* the creator's token is in the header */
    uint64_t zero = 0, dead = proc_token_make(getpid(), 1);
    poke(g_name, 0, &zero, 8);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -EAGAIN);
    CHECK_CONTAINS(err, "still being initialised");
    /* its creator gone: dflash's own leftover, for the coordinator to replace */
    poke(g_name, at * 8, &dead, 8);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EDEAD);
    CHECK_CONTAINS(err, "left half-made by pid");
    CHECK_CONTAINS(err, "which died");
    /* a token that does not name the pid beside it: not a creator's header, someone else's bytes */
    uint64_t other = proc_token_make(getpid() + 1, 1);
    poke(g_name, at * 8, &other, 8);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EMAGIC);
    CHECK_CONTAINS(err, "not a dflash ring");
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));

    /* An empty object: a creation that has not named itself yet, or one cut short long ago. */
    int fd = shm_open(g_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -EAGAIN);
    CHECK_CONTAINS(err, "an empty object, maybe being created");
    struct timespec old[2] = { { time(NULL) - 60, 0 }, { time(NULL) - 60, 0 } };
    CHECK_OK(futimens(fd, old));
    close(fd);
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -DF_EDEAD);
    CHECK_CONTAINS(err, "an empty object left by a creation cut short");
    CHECK_OK(ring_unlink(g_name));
}

/* Layout with about `bytes` of slot memory (4 slots). */
static struct ring_layout layout_of_bytes(uint64_t bytes)
{
    struct ring_layout l = small_layout(4);
    l.hidden = 1024;
    l.n_layers = 4;                    /* 8 KiB per token row */
    uint64_t tokens = bytes / 4 / 8192;
    l.max_tokens = (uint32_t)(tokens ? tokens : 1);
    return l;
}

/* In a private mount namespace, /dev/shm is a 4 MiB tmpfs: a ring bigger than what is
 * left fails at creation; one that fits is fully backed (touching every page is safe). */
static int full_shm_child(void)
{
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4m,mode=1777") < 0)
        return 77;
    struct ring *a = NULL, *b = NULL;
    struct ring_layout la = layout_of_bytes(2560 << 10), lb = layout_of_bytes(2 << 20);
    char name_b[80];
    snprintf(name_b, sizeof name_b, "%s-b", g_name);
    CHECK_OK(ring_create(&a, g_name, &la, NULL, err, sizeof err));
    /* ftruncate alone would succeed here and SIGBUS the first writer past the free space */
    int rc = ring_create(&b, name_b, &lb, NULL, err, sizeof err);
    CHECK_INT(rc, ==, -ENOSPC);
    CHECK_CONTAINS(err, "cannot reserve");
    CHECK_CONTAINS(err, name_b);
    CHECK(b == NULL);
    CHECK_INT(shm_open(name_b, O_RDONLY, 0), <, 0);   /* nothing left behind */
    memset(ring_base(a), 0x5a, ring_map_size(a));       /* every page is backed */
    ring_detach(a);
    CHECK_OK(ring_unlink(g_name));
    return 0;
}

static void test_full_shm(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(full_shm_child());
    int status;
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFEXITED(status));
    if (WEXITSTATUS(status) == 0)
        return;
    CHECK_INT(WEXITSTATUS(status), ==, 77);
    /* No mount namespace here: ask for more than the whole /dev/shm instead. */
    struct statvfs vfs;
    CHECK_OK(statvfs("/dev/shm", &vfs));
    uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
    struct ring_layout l = small_layout(64);
    l.hidden = 8192;
    l.n_layers = 4;                                   /* 64 KiB rows */
    l.max_tokens = (uint32_t)(total / 64 / 65536 + 1024);
    struct ring *r = NULL;
    int rc = ring_create(&r, g_name, &l, NULL, err, sizeof err);
    CHECK_INT(rc, ==, -ENOSPC);
    CHECK_CONTAINS(err, "cannot reserve");
    CHECK_INT(shm_open(g_name, O_RDONLY, 0), <, 0);
    fprintf(stderr, "note: full-/dev/shm case ran without a private tmpfs (no mount namespace)\n");
}

static void fill_payload(struct ring *r, unsigned s, uint64_t batch, uint32_t ntok)
{
    struct ring_payload *p = ring_slot_header(r, s);
    p->batch_id = batch;
    p->epoch = 1;
    p->n_seqs = 1;
    p->n_tokens = ntok;
    ring_slot_cu_seqlens(r, s)[0] = 0;
    ring_slot_cu_seqlens(r, s)[1] = (int32_t)ntok;
}

/* ring_same_object: the creator's and an attacher's handle name the object; a ring made anew
 * under the same name (the old one removed) is another; none at all is not it either. */
static void test_same_object(void)
{
    struct ring_layout l = small_layout(4);
    struct ring *r = NULL, *a = NULL, *again = NULL;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    CHECK_OK(ring_attach(&a, g_name, &l, 0, err, sizeof err));
    CHECK_INT(ring_same_object(r, g_name), ==, 1);
    CHECK_INT(ring_same_object(a, g_name), ==, 1);
    CHECK_OK(ring_unlink(g_name));
    CHECK_INT(ring_same_object(a, g_name), ==, 0);
    CHECK_OK(ring_create(&again, g_name, &l, NULL, err, sizeof err));
    CHECK_INT(ring_same_object(a, g_name), ==, 0);
    CHECK_INT(ring_same_object(again, g_name), ==, 1);
    ring_detach(a);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
    /* A FIFO put under the name (/dev/shm is writable by every user): not the ring, told at once
     * (a read-only open of a FIFO waits for a writer: the coordinator's loop would hang). */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/dev/shm%s", g_name);
    CHECK_OK(mkfifo(path, 0600));
    CHECK_INT(ring_same_object(again, g_name), ==, 0);
    CHECK_INT(ring_attach(&a, g_name, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err), ==, -EINVAL);
    CHECK_CONTAINS(err, "not a dflash ring (a FIFO");
    CHECK_INT(ring_attach(&a, g_name, &l, 0, err, sizeof err), ==, -EINVAL);
    CHECK_OK(unlink(path));
    /* A link put there (another user's, to anything): not the ring either (the coordinator ran on
     * for ever on the one removed, every daemon started since failing to attach) */
    CHECK_OK(symlink("/dev/null", path));
    CHECK_INT(ring_same_object(again, g_name), ==, 0);
    CHECK_OK(unlink(path));
    ring_detach(again);
}

/* The object cut short in place (truncate(1) on /dev/shm) under a handle: ring_same_object says
 * it is not the object mapped any more (the coordinator exits to make it anew), and a process
 * that touches a page gone dies of SIGBUS with one line naming the ring. */
static void test_shrunk(void)
{
    struct ring_layout l = small_layout(4);
    struct ring *r = NULL;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    CHECK_INT(ring_same_object(r, g_name), ==, 1);
    int fd = shm_open(g_name, O_RDWR, 0);
    CHECK(fd >= 0);
    CHECK_OK(ftruncate(fd, 4096));
    close(fd);
    CHECK_INT(ring_same_object(r, g_name), ==, 0);

    int pfd[2];
    CHECK_OK(pipe(pfd));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], STDERR_FILENO);
        daemon_bus_report_init("test-ring");
        volatile unsigned char *last = ring_slot_hidden(r, l.nslots - 1);
        unsigned char v = *last;        /* past the object's end: SIGBUS */
        _exit(v == 0xa5 ? 3 : 2);
    }
    close(pfd[1]);
    char out[1024];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof out - 1 && (k = read(pfd[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(pfd[0]);
    int status = 0;
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFSIGNALED(status));
    CHECK_INT(WTERMSIG(status), ==, SIGBUS);
    char want[256];
    snprintf(want, sizeof want, "test-ring: SIGBUS: ring %s shrank under this process", g_name);
    CHECK_CONTAINS(out, want);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
}

static void test_transitions(void)
{
    struct ring_layout l = small_layout(4);
    struct ring *r = NULL;
    unsigned s, got[4];
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    struct ring_stats st;
    struct ring_slot_stat ss[4];

    /* payload geometry: aligned tensor areas, no overlap between slots or fields */
    CHECK_INT(ring_hidden_pitch(r), ==, 2 * 16 * 3);
    for (unsigned i = 0; i < 4; i++) {
        CHECK_INT((uintptr_t)ring_slot_hidden(r, i) % RING_ALIGN, ==, 0);
        CHECK((unsigned char *)ring_slot_loss_mask(r, i) + l.max_tokens <= (unsigned char *)ring_slot_hidden(r, i));
        CHECK((unsigned char *)ring_slot_cu_seqlens(r, i) + 4 * (l.max_seqs + 1) <= (unsigned char *)ring_slot_tokens(r, i));
        CHECK((unsigned char *)ring_slot_tokens(r, i) + 4 * l.max_tokens <= (unsigned char *)ring_slot_loss_mask(r, i));
        if (i + 1 < 4)
            CHECK((unsigned char *)ring_slot_hidden(r, i) + ring_hidden_bytes(r) <= (unsigned char *)ring_slot_header(r, i + 1));
    }
    CHECK((unsigned char *)ring_slot_hidden(r, 3) + ring_hidden_bytes(r) <= (unsigned char *)ring_base(r) + ring_map_size(r));

    for (int i = 0; i < 4; i++)
        CHECK_OK(ring_claim_write(r, 0, &got[i]));
    CHECK_INT(ring_claim_write(r, 0, &s), ==, -DF_ETIMEOUT);
    uint64_t t0 = mono_ns();
    CHECK_INT(ring_claim_write(r, 60, &s), ==, -DF_ETIMEOUT);
    CHECK_INT(mono_ns() - t0, >=, 60000000);
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.count[RING_WRITING], ==, 4);
    CHECK_INT(ss[got[0]].pid, ==, getpid());
    CHECK_INT(ss[got[0]].owner, ==, ring_owner(r));

    /* publish in order got[2], got[0], got[3]; abort got[1] */
    fill_payload(r, got[2], 100, 10);
    CHECK_OK(ring_publish(r, got[2]));
    CHECK_INT(ring_publish(r, got[2]), ==, -DF_ESTATE);   /* not WRITING any more */
    fill_payload(r, got[0], 101, 11);
    CHECK_OK(ring_publish(r, got[0]));
    fill_payload(r, got[3], 102, l.max_tokens + 1);
    CHECK_INT(ring_publish(r, got[3]), ==, -DF_ERANGE);
    fill_payload(r, got[3], 102, 12);
    CHECK_OK(ring_publish(r, got[3]));
    CHECK_OK(ring_abort_write(r, got[1]));
    CHECK_INT(ring_abort_write(r, got[1]), ==, -DF_ESTATE);
    CHECK_INT(ring_slot_header(r, got[0])->producer, ==, ring_owner(r));

    /* oldest first: 100, 101, 102 */
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 100);
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.count[RING_READING], ==, 1);
    CHECK_INT(ss[s].batch_id, ==, 100);
    CHECK_INT(ss[s].n_tokens, ==, 10);
    CHECK_INT(ss[s].pid, ==, getpid());
    /* give it back: it keeps its place in the order */
    CHECK_OK(ring_requeue(r, s));
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 100);
    CHECK_OK(ring_release(r, s));
    CHECK_INT(ring_release(r, s), ==, -DF_ESTATE);
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 101);
    unsigned held = s;

    /* reclaim by owner: READING -> READY (same seq), WRITING -> FREE */
    unsigned w;
    CHECK_OK(ring_claim_write(r, 0, &w));
    struct ring_reclaim rc;
    CHECK_OK(ring_reclaim_owner(r, ring_owner(r), &rc));
    CHECK_INT(rc.writing_freed, ==, 1);
    CHECK_INT(rc.reading_requeued, ==, 1);
    CHECK_INT(ring_release(r, held), ==, -DF_ESTATE);   /* the old reader learns it lost it */
    CHECK_INT(ring_publish(r, w), ==, -DF_ESTATE);      /* a reclaimed write is never delivered */
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 101);
    CHECK_OK(ring_release(r, s));
    /* a live owner is not reclaimed by the dead scan */
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.reading_requeued + rc.writing_freed, ==, 0);
    CHECK_OK(ring_release(r, s));
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.count[RING_FREE], ==, 4);
    CHECK_INT(st.published, ==, 3);
    CHECK_INT(st.consumed, ==, 3);
    CHECK_INT(st.aborted, ==, 1);
    CHECK_INT(st.reclaimed_writing, ==, 1);
    CHECK_INT(st.reclaimed_reading, ==, 1);
    CHECK_INT(ring_claim_read(r, NULL, 0, &s), ==, -DF_ETIMEOUT);

    /* retract: READY -> FREE, only with the batch it was published with, never once taken */
    CHECK_OK(ring_claim_write(r, 0, &w));
    fill_payload(r, w, 300, 5);
    ring_slot_header(r, w)->lease = 2;
    CHECK_OK(ring_publish(r, w));
    CHECK_INT(ring_retract(r, w, 301, 0), ==, -DF_ESTATE);
    CHECK_INT(ring_retract(r, w, 300, 2), ==, -DF_ESTATE);      /* the copy to keep */
    CHECK_OK(ring_retract(r, w, 300, 3));
    CHECK_INT(ring_retract(r, w, 300, 0), ==, -DF_ESTATE);
    CHECK_INT(ring_claim_read(r, NULL, 0, &s), ==, -DF_ETIMEOUT);  /* never delivered */
    CHECK_OK(ring_claim_write(r, 0, &w));
    fill_payload(r, w, 302, 5);
    CHECK_OK(ring_publish(r, w));
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(ring_retract(r, s, 302, 0), ==, -DF_ESTATE);     /* a reader has it */
    CHECK_OK(ring_release(r, s));
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.retracted, ==, 1);
    CHECK_INT(st.count[RING_FREE], ==, 4);

    /* a lease-form owner is reclaimed explicitly and skipped by the dead scan */
    uint64_t lease = proc_token_lease(42), self = ring_owner(r);
    CHECK_OK(ring_set_owner(r, lease));
    CHECK_OK(ring_claim_write(r, 0, &w));
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(ss[w].owner, ==, lease);
    CHECK_INT(ss[w].pid, ==, 0);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.writing_freed, ==, 0);
    CHECK_OK(ring_reclaim_owner(r, self, &rc));
    CHECK_INT(rc.writing_freed, ==, 0);
    CHECK_OK(ring_reclaim_owner(r, lease, &rc));
    CHECK_INT(rc.writing_freed, ==, 1);
    CHECK_INT(ring_set_owner(r, 0), ==, -EINVAL);
    CHECK_OK(ring_set_owner(r, self));
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
}

/* Publish n slots with batch ids base.. */
static void publish_n(struct ring *r, int n, uint64_t base)
{
    for (int i = 0; i < n; i++) {
        unsigned s;
        CHECK_OK(ring_claim_write(r, 0, &s));
        fill_payload(r, s, base + (uint64_t)i, 1);
        CHECK_OK(ring_publish(r, s));
    }
}

static void test_pick(void)
{
    struct ring_layout l = small_layout(8);
    struct ring *r = NULL;
    unsigned s;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));

    /* random: with 4 READY and min_ready 4 it picks at once, and every slot gets picked */
    struct ring_pick rnd = { .policy = RING_PICK_RANDOM, .min_ready = 4, .ready_timeout_ms = 5000 };
    int seen[4] = { 0 };
    publish_n(r, 4, 0);
    for (int it = 0; it < 400; it++) {
        uint64_t t0 = mono_ns();
        CHECK_OK(ring_claim_read(r, &rnd, 1000, &s));
        CHECK_INT(mono_ns() - t0, <, 1000000000ull);
        uint64_t b = ring_slot_header(r, s)->batch_id;
        CHECK_INT(b, <, 4);
        seen[b]++;
        CHECK_OK(ring_requeue(r, s));
    }
    for (int i = 0; i < 4; i++)
        CHECK_INT(seen[i], >, 40);
    /* drain */
    for (int i = 0; i < 4; i++) {
        CHECK_OK(ring_claim_read(r, NULL, 0, &s));
        CHECK_OK(ring_release(r, s));
    }

    /* fewer than min_ready: waits ready_timeout_ms, then takes what there is */
    struct ring_pick mix = { .policy = RING_PICK_OLDEST, .min_ready = 3, .ready_timeout_ms = 80 };
    publish_n(r, 2, 10);
    uint64_t t0 = mono_ns();
    CHECK_OK(ring_claim_read(r, &mix, 2000, &s));
    uint64_t waited = mono_ns() - t0;
    CHECK_INT(waited, >=, 80000000ull);
    CHECK_INT(waited, <, 1500000000ull);
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 10);
    CHECK_OK(ring_release(r, s));
    /* overall timeout shorter than the mixing timeout: still takes what there is at the end */
    mix.ready_timeout_ms = 10000;
    t0 = mono_ns();
    CHECK_OK(ring_claim_read(r, &mix, 50, &s));
    CHECK_INT(mono_ns() - t0, >=, 50000000ull);
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 11);
    CHECK_OK(ring_release(r, s));
    /* a wait spanning calls (since_ns, a daemon's short slices): a call that times out takes nothing
     * below min_ready, not even a poll; once the ready timeout has passed since since_ns, it takes */
    publish_n(r, 1, 12);
    mix.ready_timeout_ms = 300 * test_time_scale();     /* the first two calls end before it */
    mix.since_ns = mono_ns();
    CHECK_INT(ring_claim_read(r, &mix, 50, &s), ==, -DF_ETIMEOUT);
    CHECK_INT(ring_claim_read(r, &mix, 0, &s), ==, -DF_ETIMEOUT);
    t0 = mono_ns();
    int tries = 0, got;
    while ((got = ring_claim_read(r, &mix, 50, &s)) == -DF_ETIMEOUT && tries++ < 100 * test_time_scale())
        ;
    CHECK_OK(got);
    CHECK_INT(mono_ns() - mix.since_ns, >=, (uint64_t)mix.ready_timeout_ms * 1000000ull);
    CHECK_INT(mono_ns() - mix.since_ns, <, 2000000000ull * (uint64_t)test_time_scale());
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 12);
    CHECK_OK(ring_release(r, s));
    mix.since_ns = 0;
    /* empty ring: a plain timeout */
    t0 = mono_ns();
    CHECK_INT(ring_claim_read(r, &mix, 40, &s), ==, -DF_ETIMEOUT);
    CHECK_INT(mono_ns() - t0, >=, 40000000ull);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
}

/* Block in another process; wake it by a transition. Readiness = its waiter count. */
static void wait_for_waiters(struct ring *r, int readers, int writers)
{
    struct ring_stats st;
    for (int i = 0; i < 20000; i++) {
        CHECK_OK(ring_stats(r, &st, NULL));
        if ((int)st.readers_waiting >= readers && (int)st.writers_waiting >= writers)
            return;
        usleep(500);
    }
    TEST_FAIL("no process parked in the ring");
}

static void test_blocking(void)
{
    struct ring_layout l = small_layout(2);
    struct ring *r = NULL;
    unsigned s;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));

    /* empty ring parks a reader until a publish */
    pid_t pid = fork();
    if (pid == 0) {
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0 || ring_claim_read(c, NULL, 120000, &cs) < 0)
            _exit(1);
        uint64_t b = ring_slot_header(c, cs)->batch_id;
        _exit(ring_release(c, cs) == 0 && b == 77 ? 0 : 2);
    }
    wait_for_waiters(r, 1, 0);
    uint64_t t0 = mono_ns();
    publish_n(r, 1, 77);
    int status;
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_INT(mono_ns() - t0, <, 60000000000ull);  /* woken by the publish, not its 120 s timeout */

    /* full ring back-pressures a writer until a release */
    publish_n(r, 2, 1);
    pid = fork();
    if (pid == 0) {
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0 || ring_claim_write(c, 120000, &cs) < 0)
            _exit(1);
        fill_payload(c, cs, 5, 1);
        _exit(ring_publish(c, cs) == 0 ? 0 : 2);
    }
    wait_for_waiters(r, 0, 1);
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    t0 = mono_ns();
    CHECK_OK(ring_release(r, s));
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_INT(mono_ns() - t0, <, 60000000000ull);  /* woken by the release */

    /* a reader killed while READING: the dead scan puts its slot back, same seq */
    pid = fork();
    if (pid == 0) {
        setenv("DFLASH_RING_STOP_AT", "claimed_read", 1);
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0)
            _exit(1);
        ring_claim_read(c, NULL, 20000, &cs);   /* stops itself holding the slot */
        _exit(3);
    }
    CHECK_INT(waitpid(pid, &status, WUNTRACED), ==, pid);
    CHECK(WIFSTOPPED(status));
    struct ring_stats st;
    struct ring_slot_stat ss[2];
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.count[RING_READING], ==, 1);
    unsigned victim = ss[0].state == RING_READING ? 0 : 1;
    CHECK_INT(ss[victim].pid, ==, pid);
    CHECK_INT(ss[victim].batch_id, ==, 2);   /* oldest of {2, 5} */
    struct ring_reclaim rc;
    CHECK_OK(ring_reclaim_dead(r, &rc));     /* stopped is alive: nothing taken */
    CHECK_INT(rc.reading_requeued, ==, 0);
    kill(pid, SIGKILL);
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.reading_requeued, ==, 1);
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_INT(s, ==, victim);
    CHECK_INT(ring_slot_header(r, s)->batch_id, ==, 2);
    CHECK_OK(ring_release(r, s));
    CHECK_OK(ring_claim_read(r, NULL, 0, &s));
    CHECK_OK(ring_release(r, s));

    /* a writer stuck WRITING with a live owner is reported, not stolen */
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
    CHECK_OK(ring_create(&r, g_name, &l, &(struct ring_create_opts){ .gid = -1, .stuck_writing_ms = 30 }, err, sizeof err));
    pid = fork();
    if (pid == 0) {
        setenv("DFLASH_RING_STOP_AT", "claimed_write", 1);
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0)
            _exit(1);
        ring_claim_write(c, 0, &cs);
        _exit(3);
    }
    CHECK_INT(waitpid(pid, &status, WUNTRACED), ==, pid);
    CHECK(WIFSTOPPED(status));
    t0 = mono_ns();
    while (mono_ns() - t0 < 40000000ull)
        usleep(5000);   /* age the slot past stuck_writing_ms (a duration, not a synchronisation) */
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.writing_freed, ==, 0);
    CHECK_INT(rc.stuck_writing, ==, 1);
    CHECK_OK(ring_stats(r, &st, ss));
    CHECK_INT(st.stuck_writing, ==, 1);
    kill(pid, SIGKILL);
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.writing_freed, ==, 1);
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.count[RING_FREE], ==, 2);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
}

/* A process SIGKILLed while parked: its waiter registration stays until the dead scan forgets
 * it; the scan leaves a live parked process's alone, which a publish then still wakes. */
static pid_t park_reader(const struct ring_layout *l)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, l, 0, err, sizeof err) < 0 || ring_claim_read(c, NULL, 120000, &cs) < 0)
            _exit(1);
        _exit(ring_release(c, cs) == 0 && ring_slot_header(c, cs)->batch_id == 9 ? 0 : 2);
    }
    CHECK(pid > 0);
    return pid;
}

static void *claim_forever(void *arg)
{
    unsigned cs;
    ring_claim_read(arg, NULL, 120000, &cs);
    return NULL;
}

/* More readers parked than the waiter table has entries, their process killed: the reclaim
 * leaves no count behind (those beyond the table were counted apart and never uncounted: every
 * later publish and release made a futex syscall for sleepers that were gone). */
static void test_parked_beyond_table_killed(void)
{
    struct ring_layout l = small_layout(2);
    struct ring *r = NULL;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    pid_t many = fork();
    if (many == 0) {
        struct ring *c = NULL;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0)
            _exit(1);
        pthread_t t;
        for (int i = 0; i < 70; i++)
            if (pthread_create(&t, NULL, claim_forever, c) != 0)
                _exit(2);
        for (;;)
            pause();
    }
    CHECK(many > 0);
    wait_for_waiters(r, 64, 0);
    usleep(200000);             /* (the last six park beyond the table) */
    kill(many, SIGKILL);
    int status;
    CHECK_INT(waitpid(many, &status, 0), ==, many);
    struct ring_reclaim rc;
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 64);
    struct ring_stats st;
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.readers_waiting, ==, 0);
    ring_detach(r);
    ring_unlink(g_name);
}

static void test_parked_killed(void)
{
    struct ring_layout l = small_layout(2);
    struct ring *r = NULL;
    CHECK_OK(ring_create(&r, g_name, &l, NULL, err, sizeof err));
    pid_t doomed = park_reader(&l);
    wait_for_waiters(r, 1, 0);
    pid_t live = park_reader(&l);
    wait_for_waiters(r, 2, 0);
    kill(doomed, SIGKILL);
    int status;
    CHECK_INT(waitpid(doomed, &status, 0), ==, doomed);
    struct ring_stats st;
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.readers_waiting, ==, 2);   /* the dead one still registered */
    struct ring_reclaim rc;
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 1);
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.readers_waiting, ==, 1);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 0);

    /* A reclaimer killed half-way leaves its mark (bit 63 | its token) on the entry: a live one's
     * is left alone, a dead one's is taken over and the entry freed. */
    pid_t half = park_reader(&l);
    wait_for_waiters(r, 2, 0);
    uint64_t ticks, half_tok, me;
    CHECK_OK(proc_start_time(half, &ticks));
    half_tok = proc_token_make(half, ticks);
    CHECK_OK(proc_self_token(&me));
    int entry = word_of(half_tok);
    CHECK(entry > 0);
    kill(half, SIGKILL);
    CHECK_INT(waitpid(half, &status, 0), ==, half);
    uint64_t live_mark = (1ull << 63) | me, dead_mark = (1ull << 63) | half_tok;
    poke(g_name, entry * 8, &live_mark, 8);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 0);
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.readers_waiting, ==, 2);
    poke(g_name, entry * 8, &dead_mark, 8);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 1);
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.readers_waiting, ==, 1);
    /* Woken by the publish, not by its own timeout (120 s) and a last look: */
    uint64_t t0 = mono_ns();
    publish_n(r, 1, 9);
    CHECK_INT(waitpid(live, &status, 0), ==, live);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_INT(mono_ns() - t0, <, 60000000000ull);

    /* a writer on a full ring, likewise */
    publish_n(r, 2, 1);
    pid_t w = fork();
    if (w == 0) {
        struct ring *c = NULL;
        unsigned cs;
        if (ring_attach(&c, g_name, &l, 0, err, sizeof err) < 0)
            _exit(1);
        ring_claim_write(c, 30000, &cs);
        _exit(2);
    }
    wait_for_waiters(r, 0, 1);
    kill(w, SIGKILL);
    CHECK_INT(waitpid(w, &status, 0), ==, w);
    CHECK_OK(ring_reclaim_dead(r, &rc));
    CHECK_INT(rc.waiters_cleared, ==, 1);
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.writers_waiting, ==, 0);
    CHECK_INT(st.readers_waiting, ==, 0);
    ring_detach(r);
    CHECK_OK(ring_unlink(g_name));
}

/* A failing CHECK exits: leave nothing behind in /dev/shm (children _exit, skipping this). */
static void cleanup_shm(void)
{
    ring_unlink(g_name);
}

int main(void)
{
    snprintf(g_name, sizeof g_name, "/dflash-test-ring-%d", (int)getpid());
    atexit(cleanup_shm);
    ring_unlink(g_name);
    test_proc_tokens();
    test_validation();
    test_being_made();
    test_full_shm();
    test_same_object();
    test_shrunk();
    test_transitions();
    test_pick();
    test_blocking();
    test_parked_killed();
    test_parked_beyond_table_killed();
    fprintf(stderr, "ok\n");
    return 0;
}
