/* test_log_eintr.c: a log line written while stderr is full (journald slow to read, a pipe) and
 * cut into by a signal handled without SA_RESTART (the daemons' stop signals) reaches the reader
 * whole: the write is taken up again, not dropped. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include "common/log.h"
#include "common/timeutil.h"
#include "tests/test.h"

static int g_rd;
static pthread_t g_main;
static char g_got[1 << 20];
static size_t g_len;

static void on_usr1(int sig) { (void)sig; }

/* Interrupt the blocked write, then drain the pipe until the marker line's end is there. */
static void *reader(void *arg)
{
    (void)arg;
    usleep(200000);
    pthread_kill(g_main, SIGUSR1);
    usleep(200000);
    uint64_t end = mono_ms() + 10000;
    while (mono_ms() < end && !strstr(g_got, "END-OF-LINE\n")) {
        ssize_t k = read(g_rd, g_got + g_len, sizeof g_got - 1 - g_len);
        if (k > 0)
            g_len += (size_t)k;
        g_got[g_len] = 0;
        if (k <= 0)
            usleep(10000);
    }
    return NULL;
}

int main(void)
{
    int p[2];
    CHECK_OK(pipe(p));
    g_rd = p[0];
    CHECK_OK(fcntl(p[0], F_SETFL, O_NONBLOCK));
    /* stderr a full pipe: filled without blocking, then blocking again */
    CHECK_OK(fcntl(p[1], F_SETFL, O_NONBLOCK));
    char fill[4096];
    memset(fill, 'f', sizeof fill);
    while (write(p[1], fill, sizeof fill) > 0)
        ;
    CHECK_INT(errno, ==, EAGAIN);
    CHECK_OK(fcntl(p[1], F_SETFL, 0));
    int saved = dup(2);
    CHECK_OK(dup2(p[1], 2));
    struct sigaction sa = { 0 };
    sa.sa_handler = on_usr1;        /* no SA_RESTART, as daemon_signals_init */
    CHECK_OK(sigaction(SIGUSR1, &sa, NULL));
    g_main = pthread_self();
    log_init("test-log", LOG_LVL_INFO);
    char body[1500];
    memset(body, 'b', sizeof body - 1);
    body[sizeof body - 1] = 0;
    pthread_t t;
    CHECK_OK(pthread_create(&t, NULL, reader, NULL));
    log_info("MARK %s END-OF-LINE", body);
    pthread_join(t, NULL);
    dup2(saved, 2);
    const char *m = strstr(g_got, "MARK ");
    if (!m || !strstr(m, "END-OF-LINE\n"))
        TEST_FAIL("the line cut into by a signal did not come whole (%zu bytes read, marker %s)", g_len,
                  m ? "without its end" : "missing");
    CHECK_INT(strlen(m), ==, 5 + sizeof body - 1 + strlen(" END-OF-LINE\n"));
    puts("ok");
    return 0;
}
