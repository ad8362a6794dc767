/* An update thread's tables (updater_tables.c), as updater.c calls them. */
#ifndef PS_UPDATER_TABLES_H
#define PS_UPDATER_TABLES_H

#include "updater_reply.h"

/* The tables (updater_tables.c).  upd_sparse: a SPULL, SPUSH or SPUSHPULL
 * (frames pl[0..2] as its row of the message table has them, or with
 * PS_FLAG_SHM all of it in r->shm; the I/O thread checked them); 1 when r
 * is kept (answered later), 0 when it was answered. */
int upd_sparse(ps_updater *u, req_ctx *r, const ps_header *h, zmq_msg_t *pl);
/* PS_CMD_TABLE: take this thread's partition of a table just declared. */
void upd_table(ps_updater *u, const ps_cmd_frame *cf);
/* The partitions' hooks (table_part.h). */
void upd_thook_release(void *user, void *v, int rc, const char *why);
void upd_thook_ready(void *user, void *waiter, int64_t version);
/* A sparse reply's rows are read into u->rows, which is charged to
 * --max-memory; one grown past UPD_ROWS_KEEP floats (a large request) is
 * freed after its reply, as upd_rows_shrink does (also at the end). */
#define UPD_ROWS_KEEP (1u << 20)
void upd_rows_shrink(ps_updater *u);
/* A kept push's rows go into their round: from the arena, copied and
 * checked now (upd_take_from_arena); refused, the push is answered with the
 * error. */
int upd_thook_take(void *user, void *v, const float **g, size_t len, char *why,
                   size_t why_len);

#endif
