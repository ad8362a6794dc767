/* --restore (server/ckpt_coord.h): finding the newest valid checkpoint
 * chain of this server, checking it fits, and loading its records into the
 * shard and the tables; the coordinator then goes on from it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_coord_internal.h"
#include "ps_error.h"
#include "ps_log.h"

typedef struct id_list {
    uint64_t *ids;
    size_t n;
} id_list;

static void collect_id(void *arg, const ps_table_row_view *v)
{
    id_list *l = arg;
    l->ids[l->n++] = v->id;
}

/* Every row of t deleted: a whole partition record replaces what the
 * records before it made. */
static int clear_rows(ps_table *t)
{
    ps_table_counts c;
    ps_table_stats(t, &c);
    if (!c.rows)
        return 0;
    id_list l = {malloc(c.rows * sizeof *l.ids), 0};
    if (!l.ids)
        return PS_ENOMEM;
    ps_table_foreach(t, PS_TABLE_ROWS_ALL, collect_id, &l); /* the ids first: removing moves rows */
    for (size_t k = 0; k < l.n; k++)
        ps_table_remove(t, l.ids[k]);
    free(l.ids);
    return 0;
}

/* One partition record applied to its thread's partition (declared here
 * when it is the table's first): ps_ckpt_fill_part, restored leniently. */
static int restore_part(const ps_ckpt_restore_to *to, const ps_ckpt_part_view *v, char *why,
                        size_t why_len)
{
    if (v->part >= (uint32_t)to->nshards) {
        ps_errorf(why, why_len, "table %llu: a record of partition %u, but %d threads",
            (unsigned long long)v->key, v->part, to->nshards);
        return PS_EDATA;
    }
    ps_tparts *tp = to->tparts[v->part];
    const ps_table_options *have = ps_tparts_decl(tp, v->key);
    int rc = 0;
    if (have) {
        if (ps_table_decl_compare(v->key, &v->decl, "a later record", have, "an earlier one",
                                  why, why_len))
            return PS_EDATA;
    } else {
        ps_table *store;
        rc = ps_tparts_make_store(to->tc, v->key, &v->decl, &store, why, why_len);
        if (!rc)
            rc = ps_tparts_adopt(tp, v->key, &v->decl, store, why, why_len);
        if (rc)
            return rc == PS_EINVAL ? PS_EDATA : rc;
        if (v->part == 0 && to->declared)
            to->declared(to->user, v->key, &v->decl);
    }
    rc = ps_ckpt_fill_part(tp, v, 1, why, why_len);
    return rc == PS_EMISMATCH ? PS_EDATA : rc;
}

int ps_ckpt_fill_part(ps_tparts *tp, const ps_ckpt_part_view *v, int lenient, char *why,
                      size_t why_len)
{
    ps_table *t = ps_tparts_store(tp, v->key);
    if (!t) {
        ps_errorf(why, why_len, "table %llu is not declared here", (unsigned long long)v->key);
        return PS_ENOTFOUND;
    }
    int rc = 0;
    if (!v->delta)
        rc = clear_rows(t);
    for (size_t k = 0; !rc && v->delta && k < v->ndeleted; k++)
        ps_table_remove(t, ps_ckpt_id(v->deleted, k));
    /* the hash at its size first: the rows come in the writer's hash order */
    if (!rc && v->nrows)
        rc = ps_table_reserve(t, v->nrows, why, why_len);
    for (size_t k = 0; !rc && k < v->nrows; k++) {
        ps_table_row_view r;
        ps_ckpt_part_row(v, k, &r);
        rc = ps_table_restore_row(t, &r, why, why_len);
    }
    for (size_t k = 0; !rc && k < v->norder; k++)
        ps_table_touch(t, ps_ckpt_id(v->order, k));
    if (!rc && v->ncells)
        rc = ps_table_restore_filter(t, v->cells, v->ncells, why, why_len);
    if (rc)
        return rc;
    ps_table_set_counters(t, &v->counts);
    return ps_tparts_set_restored(tp, v->key, v->version, v->clock, lenient);
}

