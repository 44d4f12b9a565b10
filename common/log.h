/* log.h: leveled logging to stderr for daemons and tools.
 * Lines carry sd-daemon priority prefixes ("<3>") so journald keeps the level. */
#pragma once
#include <stdarg.h>
#include <stddef.h>

enum log_level { LOG_LVL_ERR = 3, LOG_LVL_WARN = 4, LOG_LVL_NOTICE = 5, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

/* ident: program name shown when not under journald; level: most verbose shown. */
void log_init(const char *ident, enum log_level level);
void log_set_level(enum log_level level);
/* Parse "error|warn|notice|info|debug"; returns 0 or -EINVAL. */
int log_level_parse(const char *s, enum log_level *out);

void log_msg(enum log_level lvl, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The text of the last error-level line this process logged (from any thread), without its
 * prefix, into buf; "" when none. */
void log_last_error(char *buf, size_t len);

/* err: 0 or a negative code; when non-zero its message is appended. */
#define log_error(err, ...) log_msg(LOG_LVL_ERR, (err), __VA_ARGS__)
#define log_warn(err, ...)  log_msg(LOG_LVL_WARN, (err), __VA_ARGS__)
#define log_notice(...)     log_msg(LOG_LVL_NOTICE, 0, __VA_ARGS__)
#define log_info(...)       log_msg(LOG_LVL_INFO, 0, __VA_ARGS__)
#define log_debug(...)      log_msg(LOG_LVL_DEBUG, 0, __VA_ARGS__)
