#include "server_internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "barrier.h"
#include "ckpt_coord.h"
#include "hs_monitor.h"
#include "outbox.h"
#include "admin.h"
#include "peers.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_fs.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ps_trace.h"
#include "ratelimit.h"
#include "reply.h"
#include "shard.h"
#include "stats_req.h"
#include "updater.h"
#include "workers.h"
#include "zmsg.h"

/* With metrics: when a request reached the update thread's hand-over (the
 * start of its push-to-apply time). */
static int64_t recv_ns(const ps_server *s) { return s->met ? ps_now_ns() : 0; }

ps_hello srv_my_hello(const ps_server *s)
{
    ps_hello h;
    memset(&h, 0, sizeof h);
    h.mode = s->cfg.mode;
    h.max_staleness = s->cfg.max_staleness;
    h.num_workers = (uint32_t)s->cfg.num_workers;
    h.num_servers = (uint32_t)s->cfg.num_servers;
    h.server_rank = s->cfg.rank;
    h.model_fp = s->model_fp;
    h.tables_fp = s->tables_fp;
    h.opt = s->cfg.opt;
    h.wire_dtype = s->cfg.wire_dtype;
    h.threads = (uint32_t)s->cfg.threads;
    return h;
}

/* ================= answers ================= */

/* An ERROR reply to req with code and why, counted; not logged (the
 * refusal is expected, or logged elsewhere). */
static void io_error_quiet(ps_server *s, zmq_msg_t *id, const ps_header *req, int code,
                           const char *why)
{
    ps_header r;
    ps_reply_error(&r, req->seq, req->rank, req->key, req->chunk, code, why);
    r.seq_negative = req->seq_negative;
    s->io_errors++;
    srv_send(s, id, &r);
}

/* The same, logged (rate-limited). */
static void io_error(ps_server *s, zmq_msg_t *id, const ps_header *req, int code,
                     const char *why)
{
    if (ps_rlimit_allow(&s->rl))
        ps_warn("refused %s from rank %d: %s: %s", ps_msg_type_name(req->type), req->rank,
                ps_strerror(code), why);
    io_error_quiet(s, id, req, code, why);
}

void srv_refuse(ps_server *s, zmq_msg_t *id, const ps_header *req, int code, const char *why)
{
    io_error(s, id, req, code, why);
}

void srv_refuse_quiet(ps_server *s, zmq_msg_t *id, const ps_header *req, int code,
                      const char *why)
{
    io_error_quiet(s, id, req, code, why);
}

/* The reply that says only "done": its type, the request's q, r, k, c. */
static void io_ack(ps_server *s, zmq_msg_t *id, const ps_header *req)
{
    ps_header r;
    ps_reply_header(&r, req->type, req->seq, req->rank, req->key, req->chunk);
    srv_send(s, id, &r);
}

/* Rank r joins (live 1) or leaves (0) the live set of every owner's shard
 * and of the barriers. */
void srv_set_live(ps_server *s, int r, int live)
{
    ps_cmd_frame cmd = {.cmd = PS_CMD_LIVE, .rank = r, .live = live};
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    ps_barriers_set_live(s->barriers, r, live);
    /* the group's members: in the stream's order (2: it left) */
    ps_repl_forward_live(s->repl, r, !live && s->left[r] ? 2 : live);
}

void srv_stream_live(ps_server *s, int rank, int live)
{
    s->left[rank] = live == 2;
    srv_set_live(s, rank, live == 1);
    ps_colls_set_live(s->colls, rank, live == 1 || live == 2);
}

/* Apply --on-worker-loss to every worker silent for longer than the timeout. */
void srv_check_workers(ps_server *s, int64_t now)
{
    for (int r; (r = ps_workers_check(s->workers, now)) >= 0;) {
        srv_set_live(s, r, 0);
        ps_colls_set_live(s->colls, r, 0); /* gone: collectives go on without it */
    }
}

/* A worker's tables differ from this server's (why: the hello's refusal):
 * say what this server has, as far as the text goes, and where they come
 * from, so the worker's log names both. */
