#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_hash.h"
#include "ps_opt_table.h"

#define MAGIC "PSCKPT1\n"
/* 2: every hyper-parameter of the optimizer table (1 lacked the lr decay);
 * 3: tables, and deltas (prev) */
#define FORMAT 3
/* bytes of the optimizer's hyper-parameters, as their C types */
#define OPT_BYTES_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) +sizeof(t)
#define OPT_BYTES (0 PS_OPT_PARAMS(OPT_BYTES_))
/* fixed part of the header, before the per-worker hello flags: format 2's,
 * and what format 3 adds (prev, threads, 0, partitions) */
#define HDR_FIXED ((int)(8 + 4 + 4 + 8 + 8 + 6 * 4 + OPT_BYTES + 8 + 8 + 8 + 8 + 6 * 8))
#define HDR_FIXED_3 (HDR_FIXED + 8 + 4 + 4 + 8)
/* fixed part of a chunk record, before the clocks */
#define REC_FIXED (8 + 4 + 4 + 8 + 8 + 8)
/* a table declaration's bytes (ps_table_decl.h's fields, the optimizer's
 * kind and its hyper-parameters, each as its C type) */
#define DECL_BYTES_(f, type, key, name) +sizeof(((ps_table_options *)0)->f)
#define DECL_BYTES ((0 PS_TABLE_DECL_STORED(DECL_BYTES_)) + 4 + OPT_BYTES)
/* fixed part of a partition record, before the clocks: table, partition,
 * flags, version, the declaration, 8 counters, 4 counts, state arrays, 0 */
#define PREC_FIXED_ (8 + 4 + 4 + 8 + DECL_BYTES + 8 * 8 + 4 * 8 + 4 + 4)
#define PREC_FIXED ((PREC_FIXED_ + 7) & ~7)
#define PREC_DELTA 1u /* the partition record's flags: a delta */
#define PREC_FULL_REFUSE 2u /* its table refuses new rows when full (decl.full) */

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static size_t header_bytes(int format, int num_workers)
{
    return pad8((size_t)(format >= 3 ? HDR_FIXED_3 : HDR_FIXED) + (size_t)num_workers);
}

/* A partition row: u64 id, u32 count, u32 0, dim values, each state array
 * (of dim floats; row-wise adagrad's of 1: ps_table_state_len of `kind`). */
static size_t prow_bytes(uint32_t dim, uint32_t nstate, int kind)
{
    return pad8(16 + 4 * ((size_t)dim + nstate * ps_table_state_len(kind, dim)));
}

static size_t record_bytes(int num_workers, size_t n, int nstate)
{
    return pad8(REC_FIXED + 8 * (size_t)num_workers + 4 * n * (size_t)(1 + nstate));
}

/* ---- little-endian put/get (the hosts we build for are little-endian; memcpy
 * keeps unaligned access defined) ---- */
#define PUT(p, v) do { __typeof__(v) put_v_ = (v); memcpy((p), &put_v_, sizeof put_v_); \
                       (p) += sizeof put_v_; } while (0)
#define GET(p, v) do { memcpy(&(v), (p), sizeof(v)); (p) += sizeof(v); } while (0)

/* The header fields of a ps_ckpt_meta after the magic, the format and the
 * header size, in file order: one list for the writer and the reader, so the
 * two cannot disagree.  I(f): stored as an int32; F(f): as the field is.
 * O is applied to every row of the optimizer table (include/ps_types.h). */
#define HEADER_FIELDS(I, F, O)                                                           \
    F(seq) F(config_fp)                                                                  \
    I(rank) I(num_servers) I(num_workers) I(mode) I(max_staleness) I(opt.kind)           \
    PS_OPT_PARAMS(O)                                                                     \
    F(model_fp) F(nchunks) F(min_version) F(max_version)                                 \
    F(counters.pushes) F(counters.pulls) F(counters.inits) F(counters.updates)           \
    F(counters.dup_dropped) F(counters.bytes_in)

