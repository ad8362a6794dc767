/* What an update thread does for readers and exports (updater_export.c):
 * a LOOKUP of rows of several tables in its partition, read-only, and its
 * part of an export's snapshot (server/snapshot.h). */
#ifndef PS_UPDATER_EXPORT_H
#define PS_UPDATER_EXPORT_H

#include "updater_reply.h"

/* A LOOKUP (frames pl[0] tables, pl[1] ids, checked by the I/O thread's
 * frame check): answered now with the rows in the request's order, a row
 * that does not exist with the initializer's values; nothing is created,
 * touched or counted but the request.  Errors: PS_ENOTFOUND (a table not
 * declared here), PS_EMISMATCH (a dim that is not the table's), PS_EPROTO
 * (ids that do not add up, or not of this partition), PS_ETOOBIG. */
void upd_lookup(ps_updater *u, req_ctx *r, const ps_header *h, zmq_msg_t *pl);

/* PS_CMD_SNAP: start this thread's part (a part under way is replaced:
 * answered as failed). */
void upd_snap_start(ps_updater *u, const ps_cmd_frame *cf);
/* After every message, and on PS_CMD_SNAP_FLUSH (force): take what is due;
 * when the part is over, send PS_OUT_SNAP. */
void upd_snap_poll(ps_updater *u, int force);
/* The thread stops: a part under way is dropped. */
void upd_snap_drop(ps_updater *u);

#endif