int ps_ckpt_load_records(ps_shard *shard, ps_tparts *tp, const ps_tparts_config *tc, int idx,
                         int num_workers, int nstate, const void *buf, size_t len,
                         const void *tbuf, size_t tlen, char *why, size_t why_len)
{
    ps_ckpt_file cf, pf;
    int rc = ps_ckpt_view_records(buf, len, tbuf, tlen, num_workers, nstate, &cf, &pf, why,
                                  why_len);
    if (rc)
        return rc;
    /* restore_part finds a partition by its number: this thread's alone */
    ps_tparts *parts[PS_SERVER_MAX_THREADS] = {0};
    parts[idx] = tp;
    ps_ckpt_restore_to to = {NULL, parts, idx + 1, tc, NULL, NULL};
    size_t off = 0;
    ps_ckpt_part_view v;
    while (!rc && ps_ckpt_next_part(&pf, &off, &v)) {
        if (v.part != (uint32_t)idx) {
            ps_errorf(why, why_len, "table %llu: a record of partition %u sent to update thread "
                      "%d", (unsigned long long)v.key, v.part, idx);
            return PS_EDATA;
        }
        rc = restore_part(&to, &v, why, why_len);
    }
    off = 0;
    ps_shard_chunk_view c;
    while (!rc && ps_ckpt_next_chunk(&cf, &off, &c))
        rc = ps_shard_restore_chunk(shard, &c, why, why_len);
    if (!rc)
        for (size_t k = 0; ; k++) { /* the next checkpoint here holds what changes from now */
            ps_tpart_view pv;
            if (!ps_tparts_view(tp, k, &pv))
                break;
            ps_table_mark_clean(pv.store);
        }
    return rc;
}

/* Read checkpoint seq and check it: 0 with f filled, PS_EMISMATCH (another
 * configuration: why says, the restore stops), or another error (this one
 * is unusable: why says, an older one may do). */
static int read_one(ps_ckpt_coord *c, uint64_t seq, ps_ckpt_file *f, char *path, size_t path_len,
                    char *why, size_t why_len)
{
    char msg[512];
    ps_ckpt_path(c->dir, c->rank, seq, path, path_len);
    int rc = ps_ckpt_read(path, f, msg, sizeof msg);
    if (rc) {
        ps_errorf(why, why_len, "%s", msg);
        return rc;
    }
    const ps_ckpt_meta *m = &f->meta;
    rc = ps_ckpt_check_config(m, c->rank, c->num_servers, c->num_workers, c->mode,
                              c->max_staleness, &c->opt, msg, sizeof msg);
    if (!rc && m->nparts && m->threads != c->threads) {
        ps_errorf(msg, sizeof msg, "it was written with --threads %d, this server has --threads "
            "%d (a table has a partition per update thread)", m->threads, c->threads);
        rc = PS_EMISMATCH;
    }
    if (rc) {
        ps_errorf(why, why_len, "--restore: checkpoint %s does not fit this server: %s (start "
            "with the flags it was written with, or without --restore)", path, msg);
        ps_ckpt_file_free(f);
        return PS_EMISMATCH;
    }
    return 0;
}

/* The chain of checkpoint seqs[i]: its seqs from the newest (chain[0] =
 * seqs[i]) back to the full one, each read back whole.  Its length, 0 when
 * a file of it is unusable (said; bad[k] marks seqs[k] found so, and a chain
 * through it is not read again), -1 on a configuration mismatch (why). */