static uint32_t crc_update(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

uint64_t ps_ckpt_config_fp(int rank, int num_servers, int num_workers, int mode,
                           int max_staleness, const ps_opt_config *opt)
{
    unsigned char b[32], *p = b;
    PUT(p, (int32_t)rank);
    PUT(p, (int32_t)num_servers);
    PUT(p, (int32_t)num_workers);
    PUT(p, (int32_t)mode);
    PUT(p, (int32_t)max_staleness);
    return ps_opt_hash(ps_fnv1a(PS_FNV1A_BASIS, b, (size_t)(p - b)), opt);
}

/* ---- serializing one update thread's chunks ---- */

typedef struct ser {
    int mode, num_workers;
    size_t need;
    unsigned char *p;
    ps_ckpt_part *out;
} ser;

static void count_chunk(void *arg, const ps_shard_chunk_view *v)
{
    ser *z = arg;
    z->need += record_bytes(z->num_workers, v->n, v->nstate);
}

size_t ps_ckpt_chunk_bytes(int num_workers, const ps_shard_chunk_view *v)
{
    return record_bytes(num_workers, v->n, v->nstate);
}

unsigned char *ps_ckpt_put_chunk(unsigned char *p, const ps_shard_chunk_view *v, int mode,
                                 int num_workers, int exact)
{
    unsigned char *start = p;
    PUT(p, v->key);
    PUT(p, v->chunk);
    PUT(p, (uint32_t)v->nstate);
    PUT(p, (uint64_t)v->n);
    PUT(p, v->total);
    PUT(p, v->version);
    for (int r = 0; r < num_workers; r++) {
        int64_t c = v->clock[r];
        /* sync: pushes of the open round are not in the weights; store the
         * clock as if they had not come, so they are applied after a restore */
        if (!exact && mode == PS_MODE_SYNC && c > v->version)
            c = v->version;
        PUT(p, c);
    }
    memcpy(p, v->w, v->n * sizeof(float));
    p += v->n * sizeof(float);
    for (int k = 0; k < v->nstate; k++) {
        memcpy(p, v->state[k], v->n * sizeof(float));
        p += v->n * sizeof(float);
    }
    size_t used = (size_t)(p - start), rec = record_bytes(num_workers, v->n, v->nstate);
    memset(p, 0, rec - used);
    return start + rec;
}

static void put_chunk(void *arg, const ps_shard_chunk_view *v)
{
    ser *z = arg;
    z->p = ps_ckpt_put_chunk(z->p, v, z->mode, z->num_workers, 0);
    ps_ckpt_part *o = z->out;
    if (!o->nchunks || v->version < o->min_version)
        o->min_version = v->version;
    if (!o->nchunks || v->version > o->max_version)
        o->max_version = v->version;
    o->nchunks++;
}

/* ---- serializing one update thread's table partitions ---- */

/* The declaration's bytes (DECL_BYTES), in file order. */
static unsigned char *put_decl(unsigned char *p, const ps_table_options *o)
{
#define PUT_DECL_(f, type, key, name) PUT(p, o->f);
    PS_TABLE_DECL_STORED(PUT_DECL_)
#undef PUT_DECL_
    PUT(p, (int32_t)o->opt.kind);
#define PUT_DOPT_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) PUT(p, o->opt.f);
    PS_OPT_PARAMS(PUT_DOPT_)
#undef PUT_DOPT_
    return p;
}

static const unsigned char *get_decl(const unsigned char *p, ps_table_options *o)
{
    memset(o, 0, sizeof *o);
#define GET_DECL_(f, type, key, name) GET(p, o->f);
    PS_TABLE_DECL_STORED(GET_DECL_)
#undef GET_DECL_
    int32_t kind;
    GET(p, kind);
    o->opt.kind = kind;
#define GET_DOPT_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) GET(p, o->opt.f);
    PS_OPT_PARAMS(GET_DOPT_)
#undef GET_DOPT_
    o->opt.given = PS_OPT_GIVEN_ALL;
    return p;
}

/* What one partition's record holds. */
typedef struct prec {
    ps_tpart_view v;
    int delta;
    size_t nd, no, nc, nr;
    const uint64_t *deleted;
    const uint8_t *cells;
    uint32_t nstate;
    size_t bytes;
} prec;

typedef struct rowser {
    unsigned char *p;
    uint32_t dim, nstate;
    size_t n;
    int kind;
} rowser;

static void count_row(void *arg, const ps_table_row_view *v)
{
    (void)v;
    ((rowser *)arg)->n++;
}

static void put_row(void *arg, const ps_table_row_view *v)
{
    rowser *z = arg;
    unsigned char *start = z->p, *p = z->p;
    PUT(p, v->id);
    PUT(p, v->count);
    PUT(p, (uint32_t)0);
    memcpy(p, v->w, z->dim * sizeof(float));
    p += z->dim * sizeof(float);
    for (uint32_t k = 0; k < z->nstate; k++) {
        memcpy(p, v->state[k], v->state_len * sizeof(float));
        p += v->state_len * sizeof(float);
    }
    size_t rb = prow_bytes(z->dim, z->nstate, z->kind);
    memset(p, 0, rb - (size_t)(p - start));
    z->p = start + rb;
}

static void put_id(void *arg, const ps_table_row_view *v)
{
    rowser *z = arg;
    PUT(z->p, v->id);
}

/* What partition i's record holds, and its bytes. */
static void plan_part(ps_tparts *tp, size_t i, int full, int num_workers, prec *r)
{
    memset(r, 0, sizeof *r);
    ps_tparts_view(tp, i, &r->v);
    ps_table *t = r->v.store;
    ps_table_counts c;
    ps_table_stats(t, &c);
    r->nstate = (uint32_t)ps_table_state_arrays(r->v.decl->opt.kind);
    r->cells = ps_table_filter_cells(t, &r->nc);
    r->delta = !full && ps_table_delta_ok(t);
    if (r->delta) {
        r->deleted = ps_table_deleted(t, &r->nd);
        rowser z = {0};
        ps_table_foreach(t, PS_TABLE_ROWS_DIRTY, count_row, &z);
        r->nr = z.n;
        /* a capped table's LRU order: every row, least recently touched first */
        r->no = r->v.decl->max_rows ? c.rows : 0;
    } else {
        r->nr = c.rows;
    }
    r->bytes = PREC_FIXED + 8 * (size_t)num_workers + 8 * (r->nd + r->no) + pad8(r->nc) +
               r->nr * prow_bytes(r->v.decl->dim, r->nstate, r->v.decl->opt.kind);
}

static unsigned char *put_part(unsigned char *p, const prec *r, int mode, int num_workers,
                               int exact)
{
    unsigned char *start = p;
    const ps_tpart_view *v = &r->v;
    ps_table_counts c;
    ps_table_stats(v->store, &c);
    PUT(p, v->key);
    PUT(p, (uint32_t)v->part);
    PUT(p, (uint32_t)((r->delta ? PREC_DELTA : 0) |
                      (v->decl->full == PS_TABLE_FULL_REFUSE ? PREC_FULL_REFUSE : 0)));
    PUT(p, v->version);
    ps_table_options decl = *v->decl;
    if (exact) /* a move: the hyper-parameters a HYPER set since the declaration go with it */
        decl.opt = ps_table_get_config(v->store)->opt;
    p = put_decl(p, &decl);
    uint64_t counters[8] = {c.created,        c.evicted, c.filtered_pulls, c.filtered_pushes,
                            c.pulled,         c.pushed,  c.updated,        c.rounds};
    memcpy(p, counters, sizeof counters);
    p += sizeof counters;
    PUT(p, (uint64_t)r->nd);
    PUT(p, (uint64_t)r->no);
    PUT(p, (uint64_t)r->nc);
    PUT(p, (uint64_t)r->nr);
    PUT(p, r->nstate);
    PUT(p, (uint32_t)0);
    memset(p, 0, (size_t)(start + PREC_FIXED - p));
    p = start + PREC_FIXED;
    for (int k = 0; k < num_workers; k++) {
        int64_t clk = v->clock[k];
        /* sync: the open round's pushes are not in the rows (as a chunk's) */
        if (!exact && mode == PS_MODE_SYNC && clk > v->version)
            clk = v->version;
        PUT(p, clk);
    }
    if (r->nd) {
        memcpy(p, r->deleted, 8 * r->nd);
        p += 8 * r->nd;
    }
    rowser z = {p, v->decl->dim, r->nstate, 0, v->decl->opt.kind};
    if (r->no)
        ps_table_foreach(v->store, PS_TABLE_ROWS_ALL, put_id, &z);
    p = z.p;
    if (r->nc)
        memcpy(p, r->cells, r->nc);
    memset(p + r->nc, 0, pad8(r->nc) - r->nc);
    p += pad8(r->nc);
    z.p = p;
    ps_table_foreach(v->store, r->delta ? PS_TABLE_ROWS_DIRTY : PS_TABLE_ROWS_ALL, put_row, &z);
    return z.p;
}

size_t ps_ckpt_part_bytes(ps_tparts *tp, size_t i, int num_workers)
{
    prec r;
    plan_part(tp, i, 1, num_workers, &r);
    return r.bytes;
}

unsigned char *ps_ckpt_put_part(unsigned char *p, ps_tparts *tp, size_t i, int mode,
                                int num_workers, int exact)
{
    prec r;
    plan_part(tp, i, 1, num_workers, &r);
    return put_part(p, &r, mode, num_workers, exact);
}

/* Every partition of tp into out->tbuf.  PS_ENOMEM. */
static int serialize_parts(ps_tparts *tp, int mode, int num_workers, int full, ps_ckpt_part *out)
{
    size_t np = tp ? ps_tparts_count(tp) : 0, need = 0;
    prec *r = calloc(np ? np : 1, sizeof *r);
    if (!r)
        return PS_ENOMEM;
    for (size_t i = 0; i < np; i++) {
        plan_part(tp, i, full, num_workers, &r[i]);
        need += r[i].bytes;
    }
    out->tbuf = malloc(need ? need : 1);
    if (!out->tbuf) {
        free(r);
        return PS_ENOMEM;
    }
    unsigned char *p = out->tbuf;
    for (size_t i = 0; i < np; i++) {
        p = put_part(p, &r[i], mode, num_workers, 0);
        int64_t v = r[i].v.version;
        if (!(out->nchunks + out->nparts) || v < out->min_version)
            out->min_version = v;
        if (!(out->nchunks + out->nparts) || v > out->max_version)
            out->max_version = v;
        out->nparts++;
    }
    out->tlen = need;
    free(r);
    return 0;
}

int ps_ckpt_serialize(const ps_shard *s, ps_tparts *tp, int mode, int num_workers, int full,
                      ps_ckpt_part *out)
{
    memset(out, 0, sizeof *out);
    ser z = {mode, num_workers, 0, NULL, out};
    ps_shard_foreach(s, count_chunk, &z);
    out->buf = malloc(z.need ? z.need : 1);
    if (!out->buf)
        return PS_ENOMEM;
    z.p = out->buf;
    ps_shard_foreach(s, put_chunk, &z);
    out->len = z.need;
    if (serialize_parts(tp, mode, num_workers, full, out)) {
        free(out->buf);
        memset(out, 0, sizeof *out);
        return PS_ENOMEM;
    }
    ps_shard_stats(s, &out->counters);
    /* the tables' message counters go with the chunks' (their rows and
     * bytes are the partitions' own, in their records) */
    ps_stats t;
    memset(&t, 0, sizeof t);
    if (tp)
        ps_tparts_stats(tp, &t);
    out->counters.pushes += t.pushes;
    out->counters.pulls += t.pulls;
    out->counters.updates += t.updates;
    out->counters.dup_dropped += t.dup_dropped;
    /* every change so far is in this snapshot: the next delta starts here
     * (not after a replica's snapshot: the checkpoints never saw it) */
    for (size_t i = 0; full != 2 && i < out->nparts; i++) {
        ps_tpart_view v;
        ps_tparts_view(tp, i, &v);
        ps_table_mark_clean(v.store);
    }
    return 0;
}

/* ---- file names ---- */

void ps_ckpt_path(const char *dir, int rank, uint64_t seq, char *out, size_t len)
{
    snprintf(out, len, "%s/shard-%d-%012llu.ckpt", dir, rank, (unsigned long long)seq);
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ps_ckpt_list(const char *dir, int rank, uint64_t **seqs, char *why, size_t why_len)
{
    *seqs = NULL;
    DIR *d = opendir(dir);
    if (!d) {
        ps_errorf(why, why_len, "cannot read the checkpoint directory %s: %s", dir,
            strerror(errno));
        return -1;
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "shard-%d-", rank);
    size_t plen = strlen(prefix), n = 0, cap = 0;
    uint64_t *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        size_t len = strlen(name);
        if (len != plen + 12 + 5 || strncmp(name, prefix, plen) != 0 ||
            strcmp(name + len - 5, ".ckpt") != 0)
            continue;
        uint64_t seq = 0;
        int ok = 1;
        for (size_t i = plen; i < plen + 12; i++) {
            if (name[i] < '0' || name[i] > '9')
                ok = 0;
            else
                seq = seq * 10 + (uint64_t)(name[i] - '0');
        }
        if (!ok)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                closedir(d);
                ps_errorf(why, why_len, "out of memory listing %s", dir);
                return -1;
            }
            v = nv;
        }
        v[n++] = seq;
    }
    closedir(d);
    if (n)
        qsort(v, n, sizeof *v, cmp_desc);
    *seqs = v;
    return (int)n;
}

