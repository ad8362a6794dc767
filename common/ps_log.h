/* One line per event that matters:
 *   ps_server[0] info 06:12:38.123: message
 * Level, role and rank come first so `grep 'ps_server\[1\] error'` works.
 * Thread-safe: each line is written with a single write(2). */
#ifndef PS_LOG_H
#define PS_LOG_H

#include "ps_types.h" /* the levels, ps_log_init, ps_log_set_level */

int ps_log_level(void);

void ps_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ps_error(...) ps_log(PS_LOG_ERROR, __VA_ARGS__)
#define ps_warn(...) ps_log(PS_LOG_WARN, __VA_ARGS__)
#define ps_info(...) ps_log(PS_LOG_INFO, __VA_ARGS__)
#define ps_debug(...) \
    do { if (ps_log_level() >= PS_LOG_DEBUG) ps_log(PS_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
