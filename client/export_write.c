/* libps: an export's folder from snapshot items (export_write.h). */
#include "export_write.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_manifest.h"
#include "ps_npy.h"
#include "ps_snap.h"
#include "ps_strbuf.h"
#include "ps_table_decl.h"

#define GATHER_BYTES (4u << 20)

typedef struct witem {
    unsigned char *buf;
    ps_snap_item it;
} witem;

struct ps_export_writer {
    char dir[3072], partial[3200];
    ps_export_info info;
    char source[32], from[1024];
    witem *items;
    size_t n, cap;
};

/* ---- the partial folder ---- */

static void rm_tree(const char *path, int depth)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        char sub[4096];
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
            struct stat st;
            if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode) && depth < 2)
                rm_tree(sub, depth + 1);
            else
                unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

static int empty_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    struct dirent *de;
    int empty = 1;
    while (empty && (de = readdir(d)))
        empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
    closedir(d);
    return empty;
}

int ps_export_writer_open(const char *dir, const ps_export_info *info, ps_export_writer **out,
                          char *why, size_t why_len)
{
    *out = NULL;
    size_t dl = dir ? strlen(dir) : 0;
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    if (!dl || dl >= 3000) {
        ps_errorf(why, why_len, "export: give a folder to write (got \"%s\")", dir ? dir : "");
        return PS_EINVAL;
    }
    struct stat st;
    char d[3072];
    snprintf(d, sizeof d, "%.*s", (int)dl, dir);
    if (stat(d, &st) == 0 && !(S_ISDIR(st.st_mode) && empty_dir(d))) {
        ps_errorf(why, why_len, "export: %s exists and is not an empty folder: an export goes to a "
            "new one", d);
        return PS_EINVAL;
    }
    ps_export_writer *w = calloc(1, sizeof *w);
    if (!w) {
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    snprintf(w->dir, sizeof w->dir, "%s", d);
    snprintf(w->partial, sizeof w->partial, "%s.partial", d);
    w->info = *info;
    snprintf(w->source, sizeof w->source, "%s", info->source ? info->source : "live");
    snprintf(w->from, sizeof w->from, "%s", info->from ? info->from : "");
    rm_tree(w->partial, 0); /* an earlier export's that did not finish */
    if (mkdir(w->partial, 0755) != 0) {
        ps_errorf(why, why_len, "export: cannot create %s: %s", w->partial, strerror(errno));
        free(w);
        return PS_EIO;
    }
    *out = w;
    return 0;
}

int ps_export_writer_add(ps_export_writer *w, unsigned char *buf, size_t len, char *why,
                         size_t why_len)
{
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 64;
        witem *a = realloc(w->items, nc * sizeof *a);
        if (!a) {
            free(buf);
            ps_errorf(why, why_len, "out of memory");
            return PS_ENOMEM;
        }
        w->items = a;
        w->cap = nc;
    }
    witem *x = &w->items[w->n];
    int rc = ps_snap_parse(buf, len, &x->it, why, why_len);
    if (rc) {
        free(buf);
        return rc;
    }
    x->buf = buf;
    w->n++;
    return 0;
}

static void free_writer(ps_export_writer *w)
{
    for (size_t k = 0; k < w->n; k++)
        free(w->items[k].buf);
    free(w->items);
    free(w);
}

void ps_export_writer_abort(ps_export_writer *w)
{
    if (!w)
        return;
    rm_tree(w->partial, 0);
    free_writer(w);
}

/* ---- tables: rows sorted by id ---- */

typedef struct ref {
    uint64_t id;
    uint32_t item, row;
} ref;

/* LSD radix sort of n refs by id, 16 bits a pass, passes whose digit is the
 * same for all skipped; tmp has room for n. */
