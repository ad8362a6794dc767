/* Objects moved between servers as records (server/move_records.h): a
 * chosen set serialized into a move block, a block read and checked, loaded
 * into a thread's stores all or nothing, and cut per destination thread. */
#include "move_records.h"

#include <stdlib.h>
#include <string.h>

#include "ckpt_coord.h"
#include "optimizer.h"
#include "ps_error.h"
#include "server.h"

#define HDR_BYTES 48

/* Where each part of a block starts: per-chunk steps, per-partition homes,
 * chunk records, partition records; [4] is the end. */
static void layout(uint64_t nc, uint64_t np, size_t cb, size_t pb, size_t at[5])
{
    at[0] = HDR_BYTES;
    at[1] = at[0] + 8 * (size_t)nc;
    at[2] = at[1] + 8 * (size_t)np;
    at[3] = at[2] + cb;
    at[4] = at[3] + pb;
}

/* A block with room for its parts, the header written; NULL out of memory. */
static unsigned char *block_new(int num_workers, int nstate, uint64_t nc, uint64_t np, size_t cb,
                                size_t pb, size_t at[5])
{
    layout(nc, np, cb, pb, at);
    unsigned char *b = malloc(at[4]);
    if (!b)
        return NULL;
    uint32_t u[4] = {PS_MOVE_MAGIC, PS_MOVE_FORMAT, (uint32_t)num_workers, (uint32_t)nstate};
    uint64_t q[4] = {nc, np, (uint64_t)cb, (uint64_t)pb};
    memcpy(b, u, sizeof u);
    memcpy(b + sizeof u, q, sizeof q);
    return b;
}

int ps_move_find_tparts(ps_tparts *const *tps, size_t ntps, int home, uint32_t part)
{
    for (size_t i = 0; i < ntps; i++) {
        const ps_tparts_config *c = ps_tparts_cfg(tps[i]);
        if (c->home == home && (uint32_t)c->part == part)
            return (int)i;
    }
    return -1;
}

/* The index of table key in tp (ps_tparts_view's), or -1. */
static long table_index(const ps_tparts *tp, uint64_t key)
{
    ps_tpart_view v;
    for (size_t i = 0; ps_tparts_view(tp, i, &v); i++)
        if (v.key == key)
            return (long)i;
    return -1;
}

static int obj_cmp(const void *x, const void *y)
{
    const ps_move_obj *a = *(const ps_move_obj *const *)x, *b = *(const ps_move_obj *const *)y;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->a != b->a)
        return a->a < b->a ? -1 : 1;
    return a->b < b->b ? -1 : a->b > b->b;
}

static void name_obj(const ps_move_obj *o, char *why, size_t why_len, const char *what)
{
    if (o->kind == PS_MOVE_CHUNK)
        ps_errorf(why, why_len, "move of key %llu chunk %llu: %s", (unsigned long long)o->key,
            (unsigned long long)o->a, what);
    else
        ps_errorf(why, why_len, "move of table %llu partition %u of server %llu: %s",
            (unsigned long long)o->key, o->b, (unsigned long long)o->a, what);
}

