/* A small JSON reader for the manifests the programs write themselves (an
 * export's manifest.json, docs/OPERATIONS.md "Export and serve"): the whole
 * text parsed into a tree of values; integers kept exact up to 64 bits.
 * Strings with \uXXXX escapes keep the escape as UTF-8 for code points
 * below 0x800 and '?' beyond (our manifests write ASCII). */
#ifndef PS_JSON_H
#define PS_JSON_H

#include <stddef.h>
#include <stdint.h>

enum { PS_JSON_NULL, PS_JSON_BOOL, PS_JSON_NUM, PS_JSON_STR, PS_JSON_ARR, PS_JSON_OBJ };

typedef struct ps_json {
    int type;
    char *key;            /* a member of an object: its name */
    char *str;            /* STR */
    double num;           /* NUM (and BOOL: 0 or 1) */
    int is_int, neg;      /* NUM written as an integer: its magnitude in u */
    uint64_t u;
    struct ps_json *kids; /* ARR, OBJ: n of them */
    size_t n;
} ps_json;

/* Parse text (len bytes) into *out (free with ps_json_free).  PS_EDATA
 * with the line and what was expected in why, PS_ENOMEM. */
int ps_json_parse(const char *text, size_t len, ps_json *out, char *why, size_t why_len);
/* Read and parse a file (PS_ENOTFOUND, PS_EIO, PS_EDATA: why names it). */
int ps_json_load(const char *path, ps_json *out, char *why, size_t why_len);
void ps_json_free(ps_json *j);

/* Member `key` of object j, or NULL. */
const ps_json *ps_json_get(const ps_json *j, const char *key);
/* Member values: 0 when there and of the type, else -1 (*out untouched). */
int ps_json_u64(const ps_json *j, const char *key, uint64_t *out);
int ps_json_i64(const ps_json *j, const char *key, int64_t *out);
int ps_json_f64(const ps_json *j, const char *key, double *out);
const char *ps_json_str(const ps_json *j, const char *key); /* NULL when not a string */

#endif
