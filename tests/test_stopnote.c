/* test_stopnote.c: the coordinator's stop note (ipc/stopnote.h): written whole, read back as its
 * first line, cleared; what is not a file in its place (a folder, a FIFO) is no note, read at
 * once, not the "stopped" every daemon would leave on. */
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ipc/stopnote.h"
#include "tests/test.h"

int main(void)
{
    char dir[] = "/tmp/dflash-stopnote.XXXXXX";
    CHECK(mkdtemp(dir));
    char sock[256], note[300], why[256];
    snprintf(sock, sizeof sock, "%s/c.sock", dir);
    snprintf(note, sizeof note, "%s.stopped", sock);

    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 0);
    CHECK_OK(stop_note_write(sock, "the run is complete", (gid_t)-1));
    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 1);
    CHECK_STR(why, "the run is complete");
    CHECK_OK(stop_note_write(sock, "", (gid_t)-1));             /* no reason: "stopped" */
    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 1);
    CHECK_STR(why, "stopped");
    stop_note_clear(sock);
    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 0);

    CHECK_OK(mkdir(note, 0755));                                /* a folder: no note */
    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 0);
    CHECK_OK(rmdir(note));
    CHECK_OK(mkfifo(note, 0644));                               /* a FIFO: no note, and no wait */
    alarm(10);
    CHECK_INT(stop_note_read(sock, why, sizeof why), ==, 0);
    alarm(0);
    CHECK_OK(unlink(note));
    CHECK_OK(rmdir(dir));
    puts("ok");
    return 0;
}
