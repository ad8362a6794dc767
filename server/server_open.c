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
#include "export.h"
#include "hs_monitor.h"
#include "import.h"
#include "outbox.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_fs.h"
#include "ps_log.h"
#include "ps_shm.h"
#include "ps_time.h"
#include "ps_trace.h"
#include "ratelimit.h"
#include "repl.h"
#include "reply.h"
#include "shard.h"
#include "stats_req.h"
#include "updater.h"
#include "workers.h"
#include "zmsg.h"

/* Replies queued per worker on the ROUTER before ZeroMQ drops (the client
 * resends on timeout).  Covers a pull burst over thousands of chunks. */
#define ROUTER_SNDHWM 10000
/* Requests the ROUTER queues per worker while the I/O thread is held up, and
 * messages each inproc PAIR queues per direction.  They bound the memory held
 * in flight (a queued push is a whole chunk) and beyond them ZeroMQ pushes
 * back on TCP; the update threads cannot go faster anyway. */
#define ROUTER_RCVHWM 256
#define PAIR_HWM 128

void ps_server_close(ps_server *s)
{
    if (!s)
        return;
    if (s->threads_running)
        srv_stop_threads(s);
    srv_close_waiters(s);
    ps_srv_metrics_close(s->met); /* no scrape reads the server after this */
    ps_repl_close(s->repl);       /* its sockets before the context */
    s->repl = NULL;
    ps_move_close(s->move);       /* its sockets too */
    s->move = NULL;
    /* every frame still held goes before the context */
    ps_barriers_destroy(s->barriers);
    ps_colls_destroy(s->colls);
    free(s->left);
    ps_stats_reqs_destroy(s->stats);
    ps_ckpt_coord_destroy(s->ck);
    ps_export_destroy(s->exp); /* a page still sent holds its item */
    for (int i = 0; i < s->cfg.threads && s->own; i++)
        ps_outbox_clear(&s->own[i].out);
    for (int i = 0; i < s->cfg.threads && s->own; i++)
        ps_updater_destroy(s->own[i].upd);
    /* the arenas after the update threads, which may hold references */
    ps_shm_table_destroy(s->shm);
    for (int i = 0; i < s->cfg.threads && s->own; i++)
        if (s->own[i].pair)
            zmq_close(s->own[i].pair);
    ps_hs_monitor_close(s->mon);
    if (s->router)
        zmq_close(s->router);
    /* the ZAP handler outlives the ROUTER and goes before the context */
    ps_curve_auth_stop(s->auth);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->efd >= 0)
        close(s->efd);
    /* after the context: no payload counted against a peer is left */
    ps_peers_destroy(s->peers);
    /* libzmq 4.3 leaves the socket file of an ipc:// endpoint behind */
    if (strncmp(s->endpoint, "ipc://", 6) == 0 && s->endpoint[6] && s->endpoint[6] != '@')
        unlink(s->endpoint + 6);
    if (s->trace && ps_trace_close(s->trace) != 0)
        ps_error("--timeline %s: cannot finish the file", s->timeline_path);
    ps_workers_destroy(s->workers);
    free(s->own);
    free(s->tables);
    free(s->worker_mem); /* after the stores that charge it */
    free(s->timeline_path);
    free(s->curve_dir);
    free(s->ckpt_dir);
    free(s->group);
    free(s->coord);
    free(s->job);
    ps_admin_close(s->admin);
    free(s);
}

static int set_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

/* A table the checkpoint declares: this server's, as on disk already. */
static void restored_table(void *user, uint64_t key, const ps_table_options *decl)
{
    ps_server *s = user;
    if (!srv_add_table(s, key, decl, 1))
        ps_error("out of memory noting table %llu: a worker's declaration of it is taken as "
                 "new", (unsigned long long)key);
}

/* --restore: the coordinator fills the shards and the table partitions
 * (threads not started yet); the workers the checkpoint knows are served
 * without a new hello. */
static int restore(ps_server *s, char *why, size_t why_len)
{
    ps_shard *shards[PS_SERVER_MAX_THREADS];
    ps_tparts *tparts[PS_SERVER_MAX_THREADS];
    for (int i = 0; i < s->cfg.threads; i++) {
        shards[i] = ps_updater_shard(s->own[i].upd);
        tparts[i] = ps_updater_tparts(s->own[i].upd);
    }
    uint8_t *hello = calloc((size_t)s->cfg.num_workers, 1);
    if (!hello)
        return PS_ENOMEM;
    ps_tparts_config tc = srv_tparts_config(s);
    ps_ckpt_restore_to to = {shards, tparts, s->cfg.threads, &tc, restored_table, s};
    int rc = ps_ckpt_coord_restore(s->ck, &to, hello, &s->model_fp, why, why_len);
    if (!rc)
        s->tables_fp = srv_tables_fp(s); /* a worker's tables must be the checkpoint's */
    if (!rc)
        rc = ps_workers_restore(s->workers, hello, ps_now_ns());
    free(hello);
    return rc;
}

