/* Which worker's shared-memory arena this server has mapped: the I/O
 * thread's table of one ps_shm_peer per rank (server.h; the data plane of
 * docs/PROTOCOL.md "Same host").  A worker's hello names its arena; the
 * server maps it (unless started with --shm off) and says in its reply
 * whether payloads of that rank will travel through it.  Requests that use
 * the arena take a reference to hand to an update thread.  I/O thread only. */
#ifndef PS_SHM_TABLE_H
#define PS_SHM_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "ps_proto.h"
#include "shm_peer.h"

typedef struct ps_shm_table ps_shm_table;

/* enabled 0: every arena is refused ("--shm off").  users[0..nusers) (at
 * most PS_SHM_MAX_USERS): the uids whose arenas are mapped besides the
 * server's own user's (--shm-users). */
int ps_shm_table_create(int num_workers, int enabled, const uint32_t *users, int nusers,
                        ps_shm_table **out);
/* Drop every mapping (the last reference of each unmaps it). */
void ps_shm_table_destroy(ps_shm_table *t);

/* Rank r said hello with req: map the arena it names (a new one replaces the
 * old; the same one is kept), or forget the old one when it names none.
 * Fills reply->shm (1: payloads through the arena) and reply->shm_why, and
 * logs which path the rank's payloads take. */
void ps_shm_table_hello(ps_shm_table *t, int r, const ps_hello *req, ps_hello *reply);

/* For a request of rank r with PS_FLAG_SHM naming [off, off + bytes) of its
 * arena: 0 and a new reference to the arena in *out; PS_EHELLO when no arena
 * of r is mapped (this server started after r's hello: r says hello again);
 * PS_EPROTO when the range is not inside it.  why says which. */
int ps_shm_table_take(ps_shm_table *t, int r, uint64_t off, uint64_t bytes, ps_shm_peer **out,
                      char *why, size_t why_len);

/* Ranks whose payloads go through shared memory now. */
int ps_shm_table_count(const ps_shm_table *t);

#endif
