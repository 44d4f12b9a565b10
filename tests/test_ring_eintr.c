/* test_ring_eintr.c: a signal during the page reservation of the ring or of a drafter group's
 * collective (posix_fallocate's EINTR, which tmpfs gives for a large reservation when a signal is
 * pending: a stop during a start) is retried, not a failed start. posix_fallocate is interposed
 * here: its first calls say EINTR, as the kernel would. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ipc/collective.h"
#include "ipc/ring.h"
#include "tests/test.h"

static int g_interrupts;    /* calls still to cut short */
static int g_calls;

int posix_fallocate(int fd, off_t offset, off_t len)
{
    g_calls++;
    if (g_interrupts > 0) {
        g_interrupts--;
        return EINTR;
    }
    int (*real)(int, off_t, off_t) = (int (*)(int, off_t, off_t))dlsym(RTLD_NEXT, "posix_fallocate");
    return real(fd, offset, len);
}

int main(void)
{
    char name[64], err[512];
    snprintf(name, sizeof name, "/dflash-test-eintr-%d", (int)getpid());
    struct ring_layout l = { .nslots = 2, .hidden = 8, .n_layers = 1, .dtype = RING_DTYPE_BF16,
                             .max_tokens = 16, .max_seqs = 2 };
    struct ring *r = NULL;
    g_interrupts = 2;
    int rc = ring_create(&r, name, &l, NULL, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "ring_create: %s\n", err);
    CHECK_OK(rc);
    CHECK_INT(g_calls, ==, 3);
    ring_detach(r);
    CHECK_OK(ring_unlink(name));

    snprintf(name, sizeof name, "/dflash-test-eintr-%d-coll", (int)getpid());
    struct coll *c = NULL;
    struct coll_opts o = { .generation = 1, .chunk_floats = 1024 };
    g_interrupts = 2;
    g_calls = 0;
    rc = coll_open(&c, name, 0, 1, 5000, &o, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "coll_open: %s\n", err);
    CHECK_OK(rc);
    CHECK_INT(g_calls, ==, 3);
    coll_close(c);
    shm_unlink(name);
    return 0;
}