/* --import: the export's tables into the partitions (threads not started
 * yet); a worker's tables must be the export's. */
static int import(ps_server *s, char *why, size_t why_len)
{
    ps_tparts *tparts[PS_SERVER_MAX_THREADS];
    for (int i = 0; i < s->cfg.threads; i++)
        tparts[i] = ps_updater_tparts(s->own[i].upd);
    ps_tparts_config tc = srv_tparts_config(s);
    ps_ckpt_restore_to to = {NULL, tparts, s->cfg.threads, &tc, restored_table, s};
    uint64_t rows;
    int rc = ps_import_tables(s->cfg.import_dir, s->cfg.rank, s->cfg.num_servers,
                              s->cfg.num_workers, s->cfg.import_state, &to, &rows, why, why_len);
    for (size_t k = 0; !rc && k < s->ntables; k++) { /* the export's names, for the logs */
        srv_table *t = &s->tables[k];
        const char *name = ps_tparts_name(tparts[0], t->key);
        if (name && !t->name[0])
            snprintf(t->name, sizeof t->name, "%s", name);
    }
    if (!rc)
        s->tables_fp = srv_tables_fp(s);
    return rc;
}

static char *dup_opt(const char *p, int *fail)
{
    if (!p)
        return NULL;
    char *d = strdup(p);
    if (!d)
        *fail = 1;
    return d;
}

/* --timeline: a lane per update thread and one for the checkpoint writer. */
static int open_timeline(ps_server *s, char *why, size_t why_len)
{
    if (!s->timeline_path)
        return 0;
    /* its directory is made here and an unwritable place named with errno,
     * before anything runs */
    int rc = ps_check_output_file("--timeline", s->timeline_path, why, why_len);
    if (rc)
        return rc;
    char name[64];
    snprintf(name, sizeof name, "ps_server[%d]", s->cfg.rank);
    if (ps_trace_open(s->timeline_path, 2000 + s->cfg.rank, name, &s->trace) != 0) {
        ps_errorf(why, why_len, "--timeline %s: cannot create the file: %s", s->timeline_path,
            strerror(errno));
        return PS_EIO;
    }
    for (int i = 0; i < s->cfg.threads; i++) {
        snprintf(name, sizeof name, "update-%d", i);
        ps_trace_thread_name(s->trace, 1 + i, name);
    }
    ps_ckpt_coord_set_trace(s->ck, s->trace);
    return 0;
}

/* One end of an inproc PAIR: no linger, PAIR_HWM messages each way.  NULL
 * with errno set on failure. */
static void *pair_socket(void *ctx)
{
    void *p = zmq_socket(ctx, ZMQ_PAIR);
    if (p && (set_int(p, ZMQ_LINGER, 0) || set_int(p, ZMQ_SNDHWM, PAIR_HWM) ||
              set_int(p, ZMQ_RCVHWM, PAIR_HWM))) {
        int e = errno;
        zmq_close(p);
        errno = e;
        return NULL;
    }
    return p;
}

/* The update threads' shards and PAIRs (threads not started yet). */
static int open_owners(ps_server *s, char *why, size_t why_len)
{
    const ps_server_config *c = &s->cfg;
    const ps_ckpt_policy *pol = ps_ckpt_coord_policy(s->ck);
    ps_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = c->mode;
    sc.max_staleness = c->max_staleness;
    sc.num_workers = c->num_workers;
    sc.opt = c->opt;
    sc.max_memory = c->max_memory;
    sc.mem_used = &s->mem_used;
    sc.guard = c->on_nonfinite != PS_NONFINITE_APPLY;
    ps_updater_config uc;
    memset(&uc, 0, sizeof uc);
    uc.copies = &s->copies;
    uc.mode = c->mode;
    uc.wire_dtype = c->wire_dtype;
    uc.on_nonfinite = c->on_nonfinite;
    uc.num_workers = c->num_workers;
    uc.elastic = srv_elastic(c);
    uc.server_rank = c->rank;
    uc.num_servers = c->num_servers;
    uc.nparts = c->threads;
    uc.trace = s->trace;
    uc.hold_inits = pol->on;
    uc.durable = pol->durable;
    uc.defer_acks = pol->defer_acks;
    uc.report_progress = pol->report_progress;
    uc.ack_bound = pol->ack_bound;
    uc.worker_mem = s->worker_mem;
    uc.worker_share = ps_server_worker_share(c);
    uc.metrics = s->met;
    for (int i = 0; i < c->threads; i++) {
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://ps-update-%d", i);
        s->own[i].pair = pair_socket(s->ctx);
        void *pair = s->own[i].pair ? pair_socket(s->ctx) : NULL;
        if (!pair || zmq_bind(s->own[i].pair, ep) != 0 || zmq_connect(pair, ep) != 0) {
            ps_errorf(why, why_len, "cannot set up %s: %s", ep, zmq_strerror(errno));
            if (pair)
                zmq_close(pair);
            return PS_EIO;
        }
        uc.idx = i;
        uc.mblock = ps_srv_metrics_thread(s->met, i);
        int rc = ps_updater_create(&uc, &sc, pair, &s->own[i].upd);
        if (rc) {
            ps_errorf(why, why_len, "cannot create the shard store: %s", ps_strerror(rc));
            zmq_close(pair);
            return rc;
        }
    }
    return 0;
}

