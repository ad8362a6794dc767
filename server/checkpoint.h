/* Checkpoints of one server's shard: the file format, writing it atomically,
 * finding and checking the newest valid one.  No sockets and no threads here;
 * server/ckpt_coord.c decides when (docs/OPERATIONS.md "Checkpoints").
 *
 * File DIR/shard-<rank>-<seq>.ckpt (seq: 12 decimal digits, growing), all
 * integers and floats little-endian:
 *
 *   header   "PSCKPT1\n", u32 format (3), u32 header bytes, u64 seq,
 *            u64 config fingerprint, i32 rank, num_servers, num_workers, mode,
 *            max_staleness, optimizer kind, every hyper-parameter of the
 *            optimizer table as its C type, u64 model fingerprint (from the
 *            workers' hello), u64 chunks, i64 lowest and highest version (of
 *            chunks and table partitions), u64 counters (pushes, pulls, inits,
 *            updates, duplicates, bytes in), u64 prev (0: a full checkpoint;
 *            else the checkpoint this one holds the changes since), i32 threads,
 *            u32 0, u64 partitions, u8 per worker rank: 1 = said hello
 *   chunks   u64 key, u32 chunk, u32 state arrays, u64 n, u64 total,
 *            i64 version, i64 clock per worker, f32 weights[n], then each
 *            optimizer state array f32[n]
 *   tables   a record per table partition (server/table_part.h): u64 table,
 *            u32 partition, u32 flags (1: a delta: only the rows changed since
 *            `prev`, and the rows deleted since; else every row), i64 version,
 *            the declaration (dim, initializer, scale, seed, optimizer kind,
 *            every hyper-parameter, FTRL's beta, l1, l2, row cap, min count,
 *            filter cells: ps_table_decl.h's fields, each as its C type), u64
 *            counters (created, evicted, filtered pulls, filtered pushes,
 *            pulled, pushed, updated, rounds), u64 deleted, u64 order, u64
 *            filter cells, u64 rows, u32 state arrays, u32 0, i64 clock per
 *            worker, u64 deleted ids[deleted], u64 ids[order] (a capped table:
 *            every row from the least to the most recently touched), u8
 *            cells[filter cells], then each row: u64 id, u32 count (lazy adam's
 *            t), u32 0, f32 values[dim], each state array f32[dim]
 *   trailer  u32 CRC-32 (zlib) of every byte before it
 * (each record padded to 8 bytes).  Format 2 (no tables, no prev) is still
 * read.
 *
 * A chain: a full checkpoint, then deltas, each naming the one before it
 * (prev).  A delta holds every chunk whole and, of each table partition,
 * the rows changed and deleted since prev (a partition never in a
 * checkpoint before, or whose deletions could not be recorded, whole).
 * Restoring the newest file restores its chain from the full one, in order
 * (ckpt_coord.c); a full one is written every PS_CKPT_FULL_EVERY
 * checkpoints and after any that failed.
 *
 * Writing: DIR/shard-<rank>.tmp is written, fsync'ed and renamed to the
 * versioned name, then the directory is fsync'ed, so a crash leaves either
 * the old set of files or the new one, never a half-written .ckpt; then
 * every checkpoint older than the newest `keep` full ones is removed: the
 * chains of those stay whole, so a damaged newest full one leaves the chain
 * before it to restore (ckpt_restore.c). 
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
#include "table_part.h"

/* Full checkpoints kept, each with its deltas (the newest chain and the
 * one before it). */
#define PS_CKPT_KEEP 2
/* A full checkpoint after this many deltas (a chain is at most this long
 * plus one). */
#define PS_CKPT_FULL_EVERY 8

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
    uint64_t prev;        /* 0: full; else the checkpoint a delta builds on */
    int threads;          /* the writer's update threads: each table's partitions */
    uint64_t nparts;      /* table partition records */
    const uint8_t *hello; /* num_workers flags; owned by whoever filled the meta */
} ps_ckpt_meta;

/* One update thread's chunks and table partitions, serialized (the records
 * above). */
typedef struct ps_ckpt_part {
    void *buf;           /* the chunk records; malloc'd; whoever holds the part frees it */
    size_t len;
    void *tbuf;          /* the table partitions' records, the same way */
    size_t tlen;
    uint64_t nchunks, nparts;
    int64_t min_version, max_version; /* of chunks and partitions; valid when
                                         nchunks + nparts > 0 */
    ps_stats counters;
} ps_ckpt_part;

/* The configuration fingerprint: FNV-1a over rank, servers, workers, mode,
 * staleness and the optimizer with its hyper-parameters. */
uint64_t ps_ckpt_config_fp(int rank, int num_servers, int num_workers, int mode,
                           int max_staleness, const ps_opt_config *opt);

/* Serialize every chunk of s and every table partition of tp (NULL: none;
 * the caller's thread owns both): the partitions whole when full, else each as a delta
 * where its table allows (ps_table_delta_ok).  Then every table is marked
 * clean (the next delta starts here).  PS_ENOMEM (nothing is marked then). */
