/* Inside the table store (server/table.h): the struct shared by table.c (the
 * operations), table_hash.c (the hash, the slabs, the LRU list, memory) and
 * table_opt.c (the initializer and the row updates).  Not for other modules. */
#ifndef PS_TABLE_INTERNAL_H
#define PS_TABLE_INTERNAL_H

#include <string.h>

#include "table.h"

/* A hash entry: 0 empty, else (slot + 1) | (TBL_DIRTY when the row changed
 * since the last ps_table_mark_clean). */
#define TBL_DIRTY 0x80000000u
#define TBL_SLOT 0x7fffffffu
#define TBL_NIL UINT32_MAX /* no slot: the ends of the LRU list */
/* Slab 0 holds 1 << TBL_SMALL rows, slab j (1 <= j <= big - TBL_SMALL) holds
 * 1 << (TBL_SMALL + j - 1), every later one 1 << big (t->big). */
#define TBL_SMALL 4
#define TBL_SLAB_BYTES (2u << 20)

typedef struct tbl_slab {
    char *rec;     /* row records, t->stride bytes each: u64 id, values, state */
    uint32_t *cnt; /* adam: updates per row (t); else NULL */
    uint32_t *lru; /* capped: prev, next slot per row; else NULL */
} tbl_slab;

struct ps_table {
    ps_table_config cfg;
    int nstate;
    size_t stride;  /* bytes per row record: 8 + 4 * dim * (1 + nstate), no padding */
    int big;        /* log2 of the rows of a full-size slab */
    tbl_slab *slabs;
    uint32_t nslabs, slabs_cap;
    uint64_t slot_cap;  /* rows the slabs hold */
    uint64_t rows;      /* rows that exist, in slots 0 .. rows-1 */
    uint32_t *map;      /* the hash: hcap entries, linear probing, <= 3/4 full */
    uint64_t hcap;
    uint64_t map_gen;   /* raised whenever entries move (growth, deletion) */
    uint64_t *pos;      /* a request's entry positions (UINT64_MAX: no row), npos */
    size_t npos;
    uint32_t lru_head, lru_tail; /* capped: most and least recently touched */
    uint8_t *cells;     /* frequency filter: ncells counters; NULL without one */
    size_t ncells;
    /* the open sync round: acc_n ids (in order of first appearance) with their
     * sums, found through acc_map (power-of-two size, entry index + 1) */
    uint64_t *acc_ids;
    float *acc_rows;
    uint32_t *acc_map;
    size_t acc_n, acc_cap, acc_hcap;
    int ncontrib, last_rank;
    uint64_t round_new;  /* rows the open round may create (reserved) */
    int tracking;        /* deletions recorded (after the first mark_clean) */
    int deleted_lost;    /* out of memory recording one: the next checkpoint is full */
    uint64_t *deleted;
    size_t ndeleted, deleted_cap;
    int64_t version;
    float *scratch;      /* dim floats: the mean of a summed push */
    uint64_t bytes;      /* charged by this table */
    _Atomic uint64_t own_mem;
    ps_table_counts st;
};

/* ---- hashing ---- */
static inline uint64_t tbl_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The hash of an id inside a table: salted, so that the ids one server holds
 * (placed on it by another hash of the id) spread over its entries. */
static inline uint64_t tbl_hash(uint64_t id) { return tbl_mix(id ^ 0x6a09e667f3bcc909ull); }

/* Home entry of hash h in a hash of hcap entries (any size: multiply-shift). */
static inline uint64_t tbl_home(uint64_t h, uint64_t hcap)
{
    return (uint64_t)(((unsigned __int128)h * hcap) >> 64);
}

/* ---- slots ---- */
static inline void tbl_locate(const ps_table *t, uint32_t s, uint32_t *j, uint32_t *o)
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

static inline char *tbl_rec(const ps_table *t, uint32_t s)
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

static inline float *tbl_rec_w(char *rec) { return (float *)(rec + 8); }

/* adam's count of slot s (NULL for other optimizers) */
static inline uint32_t *tbl_cnt(const ps_table *t, uint32_t s)
{
    uint32_t j, o;
    tbl_locate(t, s, &j, &o);
    return t->slabs[j].cnt ? t->slabs[j].cnt + o : NULL;
}

/* Position of id's entry in the hash (*found = 1), or of the empty entry
 * where it would go (*found = 0).  The hash must exist (hcap > 0). */
static inline uint64_t tbl_find(ps_table *t, uint64_t id, int *found)
{
    uint64_t i = tbl_home(tbl_hash(id), t->hcap);
    t->st.lookups++;
    for (;;) {
        uint32_t e = t->map[i];
        if (!e) {
            *found = 0;
            return i;
        }
        t->st.probes++;
        if (tbl_rec_id(tbl_rec(t, (e & TBL_SLOT) - 1)) == id) {
            *found = 1;
            return i;
        }
        if (++i == t->hcap)
            i = 0;
    }
}

/* ---- table_hash.c ---- */
/* Charge bytes to the shared counter unless that passes max_memory: 1 done, 0 not. */
int tbl_charge(ps_table *t, uint64_t bytes);
void tbl_uncharge(ps_table *t, uint64_t bytes);
/* Room for `more` rows beyond the rows and those the open round reserved
 * (within the cap): slabs and hash, charged together with `extra` bytes the
 * caller allocates itself.  PS_ETOOBIG or PS_ENOMEM with nothing changed
 * (extra not charged). */
int tbl_reserve(ps_table *t, uint64_t more, uint64_t extra, char *why, size_t why_len);
/* Do `more` new rows fit without allocating? */
int tbl_has_room(const ps_table *t, uint64_t more);
/* A new row for id, whose lookup ended at empty entry pos: initializer
 * values, zero state, dirty, most recently touched (in a full capped table
 * the least recently touched row is evicted first).  Room must be reserved.
 * Returns the position of its entry. */
uint64_t tbl_create_row(ps_table *t, uint64_t id, uint64_t pos);
/* Move slot s to the front of the LRU list (capped tables; else nothing). */
void tbl_touch(ps_table *t, uint32_t s);
/* The slot touched just before s (capped tables; TBL_NIL: s is the least recent). */
uint32_t tbl_lru_prev(const ps_table *t, uint32_t s);
/* Delete the row whose entry is at pos (slot s): its entry, its slot (the
 * last row moves into it), its place in the LRU list; recorded as a deletion. */
void tbl_delete_row(ps_table *t, uint64_t pos);
/* Free the slabs, the hash and the LRU (not the charge). */
void tbl_free_rows(ps_table *t);

/* ---- table_opt.c ---- */
/* What one update needs besides the row: the rate of the table's update t. */
typedef struct tbl_step {
    float lr;
    int64_t m;   /* updates this one counts as */
} tbl_step;
/* Apply gradient row g to row record rec (slot s) with the table's optimizer. */
void tbl_apply_row(const ps_table *t, const tbl_step *st, char *rec, uint32_t s,
                   const float *g);

#endif
