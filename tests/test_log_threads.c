/* test_log_threads.c: common/log's memory of the last error line (what a failing daemon sends
 * the coordinator as its exit reason): only error-level lines, without the prefix, with the
 * code's text, cut to its buffer, and whole when several threads log errors at once. */
#include <errno.h>
#include <pthread.h>
#include "common/log.h"
#include "tests/test.h"

static void *log_errors(void *arg)
{
    for (int i = 0; i < 500; i++)
        log_error(0, "thread %c: error %d", *(const char *)arg, i);
    return NULL;
}

int main(void)
{
    char last[128];
    log_init("test-log", LOG_LVL_INFO);
    log_last_error(last, sizeof last);
    CHECK_STR(last, "");

    log_warn(-EIO, "a warning is not an error");
    log_notice("nor is a notice");
    log_last_error(last, sizeof last);
    CHECK_STR(last, "");

    log_error(0, "GPU %d: invalid device ordinal", 3);
    log_notice("a notice after it");
    log_last_error(last, sizeof last);
    CHECK_STR(last, "GPU 3: invalid device ordinal");

    log_error(-ENOENT, "opening %s", "/nonexistent");
    log_last_error(last, sizeof last);
    CHECK_CONTAINS(last, "opening /nonexistent: ");
    CHECK(strlen(last) > strlen("opening /nonexistent: "));

    /* a message that ends with the code's text already does not get it twice */
    log_error(-ENOENT, "opening %s: %s", "/nonexistent", strerror(ENOENT));
    log_last_error(last, sizeof last);
    CHECK_STR(last, "opening /nonexistent: No such file or directory");

    char small[8];
    log_last_error(small, sizeof small);
    CHECK_STR(small, "opening");

    char big[1500];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    log_error(0, "%s", big);
    char whole[600];
    log_last_error(whole, sizeof whole);
    CHECK(strlen(whole) >= 500 && strspn(whole, "x") == strlen(whole));

    pthread_t t[2];
    CHECK(pthread_create(&t[0], NULL, log_errors, "a") == 0);
    CHECK(pthread_create(&t[1], NULL, log_errors, "b") == 0);
    for (int i = 0; i < 2000; i++) {
        log_last_error(last, sizeof last);
        char who, again[128];
        int n;
        if (strspn(last, "x") == strlen(last))
            continue;                   /* none of theirs yet */
        CHECK(sscanf(last, "thread %c: error %d", &who, &n) == 2);
        snprintf(again, sizeof again, "thread %c: error %d", who, n);
        CHECK_STR(last, again);         /* one line, not two torn together */
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    log_last_error(last, sizeof last);
    CHECK(!strcmp(last, "thread a: error 499") || !strcmp(last, "thread b: error 499"));
    printf("ok: the last error line, whole, from any thread\n");
    return 0;
}
