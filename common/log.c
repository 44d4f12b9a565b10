/* log.c: leveled logging with sd-daemon prefixes.
 * Under journald (JOURNAL_STREAM set) or a non-tty stderr lines start with "<N>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <errno.h>
#include <pthread.h>
#include "common/log.h"
#include "common/err.h"

#define LAST_ERROR_MAX 512

static const char *g_ident = "dflash";
static enum log_level g_level = LOG_LVL_INFO;
static int g_prefix = -1;
static pthread_mutex_t g_last_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last[LAST_ERROR_MAX];

void log_init(const char *ident, enum log_level level)
{
    g_ident = ident;
    g_level = level;
    g_prefix = getenv("JOURNAL_STREAM") != NULL || !isatty(STDERR_FILENO);
}

void log_set_level(enum log_level level) { g_level = level; }

int log_level_parse(const char *s, enum log_level *out)
{
    static const struct { const char *n; enum log_level l; } t[] = {
        {"error", LOG_LVL_ERR}, {"warn", LOG_LVL_WARN}, {"notice", LOG_LVL_NOTICE},
        {"info", LOG_LVL_INFO}, {"debug", LOG_LVL_DEBUG},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcasecmp(s, t[i].n)) { *out = t[i].l; return 0; }
    return -EINVAL;
}

void log_msg(enum log_level lvl, int err, const char *fmt, ...)
{
    if (lvl > g_level)
        return;
    static const char *const names[] = {
        [LOG_LVL_ERR] = "error", [LOG_LVL_WARN] = "warning", [LOG_LVL_NOTICE] = "notice",
        [LOG_LVL_INFO] = "info", [LOG_LVL_DEBUG] = "debug",
    };
    char line[2048];
    int n, body;
    if (g_prefix < 0)
        g_prefix = getenv("JOURNAL_STREAM") != NULL || !isatty(STDERR_FILENO);
    if (g_prefix)
        n = snprintf(line, sizeof line, "<%d>%s: ", (int)lvl, g_ident);
    else
        n = snprintf(line, sizeof line, "%s: %s: ", g_ident, names[lvl]);
    body = n;
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    /* The code's text, unless the message ends with it already (an err string made with
     * strerror, logged with its code) */
    const char *why = err ? err_str(err) : "";
    size_t wl = strlen(why);
    if (err && !((size_t)(n - body) >= wl && !memcmp(line + n - wl, why, wl)))
        n += snprintf(line + n, sizeof line - (size_t)n, ": %s", why);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    if (lvl == LOG_LVL_ERR) {
        pthread_mutex_lock(&g_last_mu);
        snprintf(g_last, sizeof g_last, "%.*s", n - body, line + body);
        pthread_mutex_unlock(&g_last_mu);
    }
    line[n++] = '\n';
    /* One write per line so lines of concurrent processes never interleave; a stop signal
     * cutting into a write blocked on a full pipe (no SA_RESTART) must not lose the line, and
     * a short write's rest follows it. */
    int saved = errno;
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = write(STDERR_FILENO, line + off, (size_t)n - off);
        if (w > 0)
            off += (size_t)w;
        else if (w == 0 || errno != EINTR)
            break;      /* nowhere to say it */
    }
    errno = saved;
}

void log_last_error(char *buf, size_t len)
{
    if (!len)
        return;
    pthread_mutex_lock(&g_last_mu);
    snprintf(buf, len, "%s", g_last);
    pthread_mutex_unlock(&g_last_mu);
}