static int sort_refs(ref *a, ref *tmp, size_t n)
{
    uint64_t *count = malloc(65536 * sizeof *count);
    if (!count)
        return PS_ENOMEM;
    uint64_t or_all = 0, and_all = ~0ull;
    for (size_t i = 0; i < n; i++) {
        or_all |= a[i].id;
        and_all &= a[i].id;
    }
    for (int shift = 0; shift < 64; shift += 16) {
        if ((((or_all ^ and_all) >> shift) & 0xffff) == 0)
            continue; /* every id has this digit */
        memset(count, 0, 65536 * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(a[i].id >> shift) & 0xffff]++;
        uint64_t sum = 0;
        for (size_t d = 0; d < 65536; d++) {
            uint64_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[(a[i].id >> shift) & 0xffff]++] = a[i];
        memcpy(a, tmp, n * sizeof *a);
    }
    free(count);
    return 0;
}

/* The state arrays of a row-wise kind (one float a row) are 1-D: (rows,). */
static int state_per_row(const ps_snap_item *it)
{
    return ps_table_decl_kind(&it->decl) == PS_TABLE_OPT_ROWWISE_ADAGRAD;
}

/* Write one array of a table in id order: what 0 ids, 1 counts, 2 values
 * (n x dim), 3 + k state array k (n x slen; a row-wise one n). */
