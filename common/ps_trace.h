/* Chrome trace-event JSON writer (opens in Perfetto and chrome://tracing).
 * Timestamps are CLOCK_MONOTONIC microseconds, which every process on a host
 * shares, so worker and server files can be loaded together.  Thread-safe:
 * events from any thread are appended under a mutex, one line each. */
#ifndef PS_TRACE_H
#define PS_TRACE_H

#include <stdint.h>

typedef struct ps_trace ps_trace;

/* Create `path` and write the process name (e.g. "ps_worker[1]") as metadata.
 * pid is the process id shown in the viewer.  Returns 0 or PS_EIO. */
int ps_trace_open(const char *path, int pid, const char *process_name, ps_trace **out);
/* Name a thread lane (tid) of this process. */
void ps_trace_thread_name(ps_trace *t, int tid, const char *name);
/* A complete event ("ph":"X") from start_ns to end_ns (ps_now_ns clock).
 * name and cat must be plain identifiers (no quotes or backslashes);
 * step and layer go into args when >= 0.  NULL t: does nothing. */
void ps_trace_event(ps_trace *t, const char *name, const char *cat, int tid, int64_t start_ns,
                    int64_t end_ns, int64_t step, int layer);
/* Finish the JSON and close.  NULL is fine. */
int ps_trace_close(ps_trace *t);

#endif
