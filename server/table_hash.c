/* The table store's rows (server/table_hash.h): the open-addressing hash
 * from id to slot, the slabs that hold the rows, the LRU list of capped
 * tables, the dirty bits and deletions, and the memory charge of all of it. */
#include "table_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

static void maker_leaves(tbl_rows *t, uint32_t s);

static _Atomic uint64_t *mem(tbl_rows *t)
{
    return t->cfg.mem_used ? t->cfg.mem_used : &t->own_mem;
}

uint64_t tbl_mem_used(const tbl_rows *t)
{
    return atomic_load(t->cfg.mem_used ? t->cfg.mem_used : &((tbl_rows *)t)->own_mem);
}

int tbl_charge(tbl_rows *t, uint64_t bytes)
{
    uint64_t before = atomic_fetch_add(mem(t), bytes);
    if (before + bytes > t->cfg.max_memory) {
        atomic_fetch_sub(mem(t), bytes);
        return 0;
    }
    t->bytes += bytes;
    return 1;
}

void tbl_uncharge(tbl_rows *t, uint64_t bytes)
{
    atomic_fetch_sub(mem(t), bytes);
    t->bytes -= bytes;
}

/* ---- slabs ---- */

/* Rows slab j holds when full (see TBL_SMALL). */
static uint64_t slab_rows(const tbl_rows *t, uint32_t j)
{
    uint32_t nsmall = (uint32_t)(t->big - TBL_SMALL);
    if (j == 0)
        return 1u << TBL_SMALL;
    if (j <= nsmall)
        return 1ull << (TBL_SMALL + j - 1);
    return 1ull << t->big;
}

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

/* Bytes of a slab of `rows` rows: the records, then the counts and the
 * LRU links when the table keeps them. */
static size_t slab_bytes(const tbl_rows *t, uint64_t rows, size_t *cnt_off, size_t *lru_off)
{
    size_t b = round64((size_t)rows * t->stride);
    *cnt_off = b;
    if (t->cfg.counts)
        b += (size_t)rows * 4;
    *lru_off = b;
    if (t->cfg.max_rows)
        b += (size_t)rows * 12;
    return round64(b);
}

/* The rows the table may need: the rows, those reserved and `more`, within
 * the cap. */
static uint64_t rows_wanted(const tbl_rows *t, uint64_t more)
{
    uint64_t want = t->rows + t->reserved + more;
    if (t->cfg.max_rows && want > t->cfg.max_rows)
        want = t->cfg.max_rows;
    return want;
}

int tbl_has_room(const tbl_rows *t, uint64_t more)
{
    uint64_t want = rows_wanted(t, more);
    return want <= t->slot_cap && want * 4 <= t->hcap * 3;
}

/* Rebuild the hash with ncap entries into fresh (zeroed), keeping each
 * entry's dirty bit. */
static void rehash(tbl_rows *t, uint32_t *fresh, uint64_t ncap)
{
    for (uint64_t i = 0; i < t->hcap; i++) {
        uint32_t e = t->map[i];
        if (!e)
            continue;
        uint64_t id = tbl_rec_id(tbl_rec(t, (e & TBL_SLOT) - 1));
        uint64_t k = tbl_home(tbl_hash(id), ncap);
        while (fresh[k])
            if (++k == ncap)
                k = 0;
        fresh[k] = e;
    }
    free(t->map);
    t->map = fresh;
    t->hcap = ncap;
}