/* The ROUTER, as a CURVE server with --curve-keys, bound. */
/* Objects moved between servers (move.h): every server answers for what
 * it gave away; an added server starts empty. */
static int open_move(ps_server *s, char *why, size_t why_len)
{
    int rc = ps_move_open(s, &s->move);
    if (rc)
        ps_errorf(why, why_len, "out of memory");
    else if (s->cfg.added)
        ps_info("added server (--added), slot %d of a running job: it holds nothing until "
                "the job's server 0 moves objects here", s->cfg.rank);
    return rc;
}

static int open_router(ps_server *s, char *why, size_t why_len)
{
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    int64_t maxmsg = (int64_t)PS_MAX_PAYLOAD_BYTES + PS_HEADER_MAX;
    if (!s->router || set_int(s->router, ZMQ_LINGER, 1000) ||
        set_int(s->router, ZMQ_SNDHWM, ROUTER_SNDHWM) ||
        set_int(s->router, ZMQ_RCVHWM, ROUTER_RCVHWM) ||
        zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        ps_errorf(why, why_len, "cannot create the ROUTER socket: %s", zmq_strerror(errno));
        return PS_EIO;
    }
    if (s->curve_dir) {
        /* before bind: no connection may come in before the ZAP handler is up */
        char msg[512];
        int rc = ps_curve_server_setup(s->ctx, s->router, s->curve_dir, s->cfg.rank, &s->auth,
                                       msg, sizeof msg);
        if (rc) {
            ps_errorf(why, why_len, "--curve-keys %s: %s", s->curve_dir, msg);
            return rc;
        }
    }
    /* disconnects; with CURVE handshake failures the ZAP handler never sees
     * (plaintext peers) */
    s->mon = ps_hs_monitor_open(s->ctx, s->router, s->curve_dir != NULL);
    if (zmq_bind(s->router, s->bind) != 0) {
        ps_errorf(why, why_len, "cannot bind %s: %s", s->bind, zmq_strerror(errno));
        return PS_EIO;
    }
    size_t len = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", s->bind);
    return 0;
}

