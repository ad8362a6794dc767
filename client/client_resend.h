/* libps: liveness (client_resend.c): when to resend, when heartbeats are
 * due, when to give up on a silent server.  Comm thread only, apart from
 * new and free; its state (c->live) is its own, with the resend deadlines
 * of each slot (psc_sub.deadline_ns, backoff_ns).  It sends nothing: the
 * comm loop sends what it names. */
#ifndef PS_CLIENT_RESEND_H
#define PS_CLIENT_RESEND_H

#include <stdint.h>

#include "client_internal.h"

/* Open (c->nservers set): 0 or PS_ENOMEM. */
int psc_liveness_new(ps_client *c);
void psc_liveness_free(ps_client *c);
/* Room for nslots server slots (client_moved.h): 0 or PS_ENOMEM. */
int psc_liveness_grow(ps_client *c, int nslots);

/* Slot i was sent at now: when resending is on, set when to resend it (the
 * first time after request_timeout_ms). */
void psc_resend_arm(ps_client *c, uint32_t i, int64_t now);
/* The next sub-request to resend at now: the first live one at or after
 * slot `from` whose deadline has passed (not SHUTDOWN, not parked), its
 * backoff doubled up to 30 s and the resend logged; PSC_NO_SLOT when none
 * is left.  A round starts with from 0 (PSC_NO_SLOT at once when no
 * deadline can have passed) and goes on from the slot returned + 1; the
 * caller sends each slot returned (psc_resend_arm) before asking again. */
uint32_t psc_resend_next(ps_client *c, int64_t now, uint32_t from);
/* Slot i is to be sent again at at_ns (a PS_EMOVED said its object is on
 * its way to that server: ask again shortly), resending on or off: a
 * retry, not a resend (no backoff doubled, nothing logged). */
void psc_resend_after(ps_client *c, uint32_t i, int64_t at_ns);
/* 1 when the heartbeats are to go to every server now (after start, every
 * heartbeat_ms); the next ones are due heartbeat_ms later. */
int psc_heartbeat_due(ps_client *c, int64_t now);
/* Something came from server s at now. */
void psc_server_heard(ps_client *c, int s, int64_t now);
/* The loop's poll is due back by wake_by_ns (INT64_MAX: no limit); much
 * later means the process did not run (see psc_give_up_next). */
void psc_liveness_wake_by(ps_client *c, int64_t wake_by_ns);
/* The next server at or after `from` silent for longer than
 * server_timeout_ms while sub-requests wait on it (after start): those fail
 * with PS_ETIMEDOUT (logged once per server and episode) and it is
 * returned, for the caller to reset its connection (payloads ZeroMQ still
 * queues for it belong to those requests: only once they are released are
 * the requests complete); -1 when none is left.  With from 0 a pause of the
 * process (a loop much later than its wake_by: SIGSTOP, a suspended VM)
 * first makes silence count afresh from now, so a resumed worker does not
 * give up on servers whose replies are still on their way. */
int psc_give_up_next(ps_client *c, int64_t now, int from);
/* Replicated groups: has server s's member been silent past the failure
 * timeout (client_route.h) while requests wait on it? */
int psc_lost(ps_client *c, int64_t now, int s);
/* How long the poll may sleep before resends, heartbeats or giving up are
 * due: ms, or -1 when nothing is due. */
long psc_liveness_timeout_ms(const ps_client *c, int64_t now);

#endif
