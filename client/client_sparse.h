/* libps: the tables' requests (client_sparse.c): a sparse pull, push or
 * pushpull of the caller's ids turned into one message per (server,
 * partition), and their replies written back in the caller's order.
 *
 *  - Duplicate ids of a request are removed (a pushed id's gradient rows
 *    summed in the order they come, so the sum is the same every run); the
 *    unique ids keep the order of their first appearance.
 *  - Each unique id goes to the partition of its row
 *    (common/ps_table_row.h: server h mod S, partition (h / S) mod P of
 *    that server, P from its hello reply).
 *  - A push goes to EVERY partition of every server (one with no rows there
 *    says so with n = 0): the partitions' clocks then move as chunks' do.  A
 *    pushpull is a SPUSHPULL where rows are pulled and a SPUSH elsewhere; a
 *    pull goes only where it has ids.
 *  - A reply's rows go to every position of the caller's ids that names
 *    them (duplicates filled from the one row fetched), widened from the wire
 *    type.
 * The messages' ids and rows are copies (made here, on the comm thread,
 * narrowed to the wire type when the frames are built, or same host written
 * float32 to a block of the arena's stage, where the server also writes the
 * rows it answers with), so each resend is built afresh and no frame holds
 * the caller's buffers.  Comm thread only;
 * everything here is freed with its slot (client_requests.c). */
#ifndef PS_CLIENT_SPARSE_H
#define PS_CLIENT_SPARSE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "client_internal.h"
#include "client_requests.h"

/* The slots of one sparse request of type (PS_MSG_SPULL, SPUSH or
 * SPUSHPULL) on table t (an index of c->tables): pull ids[0..n) into dst;
 * push n (pushpull: npush) ids' gradient rows g; a pushpull pulls ids2
 * (n2).  step and npush (`m`) as the header's.  The slots are new, filled
 * and not sent: *slots (the module's scratch, valid until the next call)
 * gets their indices, and the return value their number.  r's pending is
 * not touched (the caller adds one per slot).  On failure (-1) nothing is
 * left and r has the error (PS_ENOMEM, PS_ETOOBIG: a partition's share is
 * over PS_MAX_SPARSE_IDS or the payload limit). */
long psc_sparse_begin(ps_client *c, uint32_t type, uint32_t t, ps_request *r,
                      const uint64_t *ids, size_t n, const float *g, const uint64_t *ids2,
                      size_t n2, float *dst, int64_t step, uint32_t npush, uint32_t **slots);

/* The frames of sparse slot i, after its header: f[0..*nf) (ids, rows in
 * `dtype`, ids to pull, as its type's layout), made now.  The header's n,
 * np and dim go to h.  0, or PS_ENOMEM (the frames made are closed). */
int psc_sparse_frames(const ps_client *c, uint32_t i, ps_header *h, uint32_t dtype,
                      zmq_msg_t *f, int *nf);

/* Same host: when slot i's server maps the arena and its stage has room,
 * write the slot's ids and rows to its block there (once made, kept until
 * the slot is freed) and fill the header for it (PS_FLAG_SHM, `o`, n, np,
 * dim, float32): 1, and no frame goes; else 0 (the frames go). */
int psc_sparse_shm(ps_client *c, uint32_t i, ps_header *h);

/* A reply to sparse slot i: its rows frame (checked against the header by
 * the caller) written to the caller's positions.  0, or PS_EPROTO when it is
 * not the reply this slot wants (why says). */
int psc_sparse_reply(const ps_client *c, uint32_t i, const ps_header *h, const zmq_msg_t *rows,
                     char *why, size_t why_len);

/* Sparse slot i was answered PS_EMOVED and goes to another server: a
 * block of the arena's stage it went through once is given back (that
 * server did not touch it; the next may not map the arena), so the next
 * send takes the path its server allows. */
void psc_sparse_moved(ps_client *c, uint32_t i);

/* Free a slot's sparse part, its share of the request's, and its block of
 * the arena's stage once the server is done with it: the slot table's
 * sp_free (client_requests.h), called when the slot is freed. */
void psc_sparse_sub_free(ps_client *c, psc_sparse_sub *sp);

/* Free the scratch (at close). */
void psc_sparse_free(ps_client *c);

#endif
