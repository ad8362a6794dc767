/* ps_server --import (import.h). */
#include "import.h"

#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_manifest.h"
#include "ps_npy.h"
#include "ps_table_decl.h"
#include "ps_table_row.h"
#include "server.h"
#include "table_opt.h"

/* ---- the manifest's members (json-c) ---- */

/* Member `key` of object o, or NULL. */
static struct json_object *member(struct json_object *o, const char *key)
{
    struct json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object) ||
        !json_object_object_get_ex(o, key, &v))
        return NULL;
    return v;
}

/* 0 with *out when the member is an integer in [0, 2^64), else -1 */
static int get_u64(struct json_object *o, const char *key, uint64_t *out)
{
    struct json_object *v = member(o, key);
    if (!v || !json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
        return -1;
    *out = json_object_get_uint64(v);
    return 0;
}

/* 0 with *out when the member is an integer of int64_t, else -1 */
static int get_i64(struct json_object *o, const char *key, int64_t *out)
{
    struct json_object *v = member(o, key);
    if (!v || !json_object_is_type(v, json_type_int))
        return -1;
    errno = 0;
    int64_t i = json_object_get_int64(v);
    if (errno == ERANGE || (i == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX))
        return -1; /* past int64_t */
    *out = i;
    return 0;
}

/* 0 with *out when the member is a number, else -1 */
static int get_f64(struct json_object *o, const char *key, double *out)
{
    struct json_object *v = member(o, key);
    if (!v || !(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
        return -1;
    *out = json_object_get_double(v);
    return 0;
}

/* the member's string, or NULL when it is not one */
static const char *get_str(struct json_object *o, const char *key)
{
    struct json_object *v = member(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int missing(const char *what, char *why, size_t why_len)
{
    ps_errorf(why, why_len, "the member \"%s\" is missing or not a number", what);
    return PS_EDATA;
}

/* Parse the file at path (all of it: one JSON value) into *out.  PS_EDATA
 * (why: json-c's reason and the line), PS_EIO, PS_ENOMEM. */
static int load_json(const char *path, struct json_object **out, char *why, size_t why_len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        ps_errorf(why, why_len, "cannot read %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len + 65536 > cap) {
            char *t = realloc(text, cap = 2 * cap + 65536);
            if (!t) {
                rc = PS_ENOMEM;
                break;
            }
            text = t;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (!rc && ferror(f))
        rc = PS_EIO;
    fclose(f);
    if (rc) {
        ps_errorf(why, why_len, "cannot read %s: %s", path,
            rc == PS_ENOMEM ? "out of memory" : strerror(errno));
        free(text);
        return rc;
    }
    struct json_tokener *tok = json_tokener_new();
    if (!tok) {
        free(text);
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    struct json_object *v = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    while (v && end < len && (text[end] == ' ' || text[end] == '\n' || text[end] == '\t' ||
                              text[end] == '\r'))
        end++;
    if (!v || e != json_tokener_success || end != len) {
        size_t line = 1;
        for (size_t i = 0; i < end && i < len; i++)
            line += text[i] == '\n';
        ps_errorf(why, why_len, "%s is not one JSON value: %s at line %zu", path,
            e == json_tokener_continue ? "the text ends inside a value (cut short?)"
            : e != json_tokener_success ? json_tokener_error_desc(e)
                                        : "more text after the value",
            line);
        json_object_put(v);
        rc = PS_EDATA;
    } else {
        *out = v;
    }
    json_tokener_free(tok);
    free(text);
    return rc;
}

/* A table's declaration from its object, as the exporter wrote it
 * (ps_manifest_put_decl: each field by its C name, the optimizer's kind_id
 * and hyper-parameters): PS_EDATA (why names the member) when one is
 * missing or of another type; the caller checks the declaration. */
static int get_decl(struct json_object *t, ps_table_options *d, char *why, size_t why_len)
{
    memset(d, 0, sizeof *d);
    uint64_t u;
    int64_t i;
    double f;
#define GET_U32(fl)                                                                      \
    do {                                                                                 \
        if (get_u64(t, #fl, &u) || u > UINT32_MAX)                                       \
            return missing(#fl, why, why_len);                                           \
        d->fl = (uint32_t)u;                                                             \
    } while (0);
#define GET_I32(fl)                                                                      \
    do {                                                                                 \
        if (get_i64(t, #fl, &i) || i < INT32_MIN || i > INT32_MAX)                       \
            return missing(#fl, why, why_len);                                           \
        d->fl = (int)i;                                                                  \
    } while (0);
#define GET_U64(fl)                                                                      \
    do {                                                                                 \
        if (get_u64(t, #fl, &u))                                                         \
            return missing(#fl, why, why_len);                                           \
        d->fl = u;                                                                       \
    } while (0);
#define GET_F32(fl)                                                                      \
    do {                                                                                 \
        if (get_f64(t, #fl, &f))                                                         \
            return missing(#fl, why, why_len);                                           \
        d->fl = (float)f;                                                                \
    } while (0);
#define GET_DECL_(fl, type, key, name) GET_##type(fl)
    PS_TABLE_DECL_FIELDS(GET_DECL_)
#undef GET_DECL_
    struct json_object *o = member(t, "optimizer");
    if (!o || get_i64(o, "kind_id", &i) || i < INT32_MIN || i > INT32_MAX)
        return missing("optimizer.kind_id", why, why_len);
    d->opt.kind = (int)i;
#define GET_OPT_(fl, ty, key, flag, def, lo, lob, hi, hib, used, zu, help)                    \
    if (get_f64(o, #fl, &f))                                                                 \
        return missing("optimizer." #fl, why, why_len);                                      \
    d->opt.fl = (ty)f;
    PS_OPT_PARAMS(GET_OPT_)
#undef GET_OPT_
#undef GET_U32
#undef GET_I32
#undef GET_U64
#undef GET_F32
    d->opt.given = PS_OPT_GIVEN_ALL;
    return 0;
}

/* A table's name as the wire takes it (TABLE's `nm`: printable ASCII, the
 * last PS_TABLE_NAME_MAX characters, as ps.torch sends a longer one), or
 * NULL: none (null: the export did not know it) or one that is not text. */
static const char *table_name(const char *name, uint64_t key)
{
    if (!name || !name[0])
        return NULL;
    size_t n = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (name[i] < 0x20 || name[i] >= 0x7f) {
            ps_warn("--import: table %llu's name in the manifest is not printable ASCII: the "
                    "table goes unnamed until a worker declares it", (unsigned long long)key);
            return NULL;
        }
    return n > PS_TABLE_NAME_MAX ? name + n - PS_TABLE_NAME_MAX : name;
}

/* ---- a table's files ---- */

/* The files of one table, mapped. */
typedef struct tfiles {
    ps_npy_in ids, w, counts, state[2];
} tfiles;

static void close_files(tfiles *f)
{
    ps_npy_close_in(&f->ids);
    ps_npy_close_in(&f->w);
    ps_npy_close_in(&f->counts);
    ps_npy_close_in(&f->state[0]);
    ps_npy_close_in(&f->state[1]);
}

/* Map the member `what` of table t (a file name under dir) as a dtype array
 * of rows x cols (cols 0: one dimension; cols 1 takes (rows,) too). */
static int open_file(const char *dir, struct json_object *t, const char *what, int dtype,
                     uint64_t rows, uint64_t cols, ps_npy_in *in, char *why, size_t why_len)
{
    const char *rel = get_str(t, what);
    if (!rel || strstr(rel, "..") || rel[0] == '/') {
        ps_errorf(why, why_len, "no file named for \"%s\"", what);
        return PS_EDATA;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int rc = ps_npy_open(in, path, why, why_len);
    if (rc)
        return rc == PS_ENOTFOUND ? PS_EDATA : rc;
    int shape_ok = cols == 0   ? in->ndim == 1
                   : cols == 1 ? in->ndim == 1 || (in->ndim == 2 && in->cols == 1)
                               : in->ndim == 2 && in->cols == cols;
    if (in->dtype != dtype || in->rows != rows || !shape_ok) {
        ps_errorf(why, why_len, "%s: not %llu x %llu of the type the manifest says", path,
            (unsigned long long)rows, (unsigned long long)cols);
        ps_npy_close_in(in);
        return PS_EDATA;
    }
    return 0;
}

/* One partition's rows of a table: the rows r with part[r] == idx go into
 * store, each with its state (or zeros) and count.  Partitions are
 * independent stores, so each has a thread of its own (import_rows). */
typedef struct restore_job {
    ps_table *store;
    uint16_t idx;
    const uint16_t *part;
    const uint64_t *ids;
    const float *w, *state[2], *zeros;
    const uint32_t *counts;
    uint64_t rows;
    uint32_t dim, slen;
    int nstate;
    uint64_t here;
    int rc;
    char msg[512];
} restore_job;

static void *restore_part(void *arg)
{
    restore_job *j = arg;
    size_t d = j->dim;
    for (uint64_t r = 0; !j->rc && r < j->rows; r++) {
        if (j->part[r] != j->idx)
            continue;
        ps_table_row_view v = {.id = j->ids[r], .dim = j->dim, .nstate = j->nstate,
                               .w = j->w + r * d, .state_len = j->slen};
        for (int k = 0; k < j->nstate; k++)
            v.state[k] = j->state[k] ? j->state[k] + r * j->slen : j->zeros;
        v.count = j->counts ? j->counts[r] : 0;
        j->rc = ps_table_restore_row(j->store, &v, j->msg, sizeof j->msg);
        j->here++;
    }
    return NULL;
}

/* Restore jobs[0..T) at once: a thread for each partition with rows but
 * the first (this thread's); one that cannot start runs here after it (one
 * without rows has nothing to do).
 * The first error, with its message in why. */
static int import_rows(restore_job *jobs, int T, uint64_t *here, char *why, size_t why_len)
{
    pthread_t th[PS_SERVER_MAX_THREADS];
    int started[PS_SERVER_MAX_THREADS] = {0};
    for (int i = 1; i < T; i++)
        started[i] = jobs[i].rows && pthread_create(&th[i], NULL, restore_part, &jobs[i]) == 0;
    restore_part(&jobs[0]);
    int rc = 0;
    for (int i = 0; i < T; i++) {
        if (i && started[i])
            pthread_join(th[i], NULL);
        else if (i)
            restore_part(&jobs[i]);
        *here += jobs[i].here;
        if (jobs[i].rc && !rc) {
            rc = jobs[i].rc;
            snprintf(why, why_len, "%s", jobs[i].msg);
        }
    }
    return rc;
}

static int import_table(const char *dir, struct json_object *t, int rank, int S, int W,
                        int state, const ps_ckpt_restore_to *to, uint64_t *rows_here, char *why,
                        size_t why_len)
{
    uint64_t key, rows;
    int64_t version;
    ps_table_options decl;
    char msg[512];
    if (get_u64(t, "key", &key)) {
        ps_errorf(why, why_len, "a table without a key (an integer)");
        return PS_EDATA;
    }
    int rc = get_decl(t, &decl, msg, sizeof msg);
    if (!rc && (get_u64(t, "rows", &rows) || get_i64(t, "version", &version))) {
        ps_errorf(msg, sizeof msg, "the member \"rows\" or \"version\" is missing or not an "
            "integer");
        rc = PS_EDATA;
    }
    if (rc) {
        ps_errorf(why, why_len, "table %llu: %s", (unsigned long long)key, msg);
        return rc;
    }
    if ((rc = ps_table_decl_check(key, &decl, why, why_len)) != 0)
        return PS_EDATA;
    const char *name = table_name(get_str(t, "name"), key);
    int nstate = ps_table_state_arrays(decl.opt.kind), keep = state == PS_IMPORT_KEEP;
    size_t slen = ps_table_state_len(decl.opt.kind, decl.dim); /* a row-wise kind's: 1 */
    tfiles f;
    memset(&f, 0, sizeof f);
    rc = open_file(dir, t, "ids", PS_NPY_U8, rows, 0, &f.ids, msg, sizeof msg);
    if (!rc)
        rc = open_file(dir, t, "weights", PS_NPY_F4, rows, decl.dim, &f.w, msg, sizeof msg);
    if (!rc && keep) {
        struct json_object *st = member(t, "state");
        if (!st || !json_object_is_type(st, json_type_array) ||
            json_object_array_length(st) != (size_t)nstate || !get_str(t, "counts")) {
            ps_errorf(msg, sizeof msg, "the export holds no optimizer state of it (%s needs %d "
                "arrays): export with the state, or start with --import-state reset",
                ps_table_opt_name(decl.opt.kind), nstate);
            rc = PS_EDATA;
        }
        for (int k = 0; !rc && k < nstate; k++) {
            char sname[24];
            snprintf(sname, sizeof sname, "state%d", k);
            rc = open_file(dir, t, sname, PS_NPY_F4, rows, slen, &f.state[k], msg, sizeof msg);
        }
        if (!rc)
            rc = open_file(dir, t, "counts", PS_NPY_U4, rows, 0, &f.counts, msg, sizeof msg);
    }
    if (rc) {
        close_files(&f);
        ps_errorf(why, why_len, "table %llu: %s", (unsigned long long)key, msg);
        return rc;
    }
    /* declared on every thread, as the export has it */
    int T = to->nshards;
    for (int i = 0; i < T && !rc; i++) {
        ps_table *store;
        rc = ps_tparts_make_store(to->tc, key, &decl, &store, msg, sizeof msg);
        if (!rc)
            rc = ps_tparts_adopt(to->tparts[i], key, &decl, store, msg, sizeof msg);
    }
    for (int i = 0; !rc && name && i < T; i++) /* for the logs and the next export */
        ps_tparts_set_name(to->tparts[i], key, name);
    if (!rc && to->declared)
        to->declared(to->user, key, &decl);
    /* this server's rows: their partitions first, to size each store */
    const uint64_t *ids = f.ids.data;
    uint16_t *part = rc ? NULL : malloc((rows ? rows : 1) * sizeof *part);
    uint64_t per[PS_SERVER_MAX_THREADS] = {0};
    if (!rc && !part) {
        ps_errorf(msg, sizeof msg, "out of memory");
        rc = PS_ENOMEM;
    }
    for (uint64_t r = 0; !rc && r < rows; r++) {
        uint64_t h = ps_table_row_hash(key, ids[r]);
        part[r] = UINT16_MAX;
        if (ps_table_row_server(h, S) == rank) {
            part[r] = (uint16_t)ps_table_row_part(h, S, (uint32_t)T);
            per[part[r]]++;
        }
    }
    for (int i = 0; !rc && i < T; i++)
        if (per[i])
            rc = ps_table_reserve(ps_tparts_store(to->tparts[i], key), per[i], msg, sizeof msg);
    float *zeros = rc ? NULL : calloc(slen, sizeof *zeros); /* reset: a row's state */
    if (!rc && !zeros) {
        ps_errorf(msg, sizeof msg, "out of memory");
        rc = PS_ENOMEM;
    }
    uint64_t here = 0;
    restore_job *jobs = rc ? NULL : calloc((size_t)T, sizeof *jobs);
    if (!rc && !jobs) {
        ps_errorf(msg, sizeof msg, "out of memory");
        rc = PS_ENOMEM;
    }
    for (int i = 0; !rc && i < T; i++) {
        restore_job *j = &jobs[i];
        *j = (restore_job){.store = ps_tparts_store(to->tparts[i], key), .idx = (uint16_t)i,
                           .part = part, .ids = ids, .w = f.w.data, .zeros = zeros,
                           .counts = keep ? f.counts.data : NULL, .rows = per[i] ? rows : 0,
                           .dim = decl.dim, .slen = (uint32_t)slen, .nstate = nstate};
        for (int k = 0; keep && k < nstate; k++)
            j->state[k] = f.state[k].data;
    }
    if (!rc)
        rc = import_rows(jobs, T, &here, msg, sizeof msg);
    free(jobs);
    free(part);
    free(zeros);
    close_files(&f);
    if (!rc) {
        int64_t step = keep ? version : 0;
        int64_t *clock = malloc((size_t)W * sizeof *clock);
        if (!clock)
            rc = PS_ENOMEM;
        for (int r = 0; clock && r < W; r++)
            clock[r] = step;
        for (int i = 0; !rc && i < T; i++)
            rc = ps_tparts_restored(to->tparts[i], key, step, clock);
        free(clock);
        if (rc)
            ps_errorf(msg, sizeof msg, "out of memory");
    }
    if (rc) {
        ps_errorf(why, why_len, "table %llu: %s", (unsigned long long)key, msg);
        return rc == PS_EMISMATCH || rc == PS_EINVAL ? PS_EDATA : rc;
    }
    *rows_here += here;
    ps_info("--import: table %llu: %llu of its %llu rows here (dim %u, %s, %s), step %lld",
            (unsigned long long)key, (unsigned long long)here, (unsigned long long)rows, decl.dim,
            ps_table_opt_name(decl.opt.kind), keep ? "optimizer state kept" : "state reset",
            (long long)(keep ? version : 0));
    return 0;
}

int ps_import_tables(const char *dir, int rank, int num_servers, int num_workers, int state,
                     const ps_ckpt_restore_to *to, uint64_t *rows, char *why, size_t why_len)
{
    char path[4096], msg[512];
    snprintf(path, sizeof path, "%s/%s", dir, PS_MANIFEST_FILE);
    *rows = 0;
    if (access(path, R_OK) != 0) {
        int e = errno;
        ps_errorf(why, why_len, "--import %s: cannot read %s: %s (an export's folder holds %s)",
            dir, path, strerror(e), PS_MANIFEST_FILE);
        return e == ENOENT || e == ENOTDIR ? PS_ENOTFOUND : PS_EDATA;
    }
    struct json_object *m = NULL;
    int rc = load_json(path, &m, msg, sizeof msg);
    if (rc) {
        ps_errorf(why, why_len, "--import %s: %s", dir, msg);
        return rc;
    }
    const char *fmt = get_str(m, "format");
    uint64_t version = 0;
    struct json_object *tables = member(m, "tables");
    if (!fmt || strcmp(fmt, PS_EXPORT_FORMAT) || get_u64(m, "format_version", &version) ||
        version != PS_EXPORT_FORMAT_VERSION || !tables ||
        !json_object_is_type(tables, json_type_array)) {
        ps_errorf(why, why_len, "--import %s: %s is not an export's manifest of format %s %d",
            dir, path, PS_EXPORT_FORMAT, PS_EXPORT_FORMAT_VERSION);
        json_object_put(m);
        return PS_EDATA;
    }
    size_t n = json_object_array_length(tables);
    for (size_t k = 0; !rc && k < n; k++) {
        rc = import_table(dir, json_object_array_get_idx(tables, k), rank, num_servers,
                          num_workers, state, to, rows, msg, sizeof msg);
        if (rc)
            ps_errorf(why, why_len, "--import %s: %s", dir, msg);
    }
    if (!rc)
        ps_info("--import %s: %zu tables, %llu rows on this server (%d of %d)", dir, n,
                (unsigned long long)*rows, rank, num_servers);
    json_object_put(m);
    return rc;
}