static int write_table_array(const char *path, const witem *items, const ref *r, size_t n,
                             const ps_snap_item *t0, int what, uint64_t *bytes, char *why,
                             size_t why_len)
{
    uint32_t dim = t0->dim, slen = t0->slen;
    int dtype = what == 0 ? PS_NPY_U8 : what == 1 ? PS_NPY_U4 : PS_NPY_F4;
    uint32_t cols = what == 2 ? dim : what > 2 && !state_per_row(t0) ? slen : 0;
    ps_npy_out o;
    int rc = ps_npy_create(&o, path, dtype, n, cols, why, why_len);
    if (rc)
        return rc;
    size_t width = what == 2 ? dim : slen; /* floats a row of this array */
    size_t rb = what == 0 ? 8 : what == 1 ? 4 : 4 * width;
    size_t per = GATHER_BYTES / rb ? GATHER_BYTES / rb : 1;
    unsigned char *g = malloc(per * rb);
    if (!g) {
        fclose(o.f);
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    for (size_t i = 0; !rc && i < n;) {
        size_t m = n - i < per ? n - i : per;
        unsigned char *p = g;
        for (size_t k = 0; k < m; k++, p += rb) {
            const ref *x = &r[i + k];
            const ps_snap_item *it = &items[x->item].it;
            if (what == 0)
                memcpy(p, &x->id, 8);
            else if (what == 1)
                memcpy(p, &it->counts[x->row], 4);
            else
                memcpy(p, (what == 2 ? it->w : it->state[what - 3]) + (size_t)x->row * width,
                       rb);
        }
        rc = ps_npy_write(&o, g, m * rb, why, why_len);
        i += m;
    }
    free(g);
    if (rc) {
        fclose(o.f);
        return rc;
    }
    *bytes += o.want;
    return ps_npy_close(&o, path, why, why_len);
}

/* items[first..last) are the partitions of one table */
static int write_table(ps_export_writer *w, ps_strbuf *m, size_t first, size_t last,
                       int put_comma, uint64_t *bytes, char *why, size_t why_len)
{
    const ps_snap_item *t0 = &w->items[first].it;
    uint64_t key = t0->key, rows = 0;
    int64_t vlo = t0->version, vhi = t0->version;
    int behind = 0;
    for (size_t k = first; k < last; k++) {
        const ps_snap_item *it = &w->items[k].it;
        if (it->dim != t0->dim || it->nstate != t0->nstate || it->slen != t0->slen) {
            ps_errorf(why, why_len, "table %llu: partitions of dim %u and %u", (unsigned long long)key,
                t0->dim, it->dim);
            return PS_EDATA;
        }
        rows += it->n;
        vlo = it->version < vlo ? it->version : vlo;
        vhi = it->version > vhi ? it->version : vhi;
        behind |= (it->flags & PS_SNAP_BEHIND) != 0;
    }
    ref *r = malloc((rows ? rows : 1) * sizeof *r), *tmp = malloc((rows ? rows : 1) * sizeof *tmp);
    if (!r || !tmp) {
        free(r);
        free(tmp);
        ps_errorf(why, why_len, "out of memory sorting table %llu", (unsigned long long)key);
        return PS_ENOMEM;
    }
    size_t at = 0;
    for (size_t k = first; k < last; k++) {
        const ps_snap_item *it = &w->items[k].it;
        for (uint64_t j = 0; j < it->n; j++, at++)
            r[at] = (ref){it->ids[j], (uint32_t)k, (uint32_t)j};
    }
    int rc = sort_refs(r, tmp, rows);
    free(tmp);
    if (rc)
        ps_errorf(why, why_len, "out of memory sorting table %llu", (unsigned long long)key);
    for (size_t i = 1; i < rows && !rc; i++)
        if (r[i].id == r[i - 1].id) {
            ps_errorf(why, why_len, "table %llu: id %llu in two partitions (servers of another "
                "job mixed?)", (unsigned long long)key, (unsigned long long)r[i].id);
            rc = PS_EDATA;
        }
    char rel[256], path[4096];
    static const char *const names[] = {"ids", "counts", "weights", "state0", "state1", "state2",
                                        "state3"};
    int narr = 3 + (w->info.with_state ? (int)t0->nstate : 0);
    /* its name: any partition's that has one (a server restored from a
     * checkpoint learns it at a worker's declaration) */
    const char *name = "";
    for (size_t k = first; k < last && !name[0]; k++)
        name = w->items[k].it.name;
    ps_strbuf_addf(m, "%s\n    {\"key\": %llu, \"name\": ", put_comma ? "," : "",
                   (unsigned long long)key);
    if (name[0])
        ps_manifest_put_str(m, name);
    else
        ps_strbuf_add(m, "null");
    ps_strbuf_addf(m, ", \"rows\": %llu, \"version\": %lld, \"version_min\": %lld, "
                   "\"behind\": %s, \"partitions\": %zu, \"state_cols\": %u, ",
                   (unsigned long long)rows, (long long)vhi, (long long)vlo,
                   behind ? "true" : "false", last - first, t0->slen);
    ps_manifest_put_decl(m, &t0->decl);
    for (int a = 0; a < narr && !rc; a++) {
        if (a == 1 && !w->info.with_state)
            continue;
        ps_manifest_file(rel, sizeof rel, 1, key, names[a]);
        snprintf(path, sizeof path, "%s/%s", w->partial, rel);
        rc = write_table_array(path, w->items, r, rows, t0, a, bytes, why, why_len);
        if (a < 3)
            ps_strbuf_addf(m, ", \"%s\": \"%s\"", names[a], rel);
    }
    if (w->info.with_state) {
        ps_strbuf_add(m, ", \"state\": [");
        for (uint32_t k = 0; k < t0->nstate; k++) {
            ps_manifest_file(rel, sizeof rel, 1, key, names[3 + k]);
            ps_strbuf_addf(m, "%s\"%s\"", k ? ", " : "", rel);
        }
        ps_strbuf_add(m, "]");
        for (uint32_t k = 0; k < t0->nstate; k++) {
            ps_manifest_file(rel, sizeof rel, 1, key, names[3 + k]);
            ps_strbuf_addf(m, ", \"state%u\": \"%s\"", k, rel);
        }
    }
    ps_strbuf_add(m, "}");
    free(r);
    return rc;
}

/* items[first..last) are the chunks of one dense tensor */
static int write_dense(ps_export_writer *w, ps_strbuf *m, size_t first, size_t last,
                       int put_comma, uint64_t *bytes, char *why, size_t why_len)
{
    const ps_snap_item *c0 = &w->items[first].it;
    uint64_t key = c0->key, sum = 0;
    int64_t vlo = c0->version, vhi = c0->version;
    int behind = 0;
    for (size_t k = first; k < last; k++) {
        const ps_snap_item *it = &w->items[k].it;
        if (it->index != k - first || it->total != c0->total || it->nstate != c0->nstate) {
            ps_errorf(why, why_len, "key %llu: chunk %zu of %llu elements missing or twice (the "
                "snapshot has %zu chunks of it)", (unsigned long long)key, k - first,
                (unsigned long long)c0->total, last - first);
            return PS_EDATA;
        }
        sum += it->n;
        vlo = it->version < vlo ? it->version : vlo;
        vhi = it->version > vhi ? it->version : vhi;
        behind |= (it->flags & PS_SNAP_BEHIND) != 0;
    }
    if (sum != c0->total) {
        ps_errorf(why, why_len, "key %llu: its chunks hold %llu of its %llu elements",
            (unsigned long long)key, (unsigned long long)sum, (unsigned long long)c0->total);
        return PS_EDATA;
    }
    ps_strbuf_addf(m, "%s\n    {\"key\": %llu, \"elements\": %llu, \"version\": %lld, "
                   "\"version_min\": %lld, \"behind\": %s, \"chunks\": %zu",
                   put_comma ? "," : "", (unsigned long long)key, (unsigned long long)sum,
                   (long long)vhi, (long long)vlo, behind ? "true" : "false", last - first);
    int narr = 1 + (w->info.with_state ? (int)c0->nstate : 0), rc = 0;
    char rel[256], path[4096];
    for (int a = 0; a < narr && !rc; a++) {
        char what[16];
        snprintf(what, sizeof what, a ? "state%d" : "weights", a - 1);
        ps_manifest_file(rel, sizeof rel, 0, key, what);
        snprintf(path, sizeof path, "%s/%s", w->partial, rel);
        ps_npy_out o;
        rc = ps_npy_create(&o, path, PS_NPY_F4, sum, 0, why, why_len);
        for (size_t k = first; !rc && k < last; k++) {
            const ps_snap_item *it = &w->items[k].it;
            rc = ps_npy_write(&o, a ? it->state[a - 1] : it->w, it->n * sizeof(float), why,
                              why_len);
        }
        if (!rc) {
            *bytes += o.want;
            rc = ps_npy_close(&o, path, why, why_len);
        } else if (o.f) {
            fclose(o.f);
        }
        ps_strbuf_addf(m, ", \"%s\": \"%s\"", a ? what : "weights", rel);
    }
    if (w->info.with_state) {
        ps_strbuf_add(m, ", \"state\": [");
        for (uint32_t k = 0; k < c0->nstate; k++) {
            char what[16];
            snprintf(what, sizeof what, "state%u", k);
            ps_manifest_file(rel, sizeof rel, 0, key, what);
            ps_strbuf_addf(m, "%s\"%s\"", k ? ", " : "", rel);
        }
        ps_strbuf_add(m, "]");
    }
    ps_strbuf_add(m, "}");
    return rc;
}

static int by_item(const void *a, const void *b)
{
    const ps_snap_item *x = &((const witem *)a)->it, *y = &((const witem *)b)->it;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int ps_export_writer_finish(ps_export_writer *w, uint64_t *bytes, char *why, size_t why_len)
{
    *bytes = 0;
    char path[4096];
    int rc = 0;
    snprintf(path, sizeof path, "%s/dense", w->partial);
    if (mkdir(path, 0755) != 0)
        rc = PS_EIO;
    snprintf(path, sizeof path, "%s/tables", w->partial);
    if (!rc && mkdir(path, 0755) != 0)
        rc = PS_EIO;
    if (rc) {
        ps_errorf(why, why_len, "export: cannot create %s: %s", path, strerror(errno));
        ps_export_writer_abort(w);
        return rc;
    }
    qsort(w->items, w->n, sizeof *w->items, by_item);
    /* the manifest's head */
    ps_strbuf m = {0};
    int64_t lo = 0, hi = 0;
    int behind = 0;
    for (size_t k = 0; k < w->n; k++) {
        const ps_snap_item *it = &w->items[k].it;
        lo = !k || it->version < lo ? it->version : lo;
        hi = !k || it->version > hi ? it->version : hi;
        behind |= (it->flags & PS_SNAP_BEHIND) != 0;
    }
    const char *cons;
    char ctext[256];
    if (w->info.mode != PS_MODE_SYNC)
        cons = "async: each chunk and table partition as its server's update thread had it when "
               "the snapshot reached it (each one's version is below)";
    else if (w->info.own_targets)
        cons = "sync: every tensor and table at the step the exporting worker was at (one round "
               "of the job)";
    else if (w->info.target < 0)
        cons = "sync: each chunk and table partition as it was (versions below)";
    else {
        snprintf(ctext, sizeof ctext, "sync: one round: every tensor and table at step %lld%s",
                 (long long)w->info.target,
                 behind ? ", but those marked behind, which were not at it and are as they were"
                        : "");
        cons = ctext;
    }
    ps_strbuf_addf(&m, "{\n  \"format\": \"%s\",\n  \"format_version\": %d,\n  \"source\": \"%s\",\n"
                   "  \"from\": ", PS_EXPORT_FORMAT, PS_EXPORT_FORMAT_VERSION, w->source);
    ps_manifest_put_str(&m, w->from); /* a path or endpoints */
    ps_strbuf_addf(&m, ",\n  \"mode\": \"%s\",\n  \"servers\": %d,\n  \"step\": %lld,\n"
                   "  \"step_min\": %lld,\n  \"consistency\": \"%s\",\n  \"with_state\": %s,\n  ",
                   w->info.mode == PS_MODE_SYNC ? "sync" : "async", w->info.num_servers,
                   (long long)hi, (long long)lo, cons, w->info.with_state ? "true" : "false");
    /* the dense optimizer: a chunk item carries the server's */
    ps_opt_config dense_opt = {0};
    for (size_t k = 0; k < w->n; k++)
        if (w->items[k].it.kind == PS_SNAP_CHUNK) {
            dense_opt = w->items[k].it.decl.opt;
            break;
        }
    ps_manifest_put_opt(&m, &dense_opt, 0);
    ps_strbuf_add(&m, ",\n  \"dense\": [");
    size_t k = 0;
    int ndense = 0;
    while (!rc && k < w->n && w->items[k].it.kind == PS_SNAP_CHUNK) {
        size_t e = k;
        while (e < w->n && w->items[e].it.kind == PS_SNAP_CHUNK &&
               w->items[e].it.key == w->items[k].it.key)
            e++;
        rc = write_dense(w, &m, k, e, ndense++ > 0, bytes, why, why_len);
        k = e;
    }
    ps_strbuf_add(&m, "],\n  \"tables\": [");
    int ntables = 0;
    while (!rc && k < w->n) {
        size_t e = k;
        while (e < w->n && w->items[e].it.key == w->items[k].it.key)
            e++;
        rc = write_table(w, &m, k, e, ntables++ > 0, bytes, why, why_len);
        k = e;
    }
    ps_strbuf_add(&m, "]\n}\n");
    if (!rc) {
        snprintf(path, sizeof path, "%s/%s", w->partial, PS_MANIFEST_FILE);
        FILE *f = fopen(path, "w");
        const char *txt = ps_strbuf_str(&m);
        if (!f || fputs(txt, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
            ps_errorf(why, why_len, "export: cannot write %s: %s", path, strerror(errno));
            rc = PS_EIO;
        }
        if (f && fclose(f) != 0 && !rc) {
            ps_errorf(why, why_len, "export: cannot write %s: %s", path, strerror(errno));
            rc = PS_EIO;
        }
    }
    ps_strbuf_free(&m);
    if (!rc) {
        char sub[4200];
        snprintf(sub, sizeof sub, "%s/dense", w->partial);
        sync_path(sub);
        snprintf(sub, sizeof sub, "%s/tables", w->partial);
        sync_path(sub);
        sync_path(w->partial);
        rmdir(w->dir); /* an empty folder there is replaced */
        if (rename(w->partial, w->dir) != 0) {
            ps_errorf(why, why_len, "export: cannot rename %s to %s: %s", w->partial, w->dir,
                strerror(errno));
            rc = PS_EIO;
        } else {
            char parent[3072];
            snprintf(parent, sizeof parent, "%s", w->dir);
            char *slash = strrchr(parent, '/');
            if (slash && slash != parent)
                *slash = 0;
            else
                snprintf(parent, sizeof parent, "%s", slash ? "/" : ".");
            sync_path(parent);
        }
    }
    if (rc)
        ps_export_writer_abort(w);
    else
        free_writer(w);
    return rc;
}
