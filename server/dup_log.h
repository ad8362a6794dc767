/* The log of duplicate pushes of one update thread: a push below its
 * worker's clock is dropped (a resend, or another connection pushing in the
 * worker's name), and said without a line per push.  A zeroed ps_dup_log
 * is an empty one. */
#ifndef PS_DUP_LOG_H
#define PS_DUP_LOG_H

#include <stdint.h>

#include "ps_proto.h"

/* Duplicate pushes are summed over a window of this long per worker and
 * said in one line (a worker whose pushes are all duplicates is a sign that
 * another connection pushed in its name, or of a restarted worker catching
 * up); the first of a quiet spell is said at once. */
#define DUP_WINDOW_NS 10000000000LL
#define DUP_WARN 100 /* a window with this many: a warning, else info */
#define DUP_RANKS 4  /* workers named per window */

typedef struct ps_dup_rank {
    int rank;
    uint64_t n, key;
    uint32_t chunk;
    int64_t step;
} ps_dup_rank;

typedef struct ps_dup_log {
    int64_t win_ns;   /* the window's start; 0: none open */
    uint64_t n;       /* duplicates in it */
    int nranks;
    ps_dup_rank r[DUP_RANKS];
    uint64_t others;  /* of workers beyond the first DUP_RANKS */
    int64_t quiet_ns; /* the last one said at once */
} ps_dup_log;

/* A duplicate push (h: its header; key and chunk name a table and its
 * partition for a sparse push).  The first of a quiet spell is said at once. */
void ps_dup_log_note(ps_dup_log *d, const ps_header *h);
/* Say the window and close it once it is DUP_WINDOW_NS old (call often). */
void ps_dup_log_tick(ps_dup_log *d);
/* Say what the window holds now, and close it (nothing when it is empty). */
void ps_dup_log_flush(ps_dup_log *d, int64_t now);

#endif
