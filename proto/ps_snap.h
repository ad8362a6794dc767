/* One item of a server's snapshot (an export, docs/PROTOCOL.md "Export and
 * readers"):
 * a dense chunk or a table partition with its optimizer state, as a byte
 * stream the server lays out (server/snapshot.c), SNAPREAD carries in pages
 * and the exporter parses (client/export.c).  No state, no sockets.
 *
 * The stream, little-endian, every part 8-byte aligned:
 *   head   "PSSNAP1\0", u32 head bytes, u32 kind (1 chunk, 2 table
 *          partition), u32 index (the chunk's, or the partition's), u32 the
 *          server's rank, u64 key, i64 version, u64 total (a chunk: elements
 *          of its tensor; a partition: 0), u64 n (a chunk: its elements; a
 *          partition: its rows), u32 dim (a partition's floats per row; a
 *          chunk: 1), u32 state arrays, u32 flags (1: taken behind the
 *          version asked for), u32 state floats per row (dim; row-wise
 *          adagrad's 1; a chunk: 1), then the declaration: every field of
 *          PS_TABLE_DECL_FIELDS as its C type, i32 the optimizer's kind and
 *          each hyper-parameter of PS_OPT_PARAMS as its C type (a chunk:
 *          only the server's optimizer, the rest 0), then the table's name
 *          (the TABLE declaration's `nm`: PS_TABLE_NAME_MAX + 1 bytes, NUL
 *          padded; "" none or a chunk), padded to 8
 *   data   a partition: u64 ids[n], u32 counts[n] (adam's per-row t, padded
 *          to 8), f32 values[n x dim], each state array f32[n x slen];
 *          a chunk: f32 values[n], each state array f32[n]. */
#ifndef PS_SNAP_H
#define PS_SNAP_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

enum { PS_SNAP_CHUNK = 1, PS_SNAP_PART = 2 };
#define PS_SNAP_MAX_STATE 4
#define PS_SNAP_BEHIND 1u /* flags: taken at a version below the one asked for */

typedef struct ps_snap_item {
    uint32_t kind, index;
    int32_t server;
    uint64_t key;
    int64_t version;
    uint64_t total, n;
    uint32_t dim, nstate, flags;
    uint32_t slen;         /* floats of each state array per row: dim, row-wise adagrad's 1 */
    ps_table_options decl; /* a partition's declaration; a chunk's: opt alone */
    char name[PS_TABLE_NAME_MAX + 1]; /* a partition's table's name, or "" */
    /* the data: into the stream (ps_snap_layout, ps_snap_parse) */
    uint64_t *ids;         /* a partition's n ids; NULL for a chunk */
    uint32_t *counts;      /* a partition's n counts; NULL for a chunk */
    float *w;              /* n x dim values */
    float *state[PS_SNAP_MAX_STATE]; /* nstate arrays of n x slen */
} ps_snap_item;

/* The stream's bytes for it's kind, n, dim, nstate and slen. */
size_t ps_snap_bytes(const ps_snap_item *it);

/* Write it's head into buf (ps_snap_bytes(it) of them) and point it's data
 * pointers into buf, for the caller to fill. */
void ps_snap_layout(ps_snap_item *it, unsigned char *buf);

/* Read a stream of len bytes (8-byte aligned) into *it, its data pointers
 * into buf.  PS_EPROTO (why says) when it is not one. */
int ps_snap_parse(unsigned char *buf, size_t len, ps_snap_item *it, char *why, size_t why_len);

#endif