/* ---- writing ---- */

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Remove every checkpoint older than the newest `keep` full ones: those and
 * every delta after the oldest of them stay (each chain from its full one
 * on, so a damaged full one leaves the chain before it whole).  While there
 * are fewer full ones, nothing is removed.  A file whose header cannot be
 * read counts as no full one. */
static void prune(const char *dir, int rank, int keep)
{
    uint64_t *seqs;
    int n = ps_ckpt_list(dir, rank, &seqs, NULL, 0);
    int fulls = 0, i = 0;
    for (; i < n && fulls < keep; i++) /* newest first */
        fulls += ps_ckpt_prev_of(dir, rank, seqs[i]) == 0;
    char path[1024];
    for (; fulls == keep && i < n; i++) {
        ps_ckpt_path(dir, rank, seqs[i], path, sizeof path);
        unlink(path);
    }
    free(seqs);
}

int64_t ps_ckpt_prev_of(const char *dir, int rank, uint64_t seq)
{
    char path[1024];
    unsigned char h[HDR_FIXED_3];
    ps_ckpt_path(dir, rank, seq, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, h, sizeof h);
    close(fd);
    uint32_t format;
    if (got < 12 || memcmp(h, MAGIC, 8) != 0)
        return -1;
    memcpy(&format, h + 8, 4);
    if (format < 3)
        return 0;
    uint64_t prev;
    if (got < HDR_FIXED_3)
        return -1;
    memcpy(&prev, h + HDR_FIXED, 8);
    return (int64_t)prev;
}

