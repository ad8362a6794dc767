/* An update thread's side of servers added and removed (updater_move.c):
 * PS_CMD_TAKE and PS_CMD_LOAD_MOVED (updater_frames.h), the table
 * partitions moved here from other servers, and requests for them
 * (PS_FLAG_AWAY).  Runs on the update thread alone. */
#ifndef PS_UPDATER_MOVE_H
#define PS_UPDATER_MOVE_H

#include "updater_reply.h"

/* No sync round of this thread (chunks, its tables, the partitions moved
 * here) holds a push: a snapshot or a take here needs no round's sums. */
int upd_quiet(const ps_updater *u);

/* PS_CMD_TAKE: done now (async, or sync at a quiet point) or queued until
 * the quiet point (upd_move_poll). */
void upd_move_take(ps_updater *u, const ps_cmd_frame *cf);
/* Sync: the TAKEs queued, done once the thread is quiet. */
void upd_move_poll(ps_updater *u);
/* PS_CMD_LOAD_MOVED. */
void upd_move_load(ps_updater *u, const ps_cmd_frame *cf);
/* PS_CMD_OBJECTS: every chunk and table partition here with its bytes,
 * answered PS_OUT_OBJECTS. */
void upd_move_objects(ps_updater *u);
/* At the end: TAKEs still queued answered PS_ECLOSED, then every moved-in
 * ps_tparts destroyed (their waiters cancelled). */
void upd_move_stop(ps_updater *u);

/* The ps_tparts a table request is for: its own, or with PS_FLAG_AWAY the
 * moved-in partition h->chunk of home h->home; NULL when this thread holds
 * no such partition (r answered PS_ENOTFOUND, saying so). */
ps_tparts *upd_req_tparts(ps_updater *u, req_ctx *r, const ps_header *h);

/* Request r names an object taken from this thread (r's not found): 1 and
 * where it went; else 0. */
int upd_move_where(const ps_updater *u, const req_ctx *r, int32_t *slot, const char **ep);

/* The error reply for a moved object: PS_EMOVED in h names the slot and
 * endpoint u->gone_* says (upd_error calls it). */
void upd_move_name_dest(const ps_updater *u, ps_header *h);

#endif
