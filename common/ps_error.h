/* Error codes shared by every module.  Functions that can fail return 0 or a
 * PS_E* code (always positive); only main() decides to exit. */
#ifndef PS_ERROR_H
#define PS_ERROR_H

#include <stddef.h>

/* The codes themselves (PS_OK, PS_EINVAL, ...) and ps_strerror() are public:
 * include/ps_types.h. */
#include "ps_types.h"

/* printf into a caller's `why` buffer (truncated to why_len, always
 * terminated).  why may be NULL or why_len 0: then it writes nothing, so
 * callers can pass their own optional buffer straight through. */
void ps_errorf(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The one exit-status rule of every program (ps_server, ps_worker,
 * ps_launch, ps_keygen):
 *   0  done;
 *   1  failed while running (a peer or the network went away, I/O error);
 *   2  something to fix before running again: a flag or its value, a
 *      setting that disagrees with the servers (mode, workers, optimizer,
 *      model), keys, data or checkpoint files, the device;
 *   128 + N  a worker stopped by signal N before it finished.
 * Maps a PS_E* code (0: success) to 0, 1 or 2. */
int ps_exit_status(int rc);

#endif