int ps_ckpt_serialize(const ps_shard *s, ps_tparts *tp, int mode, int num_workers, int full,
                      ps_ckpt_part *out);
/* (full 2: every partition whole, and no table is marked: a replica's
 * snapshot, which the checkpoints' delta chain does not see.) */

/* Single records, as ps_ckpt_serialize writes them (server/move_records.c
 * builds a move's from them).  exact: every clock as it is (a move, taken
 * where no round holds a push: a clock beyond the version is a rank that
 * joins at a later round), and a partition's optimizer as its table uses it
 * now (a HYPER's change since the declaration included; one scheduled for a
 * later sync round is not carried); 0: sync clocks stored as at most the
 * version (a checkpoint).  Each put returns the end of the record. */
size_t ps_ckpt_chunk_bytes(int num_workers, const ps_shard_chunk_view *v);
unsigned char *ps_ckpt_put_chunk(unsigned char *p, const ps_shard_chunk_view *v, int mode,
                                 int num_workers, int exact);
/* Partition i of tp (ps_tparts_view's order) as one whole record. */
size_t ps_ckpt_part_bytes(ps_tparts *tp, size_t i, int num_workers);
unsigned char *ps_ckpt_put_part(unsigned char *p, ps_tparts *tp, size_t i, int mode,
                                int num_workers, int exact);

/* Write parts under dir as checkpoint m->seq (see above), keep the newest
 * `keep` full ones and the deltas after them.  *path gets the final file
 * name; *bytes its size.  PS_EIO with the failing step in why. */
int ps_ckpt_write(const char *dir, const ps_ckpt_meta *m, const ps_ckpt_part *parts, int nparts,
                  int keep, char *path, size_t path_len, uint64_t *bytes, char *why,
                  size_t why_len);

/* Checkpoint files of server `rank` under dir, newest first: *seqs (malloc'd)
 * gets their sequence numbers.  Returns the count (0: none), or -1 when dir
 * cannot be read (why says). */
/* The `prev` of checkpoint seq as its header says, without reading the
 * rest: 0 (a full one, a format 2 file) or the seq it builds on; -1 when the
 * header cannot be read. */
int64_t ps_ckpt_prev_of(const char *dir, int rank, uint64_t seq);
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
    size_t first_part;   /* offset of the first table partition record */
} ps_ckpt_file;

/* Records held in memory as two files' views (a primary's snapshot for a
 * replacement member, server/repl.h): chunk records buf[0, len) (read with
 * ps_ckpt_next_chunk on *chunks) and partition records tbuf[0, tlen)
 * (ps_ckpt_next_part on *parts), each checked as ps_ckpt_read checks a
 * file's; the views borrow the buffers.  PS_EDATA with why. */
int ps_ckpt_view_records(const void *buf, size_t len, const void *tbuf, size_t tlen,
                         int num_workers, int nstate, ps_ckpt_file *chunks, ps_ckpt_file *parts,
                         char *why, size_t why_len);

/* A table partition's record as ps_ckpt_next_part reads it; pointers into
 * the file's data.  The id lists are little-endian u64 at any alignment:
 * ps_ckpt_id reads them. */
typedef struct ps_ckpt_part_view {
    uint64_t key;
    uint32_t part;
    int delta;
    int64_t version;
    ps_table_options decl;
    ps_table_counts counts;  /* created .. rounds */
    const int64_t *clock;    /* num_workers */
    size_t ndeleted, norder, ncells, nrows;
    const unsigned char *deleted, *order;
    const uint8_t *cells;
    const unsigned char *rows;
    size_t row_bytes;
    uint32_t nstate;
} ps_ckpt_part_view;

/* Read and check path.  PS_EDATA (corrupt: why says how), PS_EIO,
 * PS_ENOMEM.  Free with ps_ckpt_file_free. */
int ps_ckpt_read(const char *path, ps_ckpt_file *f, char *why, size_t why_len);
void ps_ckpt_file_free(ps_ckpt_file *f);

/* Chunk record i-th in turn: start with *off = f->first; 1 while there is
 * one (v filled, pointing into f->data), 0 at the end. */
int ps_ckpt_next_chunk(const ps_ckpt_file *f, size_t *off, ps_shard_chunk_view *v);
/* The same for the table partition records: start at f->first_part. */
int ps_ckpt_next_part(const ps_ckpt_file *f, size_t *off, ps_ckpt_part_view *v);
/* Row k of a partition record (v filled, pointing into the file). */
void ps_ckpt_part_row(const ps_ckpt_part_view *p, size_t k, ps_table_row_view *v);
/* Id k of a list of a partition record (deleted or order). */
uint64_t ps_ckpt_id(const unsigned char *list, size_t k);

/* PS_EMISMATCH when the checkpoint was written with another configuration;
 * why names the flag and both values. */
int ps_ckpt_check_config(const ps_ckpt_meta *m, int rank, int num_servers, int num_workers,
                         int mode, int max_staleness, const ps_opt_config *opt, char *why,
                         size_t why_len);

#endif
