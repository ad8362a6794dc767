/* The optimizer settings, driven by the table PS_OPT_PARAMS in
 * include/ps_types.h: names, defaults, ranges, which hyper-parameters count
 * as given, the one comparison rule, command-line flags and their help.
 * ps_server, ps_worker and ps_launch parse their optimizer flags here; the
 * hello (proto/) and the checkpoint header (server/) walk the same table. */
#ifndef PS_OPT_TABLE_H
#define PS_OPT_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ps_types.h"

/* One row of the table, for code that walks it. */
typedef struct ps_opt_param {
    const char *name;   /* "lr", "weight_decay" (the C field) */
    const char *key;    /* wire key in the hello map: "lr", "wd" */
    const char *flag;   /* "--lr"; the flag without "--" names it in messages */
    int is_int;         /* uint32_t field (else float) */
    double def, lo, hi;
    int lo_open, hi_open;
    uint32_t used;      /* PS_OPT_USED_* bits */
    int zero_unset;     /* 0 means "not given" */
    const char *help;
} ps_opt_param;

const ps_opt_param *ps_opt_param_at(int p); /* 0 <= p < PS_OPT_NPARAMS */

/* ps_opt_name and ps_opt_parse: include/ps_types.h */

/* Every field at its default, kind sgd, everything given (a server's view). */
void ps_opt_default(ps_opt_config *c);

/* The value of hyper-parameter p as a double; set it (no range check). */
double ps_opt_get(const ps_opt_config *c, int p);
void ps_opt_set(ps_opt_config *c, int p, double v);

/* Is p given: its bit in c->given, or a non-zero value in a row where zero
 * means "not given". */
int ps_opt_is_given(const ps_opt_config *c, int p);

/* Does the optimizer `kind` use p?  (PS_OPT_NONE: every p.) */
int ps_opt_uses(int kind, int p);

/* PS_EINVAL when kind is not a real optimizer (allow_none: PS_OPT_NONE is
 * fine) or a given hyper-parameter is out of its range; why names the flag,
 * the range and the value. */
int ps_opt_check(const ps_opt_config *c, int allow_none, char *why, size_t why_len);

/* The one comparison rule (hello, and server against server): the kinds
 * must agree when both name one; then every hyper-parameter the optimizer
 * uses and both sides give must be equal.  PS_EMISMATCH with "lr: <an> has
 * 0.001, <bn> has 0.05" in why. */
int ps_opt_compare(const ps_opt_config *a, const char *an, const ps_opt_config *b,
                   const char *bn, char *why, size_t why_len);

/* Command-line flags: --optimizer NAME and one flag per hyper-parameter,
 * with its range.  When `flag` is one of them: parse val into c (setting the
 * given bit), *handled = 1, and return 0 or PS_EINVAL ("<prog>: --lr must be
 * a number in (0, 1e+06], got 'x'" in why).  Otherwise *handled = 0. */
int ps_opt_flag(const char *prog, const char *flag, const char *val, ps_opt_config *c,
                int *handled, char *why, size_t why_len);

/* NULL-terminated list of those flags ("--optimizer" first), for
 * the settings parser and for forwarding them (ps_launch). */
const char *const *ps_opt_flag_names(void);

/* Help lines for those flags, with ranges and defaults, `indent` spaces in. */
void ps_opt_usage(FILE *f, int indent);

/* "adam (lr 0.001, beta1 0.9, beta2 0.999, eps 1e-08, weight-decay 0,
 * lr-decay 1 every 0)": the kind and the hyper-parameters it uses. */
void ps_opt_describe(const ps_opt_config *c, char *buf, size_t len);

/* FNV-1a of the kind and every hyper-parameter (bit patterns), continuing
 * from h: for configuration fingerprints. */
uint64_t ps_opt_hash(uint64_t h, const ps_opt_config *c);

#endif
