/* The table store's sync rounds (server/table.h): each contributing
 * worker's rows summed in rank order, applied when the round finishes; the
 * rows a round may make reserved and charged to the rank whose push
 * brought the id.  The store's struct and shared helpers are
 * table_internal.h's. */
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"
#include "table_internal.h"

/* The sum of id in the open round: its index (*found = 1) or the empty
 * entry of acc_map where it would go. */
static size_t acc_find(const ps_table *t, uint64_t id, int *found)
{
    *found = 0;
    if (!t->acc_map)
        return 0;
    size_t i = (size_t)tbl_home(tbl_hash(id), t->acc_hcap);
    for (;;) {
        uint32_t e = t->acc_map[i];
        if (!e)
            return i;
        if (t->acc_ids[e - 1] == id) {
            *found = 1;
            return e - 1;
        }
        i = (i + 1) & (t->acc_hcap - 1);
    }
}

/* The sums' capacity for `need` ids (doubling; the map twice as large, a
 * power of two) and the bytes it adds (0: it fits now). */
static size_t acc_size(const ps_table *t, size_t need, uint64_t *more)
{
    *more = 0;
    if (need == 0 || (need <= t->acc_cap && t->acc_map))
        return t->acc_cap;
    size_t ncap = t->acc_cap ? t->acc_cap : 64;
    while (ncap < need)
        ncap *= 2;
    *more = (ncap - t->acc_cap) * (sizeof(uint64_t) + t->cfg.dim * sizeof(float) +
                                   2 * sizeof(uint32_t) + sizeof(int32_t));
    return ncap;
}

/* Grow the sums to ncap ids; `more` bytes are charged already (given back
 * when it fails). */
static int acc_grow(ps_table *t, size_t ncap, uint64_t more, char *why, size_t why_len)
{
    uint64_t *ids = realloc(t->acc_ids, ncap * sizeof *ids);
    if (ids)
        t->acc_ids = ids;
    float *rows = ids ? realloc(t->acc_rows, ncap * t->cfg.dim * sizeof *rows) : NULL;
    if (rows)
        t->acc_rows = rows;
    int32_t *mk = rows ? realloc(t->acc_maker, ncap * sizeof *mk) : NULL;
    if (mk)
        t->acc_maker = mk;
    uint32_t *map = mk ? calloc(2 * ncap, sizeof *map) : NULL;
    if (!map) {
        tbl_uncharge(&t->r, more);
        ps_errorf(why, why_len, "table %llu: out of memory for the sums of a round",
            (unsigned long long)t->cfg.table);
        return PS_ENOMEM;
    }
    free(t->acc_map);
    t->acc_map = map;
    t->acc_hcap = 2 * ncap;
    t->acc_cap = ncap;
    for (size_t e = 0; e < t->acc_n; e++) {
        int found;
        map[acc_find(t, t->acc_ids[e], &found)] = (uint32_t)(e + 1);
    }
    return 0;
}

/* The ids of a push new to the round (*fresh) and those of them with no
 * row (*missing), each id once: 1 when that is fewer than counted (a push
 * with an id twice), else 0. */
static int round_distinct(ps_table *t, const uint64_t *ids, size_t n, size_t *fresh,
                          uint64_t *missing)
{
    uint64_t *f = malloc(2 * n * sizeof *f);
    if (!f)
        return 0;
    uint64_t *m = f + n;
    size_t nf = 0, nm = 0;
    for (size_t i = 0; i < n; i++) {
        int found;
        acc_find(t, ids[i], &found);
        if (found)
            continue;
        f[nf++] = ids[i];
        tbl_find(&t->r, ids[i], &found);
        if (!found)
            m[nm++] = ids[i];
    }
    size_t df = table_count_distinct(f, nf), dm = table_count_distinct(m, nm);
    free(f);
    if (df == *fresh && dm == *missing)
        return 0;
    *fresh = df;
    *missing = dm;
    return 1;
}

