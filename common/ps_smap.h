/* The server map of a job whose servers are added and removed while it
 * trains (docs/DESIGN.md "Keys, chunks, placement"): which server slot holds
 * each movable object, and the plans that move objects when a slot comes or
 * goes.  Pure: no sockets, no threads, no globals; the caller serializes
 * writers against readers (a map is plain data).
 *
 * Objects are dense chunks (key = the tensor's key, a = the chunk index,
 * b = 0) and table partitions (key = the table's key, a = the home server h,
 * b = the partition index p of common/ps_table_row.h).  A partition is moved
 * whole and keeps its identity (h, p) wherever it is.  Each object has a
 * DEFAULT owner, its home (a chunk: common/ps_placement.c's server; a
 * partition: h), and a current owner; the map lists only the OVERRIDES, the
 * objects whose owner is not their home, so a job that never moved anything
 * has an empty map and a lookup costs nothing.
 *
 * Slots: slot i is one server process's endpoint.  Slots 0..S0-1 are the
 * servers named at start; an added server takes the next number; a removed
 * slot stays in the list, marked removed, and its number is never reused, so
 * a partition's home h always names the same slot.
 *
 * The epoch starts at 0 and grows by 1 with each change (a slot added or
 * removed, a list of moves applied), so a client holding an older map can
 * tell.
 *
 * The encoded map (a MAP reply's payload, the coordinator's log),
 * little-endian, every part 8-byte aligned:
 *   head      "PSSMAP1\0", u64 epoch, u32 slots (1..PS_SMAP_MAX_SLOTS),
 *             u32 overrides (0..PS_SMAP_MAX_OVERRIDES)
 *   each slot u32 state (1 live, 2 removed), u32 length of its endpoint
 *             (1..PS_ENDPOINT_MAX-1 bytes, printable ASCII 0x20..0x7e, no
 *             terminator), the endpoint, NUL padded to 8
 *   each override (24 bytes), sorted by (kind, key, a, b), no duplicates:
 *             u32 kind, u32 a, u64 key, u32 b, i32 owner (a live slot; a
 *             partition's owner is not its home a, which is a slot; a
 *             chunk's b is 0)
 * Nothing follows the last override. */
#ifndef PS_SMAP_H
#define PS_SMAP_H

#include <stddef.h>
#include <stdint.h>

#include "ps_limits.h" /* PS_ENDPOINT_MAX */

enum { PS_SMAP_CHUNK = 1, PS_SMAP_PART = 2 };
enum { PS_SMAP_LIVE = 1, PS_SMAP_REMOVED = 2 };
enum { PS_SMAP_ADD = 1, PS_SMAP_REMOVE = 2 }; /* a plan's op */

#define PS_SMAP_MAX_SLOTS 256
/* Overrides one map may hold: 16 Mi of 24 encoded bytes (384 MiB) stays
 * inside one message's PS_MAX_PAYLOAD_BYTES. */
#define PS_SMAP_MAX_OVERRIDES (1u << 24)
#define PS_SMAP_HEAD_BYTES 24
#define PS_SMAP_OVERRIDE_BYTES 24

typedef struct ps_smap_id {
    uint32_t kind; /* PS_SMAP_CHUNK or PS_SMAP_PART */
    uint64_t key;  /* the tensor's or the table's key */
    uint32_t a;    /* chunk: its index; partition: its home server h */
    uint32_t b;    /* chunk: 0; partition: its index p on h */
} ps_smap_id;

/* One object of a job's inventory (what the planner is given). */
typedef struct ps_smap_obj {
    ps_smap_id id;
    uint64_t bytes; /* weights + optimizer state + rows */
    int32_t home;   /* default owner */
    int32_t owner;  /* current owner */
} ps_smap_obj;

/* One object to move.  home rides along so applying the move knows whether
 * the object is going back to its default owner (a chunk's home is not in
 * its id). */
