/* test_fuzz_regress.c: replays every seed corpus file and every saved fuzz finding
 * (tests/fuzz/corpus/<target>/, tests/fuzz/regress/<target>/) through the fuzz entry points,
 * one child process per input, so a plain or sanitizer build covers them without libFuzzer. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include "tests/test.h"
#include "tests/fuzz/fuzz_ckpt.c"
#include "tests/fuzz/fuzz_config.c"
#include "tests/fuzz/fuzz_ctl.c"
#include "tests/fuzz/fuzz_dataset.c"
#include "tests/fuzz/fuzz_hfconfig.c"
#include "tests/fuzz/fuzz_proto.c"
#include "tests/fuzz/fuzz_ring.c"
#include "tests/fuzz/fuzz_safetensors.c"
#include "tests/fuzz/fuzz_st_index.c"

static const struct {
    const char *name;
    int (*fn)(const uint8_t *, size_t);
} targets[] = {
    { "ckpt", fuzz_ckpt },
    { "config", fuzz_config },
    { "ctl", fuzz_ctl },
    { "dataset", fuzz_dataset },
    { "hfconfig", fuzz_hfconfig },
    { "proto", fuzz_proto },
    { "ring", fuzz_ring },
    { "safetensors", fuzz_safetensors },
    { "st_index", fuzz_st_index },
};

static int read_all(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    for (size_t got; b && (got = fread(b + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    fclose(f);
    if (!b)
        return -1;
    *out = b;
    *len = n;
    return 0;
}

/* Run one input in a child; 0 when it returned normally. */
static int replay(int (*fn)(const uint8_t *, size_t), const char *path)
{
    uint8_t *data;
    size_t len;
    if (read_all(path, &data, &len) < 0) {
        fprintf(stderr, "%s: cannot read\n", path);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        TEST_FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        /* The exact-size copy lets ASan see a read one byte past the input. */
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, data, len);
        fn(exact, len);
        free(exact);
        free(data);
        exit(0);
    }
    free(data);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    char shm[64];
    snprintf(shm, sizeof shm, "/dflash-fuzz-ring-%d", (int)pid);
    ring_unlink(shm);   /* left behind when the child died */
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (WIFSIGNALED(st))
        fprintf(stderr, "%s: killed by signal %d (%s)\n", path, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        fprintf(stderr, "%s: exit status %d\n", path, WEXITSTATUS(st));
    return -1;
}

/* Replays every file of dir; returns files run, adds failures to *failed. */
static int replay_dir(int (*fn)(const uint8_t *, size_t), const char *dir, int *failed)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (replay(fn, path) < 0)
            (*failed)++;
        n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    int failed = 0;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        if (only && strcmp(only, targets[i].name))
            continue;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", test_srcdir(), targets[i].name);
        int seeds = replay_dir(targets[i].fn, dir, &failed);
        snprintf(dir, sizeof dir, "%s/tests/fuzz/regress/%s", test_srcdir(), targets[i].name);
        int regs = replay_dir(targets[i].fn, dir, &failed);
        printf("%-12s %4d corpus inputs, %3d regression inputs\n", targets[i].name, seeds, regs);
        /* An empty corpus would make this test pass vacuously. */
        CHECK_INT(seeds, >, 0);
    }
    CHECK_INT(failed, ==, 0);
    return 0;
}
