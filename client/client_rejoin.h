/* libps: hello again after PS_EHELLO or PS_EPERM (client_rejoin.c).  Comm thread only,
 * apart from new and free; its state (c->rejoin) is its own, with the
 * parked flag of each slot (psc_sub.parked).  It sends nothing: the comm
 * loop sends the hello it makes and what it unparks. */
#ifndef PS_CLIENT_REJOIN_H
#define PS_CLIENT_REJOIN_H

#include <stdint.h>

#include "client_internal.h"

/* Open (c->nservers set): 0 or PS_ENOMEM. */
int psc_rejoin_new(ps_client *c);
/* Room for nslots server slots (client_moved.h): 0 or PS_ENOMEM. */
int psc_rejoin_grow(ps_client *c, int nslots);
void psc_rejoin_free(ps_client *c);

/* Sub-request i was refused with PS_EHELLO or PS_EPERM (its server dropped
 * or forgot this rank, or holds it for another connection).  0: it is parked (no resends) until that server takes this
 * worker back (psc_rejoin_hello); -1: the caller should fail it instead
 * (before start, a hello itself, or the server kept refusing us right after
 * each hello). */
int psc_rejoin_park(ps_client *c, uint32_t i);
/* `server` refused us with `refusal` (a sub-request, or a heartbeat: then
 * before a request runs into it; NULL: a server slot added while training,
 * whose first hello this is, client_moved.h): a new slot holding the hello
 * that (re)joins it, for the caller to send; PSC_NO_SLOT when none is to go (before start,
 * a hello on its way already, or too many in a row; out of memory fails
 * what is parked on it). */
uint32_t psc_rejoin_hello(ps_client *c, int server, const ps_header *refusal);
/* The hello of psc_rejoin_hello could not be sent (its slot finished with
 * the error): what is parked on `server` fails with it. */
void psc_rejoin_unsent(ps_client *c, int server);
/* A reply of server `server` to one of our requests was served: the rank
 * is live there. */
void psc_rejoin_served(ps_client *c, int server);
/* Sub-request i is a rejoin hello: take its reply h and finish the slot.
 * If the server took us back, what is parked on it is for the caller to
 * resend (psc_rejoin_unpark); if not, that failed.  1 when i was one
 * (handled), 0 otherwise. */
int psc_rejoin_reply(ps_client *c, uint32_t i, const ps_header *h);
/* Sparse sub-request i was refused with PS_ENOTFOUND (its server does not
 * know the table: restored from a checkpoint older than the declaration).
 * 0: parked until every table is declared to it again (psc_redeclare);
 * -1: the caller should fail it instead (before start, not a table request,
 * or the server kept forgetting them). */
int psc_redeclare_park(ps_client *c, uint32_t i);
/* `server` refused a table request with `refusal`: a re-declaration of
 * every table to it starts (0), for the caller to make and send its TABLEs
 * with psc_redeclare_slot; -1 when one is on its way already. */
int psc_redeclare_begin(ps_client *c, int server, const ps_header *refusal);
/* A new slot holding table t's TABLE of that re-declaration, for the caller
 * to send; PSC_NO_SLOT when out of memory (that part done, failed). */
uint32_t psc_redeclare_slot(ps_client *c, int server, size_t t);
/* After making and sending them (some may have failed): when that completed
 * the re-declaration already, what is parked on `server` fails with its
 * error. */
void psc_redeclare_unsent(ps_client *c, int server);
/* Sub-request i is a re-declaration's TABLE: take its reply h and finish
 * the slot; 1 when it was one.  *ok: the last one came and every table was
 * taken: what is parked on the server is for the caller to resend
 * (psc_rejoin_unpark).  One refused fails what is parked there. */
int psc_redeclare_reply(ps_client *c, uint32_t i, const ps_header *h, int *ok);

/* The next sub-request at or after slot `from` parked on `server`, which
 * has taken us back: unparked, for the caller to send again; PSC_NO_SLOT
 * when none is left (or the hello is still on its way). */
uint32_t psc_rejoin_unpark(ps_client *c, int server, uint32_t from);
/* The slot of the hello to `server` that is on its way, or PSC_NO_SLOT. */
uint32_t psc_rejoin_slot(ps_client *c, int server);

#endif
