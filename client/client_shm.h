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
/* Unmap and close the arena (after the comm thread stopped). */
void psc_shm_close(ps_client *c);

#endif