static void tables_said(ps_server *s, char *why, size_t why_len)
{
    size_t off = strlen(why);
    off += (size_t)snprintf(why + off, why_len - off, "; %s has ",
                            s->tables[0].restored ? "its checkpoint" : "this server");
    for (size_t i = 0; i < s->ntables && off < why_len; i++) {
        const ps_table_options *d = &s->tables[i].decl;
        char label[128];
        off += (size_t)snprintf(why + off, why_len - off, "%s%s (dim %u, %s)", i ? ", " : "",
                                srv_table_label(&s->tables[i], label, sizeof label), d->dim,
                                ps_table_opt_name(d->opt.kind));
    }
}

/* The connection a message came on (f[0] its route, f[1] its header frame),
 * as workers.h takes it; borrows f. */
ps_conn srv_conn_of(zmq_msg_t *f)
{
    return (ps_conn){zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), zmq_msg_get(&f[1], ZMQ_SRCFD),
                     zmq_msg_gets(&f[1], "User-Id")};
}

/* ================= one handler per message type ================= */

/* Each gets a request that the dispatch (io_message) checked against its
 * type's row of proto/ps_msg_table.h: decoded, the frames its payload
 * columns call for, and a sender its `from` column allows.  f[0] is the
 * route, f[1] the header frame, f[2..nf-1] the payload frames. */
typedef void (*io_handler)(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);

static void io_on_hello(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    ps_hello mine = srv_my_hello(s);
    char why[256], who[32];
    snprintf(who, sizeof who, h->rank >= 0 ? "worker %d" : "rank %d", h->rank);
    ps_hello theirs = h->hello;
    if (h->rank < 0) {
        /* a tool or reader joins no round and moves no payload it pushes:
         * it takes this server's settings (its server list must be this
         * job's, and a model or tables it gives must be the servers') */
        uint32_t ns = theirs.num_servers;
        for (int i = 0; i < ps_hello_nagreed(); i++)
            ps_hello_set(&theirs, i, ps_hello_get(&mine, i));
        theirs.num_servers = ns;
    }
    int rc = ps_hello_compare(&mine, "server", &theirs, who, 1, why, sizeof why);
    if (rc == 0 && h->hello.server_rank >= 0 && h->hello.server_rank != s->cfg.rank) {
        ps_errorf(why, sizeof why,
            "server-rank: server has %d, %s has %d (check the order of the server list)",
            s->cfg.rank, who, h->hello.server_rank);
        rc = PS_EMISMATCH;
    }
    if (rc == 0 && h->rank >= s->cfg.num_workers) {
        ps_errorf(why, sizeof why, "rank %d is out of range: this server has --num-workers %d",
            h->rank, s->cfg.num_workers);
        rc = PS_EPROTO;
    }
    if (rc == PS_EMISMATCH && !strncmp(why, "tables:", 7) && s->ntables)
        tables_said(s, why, sizeof why);
    if (rc) {
        /* its peers waiting at a barrier for it are told, and stop waiting */
        if (h->rank >= 0 && h->rank < s->cfg.num_workers)
            ps_barriers_refused(s->barriers, h->rank, rc, why);
        io_error(s, &f[0], h, rc, why);
        return;
    }
    uint64_t token = 0;
    if (h->rank >= 0) {
        int rejoined;
        char peer[256];
        ps_peer_name(&f[0], &f[1], h->rank, peer, sizeof peer);
        /* a holder that just hung up is gone by now, not live */
        srv_read_monitor(s);
        ps_conn c = srv_conn_of(f);
        rc = ps_workers_hello(s->workers, h->rank, &c, h->hello.token, ps_now_ns(), peer,
                              &token, &rejoined, why, sizeof why);
        if (rc) { /* logged by the table, rate-limited */
            io_error_quiet(s, &f[0], h, rc, why);
            return;
        }
        ps_barriers_accepted(s->barriers, h->rank);
        /* back in the live set before any of its requests reach an owner (a
         * worker that left says hello again only as a new process) */
        if (rejoined || s->left[h->rank]) {
            s->left[h->rank] = 0;
            srv_set_live(s, h->rank, 1);
            ps_colls_set_live(s->colls, h->rank, 1);
        }
    } else {
        ps_debug("hello from a tool (rank -1)");
    }
    /* the first fingerprints an accepted worker gives are the model's */
    if (h->hello.model_fp && !s->model_fp) {
        s->model_fp = h->hello.model_fp;
        ps_info("model fingerprint %016llx (from %s)", (unsigned long long)s->model_fp, who);
    }
    if (h->hello.tables_fp && !s->tables_fp)
        s->tables_fp = h->hello.tables_fp;
    ps_header r;
    ps_reply_header(&r, PS_MSG_HELLO, h->seq, h->rank, h->key, h->chunk);
    r.hello = srv_my_hello(s);
    r.hello.token = token;
    if (h->rank >= 0) /* does it move payloads through shared memory? */
        ps_shm_table_hello(s->shm, h->rank, &h->hello, &r.hello);
    srv_send(s, &f[0], &r);
}

