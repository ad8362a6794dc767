/* ps_server --import DIR (docs/OPERATIONS.md "Export and serve"): a new
 * job's server starts with the tables of an export (a live job's, or
 * ps_export --checkpoint-dir's): each table declared as the export has it,
 * and of its rows those this server holds under its own number of servers
 * and --threads (common/ps_table_row.h places a row), with their optimizer
 * state and each table at the export's step (--import-state keep), or with
 * state 0 and step 0 (reset).  So an export of S servers goes into S'.
 * Before any update thread runs; no sockets.  The dense tensors of an
 * export are the model's state_dict: the workers load them (ps.torch
 * tables_from=); a frequency filter starts empty and a capped table's LRU
 * order follows the ids. */
#ifndef PS_IMPORT_H
#define PS_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_coord.h"

/* Import dir into to's table partitions (to->shards unused); to->declared
 * is called once per table.  state: PS_IMPORT_KEEP or PS_IMPORT_RESET.
 * *rows gets the rows put in here.  Errors: PS_ENOTFOUND (no manifest),
 * PS_EDATA (a file that does not read or fit: why names it), PS_ETOOBIG
 * (--max-memory), PS_ENOMEM. */
int ps_import_tables(const char *dir, int rank, int num_servers, int num_workers, int state,
                     const ps_ckpt_restore_to *to, uint64_t *rows, char *why, size_t why_len);

#endif