int ps_ckpt_write(const char *dir, const ps_ckpt_meta *m, const ps_ckpt_part *parts, int nparts,
                  int keep, char *path, size_t path_len, uint64_t *bytes, char *why,
                  size_t why_len)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/shard-%d.tmp", dir, m->rank);
    ps_ckpt_path(dir, m->rank, m->seq, path, path_len);
    size_t hb = header_bytes(FORMAT, m->num_workers);
    unsigned char *h = calloc(1, hb), *p = h;
    if (!h) {
        ps_errorf(why, why_len, "out of memory writing %s", path);
        return PS_ENOMEM;
    }
    memcpy(p, MAGIC, 8);
    p += 8;
    PUT(p, (uint32_t)FORMAT);
    PUT(p, (uint32_t)hb);
#define PUT_INT32(f) PUT(p, (int32_t)m->f);
#define PUT_FIELD(f) PUT(p, m->f);
#define PUT_OPT(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) PUT(p, m->opt.f);
    HEADER_FIELDS(PUT_INT32, PUT_FIELD, PUT_OPT)
    /* format 3's: prev, threads, 0 (nparts stays 8-aligned), nparts */
    PUT(p, m->prev);
    PUT(p, (int32_t)m->threads);
    PUT(p, (uint32_t)0);
    PUT(p, m->nparts);