static int chain_of(ps_ckpt_coord *c, const uint64_t *seqs, int n, int i, uint8_t *bad,
                    uint64_t *chain, char *why, size_t why_len)
{
    int len = 0;
    char path[1024], msg[512];
    for (uint64_t seq = seqs[i];;) {
        int at = i;
        while (at < n && seqs[at] != seq)
            at++;
        if (at < n && bad[at]) {
            if (at == i)
                ps_warn("checkpoint %llu is unusable (above): skipped",
                        (unsigned long long)seq);
            else
                ps_warn("checkpoint %llu builds on checkpoint %llu, which is unusable "
                        "(above): skipped", (unsigned long long)seqs[i], (unsigned long long)seq);
            return 0;
        }
        ps_ckpt_file f;
        int rc = read_one(c, seq, &f, path, sizeof path, msg, sizeof msg);
        if (rc == PS_EMISMATCH) {
            ps_errorf(why, why_len, "%s", msg);
            return -1;
        }
        if (rc) {
            if (at < n)
                bad[at] = 1;
            ps_warn("checkpoint %s is corrupt or unreadable (%s): %s%s", path, msg,
                    seq == seqs[i] ? "skipped" : "the ones after it cannot be restored",
                    i + 1 < n ? "; trying the one before it" : "");
            return 0;
        }
        uint64_t prev = f.meta.prev;
        ps_ckpt_file_free(&f);
        chain[len++] = seq;
        if (!prev)
            return len;
        int there = 0;
        for (int k = i; k < n && !there; k++)
            there = seqs[k] == prev;
        if (!there || len > PS_CKPT_FULL_EVERY * 4) {
            ps_warn("checkpoint %s holds the changes since checkpoint %llu, which %s: it cannot "
                    "be restored%s", path, (unsigned long long)prev,
                    there ? "is too far back" : "is not there",
                    i + 1 < n ? "; trying the one before it" : "");
            return 0;
        }
        seq = prev;
    }
}

/* After a restore: what the old process acknowledged and the checkpoint
 * restored does not hold is lost; how much the policy allows, said once
 * (issue 32: a server restarted from its checkpoint logs its loss). */
static void log_loss_bound(const ps_ckpt_coord *c, uint64_t seq, long long version)
{
    if (c->pol.durable)
        ps_info("--restore: nothing acknowledged is lost: every round a worker saw was in a "
                "checkpoint before its replies left (sync, --checkpoint-every 1)");
    else if (c->pol.ack_bound)
        ps_warn("--restore: at most %lld pushes this server acknowledged after checkpoint %llu "
                "are lost (async, --checkpoint-every %lld); the workers go on from here",
                (long long)c->every, (unsigned long long)seq, (long long)c->every);
    else if (c->mode == PS_MODE_SYNC && c->every > 0)
        ps_warn("--restore: the rounds completed after version %lld are lost (a checkpoint "
                "every %lld rounds: --checkpoint-every %lld); the workers go on from there",
                version, (long long)c->every, (long long)c->every);
    else
        ps_warn("--restore: the updates made after checkpoint %llu are lost (up to %.1f s of "
                "them: --checkpoint-every %.1fs); the workers go on from here",
                (unsigned long long)seq, c->every_ms / 1000.0, c->every_ms / 1000.0);
}

