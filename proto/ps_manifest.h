/* An export's manifest (docs/OPERATIONS.md "Export and serve"): the names
 * of its files and a table's declaration and an optimizer as JSON members,
 * one way for libps's exporter (client/export_write.c), which writes it,
 * and for ps_server --import (server/import.c), which reads it.  No state. */
#ifndef PS_MANIFEST_H
#define PS_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "ps_json.h"
#include "ps_strbuf.h"
#include "ps_types.h"

#define PS_MANIFEST_FILE "manifest.json"
#define PS_EXPORT_FORMAT "ps-export"
#define PS_EXPORT_FORMAT_VERSION 1

/* "tables/KEY.WHAT.npy" or "dense/KEY.WHAT.npy" (what "weights", "ids",
 * "counts", "state0" ...), relative to the export's folder. */
void ps_manifest_file(char *out, size_t len, int table, uint64_t key, const char *what);

/* `"optimizer": {"kind": NAME, "kind_id": N, every hyper-parameter}`
 * (table: a table's kind names, FTRL included). */
void ps_manifest_put_opt(ps_strbuf *b, const ps_opt_config *o, int table);
/* The declaration's members: every field of PS_TABLE_DECL_FIELDS by its C
 * name, "init_name", then the optimizer as above (no braces around). */
void ps_manifest_put_decl(ps_strbuf *b, const ps_table_options *d);
/* Read them back from a table's object: PS_EDATA (why names the member)
 * when one is missing or of another type; the declaration is checked by
 * the caller (ps_table_decl_check). */
int ps_manifest_get_decl(const ps_json *t, ps_table_options *d, char *why, size_t why_len);

#endif