#undef PUT_OPT
#undef PUT_INT32
#undef PUT_FIELD
    for (int r = 0; r < m->num_workers; r++)
        *p++ = m->hello ? m->hello[r] : 0;
    uint32_t crc = crc_update(0, h, hb);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const char *step = "create";
    int ok = fd >= 0 && (step = "write", write_all(fd, h, hb) == 0);
    free(h);
    uint64_t total = hb;
    /* every thread's chunks, then every thread's table partitions */
    for (int i = 0; ok && i < 2 * nparts; i++) {
        const ps_ckpt_part *q = &parts[i % nparts];
        const void *buf = i < nparts ? q->buf : q->tbuf;
        size_t len = i < nparts ? q->len : q->tlen;
        if (!len)
            continue;
        crc = crc_update(crc, buf, len);
        ok = write_all(fd, buf, len) == 0;
        total += len;
    }
    unsigned char tail[4];
    memcpy(tail, &crc, 4);
    if (ok)
        ok = write_all(fd, tail, 4) == 0;
    total += 4;
    if (ok && (step = "fsync", fsync(fd) != 0))
        ok = 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        step = "close";
        e = errno;
    }
    if (ok && (step = "rename", rename(tmp, path) != 0)) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        ps_errorf(why, why_len, "cannot %s %s: %s", step, strcmp(step, "rename") ? tmp : path,
            strerror(e));
        unlink(tmp);
        return PS_EIO;
    }
    /* the rename is durable only once the directory is */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        e = errno;
        if (dfd >= 0)
            close(dfd);
        ps_errorf(why, why_len, "cannot fsync the directory %s: %s", dir, strerror(e));
        return PS_EIO;
    }
    close(dfd);
    if (bytes)
        *bytes = total;
    prune(dir, m->rank, keep);
    return 0;
}

/* ---- reading ---- */

void ps_ckpt_file_free(ps_ckpt_file *f)
{
    free(f->data);
    memset(f, 0, sizeof *f);
}

int ps_ckpt_next_chunk(const ps_ckpt_file *f, size_t *off, ps_shard_chunk_view *v)
{
    int W = f->meta.num_workers;
    size_t end = f->first_part; /* the chunk records end where the tables' begin */
    if (*off >= end)
        return 0;
    const unsigned char *p = f->data + *off;
    uint32_t nstate;
    uint64_t n;
    memset(v, 0, sizeof *v);
    GET(p, v->key);
    GET(p, v->chunk);
    GET(p, nstate);
    GET(p, n);
    GET(p, v->total);
    GET(p, v->version);
    v->n = (size_t)n;
    v->nstate = (int)nstate;
    v->clock = (const int64_t *)(const void *)p; /* 8-aligned: records are padded */
    p += 8 * (size_t)W;
    v->w = (const float *)(const void *)p;
    p += v->n * sizeof(float);
    for (uint32_t k = 0; k < nstate && k < 2; k++) {
        v->state[k] = (const float *)(const void *)p;
        p += v->n * sizeof(float);
    }
    *off += record_bytes(W, v->n, v->nstate);
    return 1;
}