int tbl_reserve(tbl_rows *t, uint64_t more, uint64_t extra, char *why, size_t why_len)
{
    uint64_t want = rows_wanted(t, more);
    if (want > TBL_MAX_ROWS) {
        ps_errorf(why, why_len, "table %llu would hold %llu rows on this server; one server "
            "holds at most %llu rows of a table (more servers, or a row cap)",
            (unsigned long long)t->cfg.table, (unsigned long long)want,
            (unsigned long long)TBL_MAX_ROWS);
        return PS_ETOOBIG;
    }
    /* what is missing: slabs up to `want` rows, a larger hash (grown by half
     * at least, so it stays between 1/2 and 3/4 full: 4-byte entries cost a
     * row 5.3 to 8 bytes), room in the slab list */
    uint32_t nsl = t->nslabs;
    uint64_t have = t->slot_cap, bytes = 0;
    while (have < want) {
        uint64_t r = slab_rows(t, nsl);
        if (t->cfg.max_rows && have + r > t->cfg.max_rows)
            r = t->cfg.max_rows - have;
        size_t c, l;
        bytes += slab_bytes(t, r, &c, &l);
        have += r;
        nsl++;
    }
    uint64_t ncap = t->hcap;
    if (want * 4 > ncap * 3) {
        ncap = ncap + ncap / 2;
        if (ncap * 3 < want * 4)
            ncap = want * 4 / 3 + 1;
        bytes += ncap * sizeof(uint32_t);
    }
    uint32_t scap = t->slabs_cap;
    while (scap < nsl)
        scap = scap ? scap * 2 : 16;
    uint64_t list_bytes = (uint64_t)(scap - t->slabs_cap) * sizeof(tbl_slab);
    bytes += list_bytes;
    if (bytes == 0 && extra == 0)
        return 0;
    if (!tbl_charge(t, bytes + extra)) {
        uint64_t used = atomic_load(mem(t));
        ps_errorf(why, why_len, "table %llu needs %llu more bytes for %llu rows; %llu of %llu "
            "bytes (--max-memory) in use", (unsigned long long)t->cfg.table,
            (unsigned long long)(bytes + extra), (unsigned long long)want, (unsigned long long)used,
            (unsigned long long)t->cfg.max_memory);
        return PS_ETOOBIG;
    }
    /* allocate, then commit: after a failure only the slabs made stay (room
     * for later rows, charged) */
    if (scap != t->slabs_cap) {
        tbl_slab *p = realloc(t->slabs, scap * sizeof *p);
        if (!p)
            goto nomem;
        t->slabs = p;
        t->slabs_cap = scap;
        bytes -= list_bytes; /* kept: the list is larger now */
    }
    uint32_t *fresh = NULL;
    if (ncap != t->hcap && !(fresh = calloc(ncap, sizeof *fresh)))
        goto nomem;
    for (uint32_t j = t->nslabs; j < nsl; j++) {
        uint64_t r = slab_rows(t, j);
        if (t->cfg.max_rows && t->slot_cap + r > t->cfg.max_rows)
            r = t->cfg.max_rows - t->slot_cap;
        size_t c, l, b = slab_bytes(t, r, &c, &l);
        char *p = aligned_alloc(64, b);
        if (!p) {
            free(fresh);
            goto nomem;
        }
        t->slabs[j] = (tbl_slab){p, t->cfg.counts ? (uint32_t *)(p + c) : NULL,
                                 t->cfg.max_rows ? (uint32_t *)(p + l) : NULL};
        t->nslabs = j + 1;
        t->slot_cap += r;
        bytes -= b;
    }
    if (fresh) {
        uint64_t old = t->hcap * sizeof(uint32_t);
        rehash(t, fresh, ncap);
        t->map_gen++;
        tbl_uncharge(t, old);
    }
    return 0;
nomem:
    tbl_uncharge(t, bytes + extra);
    ps_errorf(why, why_len, "table %llu: out of memory growing to %llu rows",
        (unsigned long long)t->cfg.table, (unsigned long long)want);
    return PS_ENOMEM;
}

int tbl_rows_init(tbl_rows *t, const tbl_rows_config *cfg, uint64_t extra, char *why,
                  size_t why_len)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    atomic_init(&t->own_mem, 0);
    t->stride = 8 + (size_t)4 * cfg->row_floats;
    t->big = TBL_SMALL;
    while (t->big < 16 && ((size_t)2 << t->big) * t->stride <= TBL_SLAB_BYTES)
        t->big++;
    t->lru_head = t->lru_tail = TBL_NIL;
    t->maker = TBL_NO_MAKER;
    /* a row's own bytes, its share of the hash (4-byte entries at least half
     * full) and, capped, its links and maker */
    t->row_cost = (uint32_t)(t->stride + 8 + (cfg->counts ? 4 : 0) + (cfg->max_rows ? 12 : 0));
    t->hcap = 16;
    uint64_t bytes = t->hcap * sizeof(uint32_t) + extra;
    if (!tbl_charge(t, bytes)) {
        ps_errorf(why, why_len, "table %llu needs %llu bytes; %llu of %llu bytes "
            "(--max-memory) in use", (unsigned long long)cfg->table, (unsigned long long)bytes,
            (unsigned long long)tbl_mem_used(t), (unsigned long long)cfg->max_memory);
        return PS_ETOOBIG;
    }
    t->map = calloc(t->hcap, sizeof *t->map);
    if (!t->map) {
        tbl_uncharge(t, bytes);
        ps_errorf(why, why_len, "out of memory creating table %llu",
            (unsigned long long)cfg->table);
        return PS_ENOMEM;
    }
    return 0;
}