int ps_table_round_add(ps_table *t, int rank, const uint64_t *ids, size_t n, const float *g,
                       size_t g_len, char *why, size_t why_len)
{
    size_t d = t->cfg.dim;
    if (rank < 0 || rank <= t->last_rank) {
        if (rank < 0)
            ps_errorf(why, why_len, "table %llu: a push of rank %d (ranks are >= 0)",
                (unsigned long long)t->cfg.table, rank);
        else
            ps_errorf(why, why_len, "table %llu: the push of rank %d comes after rank %d's in "
                "this round; a round takes its pushes in rank order",
                (unsigned long long)t->cfg.table, rank, t->last_rank);
        return PS_ESTATE;
    }
    if (g_len != n * d)
        return table_size_error(t, "push", n, g_len, why, why_len);
    /* the ids new to the round (sums to add), and those of them with no row
     * (rows the round may create, charged to this rank's share; t->pos
     * marks them): room for both, charged at once, before anything changes */
    size_t npos = t->npos;
    int rc = table_pos_reserve(t, n, why, why_len);
    if (rc)
        return rc;
    size_t fresh = 0;
    uint64_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        int found;
        t->pos[i] = 0;
        acc_find(t, ids[i], &found);
        if (!found) {
            fresh++;
            tbl_find(&t->r, ids[i], &found);
            missing += !found;
            t->pos[i] = found ? 0 : NO_ROW;
        }
    }
    int distinct = 0;
    rc = tbl_worker_charge(&t->r, rank, missing, why, why_len);
    if (rc && fresh > 1 && round_distinct(t, ids, n, &fresh, &missing)) {
        distinct = 1;
        rc = tbl_worker_charge(&t->r, rank, missing, why, why_len);
    }
    if (rc) {
        table_pos_undo(t, npos);
        return rc;
    }
    uint64_t charged = t->r.cfg.worker_mem ? missing : 0, more; /* settled below */
    if (t->cfg.full_refuse && t->r.rows + t->r.reserved + missing > t->cfg.max_rows) {
        if (!distinct && fresh > 1 && round_distinct(t, ids, n, &fresh, &missing))
            distinct = 1;
        if ((rc = table_full_refuses(t, NULL, 0, &missing, why, why_len)) != 0) {
            tbl_worker_uncharge(&t->r, rank, charged);
            table_pos_undo(t, npos);
            return rc;
        }
    }
    size_t ncap;
    for (int pass = 0; pass < 2; pass++) {
        ncap = acc_size(t, t->acc_n + fresh, &more);
        rc = 0;
        if (missing && !tbl_has_room(&t->r, missing))
            rc = tbl_reserve(&t->r, missing, more, why, why_len);
        else if (more && !tbl_charge(&t->r, more)) {
            ps_errorf(why, why_len, "table %llu needs %llu more bytes for the sums of a round "
                "of %zu rows; %llu bytes (--max-memory) reached",
                (unsigned long long)t->cfg.table, (unsigned long long)more, t->acc_n + fresh,
                (unsigned long long)t->cfg.max_memory);
            rc = PS_ETOOBIG;
        }
        if (rc != PS_ETOOBIG || pass || distinct || fresh < 2 ||
            !round_distinct(t, ids, n, &fresh, &missing))
            break; /* else again, each id counted once */
    }
    if (!rc && more)
        rc = acc_grow(t, ncap, more, why, why_len);
    if (rc) {
        tbl_worker_uncharge(&t->r, rank, charged);
        table_pos_undo(t, npos);
        return rc;
    }
    t->r.reserved += missing;
    /* in rank order: the first contributor's row copied, the next ones added */
    uint64_t marked = 0;
    for (size_t i = 0; i < n; i++) {
        const float *restrict gi = g + i * d;
        int found;
        size_t e = acc_find(t, ids[i], &found);
        if (found) {
            float *restrict sum = t->acc_rows + e * d;
            for (size_t k = 0; k < d; k++)
                sum[k] = sum[k] + gi[k];
        } else {
            t->acc_ids[t->acc_n] = ids[i];
            memcpy(t->acc_rows + t->acc_n * d, gi, d * sizeof(float));
            int made = t->pos[i] == NO_ROW && marked < charged;
            marked += (uint64_t)made;
            t->acc_maker[t->acc_n] = made ? rank : -2 - rank;
            t->acc_map[e] = (uint32_t)++t->acc_n;
        }
    }
    tbl_worker_uncharge(&t->r, rank, charged - marked); /* an id twice: one row */
    table_pos_release(t);
    t->ncontrib++;
    t->last_rank = rank;
    t->st.pushed += n;
    return 0;
}

/* Forget the open round's sums (its rows' charges settled or given back). */
static void round_reset(ps_table *t)
{
    if (t->acc_n)
        memset(t->acc_map, 0, t->acc_hcap * sizeof *t->acc_map);
    t->acc_n = 0;
    t->ncontrib = 0;
    t->last_rank = -1;
    t->r.reserved = 0;
}

void ps_table_round_cancel(ps_table *t)
{
    for (size_t e = 0; e < t->acc_n; e++)
        if (t->acc_maker[e] >= 0)
            tbl_worker_uncharge(&t->r, t->acc_maker[e], 1);
    round_reset(t);
}

void ps_table_round_finish(ps_table *t)
{
    if (t->ncontrib == 0) {
        ps_table_round_cancel(t);
        return;
    }
    size_t d = t->cfg.dim;
    table_take_opt(t, t->version); /* this round's hyper-parameters */
    /* the mean over the pushes summed, as shard.c's finish_round divides */
    float nw = (float)t->ncontrib;
    float lr = ps_opt_lr_at(&t->cfg.opt, t->version + 1);
    uint32_t maker = t->r.maker;
    for (size_t e = 0; e < t->acc_n; e++) {
        float *restrict sum = t->acc_rows + e * d;
        for (size_t k = 0; k < d; k++)
            sum[k] = sum[k] / nw;
        uint64_t id = t->acc_ids[e];
        int32_t mk = t->acc_maker[e];
        int found;
        uint64_t p = tbl_find(&t->r, id, &found);
        if (!found && t->cells && table_filter_count(t, id) < t->cfg.min_count) {
            t->st.filtered_pushes++;
            tbl_worker_uncharge(&t->r, mk, 1);
            continue;
        }
        if (found) {
            tbl_worker_uncharge(&t->r, mk, 1); /* made meanwhile, by another's pull */
        } else {
            /* its maker charged at round_add (a row gone since: nobody's) */
            t->r.maker = mk >= 0 ? (uint32_t)mk : TBL_NO_MAKER;
            p = table_create_row(t, id, p); /* room reserved by round_add */
        }
        table_update_row(t, p, sum, lr, 1);
    }
    t->r.maker = maker;
    t->version++;
    t->st.rounds++;
    round_reset(t);
}

int ps_table_round_contributors(const ps_table *t, int *last_rank)
{
    if (last_rank)
        *last_rank = t->last_rank;
    return t->ncontrib;
}