int ps_ckpt_coord_restore(ps_ckpt_coord *c, const ps_ckpt_restore_to *to, uint8_t *hello,
                          uint64_t *model_fp, char *why, size_t why_len)
{
    const char *dir = c->dir;
    int rank = c->rank, nshards = to->nshards;
    uint64_t *seqs = NULL, chain[PS_CKPT_FULL_EVERY * 4 + 2];
    char msg[512], path[1024];
    int n = ps_ckpt_list(dir, rank, &seqs, msg, sizeof msg);
    if (n < 0) {
        ps_errorf(why, why_len, "--restore: %s", msg);
        return PS_EDATA;
    }
    if (n == 0) {
        ps_errorf(why, why_len,
            "--restore: no checkpoint of server %d in %s (start without --restore to begin afresh)",
            rank, dir);
        free(seqs);
        return PS_EDATA;
    }
    c->seq = seqs[0] + 1;
    uint8_t *bad = calloc((size_t)n, 1);
    if (!bad) {
        free(seqs);
        ps_errorf(why, why_len, "--restore: out of memory");
        return PS_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        int len = chain_of(c, seqs, n, i, bad, chain, why, why_len);
        if (len < 0) {
            free(bad);
            free(seqs);
            return PS_EMISMATCH;
        }
        if (len == 0)
            continue;
        /* the full one first, then each delta; the newest's chunks and header */
        ps_ckpt_file f;
        int rc = 0;
        for (int k = len - 1; k >= 0 && !rc; k--) {
            rc = read_one(c, chain[k], &f, path, sizeof path, why, why_len);
            if (rc)
                break;
            size_t off = f.first_part;
            ps_ckpt_part_view v;
            while (!rc && ps_ckpt_next_part(&f, &off, &v))
                if ((rc = restore_part(to, &v, msg, sizeof msg)) != 0)
                    ps_errorf(why, why_len, "--restore: %s: %s", path, msg);
            if (k > 0)
                ps_ckpt_file_free(&f);
        }
        if (rc) {
            ps_ckpt_file_free(&f);
            free(bad);
            free(seqs);
            return rc;
        }
        const ps_ckpt_meta *m = &f.meta;
        size_t off = f.first;
        ps_shard_chunk_view v;
        while (ps_ckpt_next_chunk(&f, &off, &v)) {
            int owner = ps_server_owner(v.key, v.chunk, nshards);
            rc = ps_shard_restore_chunk(to->shards[owner], &v, msg, sizeof msg);
            if (rc) {
                ps_errorf(why, why_len, "--restore: %s: %s", path, msg);
                ps_ckpt_file_free(&f);
                free(bad);
                free(seqs);
                return rc == PS_EMISMATCH ? PS_EDATA : rc;
            }
        }
        ps_shard_add_counters(to->shards[0], &m->counters);
        *model_fp = m->model_fp;
        /* a worker that said hello to the old process: its requests (resends
         * included) are served without a new hello */
        int known = 0;
        for (int r = 0; r < c->num_workers; r++) {
            hello[r] = m->hello[r] != 0;
            known += hello[r];
        }
        /* the next checkpoint may hold only what changes from here */
        for (int t = 0; t < nshards; t++) {
            ps_tpart_view pv;
            for (size_t k = 0; ps_tparts_view(to->tparts[t], k, &pv); k++)
                ps_table_mark_clean(pv.store);
            int have, have_t;
            int64_t mc = ps_shard_min_version(to->shards[t], &have),
                    mt = ps_tparts_min_version(to->tparts[t], &have_t);
            c->min_version[t] = !have_t ? mc : !have ? mt : mc < mt ? mc : mt;
            c->have_min[t] = (uint8_t)(have || have_t);
        }
        c->last_round = c->prev_round = m->min_version;
        c->durable_round = m->min_version;
        c->written_seq = m->seq;
        c->chain_len = len - 1;
        c->need_full = 0;
        ps_info("restored %s: checkpoint %llu (%s), %llu chunks, %llu table partitions, versions "
                "%lld..%lld, %llu updates, %d of %d workers known, model fingerprint %016llx",
                path, (unsigned long long)m->seq,
                len > 1 ? "with the full one and deltas before it" : "a full one",
                (unsigned long long)m->nchunks, (unsigned long long)m->nparts,
                (long long)m->min_version, (long long)m->max_version,
                (unsigned long long)m->counters.updates, known, c->num_workers,
                (unsigned long long)m->model_fp);
        log_loss_bound(c, m->seq, (long long)m->min_version);
        /* what the newer ones held is gone: say how much */
        if (i > 0)
            ps_warn("--restore fell back to checkpoint %llu: the %d newer checkpoint(s), %llu "
                    "to %llu, could not be restored (above); the updates they held after "
                    "version %lld of this server are lost",
                    (unsigned long long)m->seq, i, (unsigned long long)seqs[i - 1],
                    (unsigned long long)seqs[0], (long long)m->min_version);
        ps_ckpt_file_free(&f);
        free(bad);
        free(seqs);
        return 0;
    }
    free(bad);
    ps_errorf(why, why_len,
        "--restore: none of the %d checkpoint(s) of server %d in %s is valid (see the lines above); "
        "refusing to start from an unknown state", n, rank, dir);
    free(seqs);
    return PS_EDATA;
}