/* The bytes of the partition record at p (avail bytes there), every count
 * in range and every part inside; 0 when it is not. */
static size_t part_record_bytes(const unsigned char *p, size_t avail, int W)
{
    if (avail < PREC_FIXED + 8 * (size_t)W)
        return 0;
    ps_table_options d;
    get_decl(p + 24, &d);
    uint64_t n[4];
    uint32_t nstate;
    memcpy(n, p + 24 + DECL_BYTES + 64, sizeof n);
    memcpy(&nstate, p + 24 + DECL_BYTES + 64 + sizeof n, 4);
    if (d.dim < 1 || d.dim > PS_MAX_TABLE_DIM || nstate > 2 ||
        (int)nstate != ps_table_state_arrays(d.opt.kind))
        return 0;
    size_t left = avail - PREC_FIXED - 8 * (size_t)W, rb = prow_bytes(d.dim, nstate, d.opt.kind);
    if (n[0] > left / 8 || n[1] > left / 8 - n[0] || n[2] > left)
        return 0;
    left -= 8 * (size_t)(n[0] + n[1]);
    if (pad8((size_t)n[2]) > left)
        return 0;
    left -= pad8((size_t)n[2]);
    if (n[3] > left / rb)
        return 0;
    return PREC_FIXED + 8 * (size_t)W + 8 * (size_t)(n[0] + n[1]) + pad8((size_t)n[2]) +
           (size_t)n[3] * rb;
}

/* Check the chunk records from d + *off to end: nchunks of them (each
 * within bounds, nstate state arrays), or UINT64_MAX: as many as there
 * are.  *off ends after the last one, *first_part there too.  0, or -1
 * with why. */
static int scan_records(const unsigned char *d, size_t *off_io, size_t end, int W, int nstate,
                        uint64_t nchunks, size_t *first_part, char *why, size_t why_len)
{
    size_t off = *off_io;
    uint64_t count = 0;
    int to_end = nchunks == UINT64_MAX;
    while (off < end && count < nchunks) {
        if (end - off < REC_FIXED + 8 * (size_t)W) {
            ps_errorf(why, why_len, "chunk record %llu is cut short", (unsigned long long)count);
            return -1;
        }
        uint32_t ns;
        uint64_t n;
        memcpy(&ns, d + off + 12, 4);
        memcpy(&n, d + off + 16, 8);
        if ((int)ns != nstate || n == 0 || n > (end - off) / 4) {
            ps_errorf(why, why_len, "chunk record %llu: %u state arrays (want %d), %llu elements",
                      (unsigned long long)count, ns, nstate, (unsigned long long)n);
            return -1;
        }
        size_t rb = record_bytes(W, (size_t)n, nstate);
        if (rb > end - off) {
            ps_errorf(why, why_len, "chunk record %llu is cut short", (unsigned long long)count);
            return -1;
        }
        off += rb;
        count++;
    }
    if (!to_end && count != nchunks) {
        ps_errorf(why, why_len, "%llu chunk records, the header says %llu",
                  (unsigned long long)count, (unsigned long long)nchunks);
        return -1;
    }
    *first_part = off;
    *off_io = off;
    return 0;
}

/* The partition records from d + *off on (nparts of them, or UINT64_MAX:
 * up to end), each within bounds. */
static int scan_parts(const unsigned char *d, size_t *off_io, size_t end, int W, uint64_t nparts,
                      char *why, size_t why_len)
{
    size_t off = *off_io;
    for (uint64_t count = 0; count < nparts && (nparts != UINT64_MAX || off < end); count++) {
        size_t rb = part_record_bytes(d + off, end - off, W);
        if (!rb) {
            ps_errorf(why, why_len, "table partition record %llu is cut short or out of range",
                      (unsigned long long)count);
            return -1;
        }
        off += rb;
    }
    *off_io = off;
    return 0;
}

