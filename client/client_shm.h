/* libps: the same-host data plane, client side (client_shm.c).  Its state
 * (c->shm: the arena, which servers map it) is made by start on the
 * training thread and read by the comm thread afterwards; a rejoin's hello
 * reply updates which servers map it (comm thread). */
#ifndef PS_CLIENT_SHM_H
#define PS_CLIENT_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"
#include "client_requests.h"

/* Training thread, in start before the hellos: create the arena (options.shm)
 * and name it in the hello template.  A failure is logged and the client
 * goes on without one.  0, or PS_ENOMEM. */
int psc_shm_setup(ps_client *c);
/* Server s answered a hello with rep: note whether its payloads go through
 * the arena, and log which path they take. */
void psc_shm_hello_reply(ps_client *c, int s, const ps_hello *rep);
/* Comm thread: does sub-request s's payload (push, init) or destination
 * (pull) lie in the arena, for a server that maps it?  Then *off is where
 * (a pushpull: both, the gradient at *off, the destination at *dst_off). */
int psc_shm_use(const ps_client *c, const psc_sub *s, uint64_t *off, uint64_t *dst_off);
/* Does [p, p + bytes) lie in the arena?  Then *off is where. */
int psc_shm_holds(const ps_client *c, const void *p, size_t bytes, uint64_t *off);
/* Does server s map the arena (its payloads go through it)?  Never a slot
 * added while training (client_moved.h): no arena is offered to those. */
int psc_shm_on(const ps_client *c, int s);
/* Comm thread: a block of `bytes` in the arena's stage for a table's
 * request to server s (one that maps the arena), *off its offset; NULL when
 * the server does not map it or the stage has no room (the request goes
 * over the network).  Given back with psc_shm_block_free once the server
 * is done with it. */
void *psc_shm_block(ps_client *c, int s, size_t bytes, uint64_t *off);
void psc_shm_block_free(ps_client *c, uint64_t off);
/* The stage's bytes [off, off + bytes) (a reply's rows), NULL when they are
 * not inside it. */
void *psc_shm_at(const ps_client *c, uint64_t off, size_t bytes);
/* Unmap and close the arena (after the comm thread stopped). */
void psc_shm_close(ps_client *c);

#endif