void tbl_rows_free(tbl_rows *t)
{
    for (uint64_t s = 0; t->cfg.max_rows && s < t->rows; s++)
        maker_leaves(t, (uint32_t)s);
    for (uint32_t j = 0; j < t->nslabs; j++)
        free(t->slabs[j].rec);
    free(t->slabs);
    free(t->map);
    free(t->deleted);
    tbl_uncharge(t, t->bytes);
    t->slabs = NULL;
    t->map = NULL;
    t->deleted = NULL;
}

uint32_t tbl_lookup(const tbl_rows *t, uint64_t id)
{
    for (uint64_t i = tbl_home(tbl_hash(id), t->hcap);; i = i + 1 == t->hcap ? 0 : i + 1) {
        uint32_t e = t->map[i];
        if (!e || tbl_rec_id(tbl_rec(t, (e & TBL_SLOT) - 1)) == id)
            return e & TBL_SLOT;
    }
}

/* ---- the LRU list (capped tables): links in the slabs, by slot ---- */

static uint32_t *links(const tbl_rows *t, uint32_t s)
{
    uint32_t j, o;
    tbl_locate(t, s, &j, &o);
    return t->slabs[j].lru + 3 * (size_t)o;
}

static void lru_unlink(tbl_rows *t, uint32_t s)
{
    uint32_t *l = links(t, s), p = l[0], n = l[1];
    if (p != TBL_NIL)
        links(t, p)[1] = n;
    else
        t->lru_head = n;
    if (n != TBL_NIL)
        links(t, n)[0] = p;
    else
        t->lru_tail = p;
}

static void lru_front(tbl_rows *t, uint32_t s)
{
    uint32_t *l = links(t, s);
    l[0] = TBL_NIL;
    l[1] = t->lru_head;
    if (t->lru_head != TBL_NIL)
        links(t, t->lru_head)[0] = s;
    else
        t->lru_tail = s;
    t->lru_head = s;
}

void tbl_touch(tbl_rows *t, uint32_t s)
{
    if (!t->cfg.max_rows || t->lru_head == s)
        return;
    lru_unlink(t, s);
    lru_front(t, s);
}

uint32_t tbl_lru_prev(const tbl_rows *t, uint32_t s) { return links(t, s)[0]; }

/* ---- makers ---- */

int tbl_worker_charge(tbl_rows *t, int rank, uint64_t rows, char *why, size_t why_len)
{
    if (!t->cfg.worker_mem || rank < 0 || rank >= t->cfg.num_workers || !rows)
        return 0;
    uint64_t bytes = rows * t->row_cost;
    uint64_t before = atomic_fetch_add(&t->cfg.worker_mem[rank], bytes);
    if (before + bytes <= t->cfg.worker_share)
        return 0;
    atomic_fetch_sub(&t->cfg.worker_mem[rank], bytes);
    ps_errorf(why, why_len, "worker %d's rows here take %llu bytes of its share of %llu "
        "(--table-memory-per-worker): %llu new rows of %u bytes refused; cap the table "
        "(max_rows) or raise the share", rank, (unsigned long long)before,
        (unsigned long long)t->cfg.worker_share, (unsigned long long)rows, t->row_cost);
    return PS_ETOOBIG;
}

void tbl_worker_uncharge(tbl_rows *t, int rank, uint64_t rows)
{
    if (t->cfg.worker_mem && rank >= 0 && rank < t->cfg.num_workers && rows)
        atomic_fetch_sub(&t->cfg.worker_mem[rank], rows * t->row_cost);
}

/* A capped table's row in slot s leaves: its maker's charge goes back. */
static void maker_leaves(tbl_rows *t, uint32_t s)
{
    uint32_t m = links(t, s)[2];
    if (m != TBL_NO_MAKER)
        tbl_worker_uncharge(t, (int)m, 1);
}

/* ---- deleting ---- */

/* Empty entry pos and close the gap (backward shift): each entry after it
 * in its run moves back unless its home lies cyclically in (gap, entry]. */
