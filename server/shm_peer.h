/* A worker's shared-memory arena as a server maps it (common/ps_shm.h; the
 * same-host data plane of docs/PROTOCOL.md "Same host").
 *
 * The I/O thread opens one at the worker's hello and keeps it as the rank's
 * current arena; every request that reads or writes it (a push's gradient,
 * a pull's destination) carries a reference to the update thread, which
 * drops it when done (at once, or when a kept gradient is released or a
 * queued pull answered).  The last reference unmaps the arena (its memory
 * goes back once the worker let go of it too).  The arena is sealed: its
 * size cannot change under the mapping, so no access here can fault,
 * whatever its owner does (docs/SECURITY.md "Shared memory on one host").
 *
 * Thread-safety: references are atomic; everything else is read-only after
 * ps_shm_peer_open. */
#ifndef PS_SHM_PEER_H
#define PS_SHM_PEER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_shm_peer ps_shm_peer;

/* Map the arena a worker's hello names, trusting users[0..nusers) besides
 * the server's own user.  One reference, the caller's.  Errors as
 * ps_shm_attach (PS_ENOTFOUND: not on this host), why says. */
int ps_shm_peer_open(const char *name, uint64_t nonce, uint64_t size, const uint32_t *users,
                     int nusers, ps_shm_peer **out, char *why, size_t why_len);

void ps_shm_peer_ref(ps_shm_peer *p);
/* Drop a reference (NULL is fine): the last one unmaps. */
void ps_shm_peer_unref(ps_shm_peer *p);

/* The arena's bytes [off, off + bytes), or NULL when that is not inside its
 * buffers or not 4-byte aligned. */
void *ps_shm_peer_at(const ps_shm_peer *p, uint64_t off, uint64_t bytes);

const char *ps_shm_peer_name(const ps_shm_peer *p);
uint64_t ps_shm_peer_nonce(const ps_shm_peer *p);

#endif