int ps_server_open(const ps_server_config *c, ps_server **out, char *why, size_t why_len)
{
    *out = NULL;
    int rc = ps_server_config_check(c, why, why_len);
    if (rc)
        return rc;
    ps_server *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    s->cfg = *c;
    s->cfg.opt.given = PS_OPT_GIVEN_ALL;
    s->opt_now = s->cfg.opt;
    s->efd = -1;
    snprintf(s->bind, sizeof s->bind, "%s", c->bind);
    s->cfg.bind = s->bind;
    int fail = 0;
    s->timeline_path = dup_opt(c->timeline, &fail);
    s->curve_dir = dup_opt(c->curve_dir, &fail);
    s->ckpt_dir = dup_opt(c->checkpoint_dir, &fail);
    if (s->ckpt_dir && c->group) {
        /* every member of a shard group writes its own checkpoints, in
         * DIR/member-M (they share the rank, so the file names) */
        char *d = malloc(strlen(s->ckpt_dir) + 16);
        if (d)
            sprintf(d, "%s/member-%d", s->ckpt_dir, c->member);
        else
            fail = 1;
        free(s->ckpt_dir);
        s->ckpt_dir = d;
    }
    s->cfg.timeline = s->timeline_path;
    s->cfg.curve_dir = s->curve_dir;
    s->cfg.checkpoint_dir = s->ckpt_dir;
    s->group = dup_opt(c->group, &fail);
    s->coord = dup_opt(c->coord, &fail);
    s->job = dup_opt(c->job, &fail);
    s->cfg.group = s->group;
    s->cfg.coord = s->coord;
    s->cfg.job = s->job;
    atomic_init(&s->mem_used, 0);
    atomic_init(&s->copies, 0);
    int T = c->threads;
    s->own = calloc((size_t)T, sizeof *s->own);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->ctx = zmq_ctx_new();
    ps_reply_to to = {s, srv_reply_hook};
    uint32_t users[PS_SHM_MAX_USERS]; /* checked by ps_server_config_check */
    int nusers = 0;
    if (fail || !s->own || s->efd < 0 || !s->ctx ||
        ps_workers_create(c->num_workers, c->worker_timeout_ms, c->on_worker_loss,
                          &s->workers) != 0 ||
        ps_barriers_create(c->num_workers, to, &s->barriers) != 0 ||
        ps_colls_create(c->num_workers, srv_coll_to(s), &s->colls) != 0 ||
        !(s->left = calloc((size_t)c->num_workers, 1)) ||
        !(s->worker_mem = calloc((size_t)c->num_workers, sizeof *s->worker_mem)) ||
        ps_peers_create(c->max_peer_replies, c->max_peer_bytes, &s->mem_used, &s->copies,
                        &s->peers) != 0 ||
        ps_stats_reqs_create(T, to, &s->stats) != 0 || ps_export_create(T, &s->exp) != 0 ||
        ps_shm_parse_users(c->shm_users, users, &nusers, NULL, 0) != 0 ||
        ps_shm_table_create(c->num_workers, c->shm == PS_SHM_AUTO, users, nusers, &s->shm) != 0) {
        ps_errorf(why, why_len, "out of memory or descriptors starting the server");
        ps_server_close(s);
        return PS_ENOMEM;
    }
    srv_membership_open(s);
    if ((rc = ps_admin_open(c->admin_token_file, c->curve_dir != NULL, &s->admin, why,
                            why_len)) != 0 ||
        (rc = ps_ckpt_coord_create(&s->cfg, &s->ck, why, why_len)) != 0) {
        ps_server_close(s);
        return rc;
    }
    s->cfg.admin_token_file = NULL; /* read; the caller's string need not outlive open */
    s->cfg.metrics_bind = NULL;     /* the exporter has it */
    if ((rc = ps_srv_metrics_open(c, &s->mem_used, &s->met, why, why_len)) != 0) {
        ps_server_close(s);
        return rc;
    }
    if (s->met)
        ps_info("metrics: %s", ps_srv_metrics_url(s->met));
    /* a member of a group restores (or imports) once it knows its role: one that joins
     * takes the primary's state instead of its own checkpoint's (repl.c) */
    if ((rc = open_timeline(s, why, why_len)) != 0 || (rc = open_owners(s, why, why_len)) != 0 ||
        (c->restore && !s->group && (rc = restore(s, why, why_len)) != 0) ||
        (c->import_dir && !s->group && (rc = import(s, why, why_len)) != 0) ||
        (rc = open_router(s, why, why_len)) != 0 || (rc = open_move(s, why, why_len)) != 0 ||
        (s->group && (rc = ps_repl_open(s, &s->repl, why, why_len)) != 0) ||
        (c->restore && s->group && ps_repl_role(s->repl) != PS_REPL_JOINING &&
         (rc = restore(s, why, why_len)) != 0) ||
        (c->import_dir && s->group && ps_repl_role(s->repl) != PS_REPL_JOINING &&
         (rc = import(s, why, why_len)) != 0)) {
        ps_server_close(s);
        return rc;
    }
    /* update threads take no signals: SIGINT/SIGTERM land on the I/O thread */
    sigset_t all, old;
    sigemptyset(&all);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
        sigaddset(&all, sigs[k]);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < T; i++) {
        if (ps_updater_start(s->own[i].upd) != 0) {
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            ps_errorf(why, why_len, "cannot start update thread %d", i);
            s->threads_running = 1;
            srv_stop_threads(s); /* the ones that started */
            ps_server_close(s);
            return PS_ENOMEM;
        }
        s->own[i].started = 1;
    }
    if (ps_ckpt_coord_run_writer(s->ck) != 0)
        ps_warn("cannot start the checkpoint writer thread: checkpoints are written on the "
                "I/O thread");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    s->threads_running = 1;
    ps_info("this server stops on %s", ps_admin_describe(s->admin));
    *out = s;
    return 0;
}

