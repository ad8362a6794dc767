/* ps_export --checkpoint-dir (docs/OPERATIONS.md "Export and serve"): an
 * export from the checkpoints of a job, with no server running.  Each
 * server's newest chain is restored in memory by the server's own code
 * (ckpt_coord.h: the checkpoint it would --restore, its deltas applied) and
 * its items taken by the server's snapshot (server/snapshot.h), as a live
 * export takes them, into the same writer (client/export_write.h): so an
 * export of a checkpoint equals the live export of the same state. */
#ifndef PS_EXPORT_CKPT_H
#define PS_EXPORT_CKPT_H

#include <stddef.h>
#include <stdint.h>

/* Export the checkpoints in ckpt_dir to out (with_state: the optimizer's
 * state too).  *bytes: the data files'.  PS_EDATA (no checkpoint, or one
 * that does not read back: why says), PS_EIO, PS_ENOMEM. */
int ps_export_checkpoints(const char *ckpt_dir, const char *out, int with_state, uint64_t *bytes,
                          char *why, size_t why_len);

#endif
