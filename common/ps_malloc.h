/* How ps_server and ps_worker ask glibc to keep the memory of large
 * messages.  ZeroMQ allocates every received message (and libps every reply
 * copy) with malloc; with glibc's defaults a buffer of a few MiB is mapped
 * and unmapped, or the heap's top trimmed, on every message, so each one
 * faults all its pages in again: in a VM that costs more than the bytes'
 * copies (a 16 MiB push-pull ran at 0.2-0.3 of raw ZeroMQ instead of 0.7-0.9;
 * docs/BENCHMARKS.md section 1).  Not called by libps: a library must not
 * retune its caller's allocator (a program using libps can do the same, or
 * set MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_). */
#ifndef PS_MALLOC_H
#define PS_MALLOC_H

/* Serve allocations up to 32 MiB from the heap and keep up to 128 MiB of
 * free memory at its top, unless the environment already sets either
 * (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_): the user's word wins. */
void ps_malloc_keep_large(void);

/* Give the free memory kept at the heap's top back to the system: after a
 * peer that pinned a lot of it has gone. */
void ps_malloc_release(void);

#endif
