/* Shared-memory arenas: the memory of the same-host data plane (DESIGN.md
 * "Data plane").
 *
 * A worker creates one arena: a POSIX shared-memory segment, mode 0600, named
 * /ps-<pid>-<16 hex digits>, holding its tensors' weight and gradient
 * buffers.  It tells each server the name, size and a random nonce in its
 * hello; a server on the same host (and the same user, or root) can open
 * the segment, and the nonce in the segment's header proves it is the one the
 * worker means (a server on another host finds no such name, or another
 * segment).  From then on a push names the offset of its gradient in the
 * arena and the server reads it in place; a pull names the offset of its
 * destination and the server writes the weights there; ZeroMQ carries only
 * the headers.
 *
 * Layout: a header page (magic, format, nonce, size, the owner's pid and
 * process start time), then buffers handed out by ps_shm_alloc.
 *
 * Lifetime: the name stays until the owner closes the arena (so a server
 * restarted with --restore can map it again), then it is unlinked.  A
 * segment whose owner died (SIGKILL) is removed by the next arena created on
 * the host (ps_shm_sweep_stale) or by a server that notices its owner is
 * gone; mappings already made stay valid until unmapped.
 *
 * Thread-safety: an arena is set up by one thread; ps_shm_alloc is not
 * thread-safe.  Nothing here is on the hot path. */
#ifndef PS_SHM_H
#define PS_SHM_H

#include <stddef.h>
#include <stdint.h>

#define PS_SHM_NAME_MAX 48
/* Bytes before the first buffer (the header page). */
#define PS_SHM_HEADER_BYTES 4096
/* Buffers from ps_shm_alloc start on this boundary. */
#define PS_SHM_ALIGN 64

typedef struct ps_shm_arena {
    char name[PS_SHM_NAME_MAX]; /* "/ps-1234-0123456789abcdef" */
    unsigned char *base;        /* the mapping; NULL when not mapped */
    size_t size;                /* bytes of the segment, header included */
    size_t used;                /* ps_shm_alloc's cursor */
    uint64_t nonce;
    int owner;                  /* created here: unlinked by ps_shm_close */
    int32_t owner_pid;          /* from the header */
    uint64_t owner_start;       /* the owner's process start time (clock ticks) */
} ps_shm_arena;

/* Create and map a new arena of at least `bytes` usable bytes (rounded up to
 * pages), with a fresh name and nonce; first removes stale segments of dead
 * owners (ps_shm_sweep_stale).  PS_EIO with the reason in why (no /dev/shm,
 * out of space, ...). */
int ps_shm_create(size_t bytes, ps_shm_arena *a, char *why, size_t why_len);

/* Map the arena a worker announced: its name, nonce and size must match the
 * segment's header.  PS_ENOTFOUND when there is no such segment here (another
 * host), PS_EAUTH when it cannot be opened (permissions), PS_EMISMATCH when
 * the header differs (another segment of that name), PS_EIO otherwise. */
int ps_shm_attach(const char *name, uint64_t nonce, size_t size, ps_shm_arena *a, char *why,
                  size_t why_len);

/* Unmap; the owner also unlinks the name.  Safe on a zeroed or closed arena. */
void ps_shm_close(ps_shm_arena *a);

/* `bytes` from the arena, PS_SHM_ALIGN-aligned, zeroed; NULL when it is full
 * or not mapped. */
void *ps_shm_alloc(ps_shm_arena *a, size_t bytes);

/* Does [p, p + bytes) lie inside the arena's buffers?  Then *off is its
 * offset from the base. */
int ps_shm_contains(const ps_shm_arena *a, const void *p, size_t bytes, uint64_t *off);

/* Is [off, off + bytes) a valid, 4-byte aligned range of the arena's
 * buffers (not the header)?  For a server checking a worker's offsets. */
int ps_shm_range_ok(const ps_shm_arena *a, uint64_t off, uint64_t bytes);

/* Is the arena's owner process still running (same pid and start time)? */
int ps_shm_owner_alive(const ps_shm_arena *a);

/* Unlink a segment name (the owner is known to be gone).  0 or -1. */
int ps_shm_unlink(const char *name);

/* Remove every /dev/shm/ps-<pid>-* segment of this user whose owner is not
 * running any more.  Returns how many were removed. */
int ps_shm_sweep_stale(void);

/* Names of this host's arenas now in /dev/shm (for tests): how many there
 * are, and the first up to max of them into names (may be NULL). */
int ps_shm_list(char (*names)[PS_SHM_NAME_MAX], int max);

#endif
