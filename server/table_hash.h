/* The rows of one table store (server/table.h), as memory: the
 * open-addressing hash from id to slot, the slabs that hold the row
 * records, the LRU list of a capped table, the dirty bits and deletion list
 * of incremental checkpoints, and the memory charge of all of it.  The
 * lowest layer of the table store: it knows nothing of optimizers,
 * initializers or rounds.  A row record is its 8-byte id and `row_floats`
 * floats (the values and the optimizer state, which the layers above lay
 * out); beside it a slab may keep a 32-bit count per row (adam's) and, in a
 * capped table, the LRU links.  table.h's header comment has the layout and
 * the costs.
 *
 * A new row gets its record's id written and its count zeroed, nothing
 * else: whoever creates it fills its floats.  One tbl_rows belongs to one
 * thread. */
#ifndef PS_TABLE_HASH_H
#define PS_TABLE_HASH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ps_table_row.h"

/* A hash entry: 0 empty, else (slot + 1) | (TBL_DIRTY when the row changed
 * since the last tbl_mark_clean). */
#define TBL_DIRTY 0x80000000u
#define TBL_SLOT 0x7fffffffu
#define TBL_NIL UINT32_MAX /* no slot: the ends of the LRU list */
/* Slab 0 holds 1 << TBL_SMALL rows, slab j (1 <= j <= big - TBL_SMALL) holds
 * 1 << (TBL_SMALL + j - 1), every later one 1 << big (t->big). */
#define TBL_SMALL 4
#define TBL_SLAB_BYTES (2u << 20)
/* Rows at most (an entry holds slot + 1 in 31 bits). */
#define TBL_MAX_ROWS 0x7fffffffull

typedef struct tbl_rows_config {
    uint64_t table;      /* the table's key: for messages only */
    uint32_t row_floats; /* floats per record after the id */
    int counts;          /* keep a 32-bit count per row */
    uint64_t max_rows;   /* 0: no cap; else evict the least recently touched */
    uint64_t max_memory;        /* bytes, over everything sharing mem_used */
    _Atomic uint64_t *mem_used; /* shared charge; NULL: a private counter */
    /* Per-worker shares of the table memory (see "Makers" below); NULL: none */
    _Atomic uint64_t *worker_mem; /* num_workers counters, shared by every table */
    int num_workers;
    uint64_t worker_share;        /* bytes of rows one worker may have made */
} tbl_rows_config;

/* Makers.  A row is charged, at tbl_row_cost bytes, to the worker whose
 * request made it (t->maker when it is created; TBL_NO_MAKER: nobody, a
 * restored row), in cfg.worker_mem: the layer above takes the charge
 * before it makes rows (tbl_worker_charge, refused past worker_share) and
 * gives back what it did not make.  A capped table keeps each row's maker
 * beside its LRU links, and an evicted or deleted row's charge goes back to
 * its maker; an uncapped table's rows leave only with the table. */
#define TBL_NO_MAKER UINT32_MAX

typedef struct tbl_slab {
    char *rec;     /* row records, stride bytes each: u64 id, then row_floats floats */
    uint32_t *cnt; /* the per-row counts, or NULL */
    uint32_t *lru; /* capped: prev, next slot and maker per row; else NULL */
} tbl_slab;

typedef struct tbl_rows {
    tbl_rows_config cfg;
    size_t stride;  /* bytes per row record: 8 + 4 * row_floats, no padding */
    int big;        /* log2 of the rows of a full-size slab */
    tbl_slab *slabs;
    uint32_t nslabs, slabs_cap;
    uint64_t slot_cap;  /* rows the slabs hold */
    uint64_t rows;      /* rows that exist, in slots 0 .. rows-1 */
    uint64_t reserved;  /* rows the layer above may still create without reserving
                           (its open sync round's); counted by tbl_has_room/reserve */
    uint32_t *map;      /* the hash: hcap entries, linear probing, <= 3/4 full */
    uint64_t hcap;
    uint64_t map_gen;   /* raised whenever entries move (growth, deletion) */
    uint32_t lru_head, lru_tail; /* capped: most and least recently touched */
    uint32_t maker;     /* the worker the rows created now are charged to */
    uint32_t row_cost;  /* bytes a row is charged to its maker */
    int tracking;       /* deletions recorded (after the first tbl_mark_clean) */
    int deleted_lost;   /* out of memory recording one: the next checkpoint is full */
    uint64_t *deleted;
    size_t ndeleted, deleted_cap;
    uint64_t bytes;     /* charged by this table (the layers above charge here too) */
    _Atomic uint64_t own_mem;
    uint64_t created, evicted, lookups, probes; /* counters */
} tbl_rows;

/* ---- hashing ---- */
/* The hash of an id inside a table: salted, so that the ids one server holds
 * (placed on it by another hash of the id, ps_table_row.h) spread over its
 * entries. */
static inline uint64_t tbl_hash(uint64_t id) { return ps_table_mix(id ^ 0x6a09e667f3bcc909ull); }

/* Home entry of hash h in a hash of hcap entries (any size: multiply-shift). */
static inline uint64_t tbl_home(uint64_t h, uint64_t hcap)
{
    return (uint64_t)(((unsigned __int128)h * hcap) >> 64);
}

