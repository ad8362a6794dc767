/* Checkpoints of one server's shard: the file format, writing it atomically,
 * finding and checking the newest valid one.  No sockets and no threads here;
 * server/ckpt_coord.c decides when (docs/OPERATIONS.md "Checkpoints").
 *
 * File DIR/shard-<rank>-<seq>.ckpt (seq: 12 decimal digits, growing), all
 * integers and floats little-endian:
 *
 *   header   "PSCKPT1\n", u32 format (1), u32 header bytes, u64 seq,
 *            u64 config fingerprint, i32 rank, num_servers, num_workers, mode,
 *            max_staleness, optimizer kind, f32 lr, momentum, beta1, beta2, eps,
 *            weight_decay, u64 model fingerprint (from the workers' hello),
 *            u64 chunks, i64 lowest and highest chunk version, u64 counters
 *            (pushes, pulls, inits, updates, duplicates, bytes in),
 *            u8 per worker rank: 1 = said hello
 *   chunks   u64 key, u32 chunk, u32 state arrays, u64 n, u64 total,
 *            i64 version, i64 clock per worker, f32 weights[n], then each
 *            optimizer state array f32[n]
 *   trailer  u32 CRC-32 (zlib) of every byte before it
 *
 * Writing: DIR/shard-<rank>.tmp is written, fsync'ed and renamed to the
 * versioned name, then the directory is fsync'ed, so a crash leaves either
 * the old set of files or the new one, never a half-written .ckpt; then all
 * but the newest `keep` checkpoints are removed.
 *
 * Consistency: each update thread serializes its own chunks between two of
 * its messages (ps_ckpt_serialize), so no update is half in a checkpoint.  In
 * sync mode a chunk's clocks are stored as at most its version: gradients of
 * a round that was still open are not in the weights, so their pushes must be
 * applied again after a restore (updater.c defers their acknowledgements until
 * the round is complete for exactly that reason). */
#ifndef PS_CHECKPOINT_H
#define PS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "ps_proto.h"
#include "shard.h"

#define PS_CKPT_KEEP 2

/* What a checkpoint says about the server that wrote it. */
typedef struct ps_ckpt_meta {
    uint64_t seq;
    uint64_t config_fp;
    int rank, num_servers, num_workers, mode, max_staleness;
    ps_opt_config opt;
    uint64_t model_fp;
    uint64_t nchunks;
    int64_t min_version, max_version;
    ps_stats counters;    /* pushes, pulls, inits, updates, dup_dropped, bytes_in */
    const uint8_t *hello; /* num_workers flags; owned by whoever filled the meta */
} ps_ckpt_meta;

/* One update thread's chunks, serialized (the chunk records above). */
typedef struct ps_ckpt_part {
    void *buf;           /* malloc'd; whoever holds the part frees it */
    size_t len;
    uint64_t nchunks;
    int64_t min_version, max_version; /* valid when nchunks > 0 */
    ps_stats counters;
} ps_ckpt_part;

/* The configuration fingerprint: FNV-1a over rank, servers, workers, mode,
 * staleness and the optimizer with its hyper-parameters. */
uint64_t ps_ckpt_config_fp(int rank, int num_servers, int num_workers, int mode,
                           int max_staleness, const ps_opt_config *opt);

/* Serialize every chunk of s (the caller's thread owns s).  PS_ENOMEM. */
int ps_ckpt_serialize(const ps_shard *s, int mode, int num_workers, ps_ckpt_part *out);

/* Write parts under dir as checkpoint m->seq (see above), keep the newest
 * `keep`.  *path gets the final file name; *bytes its size.  PS_EIO with the
 * failing step in why. */
int ps_ckpt_write(const char *dir, const ps_ckpt_meta *m, const ps_ckpt_part *parts, int nparts,
                  int keep, char *path, size_t path_len, uint64_t *bytes, char *why,
                  size_t why_len);

/* Checkpoint files of server `rank` under dir, newest first: *seqs (malloc'd)
 * gets their sequence numbers.  Returns the count (0: none), or -1 when dir
 * cannot be read (why says). */
int ps_ckpt_list(const char *dir, int rank, uint64_t **seqs, char *why, size_t why_len);

/* The file name of checkpoint seq of rank under dir. */
void ps_ckpt_path(const char *dir, int rank, uint64_t seq, char *out, size_t len);

/* A checkpoint read into memory and checked (size, magic, CRC-32, every
 * record in bounds). */
typedef struct ps_ckpt_file {
    ps_ckpt_meta meta;
    unsigned char *data;
    size_t size;
    size_t first;        /* offset of the first chunk record */
} ps_ckpt_file;

/* Read and check path.  PS_EDATA (corrupt: why says how), PS_EIO,
 * PS_ENOMEM.  Free with ps_ckpt_file_free. */
int ps_ckpt_read(const char *path, ps_ckpt_file *f, char *why, size_t why_len);
void ps_ckpt_file_free(ps_ckpt_file *f);

/* Chunk record i-th in turn: start with *off = f->first; 1 while there is
 * one (v filled, pointing into f->data), 0 at the end. */
int ps_ckpt_next_chunk(const ps_ckpt_file *f, size_t *off, ps_shard_chunk_view *v);

/* PS_EMISMATCH when the checkpoint was written with another configuration;
 * why names the flag and both values. */
int ps_ckpt_check_config(const ps_ckpt_meta *m, int rank, int num_servers, int num_workers,
                         int mode, int max_staleness, const ps_opt_config *opt, char *why,
                         size_t why_len);

#endif
