/* test_ring_mode.c: the ring's shm object is the coordinator's user's alone without cluster.group
 * ("empty = owner only": the coordinator's primary group, which may be every user's, gets nothing),
 * and that group's (mode 0660) with it. */
#include <grp.h>
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* Mode and group of the ring of a coordinator started on the config as tc_setup wrote it. */
static void ring_mode(struct stat *st)
{
    tc_start_coord();
    char path[200];
    snprintf(path, sizeof path, "/dev/shm%s", TC.ring);
    CHECK_OK(stat(path, st));
    fprintf(stderr, "ring %s: mode %04o, gid %u\n", TC.ring, (unsigned)(st->st_mode & 07777), (unsigned)st->st_gid);
    tc_kill(TC.coord);
    TC.coord = 0;
    CHECK_OK(ring_unlink(TC.ring));
    unlink(TC.ledger);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    struct stat st;
    ring_mode(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0600);
    CHECK_INT(st.st_uid, ==, geteuid());

    /* a group this user is in: its primary one */
    struct group *g = getgrgid(getegid());
    if (!g)
        SKIP("the primary group %u has no name", (unsigned)getegid());
    char extra[200];
    snprintf(extra, sizeof extra, "group = %s\n", g->gr_name);
    tc_setup(extra, NULL);
    ring_mode(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0660);
    CHECK_INT(st.st_gid, ==, getegid());
    return 0;
}
