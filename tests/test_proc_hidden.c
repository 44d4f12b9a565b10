/* test_proc_hidden.c: a process whose /proc entry is hidden (/proc mounted hidepid=2, the caller
 * another user without CAP_SYS_PTRACE) is told apart (-EPERM: the coordinator refuses such a
 * daemon at HELLO). So no member of a cluster is one, and a pid-form token whose pid now names
 * one is of a process gone (the owner died, another user's process took its pid): dead, its
 * slots reclaimed (they were held for as long as that unrelated process lived). Needs root to
 * make a mount namespace and drop to another user; skips (77) without. */
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
        if (r != -EPERM) {
            fprintf(stderr, "proc_start_time of another user's hidden process: %d, wanted -EPERM\n", r);
            _exit(1);
        }
        if (proc_token_alive(token) != 0) {
            fprintf(stderr, "proc_token_alive at another user's hidden process: %d, wanted 0 (no member)\n",
                    proc_token_alive(token));
            _exit(1);
        }
        /* one's own processes are still seen (the cluster's daemons run as one user) */
        uint64_t self;
        if (proc_self_token(&self) < 0 || proc_token_alive(self) != 1) {
            fprintf(stderr, "proc_token_alive of itself under hidepid: not alive\n");
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
