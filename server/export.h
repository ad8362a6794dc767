/* The I/O thread's side of exports (docs/OPERATIONS.md "Export and
 * serve"): one snapshot session per server.  A SNAPSHOT starts it (the
 * I/O thread sends PS_CMD_SNAP to every update thread, server/snapshot.h
 * says what each takes), its reply goes once every thread's items came,
 * and SNAPREAD hands out the items' streams page by page from the
 * connection that asked, without copies.  No sockets: it says what to
 * send.
 *
 * A session ends when every page of every item has gone out (each item's
 * memory goes as soon as its last page has), when another SNAPSHOT comes
 * (from anyone: the old reader's next page is refused), or after
 * PS_EXPORT_IDLE_MS without a request.  A resent SNAPSHOT (same
 * connection and request id) is the same session.
 *
 * Threads: the I/O thread alone; the pages' frames give their references
 * back from ZeroMQ's threads (ps_snap_buf is atomic). */
#ifndef PS_EXPORT_H
#define PS_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ps_proto.h"
#include "snapshot.h"
#include "updater_frames.h"

#define PS_EXPORT_IDLE_MS 120000
/* the longest a SNAPSHOT may wait for items one behind (its `tot`, ms) */
#define PS_EXPORT_MAX_WAIT_MS 600000

typedef struct ps_export ps_export;

int ps_export_create(int threads, ps_export **out);
void ps_export_destroy(ps_export *e);

/* A SNAPSHOT h from route id (copied) with its targets frame (16 bytes per
 * key: u64 key, i64 version).  0: a new session (*token, and the targets
 * it keeps, for the PS_CMD_SNAP of each thread; *send 1) or a resend of the
 * session's request (*send 0: its reply goes when it is due; *send 2: it
 * went already, send *reply again).  PS_EPROTO (the targets frame),
 * PS_ENOMEM; why says. */
int ps_export_begin(ps_export *e, zmq_msg_t *id, const ps_header *h, const void *targets,
                    size_t bytes, int64_t now, uint64_t *token, const ps_snap_target **t,
                    size_t *nt, int *send, ps_header *reply, char *why, size_t why_len);

/* Thread i's PS_OUT_SNAP (its items are taken).  1 when the session's
 * reply is due: *id (moved out of the session) and *reply to send. */
int ps_export_part(ps_export *e, int i, ps_snap_frame *sf, int64_t now, zmq_msg_t *id,
                   ps_header *reply);

/* A SNAPREAD h from route id: 0 with *page (a frame over the item's bytes)
 * and *reply; else PS_ESTATE (no such session for this connection, or the
 * item sent already), PS_EPROTO (no such item or page), PS_ENOMEM; why
 * says. */
int ps_export_read(ps_export *e, zmq_msg_t *id, const ps_header *h, int64_t now,
                   zmq_msg_t *page, ps_header *reply, char *why, size_t why_len);

/* Periodically (at most every 100 ms while ps_export_busy): 1 when the
 * session's wait ran out (send PS_CMD_SNAP_FLUSH to every thread, once);
 * an idle session is dropped here. */
int ps_export_tick(ps_export *e, int64_t now);
int ps_export_busy(const ps_export *e);

/* Snapshots taken, and the bytes of their items, so far. */
uint64_t ps_export_count(const ps_export *e);

#endif