typedef struct ps_smap_move {
    ps_smap_id id;
    uint64_t bytes;
    int32_t home, from, to;
} ps_smap_move;

typedef struct ps_smap_override {
    ps_smap_id id;
    int32_t owner;
} ps_smap_override;

typedef struct ps_smap_slot {
    uint32_t state; /* PS_SMAP_LIVE or PS_SMAP_REMOVED */
    char endpoint[PS_ENDPOINT_MAX];
} ps_smap_slot;

/* Owns slots (room for PS_SMAP_MAX_SLOTS, so adding one never moves them)
 * and over (replaced by each ps_smap_apply: keep no pointer into it across
 * one).  Free with ps_smap_free. */
typedef struct ps_smap {
    uint64_t epoch;
    ps_smap_slot *slots;
    int nslots;
    int nlive;
    ps_smap_override *over; /* sorted by id (ps_smap_id_cmp), no duplicates */
    size_t nover;
} ps_smap;

/* A plan: moves in the order chosen (deterministic), their bytes in all.
 * Owns moves (free with ps_smap_plan_free). */
typedef struct ps_smap_plan {
    int op;   /* PS_SMAP_ADD or PS_SMAP_REMOVE */
    int slot; /* the slot added or removed */
    ps_smap_move *moves;
    size_t n;
    uint64_t bytes;
} ps_smap_plan;

/* <0, 0, >0 as x orders before, equal to, after y: by kind, key, a, b. */
int ps_smap_id_cmp(const ps_smap_id *x, const ps_smap_id *y);

/* A map of n (1..PS_SMAP_MAX_SLOTS) live slots with these endpoints, epoch
 * 0, no overrides.  PS_EINVAL (why says) for a bad count or endpoint (empty,
 * PS_ENDPOINT_MAX bytes or longer, a character outside 0x20..0x7e, the same
 * as another live slot's); PS_ENOMEM.  On failure *m is empty. */
int ps_smap_init(ps_smap *m, const char *const *endpoints, int n, char *why, size_t why_len);
void ps_smap_free(ps_smap *m);

/* Add a live slot for endpoint: its number (the next one) in *slot; epoch
 * + 1.  PS_ETOOBIG past PS_SMAP_MAX_SLOTS slots, PS_EINVAL for an endpoint
 * init would refuse, PS_ENOMEM; the map is unchanged on failure. */
int ps_smap_add_slot(ps_smap *m, const char *endpoint, int *slot, char *why, size_t why_len);

/* Mark a slot removed; epoch + 1.  The caller first moves its objects off
 * (ps_smap_plan_remove, ps_smap_apply): PS_ESTATE when an override still
 * names it as owner (objects whose home it is cannot be seen here: the
 * caller's inventory says).  PS_EINVAL for a slot out of range, already
 * removed, or the last live one. */
int ps_smap_remove_slot(ps_smap *m, int slot, char *why, size_t why_len);

/* The current owner of the object id whose default owner is home. */
int ps_smap_owner(const ps_smap *m, const ps_smap_id *id, int home);

static inline int ps_smap_chunk_owner(const ps_smap *m, uint64_t key, uint32_t chunk, int home)
{
    ps_smap_id id = {PS_SMAP_CHUNK, key, chunk, 0};
    return ps_smap_owner(m, &id, home);
}

static inline int ps_smap_part_owner(const ps_smap *m, uint64_t table, int home, uint32_t part)
{
    ps_smap_id id = {PS_SMAP_PART, table, (uint32_t)home, part};
    return ps_smap_owner(m, &id, home);
}

/* Apply moves[0..n-1] all or none: each object's owner becomes its `to`
 * (an override added or changed, or dropped when `to` is its home); epoch
 * + 1.  PS_EINVAL (why says, naming the move) for a bad id (kind, a chunk's
 * b not 0, a partition's a not its home), a home that is not a slot, a `to`
 * that is not a live slot or equals `from`, a `from` that is not the
 * object's owner in this map, the same object twice; PS_ETOOBIG past
 * PS_SMAP_MAX_OVERRIDES; PS_ENOMEM.  The map is unchanged on failure. */