/* Every object valid and named once: 0, or PS_EINVAL / PS_ENOMEM. */
static int check_objs(const ps_move_obj *objs, size_t n, char *why, size_t why_len)
{
    for (size_t i = 0; i < n; i++) {
        const ps_move_obj *o = &objs[i];
        if ((o->kind != PS_MOVE_CHUNK && o->kind != PS_MOVE_PART) ||
            (o->kind == PS_MOVE_CHUNK && (o->a > UINT32_MAX || o->b != 0)) ||
            (o->kind == PS_MOVE_PART && o->a > INT32_MAX)) {
            ps_errorf(why, why_len, "move: object %zu is not a chunk (kind 1, a = its index < "
                "2^32, b = 0) or a table partition (kind 2, a = its home server, b = its "
                "index): kind %u, a %llu, b %u", i, o->kind, (unsigned long long)o->a, o->b);
            return PS_EINVAL;
        }
    }
    const ps_move_obj **s = malloc((n ? n : 1) * sizeof *s);
    if (!s) {
        ps_errorf(why, why_len, "move: out of memory checking %zu objects", n);
        return PS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        s[i] = &objs[i];
    qsort(s, n, sizeof *s, obj_cmp);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (obj_cmp(&s[i - 1], &s[i]) == 0) {
            name_obj(s[i], why, why_len, "named twice");
            rc = PS_EINVAL;
        }
    free(s);
    return rc;
}

/* Where each object is: for a chunk its view and step, for a partition its
 * tparts and table index. */
typedef struct found {
    ps_shard_chunk_view v;
    int64_t step;
    ps_tparts *tp;
    size_t i;
    size_t bytes;
} found;

int ps_move_serialize(ps_shard *s, ps_tparts *const *tps, size_t ntps, const ps_move_obj *objs,
                      size_t n, int mode, int num_workers, void **block, size_t *len, char *why,
                      size_t why_len)
{
    *block = NULL;
    *len = 0;
    int rc = check_objs(objs, n, why, why_len);
    if (rc)
        return rc;
    found *f = calloc(n ? n : 1, sizeof *f);
    if (!f) {
        ps_errorf(why, why_len, "move: out of memory serializing %zu objects", n);
        return PS_ENOMEM;
    }
    uint64_t nc = 0, np = 0;
    size_t cb = 0, pb = 0;
    for (size_t k = 0; k < n; k++) {
        const ps_move_obj *o = &objs[k];
        if (o->kind == PS_MOVE_CHUNK) {
            if (ps_shard_view(s, o->key, (uint32_t)o->a, &f[k].v, &f[k].step)) {
                name_obj(o, why, why_len, "no such chunk on this update thread");
                free(f);
                return PS_ENOTFOUND;
            }
            f[k].bytes = ps_ckpt_chunk_bytes(num_workers, &f[k].v);
            cb += f[k].bytes;
            nc++;
            continue;
        }
        int t = ps_move_find_tparts(tps, ntps, (int)o->a, o->b);
        long i = t < 0 ? -1 : table_index(tps[t], o->key);
        if (i < 0) {
            name_obj(o, why, why_len, "no such partition on this update thread");
            free(f);
            return PS_ENOTFOUND;
        }
        f[k].tp = tps[t];
        f[k].i = (size_t)i;
        f[k].bytes = ps_ckpt_part_bytes(f[k].tp, f[k].i, num_workers);
        pb += f[k].bytes;
        np++;
    }
    size_t at[5];
    int nstate = ps_opt_state_arrays(ps_shard_opt_kind(s));
    unsigned char *b = block_new(num_workers, nstate, nc, np, cb, pb, at);
    if (!b) {
        ps_errorf(why, why_len, "move: out of memory for %zu bytes of records", cb + pb);
        free(f);
        return PS_ENOMEM;
    }
    unsigned char *step = b + at[0], *home = b + at[1], *cp = b + at[2], *pp = b + at[3];
    for (size_t k = 0; k < n; k++) {
        if (objs[k].kind == PS_MOVE_CHUNK) {
            memcpy(step, &f[k].step, 8);
            step += 8;
            cp = ps_ckpt_put_chunk(cp, &f[k].v, mode, num_workers, 1);
        } else {
            const ps_tparts_config *c = ps_tparts_cfg(f[k].tp);
            int32_t hp[2] = {c->home, c->nparts};
            memcpy(home, hp, 8);
            home += 8;
            pp = ps_ckpt_put_part(pp, f[k].tp, f[k].i, mode, num_workers, 1);
        }
    }
    free(f);
    *block = b;
    *len = at[4];
    return 0;
}

int ps_move_view_block(const void *block, size_t len, int num_workers, int nstate,
                       ps_move_view *v, char *why, size_t why_len)
{
    memset(v, 0, sizeof *v);
    const unsigned char *b = block;
    uint32_t u[4];
    uint64_t q[4];
    if (len < HDR_BYTES) {
        ps_errorf(why, why_len, "a move block of %zu bytes is shorter than its header", len);
        return PS_EDATA;
    }
    memcpy(u, b, sizeof u);
    memcpy(q, b + sizeof u, sizeof q);
    if (u[0] != PS_MOVE_MAGIC || u[1] != PS_MOVE_FORMAT) {
        ps_errorf(why, why_len, "not a move block of format %u (magic %08x, format %u)",
            PS_MOVE_FORMAT, u[0], u[1]);
        return PS_EDATA;
    }
    if (u[2] != (uint32_t)num_workers || u[3] != (uint32_t)nstate) {
        ps_errorf(why, why_len, "a move block of a job with %u workers and %u optimizer state "
            "arrays; this server has %d and %d", u[2], u[3], num_workers, nstate);
        return PS_EDATA;
    }
    /* each count bounded by the length before any sum is formed */
    if (q[0] > len / 8 || q[1] > len / 8 || q[2] > len || q[3] > len) {
        ps_errorf(why, why_len, "a move block's counts pass its %zu bytes", len);
        return PS_EDATA;
    }
    size_t at[5];
    layout(q[0], q[1], (size_t)q[2], (size_t)q[3], at);
    if (at[4] != len) {
        ps_errorf(why, why_len, "a move block of %zu bytes whose header says %zu", len, at[4]);
        return PS_EDATA;
    }
    int rc = ps_ckpt_view_records(b + at[2], (size_t)q[2], b + at[3], (size_t)q[3], num_workers,
                                  nstate, &v->chunks, &v->parts, why, why_len);
    if (rc)
        return rc;
    uint64_t nc = 0, np = 0;
    size_t off = 0;
    ps_shard_chunk_view c;
    while (ps_ckpt_next_chunk(&v->chunks, &off, &c))
        nc++;
    off = 0;
    ps_ckpt_part_view p;
    for (; ps_ckpt_next_part(&v->parts, &off, &p); np++) {
        int32_t hp[2] = {-1, 0};
        if (np < q[1])
            memcpy(hp, b + at[1] + 8 * np, 8);
        if (hp[0] < 0 || hp[1] < 1 || p.part >= (uint32_t)hp[1] || p.delta) {
            ps_errorf(why, why_len, "a move block's partition record %llu (table %llu partition "
                "%u) has home %d of %d partitions%s", (unsigned long long)np,
                (unsigned long long)p.key, p.part, hp[0], hp[1], p.delta ? ", as a delta" : "");
            return PS_EDATA;
        }
    }
    if (nc != q[0] || np != q[1]) {
        ps_errorf(why, why_len, "a move block says %llu chunks and %llu partitions, its records "
            "hold %llu and %llu", (unsigned long long)q[0], (unsigned long long)q[1],
            (unsigned long long)nc, (unsigned long long)np);
        return PS_EDATA;
    }
    v->nchunks = nc;
    v->nparts = np;
    v->opt_steps = b + at[0];
    v->homes = b + at[1];
    return 0;
}

static void home_of(const ps_move_view *v, uint64_t k, int32_t hp[2])
{
    memcpy(hp, v->homes + 8 * k, 8);
}

/* The objects loaded so far, removed again (ps_move_load failed part way). */
static void unload(ps_shard *s, const ps_move_view *v, uint64_t nc, ps_tparts **tps, uint64_t np)
{
    char why[256];
    size_t off = 0;
    ps_shard_chunk_view c;
    for (uint64_t k = 0; k < nc && ps_ckpt_next_chunk(&v->chunks, &off, &c); k++)
        ps_shard_remove_chunk(s, c.key, c.chunk, why, sizeof why);
    off = 0;
    ps_ckpt_part_view p;
    for (uint64_t k = 0; k < np && ps_ckpt_next_part(&v->parts, &off, &p); k++)
        ps_tparts_remove(tps[k], p.key, PS_ECLOSED, "a move's load failed", why, sizeof why);
}

/* Nothing of v is here yet: 0, or PS_EMISMATCH naming the first that is. */
static int none_here(ps_shard *s, const ps_move_view *v, ps_move_place_fn place, void *user,
                     char *why, size_t why_len)
{
    size_t off = 0;
    ps_shard_chunk_view c, have;
    int64_t step;
    while (ps_ckpt_next_chunk(&v->chunks, &off, &c))
        if (ps_shard_view(s, c.key, c.chunk, &have, &step) == 0) {
            ps_errorf(why, why_len, "key %llu chunk %u moved here is here already (version %lld "
                "here, %lld moved): a move never overwrites", (unsigned long long)c.key, c.chunk,
                (long long)have.version, (long long)c.version);
            return PS_EMISMATCH;
        }
    off = 0;
    ps_ckpt_part_view p;
    for (uint64_t k = 0; ps_ckpt_next_part(&v->parts, &off, &p); k++) {
        int32_t hp[2];
        home_of(v, k, hp);
        int rc = 0;
        ps_tparts *tp = place(user, hp[0], p.part, hp[1], 0, &rc, why, why_len);
        if (rc)
            return rc;
        if (tp && ps_tparts_cfg(tp)->nparts != hp[1]) {
            ps_errorf(why, why_len, "table %llu partition %u of server %d comes with %d "
                "partitions a table; its place here has %d", (unsigned long long)p.key, p.part,
                hp[0], hp[1], ps_tparts_cfg(tp)->nparts);
            return PS_EMISMATCH;
        }
        if (tp && ps_tparts_decl(tp, p.key)) {
            ps_errorf(why, why_len, "table %llu partition %u of server %d moved here is here "
                "already: a move never overwrites", (unsigned long long)p.key, p.part, hp[0]);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

/* Partition record p of home hp into the tparts place gives. */
static int load_part(const ps_ckpt_part_view *p, const int32_t hp[2], ps_move_place_fn place,
                     void *user, ps_tparts **at, char *why, size_t why_len)
{
    int rc = 0;
    ps_tparts *tp = place(user, hp[0], p->part, hp[1], 1, &rc, why, why_len);
    if (!tp)
        return rc ? rc : PS_ENOMEM;
    ps_table *store;
    rc = ps_tparts_make_store(ps_tparts_cfg(tp), p->key, &p->decl, &store, why, why_len);
    if (!rc)
        rc = ps_tparts_adopt(tp, p->key, &p->decl, store, why, why_len);
    if (rc)
        return rc == PS_EINVAL ? PS_EDATA : rc;
    *at = tp;
    return ps_ckpt_fill_part(tp, p, 0, why, why_len);
}

int ps_move_load(ps_shard *s, const void *block, size_t len, int num_workers, int nstate,
                 ps_move_place_fn place, void *user, uint64_t *nchunks, uint64_t *nparts,
                 char *why, size_t why_len)
{
    *nchunks = *nparts = 0;
    ps_move_view v;
    int rc = ps_move_view_block(block, len, num_workers, nstate, &v, why, why_len);
    if (!rc)
        rc = none_here(s, &v, place, user, why, why_len);
    if (rc)
        return rc;
    ps_tparts **tps = calloc(v.nparts ? v.nparts : 1, sizeof *tps);
    if (!tps) {
        ps_errorf(why, why_len, "out of memory loading a move of %llu partitions",
            (unsigned long long)v.nparts);
        return PS_ENOMEM;
    }
    uint64_t nc = 0, np = 0;
    size_t off = 0;
    ps_shard_chunk_view c;
    while (!rc && ps_ckpt_next_chunk(&v.chunks, &off, &c)) {
        int64_t step;
        memcpy(&step, v.opt_steps + 8 * nc, 8);
        if (!(rc = ps_shard_move_in(s, &c, step, why, why_len)))
            nc++;
    }
    off = 0;
    ps_ckpt_part_view p;
    while (!rc && ps_ckpt_next_part(&v.parts, &off, &p)) {
        int32_t hp[2];
        home_of(&v, np, hp);
        rc = load_part(&p, hp, place, user, &tps[np], why, why_len);
        if (tps[np])
            np++; /* declared: removed again should a later step fail */
    }
    if (rc)
        unload(s, &v, nc, tps, np);
    else {
        *nchunks = nc;
        *nparts = np;
    }
    free(tps);
    return rc;
}

/* The thread of a destination that takes partition p of home h, or -1. */
static int part_thread(int home, uint32_t part, int rank, int threads)
{
    if (home == rank)
        return part < (uint32_t)threads ? (int)part : -1;
    return ps_server_away_owner(home, part, threads);
}

int ps_move_split(const void *block, size_t len, int num_workers, int nstate, int rank,
                  int threads, void **out, size_t *out_len, char *why, size_t why_len)
{
    for (int t = 0; t < threads; t++) {
        out[t] = NULL;
        out_len[t] = 0;
    }
    ps_move_view v;
    int rc = ps_move_view_block(block, len, num_workers, nstate, &v, why, why_len);
    if (rc)
        return rc;
    /* per thread: chunks, partitions, their record bytes */
    uint64_t (*cnt)[4] = calloc((size_t)threads, sizeof *cnt);
    size_t (*fill)[4] = calloc((size_t)threads, sizeof *fill);
    if (!cnt || !fill) {
        free(cnt);
        free(fill);
        ps_errorf(why, why_len, "out of memory splitting a move block");
        return PS_ENOMEM;
    }
    size_t off = 0, prev = 0;
    ps_shard_chunk_view c;
    while (ps_ckpt_next_chunk(&v.chunks, &off, &c)) {
        int t = ps_server_owner(c.key, c.chunk, threads);
        cnt[t][0]++;
        cnt[t][2] += off - prev;
        prev = off;
    }
    off = prev = 0;
    ps_ckpt_part_view p;
    for (uint64_t k = 0; !rc && ps_ckpt_next_part(&v.parts, &off, &p); k++) {
        int32_t hp[2];
        home_of(&v, k, hp);
        int t = part_thread(hp[0], p.part, rank, threads);
        if (t < 0) {
            ps_errorf(why, why_len, "table %llu partition %u comes home to server %d, which has "
                "%d update threads", (unsigned long long)p.key, p.part, rank, threads);
            rc = PS_EDATA;
            break;
        }
        cnt[t][1]++;
        cnt[t][3] += off - prev;
        prev = off;
    }
    for (int t = 0; !rc && t < threads; t++) {
        if (!cnt[t][0] && !cnt[t][1])
            continue;
        size_t at[5];
        unsigned char *b = block_new(num_workers, nstate, cnt[t][0], cnt[t][1],
                                     (size_t)cnt[t][2], (size_t)cnt[t][3], at);
        if (!b) {
            ps_errorf(why, why_len, "out of memory splitting a move block");
            rc = PS_ENOMEM;
            break;
        }
        memcpy(fill[t], at, sizeof fill[t]); /* write positions: steps, homes, chunks, parts */
        out[t] = b;
        out_len[t] = at[4];
    }
    /* the records, each to its thread's block in order */
    off = prev = 0;
    for (uint64_t k = 0; !rc && ps_ckpt_next_chunk(&v.chunks, &off, &c); k++) {
        int t = ps_server_owner(c.key, c.chunk, threads);
        unsigned char *b = out[t];
        memcpy(b + fill[t][0], v.opt_steps + 8 * k, 8);
        fill[t][0] += 8;
        memcpy(b + fill[t][2], v.chunks.data + prev, off - prev);
        fill[t][2] += off - prev;
        prev = off;
    }
    off = prev = 0;
    for (uint64_t k = 0; !rc && ps_ckpt_next_part(&v.parts, &off, &p); k++) {
        int32_t hp[2];
        home_of(&v, k, hp);
        int t = part_thread(hp[0], p.part, rank, threads);
        unsigned char *b = out[t];
        memcpy(b + fill[t][1], hp, 8);
        fill[t][1] += 8;
        memcpy(b + fill[t][3], v.parts.data + prev, off - prev);
        fill[t][3] += off - prev;
        prev = off;
    }
    if (rc)
        for (int t = 0; t < threads; t++) {
            free(out[t]);
            out[t] = NULL;
            out_len[t] = 0;
        }
    free(cnt);
    free(fill);
    return rc;
}
