/* An export from checkpoints (export_ckpt.h). */
#include "export_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_coord.h"
#include "export_write.h"
#include "ps_error.h"
#include "ps_log.h"
#include "server.h"
#include "snapshot.h"

/* No request ever reaches these stores: hooks that do nothing. */
static void no_release(void *u, void *h) { (void)u; (void)h; }
static void no_ready(void *u, void *w, const float *x, size_t n, int64_t v)
{
    (void)u; (void)w; (void)x; (void)n; (void)v;
}
static void no_cancel(void *u, void *w) { (void)u; (void)w; }
static void no_trelease(void *u, void *h, int rc, const char *why)
{
    (void)u; (void)h; (void)rc; (void)why;
}
static void no_tready(void *u, void *w, int64_t v) { (void)u; (void)w; (void)v; }

/* The header of server rank's newest checkpoint under dir. */
static int newest_meta(const char *dir, int rank, ps_ckpt_meta *m, uint8_t **hello, char *why,
                       size_t why_len)
{
    uint64_t *seqs = NULL;
    char msg[512], path[4096];
    int n = ps_ckpt_list(dir, rank, &seqs, msg, sizeof msg);
    if (n <= 0) {
        ps_errorf(why, why_len, "%s: %s", dir,
            n < 0 ? msg : "no checkpoint of this server (shard-RANK-SEQ.ckpt) there");
        free(seqs);
        return PS_EDATA;
    }
    int rc = PS_EDATA;
    for (int k = 0; k < n && rc; k++) { /* the newest that reads: the restore says the rest */
        ps_ckpt_file f;
        ps_ckpt_path(dir, rank, seqs[k], path, sizeof path);
        if ((rc = ps_ckpt_read(path, &f, msg, sizeof msg)) != 0) {
            ps_warn("%s", msg);
            continue;
        }
        *m = f.meta;
        *hello = calloc((size_t)m->num_workers + 1, 1);
        m->hello = NULL;
        ps_ckpt_file_free(&f);
        if (!*hello)
            rc = PS_ENOMEM;
    }
    if (rc)
        ps_errorf(why, why_len, "%s: no checkpoint of server %d reads back (the lines above say "
            "why)", dir, rank);
    free(seqs);
    return rc;
}

/* Restore server rank's state and hand its items to w. */
static int export_rank(const char *dir, int rank, ps_export_writer *w, int *num_servers,
                       int *mode, char *why, size_t why_len)
{
    ps_ckpt_meta m;
    uint8_t *hello = NULL;
    int rc = newest_meta(dir, rank, &m, &hello, why, why_len);
    if (rc)
        return rc;
    *num_servers = m.num_servers;
    *mode = m.mode;
    int T = m.threads > 0 ? m.threads : 1;
    ps_server_config cfg;
    ps_server_config_default(&cfg);
    cfg.rank = rank;
    cfg.num_servers = m.num_servers;
    cfg.num_workers = m.num_workers;
    cfg.mode = m.mode;
    cfg.max_staleness = m.max_staleness;
    cfg.opt = m.opt;
    cfg.threads = T;
    cfg.checkpoint_dir = dir;
    cfg.restore = 1;
    _Atomic uint64_t mem = 0;
    ps_shard *shards[PS_SERVER_MAX_THREADS] = {0};
    ps_tparts *tparts[PS_SERVER_MAX_THREADS] = {0};
    ps_ckpt_coord *ck = NULL;
    ps_shard_config sc = {.mode = m.mode, .max_staleness = m.max_staleness,
                          .num_workers = m.num_workers, .opt = m.opt, .max_memory = UINT64_MAX,
                          .mem_used = &mem};
    ps_shard_hooks sh = {.release = no_release, .ready = no_ready, .cancel = no_cancel};
    ps_tparts_hooks th = {.release = no_trelease, .ready = no_tready, .cancel = no_cancel};
    ps_tparts_config tc = {.mode = m.mode, .max_staleness = m.max_staleness,
                           .num_workers = m.num_workers, .num_servers = m.num_servers,
                           .nparts = T, .max_memory = UINT64_MAX, .mem_used = &mem};
    rc = ps_ckpt_coord_create(&cfg, &ck, why, why_len);
    for (int t = 0; !rc && t < T; t++) {
        tc.part = t;
        if (ps_shard_create(&sc, &sh, &shards[t]) || ps_tparts_create(&tc, &th, &tparts[t])) {
            ps_errorf(why, why_len, "out of memory");
            rc = PS_ENOMEM;
        }
    }
    uint64_t model_fp = 0;
    if (!rc) {
        tc.part = 0;
        ps_ckpt_restore_to to = {shards, tparts, T, &tc, NULL, NULL};
        rc = ps_ckpt_coord_restore(ck, &to, hello, &model_fp, why, why_len);
    }
    /* every item as it is: the checkpoint's versions */
    ps_snap_config snc = {.server = rank, .opt = m.opt, .target = -1,
                          .max_memory = UINT64_MAX, .mem_used = NULL};
    for (int t = 0; !rc && t < T; t++) {
        ps_snap_job *job;
        if ((rc = ps_snap_begin(&snc, shards[t], tparts[t], &job)) != 0)
            break;
        ps_snap_poll(job, shards[t], tparts[t], 1);
        ps_snap_buf **items;
        size_t n;
        rc = ps_snap_end(job, &items, &n, why, why_len);
        for (size_t k = 0; k < n; k++) {
            if (!rc) {
                char msg[256];
                rc = ps_export_writer_add(w, items[k]->data, items[k]->len, msg, sizeof msg);
                items[k]->data = NULL; /* the writer's now */
                if (rc)
                    ps_errorf(why, why_len, "server %d: %s", rank, msg);
            }
            ps_snap_buf_unref(items[k]);
        }
        free(items);
    }
    for (int t = 0; t < T; t++) {
        ps_shard_destroy(shards[t]);
        ps_tparts_destroy(tparts[t]);
    }
    ps_ckpt_coord_destroy(ck);
    free(hello);
    return rc;
}

int ps_export_checkpoints(const char *ckpt_dir, const char *out, int with_state, uint64_t *bytes,
                          char *why, size_t why_len)
{
    *bytes = 0;
    ps_ckpt_meta m0;
    uint8_t *hello = NULL;
    int rc = newest_meta(ckpt_dir, 0, &m0, &hello, why, why_len);
    free(hello);
    if (rc)
        return rc;
    ps_export_info info = {"checkpoint", ckpt_dir, m0.mode, m0.num_servers, with_state, -1, 0};
    ps_export_writer *w;
    if ((rc = ps_export_writer_open(out, &info, &w, why, why_len)) != 0)
        return rc;
    for (int r = 0; !rc && r < m0.num_servers; r++) {
        int ns = 0, mode = 0;
        rc = export_rank(ckpt_dir, r, w, &ns, &mode, why, why_len);
        if (!rc && (ns != m0.num_servers || mode != m0.mode)) {
            ps_errorf(why, why_len, "%s: server %d's checkpoint is of a job of %d servers (%s), "
                "server 0's of %d (%s): checkpoints of two jobs mixed", ckpt_dir, r, ns,
                mode == PS_MODE_SYNC ? "sync" : "async", m0.num_servers,
                m0.mode == PS_MODE_SYNC ? "sync" : "async");
            rc = PS_EDATA;
        }
    }
    if (rc) {
        ps_export_writer_abort(w);
        return rc;
    }
    return ps_export_writer_finish(w, bytes, why, why_len);
}
