/* What the table store's files share (server/table.h): the store's
 * struct and the helpers its pulls, pushes and sync rounds (table.c,
 * table_round.c) both use.  Nothing outside the store includes it. */
#ifndef PS_TABLE_INTERNAL_H
#define PS_TABLE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"
#include "table_hash.h"

/* hyper-parameter changes a table holds until their round (more: the oldest
 * takes effect early) */
#define TABLE_SCHED 8

struct ps_table {
    ps_table_config cfg;
    tbl_opt o;          /* cfg's optimizer, as table_opt.c takes it */
    int nstate;
    size_t slen;        /* floats per state array (ps_table_state_len) */
    tbl_rows r;         /* the rows; r.reserved: those the open round may create */
    uint64_t *pos;      /* a request's entry positions (UINT64_MAX: no row), npos */
    size_t npos;
    uint8_t *cells;     /* frequency filter: ncells counters; NULL without one */
    size_t ncells;
    /* the open sync round: acc_n ids (in order of first appearance) with their
     * sums, found through acc_map (power-of-two size, entry index + 1) */
    uint64_t *acc_ids;
    float *acc_rows;
    uint32_t *acc_map;
    int32_t *acc_maker;  /* per sum: the rank whose push brought an id with no row (its
                            row charged to it already), -2 - rank when the row existed */
    size_t acc_n, acc_cap, acc_hcap;
    int ncontrib, last_rank;
    int64_t version;
    float *scratch;      /* dim floats: the mean of a summed push */
    ps_table_nonfinite nf; /* updates whose results were not finite, since taken */
    int maker;           /* the worker the next pull or push is for (-1: none) */
    ps_table_counts st;  /* created and evicted: restored bases (r counts the rest) */
    /* hyper-parameters changed (ps_table_set_opt), for the updates from
     * version `from` on, oldest first */
    struct {
        int64_t from;
        ps_opt_config opt;
    } sched[TABLE_SCHED];
    int nsched;
};

/* A request's entry position of an id with no row yet. */
#define NO_ROW UINT64_MAX

/* A new row for id (its lookup ended at empty entry pos; room reserved):
 * the initializer's values, zero state.  Its entry's position. */
uint64_t table_create_row(ps_table *t, uint64_t id, uint64_t pos);
/* Update the row of entry p with gradient row g at rate lr, counting as m
 * updates (its results checked with cfg.guard). */
void table_update_row(ps_table *t, uint64_t p, const float *g, float lr, int64_t m);
/* The hyper-parameters scheduled (ps_table_set_opt) for the update of
 * version `version` + 1 on, taken now. */
void table_take_opt(ps_table *t, int64_t version);
/* PS_EPROTO, why saying that `what` of n ids came with len floats, not
 * n x dim. */
int table_size_error(const ps_table *t, const char *what, size_t n, size_t len, char *why,
                     size_t why_len);
/* The frequency filter's count of id (never below its sightings). */
unsigned table_filter_count(const ps_table *t, uint64_t id);
/* t->pos for n ids (charged), back to an earlier size after a refusal, and
 * given back after a large request. */
int table_pos_reserve(ps_table *t, size_t n, char *why, size_t why_len);
void table_pos_undo(ps_table *t, size_t npos);
void table_pos_release(ps_table *t);
/* The distinct values among v[0..n) (n when out of memory). */
size_t table_count_distinct(const uint64_t *v, size_t n);
/* A full table that refuses (cfg.full_refuse): PS_ETOOBIG when *missing
 * more rows (each distinct id of ids once, with ids) do not fit. */
int table_full_refuses(ps_table *t, const uint64_t *ids, size_t n, uint64_t *missing, char *why,
                       size_t why_len);

#endif
