/* ps_server --import (import.h). */
#include "import.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_manifest.h"
#include "ps_npy.h"
#include "ps_table_decl.h"
#include "ps_table_row.h"
#include "server.h"
#include "table_opt.h"

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
 * of rows x cols (cols 0: one dimension). */
static int open_file(const char *dir, const ps_json *t, const char *what, int dtype,
                     uint64_t rows, uint64_t cols, ps_npy_in *in, char *why, size_t why_len)
{
    const char *rel = ps_json_str(t, what);
    if (!rel || strstr(rel, "..") || rel[0] == '/') {
        ps_errorf(why, why_len, "no file named for \"%s\"", what);
        return PS_EDATA;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int rc = ps_npy_open(in, path, why, why_len);
    if (rc)
        return rc == PS_ENOTFOUND ? PS_EDATA : rc;
    if (in->dtype != dtype || in->rows != rows || (cols ? in->ndim != 2 || in->cols != cols
                                                        : in->ndim != 1)) {
        ps_errorf(why, why_len, "%s: not %llu x %llu of the type the manifest says", path,
            (unsigned long long)rows, (unsigned long long)cols);
        ps_npy_close_in(in);
        return PS_EDATA;
    }
    return 0;
}

static int import_table(const char *dir, const ps_json *t, int rank, int S, int W, int state,
                        const ps_ckpt_restore_to *to, uint64_t *rows_here, char *why,
                        size_t why_len)
{
    uint64_t key, rows;
    int64_t version;
    ps_table_options decl;
    int rc = ps_manifest_get_decl(t, &decl, why, why_len);
    if (rc)
        return rc;
    if (ps_json_u64(t, "key", &key) || ps_json_u64(t, "rows", &rows) ||
        ps_json_i64(t, "version", &version)) {
        ps_errorf(why, why_len, "a table without key, rows or version");
        return PS_EDATA;
    }
    if ((rc = ps_table_decl_check(key, &decl, why, why_len)) != 0)
        return PS_EDATA;
    int nstate = ps_table_state_arrays(decl.opt.kind), keep = state == PS_IMPORT_KEEP;
    tfiles f;
    memset(&f, 0, sizeof f);
    char msg[512];
    rc = open_file(dir, t, "ids", PS_NPY_U8, rows, 0, &f.ids, msg, sizeof msg);
    if (!rc)
        rc = open_file(dir, t, "weights", PS_NPY_F4, rows, decl.dim, &f.w, msg, sizeof msg);
    if (!rc && keep) {
        const ps_json *st = ps_json_get(t, "state");
        if (!st || st->type != PS_JSON_ARR || (int)st->n != nstate ||
            !ps_json_str(t, "counts")) {
            ps_errorf(msg, sizeof msg, "the export holds no optimizer state of it (%s needs %d "
                "arrays): export with the state, or start with --import-state reset",
                ps_opt_name(decl.opt.kind), nstate);
            rc = PS_EDATA;
        }
        for (int k = 0; !rc && k < nstate; k++) {
            char name[24];
            snprintf(name, sizeof name, "state%d", k);
            rc = open_file(dir, t, name, PS_NPY_F4, rows, decl.dim, &f.state[k], msg, sizeof msg);
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
    float *zeros = rc ? NULL : calloc(decl.dim, sizeof *zeros); /* reset: a row's state */
    if (!rc && !zeros) {
        ps_errorf(msg, sizeof msg, "out of memory");
        rc = PS_ENOMEM;
    }
    const float *w = f.w.data;
    const uint32_t *counts = keep ? f.counts.data : NULL;
    size_t d = decl.dim;
    uint64_t here = 0;
    for (uint64_t r = 0; !rc && r < rows; r++) {
        if (part[r] == UINT16_MAX)
            continue;
        ps_table_row_view v = {.id = ids[r], .dim = decl.dim, .nstate = nstate, .w = w + r * d};
        for (int k = 0; k < nstate; k++)
            v.state[k] = keep ? (const float *)f.state[k].data + r * d : zeros;
        v.count = counts ? counts[r] : 0;
        rc = ps_table_restore_row(ps_tparts_store(to->tparts[part[r]], key), &v, msg, sizeof msg);
        here++;
    }
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
    ps_json m;
    *rows = 0;
    int rc = ps_json_load(path, &m, msg, sizeof msg);
    if (rc) {
        ps_errorf(why, why_len, "--import %s: %s (an export's folder holds %s)", dir, msg,
            PS_MANIFEST_FILE);
        return rc == PS_ENOTFOUND ? PS_ENOTFOUND : PS_EDATA;
    }
    const char *fmt = ps_json_str(&m, "format");
    uint64_t version = 0;
    const ps_json *tables = ps_json_get(&m, "tables");
    if (!fmt || strcmp(fmt, PS_EXPORT_FORMAT) || ps_json_u64(&m, "format_version", &version) ||
        version != PS_EXPORT_FORMAT_VERSION || !tables || tables->type != PS_JSON_ARR) {
        ps_errorf(why, why_len, "--import %s: %s is not an export's manifest of format %s %d",
            dir, path, PS_EXPORT_FORMAT, PS_EXPORT_FORMAT_VERSION);
        ps_json_free(&m);
        return PS_EDATA;
    }
    for (size_t k = 0; !rc && k < tables->n; k++) {
        rc = import_table(dir, &tables->kids[k], rank, num_servers, num_workers, state, to, rows,
                          msg, sizeof msg);
        if (rc)
            ps_errorf(why, why_len, "--import %s: %s", dir, msg);
    }
    if (!rc)
        ps_info("--import %s: %zu tables, %llu rows on this server (%d of %d)", dir, tables->n,
                (unsigned long long)*rows, rank, num_servers);
    ps_json_free(&m);
    return rc;
}