/* ---- slots ---- */
static inline void tbl_locate(const tbl_rows *t, uint32_t s, uint32_t *j, uint32_t *o)
{
    if (s < (1u << TBL_SMALL)) {
        *j = 0;
        *o = s;
    } else if ((s >> t->big) == 0) {
        int b = 31 - __builtin_clz(s);
        *j = (uint32_t)(b - TBL_SMALL + 1);
        *o = s - (1u << b);
    } else {
        *j = (uint32_t)(t->big - TBL_SMALL) + (s >> t->big);
        *o = s & ((1u << t->big) - 1);
    }
}

static inline char *tbl_rec(const tbl_rows *t, uint32_t s)
{
    uint32_t j, o;
    tbl_locate(t, s, &j, &o);
    return t->slabs[j].rec + (size_t)o * t->stride;
}

static inline uint64_t tbl_rec_id(const char *rec)
{
    uint64_t id;
    memcpy(&id, rec, 8);
    return id;
}

/* The floats of a record (values, then state). */
static inline float *tbl_rec_w(char *rec) { return (float *)(rec + 8); }

/* The count of slot s (NULL without counts) */
static inline uint32_t *tbl_cnt(const tbl_rows *t, uint32_t s)
{
    uint32_t j, o;
    tbl_locate(t, s, &j, &o);
    return t->slabs[j].cnt ? t->slabs[j].cnt + o : NULL;
}

/* The slot of the entry at pos. */
static inline uint32_t tbl_slot_at(const tbl_rows *t, uint64_t pos)
{
    return (t->map[pos] & TBL_SLOT) - 1;
}

/* Position of id's entry in the hash (*found = 1), or of the empty entry
 * where it would go (*found = 0).  Counted in lookups and probes. */
static inline uint64_t tbl_find(tbl_rows *t, uint64_t id, int *found)
{
    uint64_t i = tbl_home(tbl_hash(id), t->hcap);
    t->lookups++;
    for (;;) {
        uint32_t e = t->map[i];
        if (!e) {
            *found = 0;
            return i;
        }
        t->probes++;
        if (tbl_rec_id(tbl_rec(t, (e & TBL_SLOT) - 1)) == id) {
            *found = 1;
            return i;
        }
        if (++i == t->hcap)
            i = 0;
    }
}

/* The same without counting (read-only lookups): the slot + 1, or 0. */
uint32_t tbl_lookup(const tbl_rows *t, uint64_t id);

/* An empty store with a small hash, charged `extra` bytes more (the layer
 * above's own allocations).  PS_ETOOBIG (past max_memory), PS_ENOMEM, with
 * why filled; nothing kept then. */
int tbl_rows_init(tbl_rows *t, const tbl_rows_config *cfg, uint64_t extra, char *why,
                  size_t why_len);
/* Free the slabs, the hash, the LRU and the deletion list, and give back
 * every byte charged here. */
void tbl_rows_free(tbl_rows *t);

/* Charge bytes to the shared counter unless that passes max_memory: 1 done,
 * 0 not.  The layers above charge their allocations here too. */
int tbl_charge(tbl_rows *t, uint64_t bytes);
void tbl_uncharge(tbl_rows *t, uint64_t bytes);
/* What the shared counter holds now. */
uint64_t tbl_mem_used(const tbl_rows *t);
/* Room for `more` rows beyond the rows and those reserved (within the cap):
 * slabs and hash, charged together with `extra` bytes the caller allocates
 * itself.  PS_ETOOBIG or PS_ENOMEM with nothing changed (extra not
 * charged). */
int tbl_reserve(tbl_rows *t, uint64_t more, uint64_t extra, char *why, size_t why_len);
/* Do `more` new rows fit without allocating? */
int tbl_has_room(const tbl_rows *t, uint64_t more);
/* A new row for id, whose lookup ended at empty entry pos: its record's id
 * set and its count 0 (the caller fills its floats), dirty, most recently touched (in
 * a full capped table the least recently touched row is evicted first, its
 * charge back to its maker), made by t->maker (charged already).
 * Room must be reserved.  Returns the position of its entry. */
uint64_t tbl_create_row(tbl_rows *t, uint64_t id, uint64_t pos);
/* Charge `rows` rows to worker `rank`'s share (nothing without shares or
 * for a rank out of range): 0, or PS_ETOOBIG with nothing charged when
 * that would pass it, why naming the numbers and what to do. */
int tbl_worker_charge(tbl_rows *t, int rank, uint64_t rows, char *why, size_t why_len);
/* Give `rows` rows' charge back to worker `rank`. */
void tbl_worker_uncharge(tbl_rows *t, int rank, uint64_t rows);

/* Move slot s to the front of the LRU list (capped tables; else nothing). */
void tbl_touch(tbl_rows *t, uint32_t s);
/* The slot touched just before s (capped tables; TBL_NIL: s is the least recent). */
uint32_t tbl_lru_prev(const tbl_rows *t, uint32_t s);
/* Delete the row whose entry is at pos: its entry, its slot (the last row
 * moves into it), its place in the LRU list; recorded as a deletion. */
void tbl_delete_row(tbl_rows *t, uint64_t pos);
/* A checkpoint holds every change so far: clear the dirty bits and the
 * deletion list, and record deletions from now on. */
void tbl_mark_clean(tbl_rows *t);

#endif
