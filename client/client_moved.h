/* libps: which server slot holds each object now, and the slots added and
 * removed while training goes on (client_moved.c; docs/PROTOCOL.md "Moved
 * objects").
 *
 * Objects are what servers move whole: a dense chunk (its flat index in
 * c->place) and a table partition (table t, its flat HOME index: partition p
 * of home server h is flat base(h) + p over the homes' c->server_parts).
 * The S servers listed at open are the homes: c->nservers, the row layout,
 * forever.  Servers added later get slots S, S+1, ... (learned from a
 * PS_EMOVED reply naming one, with its endpoint); a removed server's slot is
 * never used again.  Every per-server array of the client is per SLOT:
 * psc_nslots(c) of them (homes first).
 *
 * State per slot: UNKNOWN (a hole: a later slot was named first, or never
 * added), JOINING (added: our hello is on its way, requests wait for it),
 * LIVE (a home, or an added slot that took our hello), REMOVED (it left the
 * job: nothing goes there again).
 *
 * Comm thread only, apart from new and free (open, close).  It decides
 * nothing about sockets or hellos: the comm loop (client_comm.c) adds a
 * slot's socket and hello after psc_moved_add, and calls the other modules'
 * grow functions. */
#ifndef PS_CLIENT_MOVED_H
#define PS_CLIENT_MOVED_H

#include <stdint.h>

#include "client_internal.h"

/* What a sub-request is about (psc_sub.obj_kind). */
#define PSC_OBJ_NONE 0  /* a control message: goes where it was posted */
#define PSC_OBJ_CHUNK 1 /* obj: the chunk's flat index in c->place */
#define PSC_OBJ_PART 2  /* obj: the flat home partition; obj_table the table
                           (PSC_ALL_TABLES: a lookup of several) */
#define PSC_ALL_TABLES UINT32_MAX

/* Slots beyond the homes a client takes: a PS_EMOVED naming slot
 * nservers + PSC_MAX_ADDED_SLOTS or more is refused as bad input. */
#define PSC_MAX_ADDED_SLOTS 1024
/* Redirects one sub-request follows before it fails (each names another
 * slot; a loop between stale servers ends here). */
#define PSC_MOVED_MAX_HOPS 16

enum { PSC_SLOT_UNKNOWN = 0, PSC_SLOT_JOINING, PSC_SLOT_LIVE, PSC_SLOT_REMOVED };

/* What a PS_EMOVED reply asks (psc_moved_check). */
enum {
    PSC_MOVED_BAD = -1, /* bad input: fail the request (why says) */
    PSC_MOVED_LEFT,     /* slot -1: the server left the job */
    PSC_MOVED_LOADING,  /* names the slot asked: ask again shortly */
    PSC_MOVED_GONE,     /* names a slot that left: ask the object's home (or 0) after a pause */
    PSC_MOVED_KNOWN,    /* names another slot we know (live or joining) */
    PSC_MOVED_NEW       /* names a slot to add (psc_moved_add), its endpoint checked */
};

/* Open (c->nservers set): 0 or PS_ENOMEM. */
int psc_moved_new(ps_client *c);
void psc_moved_free(ps_client *c);

/* The connection slots: homes and added ones (the highest named + 1). */
int psc_nslots(const ps_client *c);
int psc_slot_state(const ps_client *c, int s);
/* A name for messages: the endpoint listed at open (a home) or learned. */
const char *psc_slot_name(const ps_client *c, int s);
/* An added slot's endpoint, checked (what to connect to); NULL for a home. */
const char *psc_moved_endpoint(const ps_client *c, int s);

/* A PS_EMOVED reply h from slot `from`: what it asks (PSC_MOVED_*); BAD
 * with the reason in why (a slot out of bounds, a new slot without an
 * endpoint or with one that does not check, an added slot named at another
 * endpoint than before, slot 0 said to have left). */
int psc_moved_check(const ps_client *c, int from, const ps_header *h, char *why, size_t why_len);
/* Add slot s (PSC_MOVED_NEW) at endpoint ep (checked by psc_moved_check):
 * JOINING; psc_nslots grows to s + 1 when it is beyond (the slots between
 * are UNKNOWN).  Logged.  0 or PS_ENOMEM. */
int psc_moved_add(ps_client *c, int s, const char *ep);
/* Added slot s took our hello: LIVE. */
void psc_moved_joined(ps_client *c, int s);
/* Slot s left the job: REMOVED, and the objects said to be there go back
 * to being looked for at their homes.  Logged. */
void psc_moved_remove(ps_client *c, int s);

/* Object (kind, table, obj) is at slot s now (s its home clears the
 * override).  PS_ENOMEM leaves it where it was thought to be. */
int psc_moved_set(ps_client *c, int kind, uint32_t table, uint32_t obj, int s);
/* The slot to send object (kind, table, obj) with home `home` to: where it
 * was last said to be, else its home; a home that left: slot 0, whose
 * PS_EMOVED names the owner.  Call through psc_route_obj. */
int psc_moved_route(const ps_client *c, int kind, uint32_t table, uint32_t obj, int home);
/* Say (rate-limited: one line per second per (from, to) with a count) that
 * an object moved from slot `from` to slot `to`. */
void psc_moved_said(ps_client *c, int from, int to);

/* The hot path: one predictable branch while nothing moved. */
static inline int psc_route_obj(const ps_client *c, int kind, uint32_t table, uint32_t obj,
                                int home)
{
    return __builtin_expect(c->moved_any, 0) ? psc_moved_route(c, kind, table, obj, home) : home;
}

#endif