/* A table request for partition h->chunk, which this server does not have
 * (its partitions are its update threads): refused, 1.  (A partition away
 * from home, PS_FLAG_AWAY: its update thread checks.) */
static int no_partition(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    if (h->chunk < (uint32_t)s->cfg.threads || (h->flags & PS_FLAG_AWAY))
        return 0;
    char why[256];
    ps_errorf(why, sizeof why, "table %llu has %d partitions on this server (its --threads), "
        "so no partition %u", (unsigned long long)h->key, s->cfg.threads, h->chunk);
    io_error(s, id, h, PS_EPROTO, why);
    return 1;
}

/* The update thread that owns the table partition h names: its own index
 * at home, ps_server_away_owner's away from it (PS_FLAG_AWAY). */
static int part_thread(const ps_server *s, const ps_header *h)
{
    if (h->flags & PS_FLAG_AWAY)
        return ps_server_away_owner(h->home, h->chunk, s->cfg.threads);
    return (int)h->chunk;
}

/* INIT, PUSH, PULL, PUSHPULL and the torch family (ASSIGN, STATE, SETSTATE,
 * CLOCK): to the update thread that owns the chunk, or for the CLOCK of a
 * table, to the one that owns its partition. */
static void io_on_data(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    char why[256];
    int rc;
    /* a peer that does not read its replies gets no more payloads */
    if (ps_msg_reply_has_payload(h->type) &&
        (rc = ps_peers_admit(s->peers, &f[0], &f[1], h->rank, why, sizeof why)) != 0) {
        io_error_quiet(s, &f[0], h, rc, why);
        return;
    }
    ps_shm_peer *shm = NULL;
    if ((h->flags & PS_FLAG_SHM) && h->dtype != PS_DTYPE_F32) {
        ps_errorf(why, sizeof why, "payloads in shared memory are float32 (d = %d), got d = "
            "%u", PS_DTYPE_F32, h->dtype);
        io_error(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    /* PS_EHELLO: the rank said hello to another process of this server:
     * it says hello again (with its arena) and resends */
    if ((h->flags & PS_FLAG_SHM) &&
        (rc = ps_shm_table_take(s->shm, h->rank, h->shm_off, h->count * sizeof(float), &shm,
                                why, sizeof why)) != 0) {
        io_error(s, &f[0], h, rc, why);
        return;
    }
    /* a pushpull's weights go to a second place of the arena */
    if (shm && h->type == PS_MSG_PUSHPULL &&
        !ps_shm_peer_at(shm, h->shm_dst, h->count * sizeof(float))) {
        ps_shm_peer_unref(shm);
        ps_errorf(why, sizeof why, "worker %d: the pushpull's destination [%llu, +%llu) is "
            "outside its arena", h->rank, (unsigned long long)h->shm_dst,
            (unsigned long long)(h->count * sizeof(float)));
        io_error(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    /* the clock of a table's partition: to the thread that owns it */
    if (h->type == PS_MSG_CLOCK && srv_find_table(s, h->key)) {
        if (no_partition(s, &f[0], h))
            return;
        ps_cmd_frame cmd = {.cmd = PS_CMD_REQ, .h = *h, .recv_ns = recv_ns(s)};
        srv_send_cmd(s, part_thread(s, h), &cmd, &f[0], NULL);
        return;
    }
    /* what carries a payload in changes the chunk: it is a mutation */
    int mutates = ps_msg_request_has_payload(h->type);
    if (mutates)
        s->mut++;
    ps_cmd_frame cmd = {.cmd = PS_CMD_REQ, .h = *h, .mut = mutates ? s->mut : 0, .shm = shm,
                        .recv_ns = recv_ns(s)};
    /* the group's members get it in the order the owner does */
    cmd.rseq = ps_repl_forward(s->repl, f, nf, h,
                               shm ? ps_shm_peer_at(shm, h->shm_off, h->count * sizeof(float))
                                   : NULL);
    srv_send_cmd(s, ps_server_owner(h->key, h->chunk, s->cfg.threads), &cmd, &f[0],
                 nf >= 3 ? &f[2] : NULL);
}

/* ---- tables ---- */

/* The TABLE reply, at once.  With checkpoints too: a declaration does not
 * wait for one (it did, a checkpoint of every table per declaration); a
 * server restored from a checkpoint older than it answers the table's
 * requests PS_ENOTFOUND, and libps declares its tables again
 * (client/client_rejoin.c).  With replicas (rseq), once the group's members
 * have it. */
static void table_ack(ps_server *s, zmq_msg_t *id, const ps_header *req, uint64_t rseq)
{
    ps_header r;
    ps_reply_header(&r, PS_MSG_TABLE, req->seq, req->rank, req->key, req->chunk);
    if (!ps_repl_hold_io(s->repl, rseq, id, &r))
        srv_send(s, id, &r);
}

/* A declared table's name, from a later declaration (a restored table's
 * checkpoint has none): here and in the update threads (a name-only
 * PS_CMD_TABLE). */
static void table_named(ps_server *s, srv_table *t, const ps_header *h)
{
    snprintf(t->name, sizeof t->name, "%s", h->table_name);
    for (int i = 0; i < s->cfg.threads; i++) {
        ps_cmd_frame cmd = {.cmd = PS_CMD_TABLE, .h = *h, .store = NULL};
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    }
}

/* TABLE: the first declaration of a table is kept and its partitions made,
 * one per update thread; a later one must be the same. */
static void io_on_table(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    char why[256], who[32], mine[48];
    snprintf(who, sizeof who, "worker %d", h->rank);
    int rc = ps_table_decl_check(h->key, &h->table, why, sizeof why);
    if (rc) {
        io_error(s, &f[0], h, rc, why);
        return;
    }
    srv_table *t = srv_find_table(s, h->key);
    if (t) {
        snprintf(mine, sizeof mine, t->restored ? "server %d's checkpoint" : "server %d",
                 s->cfg.rank);
        if (ps_table_decl_compare(h->key, &h->table, who, &t->decl, mine, why, sizeof why)) {
            io_error(s, &f[0], h, PS_EMISMATCH, why);
            return;
        }
        if (!t->name[0] && h->table_name[0]) /* a restored table learns its name */
            table_named(s, t, h);
        table_ack(s, &f[0], h, 0);
        return;
    }
    if (s->ntables >= (size_t)s->cfg.max_tables) {
        ps_errorf(why, sizeof why, "table %llu: this server holds %zu tables, --max-tables %d: "
            "declare fewer tables (several fields can share one, their ids apart) or raise it",
            (unsigned long long)h->key, s->ntables, s->cfg.max_tables);
        io_error(s, &f[0], h, PS_ETOOBIG, why);
        return;
    }
    /* its partitions' stores are made here, so a refusal (--max-memory)
     * reaches the worker that declared it */
    ps_table *stores[PS_SERVER_MAX_THREADS] = {0};
    ps_tparts_config tc = srv_tparts_config(s);
    int T = s->cfg.threads;
    for (int i = 0; i < T && !rc; i++)
        rc = ps_tparts_make_store(&tc, h->key, &h->table, &stores[i], why, sizeof why);
    if (!rc && !(t = srv_add_table(s, h->key, &h->table, 0))) {
        ps_errorf(why, sizeof why, "out of memory declaring table %llu",
            (unsigned long long)h->key);
        rc = PS_ENOMEM;
    }
    if (rc) {
        for (int i = 0; i < T; i++)
            ps_table_destroy(stores[i]);
        io_error(s, &f[0], h, rc, why);
        return;
    }
    snprintf(t->name, sizeof t->name, "%s", h->table_name);
    uint64_t rseq = ps_repl_forward_io(s->repl, h);
    for (int i = 0; i < T; i++) {
        ps_cmd_frame cmd = {.cmd = PS_CMD_TABLE, .h = *h, .store = stores[i],
                            .after_restore = s->cfg.restore};
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    }
    char label[128];
    ps_info("%s declared by %s: dim %u, %s initializer (scale %g, seed %llu), %s, "
            "row cap %llu (%s when full), filter %u (%d partitions here)",
            srv_table_label(t, label, sizeof label), who,
            t->decl.dim, t->decl.init == PS_TABLE_INIT_ZEROS     ? "zeros"
                         : t->decl.init == PS_TABLE_INIT_UNIFORM ? "uniform"
                                                                 : "normal",
            (double)t->decl.init_scale, (unsigned long long)t->decl.seed,
            ps_table_opt_name(t->decl.opt.kind), (unsigned long long)t->decl.max_rows,
            t->decl.full == PS_TABLE_FULL_REFUSE ? "refuse" : "evict", t->decl.min_count, T);
    table_ack(s, &f[0], h, rseq);
}

/* A sparse pull's reply (over the network) sized before anything is built:
 * npull rows of dim values in the wire type may pass neither a frame's
 * limit nor what the connection may leave unread, and its rows and their
 * copy must fit in --max-memory.  PS_ETOOBIG naming the numbers, or 0. */
static int sparse_reply_fits(ps_server *s, const ps_header *h, char *why, size_t why_len)
{
    if (h->type == PS_MSG_SPUSH || h->type == PS_MSG_SASSIGN || (h->flags & PS_FLAG_SHM))
        return 0; /* no rows back, or written into the worker's arena */
    uint64_t n = h->type == PS_MSG_SPULL ? h->count : h->npull;
    uint64_t bytes = n * h->dim * ps_dtype_size(s->cfg.wire_dtype);
    uint64_t peer = ps_peers_byte_limit(s->peers);
    const char *what = NULL;
    uint64_t limit = 0;
    if (bytes > PS_MAX_PAYLOAD_BYTES)
        what = "the frame limit", limit = PS_MAX_PAYLOAD_BYTES;
    else if (bytes > peer)
        what = "--max-peer-bytes", limit = peer;
    else if (2 * bytes > s->cfg.max_memory) /* its rows, and their copy as the payload */
        what = "--max-memory / 2", limit = s->cfg.max_memory / 2;
    if (!what)
        return 0;
    ps_errorf(why, why_len, "the reply of %llu bytes (%llu ids x dim %u x %zu) is over %s, "
        "%llu bytes: pull fewer ids at a time (a duplicate id gets its row too)",
        (unsigned long long)bytes, (unsigned long long)n, h->dim,
        ps_dtype_size(s->cfg.wire_dtype), what, (unsigned long long)limit);
    return PS_ETOOBIG;
}

/* SPULL, SPUSH, SPUSHPULL, SASSIGN: to the update thread of partition `c`, once the
 * table and the rows' width are this server's. */
static void io_on_sparse(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    char why[256];
    int rc;
    /* a peer that does not read its replies gets no more payloads */
    if (ps_msg_reply_layout(h->type) != PS_PL_NONE &&
        (rc = ps_peers_admit(s->peers, &f[0], &f[1], h->rank, why, sizeof why)) != 0) {
        io_error_quiet(s, &f[0], h, rc, why);
        return;
    }
    const srv_table *t = srv_find_table(s, h->key);
    if (!t) {
        ps_errorf(why, sizeof why, "table %llu is not declared on this server (libps declares "
            "each table with a TABLE message at start: ps_client_register_table)",
            (unsigned long long)h->key);
        io_error(s, &f[0], h, PS_ENOTFOUND, why);
        return;
    }
    if (no_partition(s, &f[0], h))
        return;
    if (h->dim != t->decl.dim) {
        ps_errorf(why, sizeof why, "rows of table %llu have dim %u, not %u",
            (unsigned long long)h->key, t->decl.dim, h->dim);
        io_error(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    if ((rc = sparse_reply_fits(s, h, why, sizeof why)) != 0) {
        io_error(s, &f[0], h, rc, why);
        return;
    }
    /* same host: ids and rows in the worker's arena, and room for the rows
     * of the reply, every byte inside it (the frames' checks said the rest) */
    ps_shm_peer *shm = NULL;
    uint64_t reply_at;
    if ((h->flags & PS_FLAG_SHM) &&
        (rc = ps_shm_table_take(s->shm, h->rank, h->shm_off,
                                ps_proto_sparse_shm_bytes(h, &reply_at), &shm, why,
                                sizeof why)) != 0) {
        io_error(s, &f[0], h, rc, why);
        return;
    }
    /* a push changes the partition: a mutation */
    int mutates = h->type != PS_MSG_SPULL;
    if (mutates)
        s->mut++;
    ps_cmd_frame cmd = {.cmd = PS_CMD_REQ, .h = *h, .mut = mutates ? s->mut : 0, .shm = shm,
                        .recv_ns = recv_ns(s)};
    cmd.rseq = ps_repl_forward(s->repl, f, nf, h,
                               shm ? ps_shm_peer_at(shm, h->shm_off, reply_at) : NULL);
    srv_send_cmd_frames(s, part_thread(s, h), &cmd, &f[0], &f[2], nf - 2);
}

static void io_on_barrier(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    const char *why;
    int rc = ps_barriers_arrive(s->barriers, &f[0], h, &why);
    if (rc)
        io_error(s, &f[0], h, rc, why);
}

static void io_on_stats(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    const char *why;
    ps_cmd_frame cmd = {.cmd = PS_CMD_STATS};
    int rc = ps_stats_reqs_begin(s->stats, &f[0], h, &cmd.stats_token, &why);
    if (rc) {
        io_error(s, &f[0], h, rc, why);
        return;
    }
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
}

/* Authorised by the dispatch (from ADMIN). */
static void io_on_shutdown(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    char who[256];
    ps_peer_name(&f[0], &f[1], h->rank, who, sizeof who);
    io_ack(s, &f[0], h);
    ps_info("shutdown requested by %s", who);
    srv_set_stopping(s);
}

static void io_on_heartbeat(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    io_ack(s, &f[0], h);
}

/* A HYPER that changed an optimizer to `next` from step `from` (a table's
 * with h->key): on to the shard group's members and to every update
 * thread, which take it in order with the requests; its stream number. */
static uint64_t hyper_apply(ps_server *s, const ps_header *h, const ps_opt_config *next,
                            int64_t from)
{
    uint64_t rseq = ps_repl_forward_io(s->repl, h);
    ps_cmd_frame cmd = {.cmd = PS_CMD_OPT, .h = *h};
    cmd.h.hello.opt = *next;
    cmd.h.push_step = from;
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    return rseq;
}

/* The reply to a HYPER: the optimizer that runs now, held until the
 * members have the change when it was streamed (rseq != 0). */
static void hyper_reply(ps_server *s, zmq_msg_t *id, const ps_header *h,
                        const ps_opt_config *now, uint64_t rseq)
{
    ps_header r;
    ps_reply_header(&r, PS_MSG_HYPER, h->seq, h->rank, h->key, h->chunk);
    r.hello = srv_my_hello(s);
    r.hello.opt = *now;
    if (!ps_repl_hold_io(s->repl, rseq, id, &r))
        srv_send(s, id, &r);
}

/* HYPER with a table's key: that table's hyper-parameters (those its kind
 * uses), from step h->push_step on as the dense ones; the reply says what
 * the table runs now (its kind in `opt`). */
static void io_on_table_hyper(ps_server *s, zmq_msg_t *f, const ps_header *h)
{
    char why[256], label[128];
    srv_table *t = srv_find_table(s, h->key);
    if (!t) {
        ps_errorf(why, sizeof why, "hyper-parameters of table %llu, which is not declared on "
            "this server", (unsigned long long)h->key);
        io_error(s, &f[0], h, PS_ENOTFOUND, why);
        return;
    }
    const ps_opt_config *in = &h->hello.opt;
    ps_opt_config next = t->opt_now;
    srv_table_label(t, label, sizeof label);
    /* `opt` names the dense kind whose hyper-parameters the table's takes
     * (ps_table_decl_params_kind: a hello's `opt` holds no table-only kind) */
    int pk = ps_table_decl_params_kind(next.kind), changed = 0;
    uint64_t rseq = 0;
    if (in->kind != PS_OPT_NONE && in->kind != pk) {
        ps_errorf(why, sizeof why, "%s runs %s, worker %d asks for %s; a table's optimizer "
            "cannot change (declare it with that one)", label, ps_table_opt_name(next.kind),
            h->rank, ps_opt_name(in->kind));
        io_error(s, &f[0], h, PS_EMISMATCH, why);
        return;
    }
    for (int p = 0; p < PS_OPT_NPARAMS; p++)
        if (ps_opt_is_given(in, p) && ps_opt_uses(pk, p) &&
            ps_opt_get(in, p) != ps_opt_get(&next, p)) {
            ps_opt_set(&next, p, ps_opt_get(in, p));
            changed = 1;
        }
    ps_table_options d = t->decl;
    d.opt = next;
    if (ps_table_decl_check(h->key, &d, why, sizeof why)) {
        io_error(s, &f[0], h, PS_EINVAL, why);
        return;
    }
    if (changed) {
        int64_t from = h->push_step > 0 ? h->push_step : 0;
        char desc[256];
        ps_opt_config shown = next;
        shown.kind = pk;
        ps_opt_describe(&shown, desc, sizeof desc);
        if (s->cfg.mode == PS_MODE_SYNC)
            ps_info("worker %d changed the optimizer of %s (%s) to %s: the rounds from step "
                    "%lld on use it", h->rank, label, ps_table_opt_name(next.kind), desc,
                    (long long)from);
        else
            ps_info("worker %d changed the optimizer of %s (%s) to %s: the pushes from now on "
                    "use it", h->rank, label, ps_table_opt_name(next.kind), desc);
        t->opt_now = next;
        rseq = hyper_apply(s, h, &next, from);
    }
    ps_opt_config now = t->opt_now;
    now.kind = pk;
    hyper_reply(s, &f[0], h, &now, rseq);
}

/* New hyper-parameters from step h->push_step on (those h->hello.opt gives
 * and the optimizer uses; none: a question).  Sync rounds from that step
 * use them, async pushes from now on (ps_shard_set_opt, on every owner:
 * they take the command in order with the requests).  Hellos still compare
 * with the configuration the server started with; the reply says what runs
 * now. */
static void io_on_hyper(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    if (h->key) {
        io_on_table_hyper(s, f, h);
        return;
    }
    const ps_opt_config *in = &h->hello.opt;
    ps_opt_config next = s->opt_now;
    char why[256];
    uint64_t rseq = 0;
    if (in->kind != PS_OPT_NONE && in->kind != next.kind) {
        ps_errorf(why, sizeof why, "optimizer: the server runs %s, worker %d asks for %s; "
            "the optimizer cannot change while the servers run (start them with it)",
            ps_opt_name(next.kind), h->rank, ps_opt_name(in->kind));
        io_error(s, &f[0], h, PS_EMISMATCH, why);
        return;
    }
    int changed = 0;
    for (int p = 0; p < PS_OPT_NPARAMS; p++)
        if (ps_opt_is_given(in, p) && ps_opt_uses(next.kind, p) &&
            ps_opt_get(in, p) != ps_opt_get(&next, p)) {
            ps_opt_set(&next, p, ps_opt_get(in, p));
            changed = 1;
        }
    if (ps_opt_check(&next, 0, why, sizeof why)) {
        io_error(s, &f[0], h, PS_EINVAL, why);
        return;
    }
    if (changed) {
        int64_t from = h->push_step > 0 ? h->push_step : 0;
        char d[256];
        ps_opt_describe(&next, d, sizeof d);
        if (s->cfg.mode == PS_MODE_SYNC)
            ps_info("worker %d changed the optimizer to %s: the rounds from step %lld on use "
                    "it", h->rank, d, (long long)from);
        else
            ps_info("worker %d changed the optimizer to %s: the pushes from now on use it",
                    h->rank, d);
        s->opt_now = next;
        rseq = hyper_apply(s, h, &next, from);
    }
    hyper_reply(s, &f[0], h, &s->opt_now, rseq);
}

/* ALLREDUCE and BROADCAST: held here, on server 0, until every live worker
 * came (collective.h). */
static void io_on_collective(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    const char *why;
    if (s->cfg.rank != 0 || h->dtype != PS_DTYPE_F32 || nf < 3) {
        io_error(s, &f[0], h, PS_EPROTO, s->cfg.rank != 0
                 ? "collectives are held on server 0: send them there"
                 : "a collective's payload is float32 (d = 1)");
        return;
    }
    int rc = ps_colls_arrive(s->colls, &f[0], h, zmq_msg_data(&f[2]), &why);
    if (rc)
        io_error(s, &f[0], h, rc, why);
}

/* A worker is done (ps.torch's join): out of the live sets, so sync rounds
 * and barriers go on without it.  Its pulls are still answered (with
 * whatever the chunks hold), and collectives still count it: after a join
 * barrier every worker may average its buffers; one still training must not
 * start one meanwhile.  It is back when it says hello again. */
static void io_on_leave(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    if (!s->left[h->rank]) {
        s->left[h->rank] = 1;
        srv_set_live(s, h->rank, 0);
        if (!ps_workers_leave(s->workers, h->rank)) /* elastic: logged with the count */
            ps_info("worker %d is done (it left): rounds and barriers go on without it",
                    h->rank);
    }
    io_ack(s, &f[0], h);
}

/* Who the members are now, as the sender sees it: k members, it the
 * (c - 1)-th, c = 0 when it is not one (server 0 answers; every server keeps
 * the same table). */
static void io_on_members(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    int count, index;
    ps_header r;
    ps_reply_header(&r, h->type, h->seq, h->rank, 0, 0);
    r.members_version = ps_workers_view(s->workers, h->rank, &count, &index);
    r.key = (uint64_t)count;
    r.chunk = (uint32_t)(index + 1); /* 0: not a member */
    srv_send(s, &f[0], &r);
}

/* An elastic job's new member names the step its gradients count from
 * (membership.c): the rounds before it go on without it, on every chunk and
 * partition alike, however its hello raced them.  Only a member says it,
 * and only in an elastic job (a fixed job's ranks are members from step 0). */
static void io_on_join(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    if (!srv_elastic(&s->cfg) || h->push_step < 0 || s->left[h->rank]) {
        io_error(s, &f[0], h, PS_ESTATE, !srv_elastic(&s->cfg)
                 ? "join is for an elastic job (ps_server --num-workers MIN:MAX); this one "
                   "has a fixed number of workers"
                 : h->push_step < 0 ? "join needs a step >= 0"
                                    : "this worker left; a new process says hello first");
        return;
    }
    srv_stream_join(s, h->rank, h->push_step);
    io_ack(s, &f[0], h);
}

/* REPL_HELLO, REPL_LIVE, REPL_JOIN, REPL_SNAP: the members of a shard
 * group among themselves (repl.h). */
static void io_on_repl(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    if (h->rank != -1) {
        io_error(s, &f[0], h, PS_EPROTO, "a shard group's members send these as rank -1");
        return;
    }
    if (!s->repl) {
        io_error(s, &f[0], h, PS_ESTATE, "this server has no replicas (no --group)");
        return;
    }
    ps_repl_on_message(s->repl, f, nf, h);
}

/* ps_coll_to: [id, header, payload?] on the ROUTER. */
static void coll_send(void *user, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    srv_send_payload(user, id, h, payload);
}

ps_coll_to srv_coll_to(ps_server *s) { return (ps_coll_to){s, coll_send}; }

/* A type no request may have (the dispatch refuses it first: from NOBODY). */
static void io_on_none(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    io_error(s, &f[0], h, PS_EPROTO, "this server has no handler for this message type");
}

/* Readers and exports (server_export.c). */
static void io_on_lookup(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    srv_on_lookup(s, f, nf, h);
}

static void io_on_snapshot(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    srv_on_snapshot(s, f, nf, h);
}

static void io_on_snapread(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    srv_on_snapread(s, f, nf, h);
}

/* SERVERS, OBJECTS, MOVEPLAN, MOVE: servers added and removed (move.h). */
static void io_on_servers(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move_on_servers(s, f, nf, h);
}
static void io_on_objects(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move_on_objects(s, f, nf, h);
}
static void io_on_moveplan(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move_on_moveplan(s, f, nf, h);
}
static void io_on_move(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move_on_move(s, f, nf, h);
}

/* The handler of each type, from the table's handler column. */
static const io_handler handlers[PS_MSG_TYPE_MAX + 1] = {
#define HANDLER_(NAME, t, name, from, rq_keys, rp_keys, rq_pl, rp_pl, shm, s_rq, s_rp, handler, \
                 rq_doc, rp_doc)                                                             \
    [t] = io_on_##handler,
    PS_MSG_TABLE(HANDLER_)
#undef HANDLER_
};

/* The handler of h's type (the dispatch, server_dispatch.c, checked it). */
void srv_handle(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    handlers[h->type](s, f, nf, h);
}