int ps_smap_apply(ps_smap *m, const ps_smap_move *moves, size_t n, char *why, size_t why_len);

/* The overrides owned by slot (objects there away from their home): how
 * many; the first cap of them into out (sorted by id). */
size_t ps_smap_held(const ps_smap *m, int slot, ps_smap_override *out, size_t cap);

/* Plan the moves onto slot, just added (live, normally holding nothing):
 * only from other live slots to it, largest objects that still fit first,
 * from the most loaded slots first, so it ends close to total/L (L live
 * slots, it included): it receives at most total/L + the largest object's
 * bytes, ends with at least total/L - the largest object's bytes while
 * other slots hold objects and at most total/L + half the largest (it goes
 * past total/L only to end nearer it), each move leaves it lighter than the
 * slot the object left was, and no other slot's load grows.  Deterministic:
 * ties go to the lower (kind, key, a, b) and the lower slot.
 *
 * inv[0..n-1] is every object of the job, each once, with its bytes, home
 * and current owner, which must be what m says.  PS_EINVAL (why says) for a
 * slot out of range or not live, an object with a bad id, a home that is
 * not a slot, an owner that is not a live slot or not m's, a duplicate
 * object, an override of m missing from inv, bytes that overflow; PS_ENOMEM.
 * The caller frees *plan with ps_smap_plan_free (empty on failure). */
int ps_smap_plan_add(const ps_smap *m, const ps_smap_obj *inv, size_t n, int slot,
                     ps_smap_plan *plan, char *why, size_t why_len);

/* Plan moving every object slot holds onto the other live slots: largest
 * first onto the least loaded (ties: the lower slot); nothing else moves.
 * The same inventory and refusals as ps_smap_plan_add, and PS_EINVAL for
 * the last live slot. */
int ps_smap_plan_remove(const ps_smap *m, const ps_smap_obj *inv, size_t n, int slot,
                        ps_smap_plan *plan, char *why, size_t why_len);
void ps_smap_plan_free(ps_smap_plan *plan);

/* One line for the log into buf (always terminated, cut to len):
 * "add slot 4 (tcp://h:5555): 3 objects, 52.4 MB from slots 0 (1), 2 (2)",
 * "remove slot 1 (tcp://h:5556): 2 objects, 8.0 MB to slots 0 (1), 2 (1)",
 * "add slot 4 (tcp://h:5555): nothing to move".  MB are 10^6 bytes.
 * m is the map the plan was made with. */
void ps_smap_plan_describe(const ps_smap *m, const ps_smap_plan *plan, char *buf, size_t len);

/* One line for the log: "epoch 3: 5 slots, 4 live (0 tcp://a:1, 1 ...);
 * 12 objects away from home" (cut to len, always terminated). */
void ps_smap_describe(const ps_smap *m, char *buf, size_t len);

/* The encoded map's bytes (the layout above). */
size_t ps_smap_encoded_bytes(const ps_smap *m);
/* Write it into buf (ps_smap_encoded_bytes(m) of them, any alignment). */
void ps_smap_encode(const ps_smap *m, unsigned char *buf);
/* Read an encoded map of len bytes (network input) into *m (the caller
 * frees it).  PS_EPROTO (why names what) for anything the layout does not
 * allow: truncated or trailing bytes, a bad magic, counts beyond the
 * limits, a bad slot state, an endpoint empty, too long, with a character
 * outside 0x20..0x7e or the same as another live slot's, no live slot, an
 * override with a bad id, out of order or repeated, an owner that is not a
 * slot, is removed, or is a partition's home; PS_ENOMEM.  *m is empty on
 * failure. */
int ps_smap_decode(const unsigned char *buf, size_t len, ps_smap *m, char *why, size_t why_len);

#endif
