/* The arithmetic of a table row (server/table.h): which optimizer kinds
 * tables take, how much state each keeps per row, and one row's update.  A
 * row's update is the dense kernel of server/optimizer.h on that row's dim
 * values (so a table row and a dense chunk of the same gradients agree bit
 * for bit), with adam's t the row's own update count (lazy adam), and the
 * FTRL-proximal kernel here.  Plain arguments: nothing here knows a table. */
#ifndef PS_TABLE_OPT_H
#define PS_TABLE_OPT_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

/* FTRL-proximal (PS_TABLE_OPT_FTRL, ps_types.h).  Per coordinate, with
 * g' = g + weight_decay * w and alpha = lr:
 *   n' = n + g'^2;  z += g' - (sqrt(n') - sqrt(n)) / alpha * w;  n = n'
 *   w = |z| <= l1 ? 0 : -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
 * State arrays: z, n. */
_Static_assert(PS_OPT_KIND_MAX < PS_TABLE_OPT_FTRL,
               "a dense optimizer kind took PS_TABLE_OPT_FTRL's number");
_Static_assert(PS_OPT_KIND_LAST < PS_TABLE_OPT_ROWWISE_ADAGRAD,
               "a dense optimizer kind took PS_TABLE_OPT_ROWWISE_ADAGRAD's number");

/* Row-wise adagrad (PS_TABLE_OPT_ROWWISE_ADAGRAD, ps_types.h has the
 * formula): one state float per row (m), after the row's values; its kernel
 * is common/ps_table_row.h's (ps_worker's local tables run it too). */

/* A table's optimizer: the kind (sgd .. adam, FTRL or row-wise adagrad) with its
 * hyper-parameters, and FTRL's own. */
typedef struct tbl_opt {
    ps_opt_config opt;
    float ftrl_beta, ftrl_l1, ftrl_l2;
} tbl_opt;

/* The optimizer state arrays a row keeps for kind (0, 1 or 2), or -1 when
 * tables do not take that kind. */
int ps_table_state_arrays(int kind);
/* The floats of each state array of a row of dim values: dim, but 1 for
 * row-wise adagrad. */
size_t ps_table_state_len(int kind, size_t dim);
/* "sgd" .. "adam", "ftrl", "rowwise_adagrad"; "unknown" otherwise. */
const char *ps_table_opt_name(int kind);

/* One update of a row of d values w (its state arrays follow it: w + d,
 * w + 2d; row-wise adagrad's one float at w + d) with gradient row g at
 * rate lr, counting as m updates; cnt: the row's update count (adam: its t,
 * raised by m here; else unused, may be NULL).  guard: the results are
 * checked (ps_opt_apply_checked, optimizer.h): each value whose new value
 * or state would not be finite keeps its old ones (a row none of whose
 * values moved keeps its count too; row-wise adagrad's row, one state for
 * all its values, moves whole or not at all).  Returns how many values
 * kept theirs (0 without guard). */
size_t tbl_apply_row(const tbl_opt *o, float *w, size_t d, uint32_t *cnt, const float *g,
                     float lr, int64_t m, int guard);

/* The FTRL kernel on n coordinates (formula above), in place. */
void ps_table_ftrl(float *restrict w, float *restrict z, float *restrict nacc,
                   const float *restrict g, size_t n, float alpha, float beta, float l1,
                   float l2, float wd);

#endif
