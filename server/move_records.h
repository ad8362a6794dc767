/* Objects moved between servers (servers added and removed while training
 * goes on, issue 33), as records: what an update thread takes out of its
 * stores (PS_CMD_TAKE, server/updater_frames.h) and what another server's
 * update thread loads (PS_CMD_LOAD_MOVED).  No sockets and no threads here.
 *
 * The movable objects: a dense chunk (tensor key, chunk index), and a table
 * partition (table key, home server h, partition p): partition p of table
 * key as server h placed it (common/ps_table_row.h), moved whole and keeping
 * that identity, with its home's partition count P_h, wherever it lives
 * (server/table_part.h: a moved-in ps_tparts of home h).
 *
 * A move block: one buffer, integers little-endian, each part 8-aligned:
 *   header    u32 magic "PSMV", u32 format (1), i32 num_workers, u32 the
 *             dense optimizer's state arrays, u64 chunks, u64 partitions,
 *             u64 chunk record bytes, u64 partition record bytes
 *   per chunk, in record order: i64 its optimizer's step count
 *             (ps_shard_get_state's; adam's t goes on from it)
 *   per partition, in record order: i32 home, i32 P_h
 *   the chunk records, then the partition records: server/checkpoint.h's
 *             format exactly (ps_ckpt_view_records reads them), every
 *             partition whole, every clock as it was (taken where no round of
 *             the thread held a push: a clock past the version is a rank
 *             that joins at a later round)
 * The I/O thread ships blocks as they are; ps_move_split cuts one into the
 * blocks of a destination's update threads. */
#ifndef PS_MOVE_RECORDS_H
#define PS_MOVE_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "shard.h"
#include "table_part.h"

enum { PS_MOVE_CHUNK = 1, PS_MOVE_PART = 2 };

/* One object to move. */
typedef struct ps_move_obj {
    uint32_t kind; /* PS_MOVE_CHUNK or PS_MOVE_PART */
    uint32_t b;    /* PART: the partition index p; CHUNK: 0 */
    uint64_t key;  /* the tensor's key, or the table's */
    uint64_t a;    /* CHUNK: the chunk index; PART: the home server h */
} ps_move_obj;

#define PS_MOVE_MAGIC 0x564d5350u /* "PSMV" */
#define PS_MOVE_FORMAT 1u

/* A move block read and checked (ps_move_view): its counts, the per-object
 * fields (pointers into the block) and the records as two checkpoint views
 * (ps_ckpt_next_chunk on chunks, ps_ckpt_next_part on parts). */
typedef struct ps_move_view {
    uint64_t nchunks, nparts;
    const unsigned char *opt_steps; /* nchunks x i64 */
    const unsigned char *homes;     /* nparts x (i32 home, i32 P_h) */
    ps_ckpt_file chunks, parts;
} ps_move_view;

/* The tparts among tps[0..ntps) that holds partition `part` of server
 * `home` (ps_tparts_cfg's home and part), or -1. */
int ps_move_find_tparts(ps_tparts *const *tps, size_t ntps, int home, uint32_t part);

/* Serialize objs[0..n) (each here: a chunk of s, or a partition in one of
 * tps[0..ntps), the caller's thread owning all) as one move block: *block
 * malloc'd (the caller's), *len its bytes.  Nothing changes in the stores.
 * Errors: PS_ENOTFOUND (an object is not here), PS_EINVAL (a bad kind, an
 * object named twice), PS_ENOMEM; why names the object. */
int ps_move_serialize(ps_shard *s, ps_tparts *const *tps, size_t ntps, const ps_move_obj *objs,
                      size_t n, int mode, int num_workers, void **block, size_t *len, char *why,
                      size_t why_len);

/* Read and check block[0, len) for num_workers workers and a dense
 * optimizer of nstate state arrays.  v borrows the block.  PS_EDATA (what
 * is wrong in why). */
int ps_move_view_block(const void *block, size_t len, int num_workers, int nstate,
                       ps_move_view *v, char *why, size_t why_len);

/* Where a loaded partition goes: the tparts of (home, part) on the loading
 * thread (its own when the partition comes home, else a moved-in one,
 * made when create is set and there is none yet with nparts P_h), or NULL:
 * none (create 0) or it cannot be made (why says, *rc the code). */
typedef ps_tparts *(*ps_move_place_fn)(void *user, int home, uint32_t part, int nparts,
                                       int create, int *rc, char *why, size_t why_len);

/* Load every object of block[0, len) (checked as ps_move_view_block does)
 * into s and the tparts place gives: chunks exactly (ps_shard_move_in),
 * partitions declared from their record and filled exactly
 * (ps_ckpt_fill_part, lenient 0).  All or nothing: an object here already
 * is PS_EMISMATCH before anything is loaded (never overwritten), and an
 * error part way (PS_ETOOBIG, PS_ENOMEM) removes what was loaded (their
 * hooks see nothing: no request waits on them yet).  *nchunks, *nparts: the
 * objects loaded.  Errors: PS_EDATA, PS_EMISMATCH, PS_ETOOBIG, PS_ENOMEM;
 * why says. */
int ps_move_load(ps_shard *s, const void *block, size_t len, int num_workers, int nstate,
                 ps_move_place_fn place, void *user, uint64_t *nchunks, uint64_t *nparts,
                 char *why, size_t why_len);

/* Cut block[0, len) into one block per update thread of a destination
 * server of rank `rank` with `threads` threads: a chunk (key, c) to
 * ps_server_owner(key, c, threads), a partition (h, p) to p when h == rank
 * (it comes home; p < threads), else to ps_server_away_owner(h, p, threads).
 * out[t], out_len[t] (threads entries): a malloc'd block (the caller's), or
 * NULL and 0 when thread t gets nothing.  PS_EDATA, PS_ENOMEM (nothing in
 * out then). */
int ps_move_split(const void *block, size_t len, int num_workers, int nstate, int rank,
                  int threads, void **out, size_t *out_len, char *why, size_t why_len);

#endif