int ps_ckpt_view_records(const void *buf, size_t len, const void *tbuf, size_t tlen,
                         int num_workers, int nstate, ps_ckpt_file *chunks, ps_ckpt_file *parts,
                         char *why, size_t why_len)
{
    memset(chunks, 0, sizeof *chunks);
    memset(parts, 0, sizeof *parts);
    size_t off = 0, fp;
    if (len && scan_records(buf, &off, len, num_workers, nstate, UINT64_MAX, &fp, why, why_len))
        return PS_EDATA;
    if (off != len) {
        ps_errorf(why, why_len, "%zu bytes after the chunk records", len - off);
        return PS_EDATA;
    }
    off = 0;
    if (tlen && scan_parts(tbuf, &off, tlen, num_workers, UINT64_MAX, why, why_len))
        return PS_EDATA;
    chunks->meta.num_workers = parts->meta.num_workers = num_workers;
    chunks->data = (unsigned char *)buf;
    chunks->size = len + 4; /* as a file: a trailer's 4 bytes past the records */
    chunks->first = 0;
    chunks->first_part = len;
    parts->data = (unsigned char *)tbuf;
    parts->size = tlen + 4;
    parts->first = parts->first_part = 0;
    return 0;
}

int ps_ckpt_read(const char *path, ps_ckpt_file *f, char *why, size_t why_len)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ps_errorf(why, why_len, "cannot open: %s", strerror(errno));
        return PS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ps_errorf(why, why_len, "cannot stat: %s", strerror(errno));
        close(fd);
        return PS_EIO;
    }
    size_t size = (size_t)st.st_size;
    if (size < HDR_FIXED + 4) {
        close(fd);
        ps_errorf(why, why_len, "truncated: %zu bytes, a checkpoint has at least %d", size,
            HDR_FIXED + 4);
        return PS_EDATA;
    }
    unsigned char *d = malloc(size);
    if (!d) {
        close(fd);
        ps_errorf(why, why_len, "out of memory reading %zu bytes", size);
        return PS_ENOMEM;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, d + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(d);
        ps_errorf(why, why_len, "read %zu of %zu bytes", got, size);
        return PS_EIO;
    }
#define CORRUPT(...) \
    do { ps_errorf(why, why_len, __VA_ARGS__); free(d); return PS_EDATA; } while (0)
    if (memcmp(d, MAGIC, 8) != 0)
        CORRUPT("not a checkpoint (bad magic)");
    uint32_t crc_file;
    memcpy(&crc_file, d + size - 4, 4);
    uint32_t crc = crc_update(0, d, size - 4);
    if (crc != crc_file)
        CORRUPT("CRC-32 mismatch (file says %08x, contents give %08x): damaged or truncated",
                crc_file, crc);
    const unsigned char *p = d + 8;
    uint32_t format, hb;
    ps_ckpt_meta *m = &f->meta;
    GET(p, format);
    GET(p, hb);
    if (format != FORMAT && format != 2)
        CORRUPT("format %u, this server reads formats 2 and %d%s", format, FORMAT,
                format == 1 ? " (format 1 did not record --lr-decay; restore it with the "
                              "ps_server that wrote it, or start without --restore)"
                            : "");
#define GET_INT32(f) do { int32_t v_; GET(p, v_); m->f = v_; } while (0);
#define GET_FIELD(f) GET(p, m->f);
#define GET_OPT(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) GET(p, m->opt.f);
    HEADER_FIELDS(GET_INT32, GET_FIELD, GET_OPT)
#undef GET_OPT
#undef GET_INT32
#undef GET_FIELD
    if (format >= 3 && size >= HDR_FIXED_3 + 4) {
        int32_t threads;
        uint32_t zero;
        GET(p, m->prev);
        GET(p, threads);
        GET(p, zero);
        GET(p, m->nparts);
        m->threads = threads;
    }
    if (m->num_workers < 1 || m->num_workers > PS_MAX_RANK + 1 ||
        hb != header_bytes((int)format, m->num_workers) || hb > size - 4)
        CORRUPT("bad header (%d workers, %u header bytes)", m->num_workers, hb);
    m->hello = p;
    /* every record in bounds, as many as the header says */
    int W = m->num_workers, nstate = ps_opt_state_arrays(m->opt.kind);
    size_t off = hb, end = size - 4, first_part;
    char msg[200];
    if (scan_records(d, &off, end, W, nstate, m->nchunks, &first_part, msg, sizeof msg) ||
        scan_parts(d, &off, end, W, m->nparts, msg, sizeof msg))
        CORRUPT("%s", msg);
    if (off != end)
        CORRUPT("%zu bytes after the %llu chunk and %llu table partition records the header "
                "counts", end - off, (unsigned long long)m->nchunks,
                (unsigned long long)m->nparts);
#undef CORRUPT
    f->data = d;
    f->size = size;
    f->first = hb;
    f->first_part = first_part;
    return 0;
}

