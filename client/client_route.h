/* libps: which member of each replicated server group is its primary, on
 * the comm thread (docs/DESIGN.md "Replicas and failover").
 *
 * A server list entry may be a group, "a|b[|c]": the endpoints of one
 * shard group's members, its primary first (ps_launch --replicas writes
 * them so).  libps talks to one member per group, the one it takes for
 * the primary.  It moves to another member when
 *  - the member answers PS_ENOTPRIMARY: to the member the answer names
 *    (`mb`, epoch `ep`), or, when it names the one just left, to the same
 *    member again a little later (it has not taken over yet);
 *  - the member's connection closes (a socket monitor), or nothing came
 *    from it for failure_timeout_ms while requests waited (heartbeats go
 *    at a quarter of that): to the next member in the list.
 * Moving is the comm loop's (client_comm.c): a new socket to the member, a
 * hello with the rank's token (client_rejoin.c), and every request that
 * was waiting on the group sent again; the servers drop duplicates.
 *
 * It decides and sends nothing itself. */
#ifndef PS_CLIENT_ROUTE_H
#define PS_CLIENT_ROUTE_H

#include <stdint.h>

#include "client_internal.h"

/* At open, after the list was split at commas: split entry g ("a|b|c")
 * into its members (tok is written: '|' becomes NUL), each checked by
 * check (0 or a PS_E* code, why filled).  c->endpoints[g] keeps the whole
 * entry's text (a name for messages): psc_route_endpoint is what to
 * connect to. */
int psc_route_add(ps_client *c, int g, char *tok, int (*check)(const char *ep, char *why),
                  char *why);
/* The groups' table for c->nservers entries (psc_route_add fills it).
 * 0 or PS_ENOMEM. */
int psc_route_new(ps_client *c, int nservers);
void psc_route_free(ps_client *c);

/* Some group has more than one member. */
int psc_route_any(const ps_client *c);
/* The endpoint of the member group g is on now (an added server slot: its
 * endpoint, client_moved.h). */
const char *psc_route_endpoint(const ps_client *c, int g);

/* The member answered PS_ENOTPRIMARY (h: the answer).  1: move to the
 * member it names now (psc_route_endpoint says which); 0: stay, and say
 * hello there again once psc_route_retry_due says so. */
int psc_route_refused(ps_client *c, int g, const ps_header *h, int64_t now);
/* The member is taken as lost (why): move to the next one.  Returns 1
 * (moved) or 0 (a single member: nothing to move to). */
int psc_route_lost(ps_client *c, int g, const char *why, int64_t now);
/* A hello to the member of group g was accepted: it serves us. */
void psc_route_settled(ps_client *c, int g, int64_t now);
/* Group g left a member and no other one took us yet. */
int psc_route_moving(const ps_client *c, int g);
/* A hello to group g is due again (after a refusal); clears it. */
int psc_route_retry_due(ps_client *c, int g, int64_t now);
/* The wait until the next retry of any group (ms; -1: none). */
long psc_route_timeout_ms(const ps_client *c, int64_t now);
/* How long (ms) a group's member may be silent while requests wait on it
 * before it is taken as lost; 0: never (no groups). */
int psc_route_failure_ms(const ps_client *c);

/* A closed connection is a lost member at once: a monitor of the DEALER
 * sock of group g (made with zctx), replacing the group's last one.  The
 * comm thread polls psc_route_watch_socket(c, g) (NULL: none) and calls
 * psc_route_watch_read when it is readable: 1 when the connection closed. */
void psc_route_watch(ps_client *c, int g, void *zctx, void *sock);
void *psc_route_watch_socket(const ps_client *c, int g);
int psc_route_watch_read(ps_client *c, int g);
/* Close group g's monitor (before its socket closes); every group's at the
 * end. */
void psc_route_unwatch(ps_client *c, int g, void *sock);

#endif
