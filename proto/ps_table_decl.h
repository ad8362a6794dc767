/* A table's declaration (ps_table_options, include/ps_types.h) as every side
 * handles it: its fields in one list (wire key, name in messages), the
 * defaults, the range check, the one comparison rule and the fingerprint.
 * libps checks a declaration at register and sends it in a TABLE message
 * (ps_proto.c encodes, ps_proto_decode.c decodes the map `tb` from the list
 * below); the server keeps the first and compares later ones, and its
 * checkpoints hold it.  No state. */
#ifndef PS_TABLE_DECL_H
#define PS_TABLE_DECL_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

/* The fields besides the optimizer, one row each:
 *   X(field, type, wire key in `tb`, name in messages)
 * type: U32, I32, F32 or U64 (uint32_t, int, float, uint64_t).  The
 * optimizer goes as `opt` (its kind, PS_TABLE_OPT_FTRL included) and every
 * row of PS_OPT_PARAMS under its hello key. */
#define PS_TABLE_DECL_FIELDS(X)                                                             \
    PS_TABLE_DECL_STORED(X)                                                                 \
    X(full, U32, "full", "full")

/* The fields a checkpoint's partition record keeps in its declaration
 * bytes (server/checkpoint.c; `full` goes in the record's flags). */
#define PS_TABLE_DECL_STORED(X)                                                             \
    X(dim, U32, "dim", "dim")                                                               \
    X(init, I32, "init", "initializer")                                                     \
    X(init_scale, F32, "sc", "init-scale")                                                  \
    X(seed, U64, "seed", "seed")                                                            \
    X(ftrl_beta, F32, "fb", "ftrl-beta")                                                    \
    X(ftrl_l1, F32, "f1", "ftrl-l1")                                                        \
    X(ftrl_l2, F32, "f2", "ftrl-l2")                                                        \
    X(max_rows, U64, "mr", "max-rows")                                                      \
    X(min_count, U32, "mc", "min-count")                                                    \
    X(filter_cells, U32, "fc", "filter-cells")

/* The defaults (ps_client.h): dim 0 (to be set), uniform in [-0.01, 0.01),
 * seed 0, adagrad (kind PS_OPT_NONE) with the optimizer table's defaults,
 * FTRL beta 1, l1 0, l2 0, no row cap (full: evict), no filter. */
void ps_table_options_default(ps_table_options *o);

/* The optimizer the servers run for o: kind PS_OPT_NONE is adagrad. */
int ps_table_decl_kind(const ps_table_options *o);
/* The dense kind whose hyper-parameters a table's kind uses (FTRL: sgd's;
 * row-wise adagrad: adagrad's; the others their own). */
int ps_table_decl_params_kind(int kind);

/* PS_EINVAL, with why naming table `key`, the field, its range and the
 * value, when a field is out of range: dim 1..PS_MAX_TABLE_DIM, the
 * initializer, a scale that is not a finite number >= 0, an optimizer tables
 * do not take or a hyper-parameter it uses out of its flag's range, FTRL's
 * beta, l1 and l2 (finite, >= 0), min_count > 255, filter_cells 1..63,
 * full not PS_TABLE_FULL_EVICT or PS_TABLE_FULL_REFUSE. */
int ps_table_decl_check(uint64_t key, const ps_table_options *o, char *why, size_t why_len);

/* The one comparison rule: every field equal (the optimizer's kind as the
 * servers run it; each hyper-parameter it uses; FTRL's only for FTRL).
 * PS_EMISMATCH with "table 7: dim: worker 1 has 16, server 0 has 32" (an
 * and bn name the two sides) in why. */
int ps_table_decl_compare(uint64_t key, const ps_table_options *a, const char *an,
                          const ps_table_options *b, const char *bn, char *why, size_t why_len);

/* FNV-1a continued from h over table `key` and every field as the
 * comparison sees it (so two declarations compare equal exactly when their
 * hashes do, barring collisions): the hello's model fingerprint covers the
 * tables (docs/PROTOCOL.md "Tables"). */
uint64_t ps_table_decl_hash(uint64_t h, uint64_t key, const ps_table_options *o);

/* The tables' fingerprint of the hello (`tfp`): FNV-1a over every table's
 * key and declaration (ps_table_decl_hash) in the order of their keys, so
 * the order they were declared in does not matter; 0 is sent as 1.  The
 * tables are n entries of `stride` bytes from base, each with its key at
 * key_off and its ps_table_options at decl_off.  0 for none. */
uint64_t ps_table_decl_fingerprint(const void *base, size_t n, size_t stride, size_t key_off,
                                   size_t decl_off);

/* The declaration as the comparison sees it: the optimizer's kind resolved,
 * what its kind does not use at the defaults, the scale of zeros, the
 * cells of no filter and the full policy of no cap 0.  Checkpoints keep
 * this form. */
void ps_table_decl_normalize(ps_table_options *o);

#endif
