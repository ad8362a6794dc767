/* An export's manifest (docs/OPERATIONS.md "Export and serve"): the names
 * of its files, JSON strings, and a table's declaration and an optimizer as
 * JSON members, as libps's exporter (client/export_write.c) writes them;
 * ps_server --import (server/import.c) reads them back with json-c, by the
 * same names.  No state. */
#ifndef PS_MANIFEST_H
#define PS_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "ps_strbuf.h"
#include "ps_types.h"

#define PS_MANIFEST_FILE "manifest.json"
#define PS_EXPORT_FORMAT "ps-export"
#define PS_EXPORT_FORMAT_VERSION 1

/* "tables/KEY.WHAT.npy" or "dense/KEY.WHAT.npy" (what "weights", "ids",
 * "counts", "state0" ...), relative to the export's folder. */
void ps_manifest_file(char *out, size_t len, int table, uint64_t key, const char *what);

/* s as a JSON string, quoted: '"' and '\\' escaped, control characters
 * and bytes past ASCII as \u00XX (a table's name is a user's string). */
void ps_manifest_put_str(ps_strbuf *b, const char *s);

/* The name of an optimizer kind in a manifest: ps_opt_name's, and for a
 * table (table != 0) "ftrl" and "rowwise_adagrad" too. */
const char *ps_manifest_kind_name(int kind, int table);

/* `"optimizer": {"kind": NAME, "kind_id": N, every hyper-parameter}`
 * (table: a table's kind names, FTRL and row-wise adagrad included). */
void ps_manifest_put_opt(ps_strbuf *b, const ps_opt_config *o, int table);
/* The declaration's members: every field of PS_TABLE_DECL_FIELDS by its C
 * name, "init_name", then the optimizer as above (no braces around). */
void ps_manifest_put_decl(ps_strbuf *b, const ps_table_options *d);

#endif
