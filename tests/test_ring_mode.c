/* test_ring_mode.c: the ring's shm object is the coordinator's user's alone without cluster.group
 * ("empty = owner only": the coordinator's primary group, which may be every user's, gets nothing),
 * and that group's (mode 0660) with it; a ring re-attached by a coordinator restarted with another
 * cluster.group is given the new one's access. */
#include <grp.h>
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* Start the coordinator on the config as tc_setup wrote it, and SIGKILL it (the ring stays)
 * once *st is the ring's. */
static void ring_stat(struct stat *st)
{
    tc_start_coord();
    char path[200];
    snprintf(path, sizeof path, "/dev/shm%s", TC.ring);
    CHECK_OK(stat(path, st));
    fprintf(stderr, "ring %s: mode %04o, gid %u\n", TC.ring, (unsigned)(st->st_mode & 07777), (unsigned)st->st_gid);
    tc_kill(TC.coord);
    TC.coord = 0;
}

/* A group the coordinator may give the ring to, other than its primary one where it can. */
static struct group *some_group(void)
{
    gid_t gs[64];
    int n = getgroups(64, gs);
    for (int i = 0; i < n; i++)
        if (gs[i] != getegid() && getgrgid(gs[i]))
            return getgrgid(gs[i]);
    struct group *g = geteuid() == 0 ? getgrnam("nogroup") : NULL;
    return g ? g : getgrgid(getegid());
}

int main(void)
{
    atexit(cleanup);
    struct group *g = some_group();
    if (!g)
        SKIP("no group to give the ring to");
    gid_t gid = g->gr_gid;
    char with_group[200];
    snprintf(with_group, sizeof with_group, "group = %s\n", g->gr_name);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    struct stat st;

    /* made without a group */
    ring_stat(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0600);
    CHECK_INT(st.st_uid, ==, geteuid());
    /* re-attached after a crash by a coordinator whose cluster.group changed meanwhile */
    tc_setup(with_group, NULL);
    ring_stat(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0660);
    CHECK_INT(st.st_gid, ==, gid);
    tc_setup(NULL, NULL);
    ring_stat(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0600);
    /* made with a group */
    CHECK_OK(ring_unlink(TC.ring));
    tc_setup(with_group, NULL);
    ring_stat(&st);
    CHECK_INT(st.st_mode & 07777, ==, 0660);
    CHECK_INT(st.st_gid, ==, gid);
    return 0;
}
