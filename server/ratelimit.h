/* Rate-limited logging of refused or dropped messages: a peer that sends
 * garbage in a loop must not flood the log.  At most PS_RLIMIT_LINES lines per
 * one-second window; the rest are counted and said in one line when the
 * window ends.  One ps_rlimit per thread (no lock); zeroed is ready. */
#ifndef PS_RATELIMIT_H
#define PS_RATELIMIT_H

#include <stdint.h>

#define PS_RLIMIT_LINES 10

typedef struct ps_rlimit {
    int64_t win; /* start of the window, ps_now_ns */
    unsigned n;  /* lines allowed in it */
    unsigned long long suppressed;
} ps_rlimit;

/* 1: log this line now; 0: it was counted instead. */
int ps_rlimit_allow(ps_rlimit *r);

/* Start a new window once a second has passed (`force`: now, at exit),
 * first logging how many lines the last one swallowed. */
void ps_rlimit_flush(ps_rlimit *r, int64_t now, int force);

#endif