int ps_ckpt_next_part(const ps_ckpt_file *f, size_t *off, ps_ckpt_part_view *v)
{
    if (*off >= f->size - 4)
        return 0;
    const unsigned char *start = f->data + *off, *p = start;
    int W = f->meta.num_workers;
    uint32_t flags;
    memset(v, 0, sizeof *v);
    GET(p, v->key);
    GET(p, v->part);
    GET(p, flags);
    GET(p, v->version);
    v->delta = (flags & PREC_DELTA) != 0;
    p = get_decl(p, &v->decl);
    if (flags & PREC_FULL_REFUSE)
        v->decl.full = PS_TABLE_FULL_REFUSE;
    uint64_t c[8], n[4];
    memcpy(c, p, sizeof c);
    p += sizeof c;
    v->counts = (ps_table_counts){.created = c[0], .evicted = c[1], .filtered_pulls = c[2],
                                  .filtered_pushes = c[3], .pulled = c[4], .pushed = c[5],
                                  .updated = c[6], .rounds = c[7]};
    memcpy(n, p, sizeof n);
    p += sizeof n;
    GET(p, v->nstate);
    v->ndeleted = (size_t)n[0];
    v->norder = (size_t)n[1];
    v->ncells = (size_t)n[2];
    v->nrows = (size_t)n[3];
    p = start + PREC_FIXED;
    v->clock = (const int64_t *)(const void *)p; /* 8-aligned: records are padded */
    p += 8 * (size_t)W;
    v->deleted = p;
    p += 8 * v->ndeleted;
    v->order = p;
    p += 8 * v->norder;
    v->cells = p;
    p += pad8(v->ncells);
    v->rows = p;
    v->row_bytes = prow_bytes(v->decl.dim, v->nstate, v->decl.opt.kind);
    *off += part_record_bytes(start, f->size - 4 - *off, W);
    return 1;
}

void ps_ckpt_part_row(const ps_ckpt_part_view *p, size_t k, ps_table_row_view *v)
{
    const unsigned char *r = p->rows + k * p->row_bytes;
    memcpy(&v->id, r, 8);
    memcpy(&v->count, r + 8, 4);
    v->dim = p->decl.dim;
    v->nstate = (int)p->nstate;
    v->state_len = (uint32_t)ps_table_state_len(p->decl.opt.kind, p->decl.dim);
    v->w = (const float *)(const void *)(r + 16);
    v->state[0] = p->nstate >= 1 ? v->w + p->decl.dim : NULL;
    v->state[1] = p->nstate >= 2 ? v->w + p->decl.dim + v->state_len : NULL;
}

uint64_t ps_ckpt_id(const unsigned char *list, size_t k)
{
    uint64_t id;
    memcpy(&id, list + 8 * k, 8);
    return id;
}

int ps_ckpt_check_config(const ps_ckpt_meta *m, int rank, int num_servers, int num_workers,
                         int mode, int max_staleness, const ps_opt_config *opt, char *why,
                         size_t why_len)
{
#define DIFF(flag, fmt, a, b) do { ps_errorf(why, why_len, "it was written with " flag " " fmt \
    ", this server has " flag " " fmt, a, b); return PS_EMISMATCH; } while (0)
    if (m->rank != rank)
        DIFF("--rank", "%d", m->rank, rank);
    if (m->num_servers != num_servers)
        DIFF("--num-servers", "%d", m->num_servers, num_servers);
    if (m->num_workers != num_workers)
        DIFF("--num-workers", "%d", m->num_workers, num_workers);
    if (m->mode != mode)
        DIFF("--mode", "%s", ps_mode_name(m->mode), ps_mode_name(mode));
    if (m->max_staleness != max_staleness)
        DIFF("--max-staleness", "%d", m->max_staleness, max_staleness);
    if (m->opt.kind != opt->kind)
        DIFF("--optimizer", "%s", ps_opt_name(m->opt.kind), ps_opt_name(opt->kind));
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        double a = ps_opt_get(&m->opt, p), b = ps_opt_get(opt, p);
        if (a != b) {
            const char *flag = ps_opt_param_at(p)->flag;
            ps_errorf(why, why_len, "it was written with %s %g, this server has %s %g", flag, a,
                flag, b);
            return PS_EMISMATCH;
        }
    }
#undef DIFF
    if (m->config_fp !=
        ps_ckpt_config_fp(rank, num_servers, num_workers, mode, max_staleness, opt)) {
        ps_errorf(why, why_len, "its configuration fingerprint differs from this server's");
        return PS_EMISMATCH;
    }
    return 0;
}
