/* libps: what a reader (or an export) sends (client_read.c): a lookup's
 * rows of several tables, one LOOKUP per partition they are on, and a
 * snapshot's SNAPSHOT and SNAPREAD messages.  The comm thread's, but for
 * ps_client_lookup and psc_read_post, which post. */
#ifndef PS_CLIENT_READ_H
#define PS_CLIENT_READ_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "client_comm.h"
#include "client_internal.h"
#include "client_requests.h"

/* A lookup as posted (psc_op.out, the comm thread frees it): nt tables,
 * each its key, index in c->tables, ids and where their rows go. */
typedef struct psc_lookup_req {
    size_t nt;
    uint64_t *keys;
    uint32_t *table;
    const uint64_t **ids;
    size_t *n;
    float **rows;
} psc_lookup_req;

/* SNAPSHOT's out: in, how long items one version behind are waited for;
 * out, the reply's item count and lowest and highest version. */
typedef struct psc_snap_io {
    uint32_t wait_ms;
    uint64_t items;
    int64_t lo, hi;
} psc_snap_io;

/* SNAPREAD's out: in, the item and page and where its bytes go (cap of
 * them); out, the page's bytes and the item's. */
typedef struct psc_page_io {
    uint64_t item;
    uint32_t page;
    unsigned char *dst;
    size_t cap;
    uint64_t got, total;
} psc_page_io;

/* The flat partitions of every server (room for a lookup's slots). */
size_t psc_read_parts(const ps_client *c);
/* The most slots op o (a LOOKUP) takes: one per partition, or, once
 * anything moved (client_moved.h), one per partition and table. */
size_t psc_lookup_max_slots(const ps_client *c, const psc_op *o);
/* The tables (indices in c->tables, at most cap) lookup slot i reads. */
size_t psc_lookup_tables(const ps_client *c, uint32_t i, uint32_t *tables, size_t cap);
/* Comm thread: op o (a LOOKUP) as one slot per partition (and table) it
 * reads, into slots (room for psc_lookup_max_slots), to send; the caller adds them to
 * o->req's parts.  Frees o->out.  -1: nothing sent (the request has the
 * error). */
long psc_lookup_begin(ps_client *c, const psc_op *o, uint32_t *slots);

/* Comm thread: the frames after slot i's header, for the types that carry
 * frames other than a dense payload (LOOKUP: tables and ids; SNAPSHOT: its
 * targets), and the header fields they need.  *nf 0 for other types.
 * PS_ENOMEM. */
int psc_read_frames(ps_client *c, uint32_t i, ps_header *h, zmq_msg_t *f, int *nf);

/* Comm thread: slot i's reply h (checked against its type's row), with its
 * payload frame pm: a LOOKUP's rows go to the caller's places, a SNAPSHOT's
 * and SNAPREAD's answer to their out.  PS_EPROTO with why. */
int psc_read_reply(ps_client *c, uint32_t i, const ps_header *h, zmq_msg_t *pm, char *why,
                   size_t why_len);

/* Training thread: post a SNAPSHOT (target `version` for the keys without
 * their own, targets: n pairs (u64 key, i64 version), read until the
 * request completes) or a SNAPREAD to one server. */
int psc_snapshot_post(ps_client *c, int server, int64_t version, const void *targets,
                      size_t bytes, psc_snap_io *io, ps_request *req);
int psc_snapread_post(ps_client *c, int server, psc_page_io *io, ps_request *req);

#endif