static void map_delete(tbl_rows *t, uint64_t pos)
{
    uint64_t i = pos, j = pos;
    for (;;) {
        if (++j == t->hcap)
            j = 0;
        uint32_t e = t->map[j];
        if (!e)
            break;
        uint64_t k = tbl_home(tbl_hash(tbl_rec_id(tbl_rec(t, (e & TBL_SLOT) - 1))), t->hcap);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        t->map[i] = e;
        i = j;
    }
    t->map[i] = 0;
    t->map_gen++;
}

static void record_deletion(tbl_rows *t, uint64_t id)
{
    if (!t->tracking || t->deleted_lost)
        return;
    if (t->ndeleted == t->deleted_cap) {
        size_t ncap = t->deleted_cap ? t->deleted_cap * 2 : 256;
        uint64_t *p = realloc(t->deleted, ncap * sizeof *p);
        if (!p) {
            ps_error("table %llu: out of memory recording evicted rows; its next checkpoint "
                     "must be a full one", (unsigned long long)t->cfg.table);
            t->deleted_lost = 1;
            return;
        }
        /* charged, never refused: an eviction frees a row, it cannot wait */
        uint64_t more = (ncap - t->deleted_cap) * sizeof *p;
        atomic_fetch_add(mem(t), more);
        t->bytes += more;
        t->deleted = p;
        t->deleted_cap = ncap;
    }
    t->deleted[t->ndeleted++] = id;
}

/* Evict the least recently touched row: its slot, free for a new row. */
static uint32_t evict(tbl_rows *t)
{
    uint32_t s = t->lru_tail;
    uint64_t id = tbl_rec_id(tbl_rec(t, s));
    int found;
    uint64_t pos = tbl_find(t, id, &found);
    lru_unlink(t, s);
    maker_leaves(t, s);
    map_delete(t, pos);
    record_deletion(t, id);
    t->evicted++;
    return s;
}

void tbl_delete_row(tbl_rows *t, uint64_t pos)
{
    uint32_t s = (t->map[pos] & TBL_SLOT) - 1;
    char *rec = tbl_rec(t, s);
    if (t->cfg.max_rows) {
        lru_unlink(t, s);
        maker_leaves(t, s);
    }
    map_delete(t, pos);
    record_deletion(t, tbl_rec_id(rec));
    uint32_t last = (uint32_t)(t->rows - 1);
    t->rows--;
    if (s == last)
        return;
    /* keep the slots dense: the last row moves into the hole */
    char *from = tbl_rec(t, last);
    memcpy(rec, from, t->stride);
    uint32_t *c = tbl_cnt(t, s);
    if (c)
        *c = *tbl_cnt(t, last);
    if (t->cfg.max_rows) {
        uint32_t *l = links(t, s), *m = links(t, last);
        l[0] = m[0];
        l[1] = m[1];
        l[2] = m[2];
        if (l[0] != TBL_NIL)
            links(t, l[0])[1] = s;
        else
            t->lru_head = s;
        if (l[1] != TBL_NIL)
            links(t, l[1])[0] = s;
        else
            t->lru_tail = s;
    }
    int found;
    uint64_t p = tbl_find(t, tbl_rec_id(rec), &found);
    t->map[p] = (t->map[p] & TBL_DIRTY) | (s + 1);
}

/* ---- creating ---- */

uint64_t tbl_create_row(tbl_rows *t, uint64_t id, uint64_t pos)
{
    uint32_t s;
    if (t->cfg.max_rows && t->rows == t->cfg.max_rows) {
        s = evict(t);
        int found; /* the deletion may have moved entries: look again */
        pos = tbl_find(t, id, &found);
    } else {
        s = (uint32_t)t->rows++;
    }
    memcpy(tbl_rec(t, s), &id, 8);
    uint32_t *c = tbl_cnt(t, s);
    if (c)
        *c = 0;
    t->map[pos] = (s + 1) | TBL_DIRTY;
    if (t->cfg.max_rows) {
        lru_front(t, s);
        links(t, s)[2] = t->maker;
    }
    t->created++;
    return pos;
}

void tbl_mark_clean(tbl_rows *t)
{
    for (uint64_t i = 0; i < t->hcap; i++)
        t->map[i] &= ~TBL_DIRTY;
    t->ndeleted = 0;
    t->deleted_lost = 0;
    t->tracking = 1;
}
