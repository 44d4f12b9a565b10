/* test_ring_create_mode.c: a ring made for cluster.group (mode 0660) is never open to the
 * coordinator's primary group, not even for a moment: the object is made 0600, given to the
 * group, and only then given the group's bits (an fd opened in between would keep its access).
 * shm_open, fchown and fchmod are interposed here to see the order. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ipc/ring.h"
#include "tests/test.h"

static int g_fd = -1;           /* the object's fd, as shm_open made it */
static mode_t g_create_mode;
static int g_chowned;           /* fchown of g_fd done */
static int g_early_chmod;       /* fchmod of g_fd granting group or other bits before its fchown */

int shm_open(const char *name, int oflag, mode_t mode)
{
    int (*real)(const char *, int, mode_t) = (int (*)(const char *, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
    int fd = real(name, oflag, mode);
    if (fd >= 0 && (oflag & O_CREAT)) {
        g_fd = fd;
        g_create_mode = mode;
    }
    return fd;
}

int fchown(int fd, uid_t owner, gid_t group)
{
    int (*real)(int, uid_t, gid_t) = (int (*)(int, uid_t, gid_t))dlsym(RTLD_NEXT, "fchown");
    int r = real(fd, owner, group);
    if (fd == g_fd && r == 0)
        g_chowned = 1;
    return r;
}

int fchmod(int fd, mode_t mode)
{
    int (*real)(int, mode_t) = (int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod");
    if (fd == g_fd && (mode & 077) && !g_chowned)
        g_early_chmod = 1;
    return real(fd, mode);
}

int main(void)
{
    char name[64], err[512];
    snprintf(name, sizeof name, "/dflash-test-mode-%d", (int)getpid());
    struct ring_layout l = { .nslots = 2, .hidden = 8, .n_layers = 1, .dtype = RING_DTYPE_BF16, .max_tokens = 16,
                             .max_seqs = 2 };
    struct ring *r = NULL;
    ring_unlink(name);
    int rc = ring_create(&r, name, &l, &(struct ring_create_opts){ .mode = 0660, .gid = (int)getgid() }, err,
                         sizeof err);
    if (rc < 0)
        TEST_FAIL("ring_create: %s", err);
    CHECK(g_fd >= 0);
    if (g_create_mode & 077)
        TEST_FAIL("the object was made %04o: open to the primary group until its chown", (unsigned)g_create_mode);
    CHECK(g_chowned);
    CHECK(!g_early_chmod);
    struct stat st;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    CHECK_OK(stat(path, &st));
    CHECK_INT(st.st_mode & 0777, ==, 0660);     /* (the mode asked for, in the end) */
    CHECK_INT(st.st_gid, ==, getgid());
    ring_detach(r);
    CHECK_OK(ring_unlink(name));
    puts("ok: the ring is made 0600, given to its group, then given the group's bits");
    return 0;
}
