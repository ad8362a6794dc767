/* libps: an export's folder (docs/OPERATIONS.md "Export and serve"), from
 * snapshot items (proto/ps_snap.h) however they came: from the servers
 * (client/export.c) or from a checkpoint restored in memory
 * (tools/ps_export).  The items' chunks become whole tensors, the
 * partitions of a table one table with its ids sorted; .npy files and a
 * manifest, written as DIR.partial and renamed to DIR when all is on disk. */
#ifndef PS_EXPORT_WRITE_H
#define PS_EXPORT_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

typedef struct ps_export_writer ps_export_writer;

/* What the manifest says of the snapshot besides its items. */
typedef struct ps_export_info {
    const char *source;  /* "live" or "checkpoint" */
    const char *from;    /* the servers' endpoints, or the checkpoint directory */
    int mode;            /* PS_MODE_SYNC / ASYNC */
    int num_servers;
    int with_state;      /* the optimizer's state arrays and counts are written */
    int64_t target;      /* the version asked for; -1: none (each item as it was) */
    int own_targets;     /* keys had versions of their own (a worker's steps) */
} ps_export_info;

/* dir must not exist, or be an empty folder; a DIR.partial of an earlier
 * export that did not finish is removed.  PS_EINVAL, PS_EIO (why says). */
int ps_export_writer_open(const char *dir, const ps_export_info *info, ps_export_writer **out,
                          char *why, size_t why_len);
/* An item's stream (malloc'd, 8-byte aligned): the writer owns it from now
 * on, also on error.  PS_EPROTO (not an item), PS_ENOMEM. */
int ps_export_writer_add(ps_export_writer *w, unsigned char *buf, size_t len, char *why,
                         size_t why_len);
/* Write everything, then rename; w is freed.  *bytes: the data files'
 * bytes.  PS_EDATA (the items do not make whole tensors and tables: a
 * chunk missing, an id twice), PS_EIO, PS_ENOMEM; the partial folder is
 * removed on error. */
int ps_export_writer_finish(ps_export_writer *w, uint64_t *bytes, char *why, size_t why_len);
/* Give up: free w and remove the partial folder. */
void ps_export_writer_abort(ps_export_writer *w);

#endif
