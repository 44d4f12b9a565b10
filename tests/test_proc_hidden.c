/* test_proc_hidden.c: a live process whose /proc entry is hidden (/proc mounted hidepid=2, the
 * caller another user without CAP_SYS_PTRACE) is not taken for dead: its liveness is unknown
 * (-EACCES), which every caller treats as alive, so its ring slots are never reclaimed in use.
 * Needs root to make a mount namespace and drop to another user; skips (77) without. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/proc.h"
#include "tests/test.h"

int main(void)
{
    pid_t parent = getpid();
    uint64_t ticks, token;
    CHECK_OK(proc_self_token(&token));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("proc", "/proc", "proc", 0, "hidepid=2") < 0)
            _exit(77);
        if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
            _exit(77);
        int r = proc_start_time(parent, &ticks);
        if (r != -EACCES) {
            fprintf(stderr, "proc_start_time of a hidden live process: %d, wanted -EACCES\n", r);
            _exit(1);
        }
        if (proc_token_alive(token) >= 0) {
            fprintf(stderr, "proc_token_alive of a hidden live process: %d, wanted < 0 (unknown)\n",
                    proc_token_alive(token));
            _exit(1);
        }
        /* a process that is gone is still gone */
        pid_t gone = fork();
        if (gone == 0)
            _exit(0);
        waitpid(gone, NULL, 0);
        r = proc_start_time(gone, &ticks);
        if (r != -ESRCH) {
            fprintf(stderr, "proc_start_time of a reaped process: %d, wanted -ESRCH\n", r);
            _exit(1);
        }
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        SKIP("cannot mount a hidepid /proc in a mount namespace and drop to another user here");
    CHECK_INT(WEXITSTATUS(st), ==, 0);
    return 0;
}
