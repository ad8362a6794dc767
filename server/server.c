#include "server.h"

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

/* ROUTER messages handled per poll round before looking at replies again. */
#define IO_BATCH 256
/* Replies queued per worker on the ROUTER before ZeroMQ drops (the client
 * resends on timeout).  Covers a pull burst over thousands of chunks. */
#define ROUTER_SNDHWM 10000
/* Requests the ROUTER queues per worker while the I/O thread is held up, and
 * messages each inproc PAIR queues per direction.  They bound the memory held
 * in flight (a queued push is a whole chunk) and beyond them ZeroMQ pushes
 * back on TCP; the update threads cannot go faster anyway. */
#define ROUTER_RCVHWM 256
#define PAIR_HWM 128

/* The I/O thread's side of one update thread. */
typedef struct owner {
    ps_updater *upd;
    void *pair;    /* the I/O end */
    ps_outbox out; /* what the PAIR did not take yet */
    int started;
    /* set when the thread's final counters arrive */
    int stopped;
    ps_stats final;
} owner;

/* ---- I/O thread state ---- */
struct ps_server {
    ps_server_config cfg;
    char bind[256], endpoint[256];
    void *ctx, *router;
    owner *own;
    size_t out_total;        /* messages waiting in every owner's outbox */
    int efd;
    _Atomic uint64_t mem_used;
    uint64_t model_fp;
    ps_workers *workers;
    ps_barriers *barriers;
    ps_stats_reqs *stats;
    uint64_t io_errors, dropped;
    ps_rlimit rl;
    ps_stats totals;
    int threads_running, run_called, stopping, io_failed;
    /* options */
    char *timeline_path, *curve_dir, *ckpt_dir;
    ps_trace *trace;
    ps_curve_auth *auth;
    ps_hs_monitor *mon;      /* CURVE: handshakes the ZAP handler never sees */
    /* checkpoints */
    ps_ckpt_coord *ck;
    uint64_t mut;            /* inits and pushes forwarded to the owners */
};

static ps_hello my_hello(const ps_server *s)
{
    ps_hello h;
    memset(&h, 0, sizeof h);
    h.mode = s->cfg.mode;
    h.max_staleness = s->cfg.max_staleness;
    h.num_workers = (uint32_t)s->cfg.num_workers;
    h.num_servers = (uint32_t)s->cfg.num_servers;
    h.server_rank = s->cfg.rank;
    h.model_fp = s->model_fp;
    h.opt = s->cfg.opt;
    return h;
}

/* ================= I/O thread ================= */

/* From here on no checkpoint is started by schedule, and one that completes
 * is written at once (the last one at stop). */
static void set_stopping(ps_server *s)
{
    s->stopping = 1;
    if (s->ck)
        ps_ckpt_coord_stopping(s->ck);
}

static void io_send(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("cannot encode a %s reply", ps_msg_type_name(h->type));
        return;
    }
    if (zmq_msg_send(id, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(s->router, buf, len, ZMQ_DONTWAIT);
}

/* ps_reply_to for the barriers and stats requests */
static void reply_hook(void *user, zmq_msg_t *id, const ps_header *h) { io_send(user, id, h); }

static void io_error(ps_server *s, zmq_msg_t *id, const ps_header *req, int code, const char *why)
{
    ps_header h;
    ps_reply_error(&h, req->seq, req->rank, req->key, req->chunk, code, why);
    h.seq_negative = req->seq_negative;
    s->io_errors++;
    if (ps_rlimit_allow(&s->rl))
        ps_warn("refused %s from rank %d: %s: %s", ps_msg_type_name(req->type), req->rank,
                ps_strerror(code), why);
    io_send(s, id, &h);
}

static void io_drop(ps_server *s, const char *why)
{
    s->dropped++;
    if (ps_rlimit_allow(&s->rl))
        ps_warn("dropped a message with no usable header: %s", why);
}

/* Hand a message to an owner, or queue it while its PAIR is full (reads from
 * the ROUTER pause meanwhile: out_total). */
static void to_owner(ps_server *s, int i, zmq_msg_t *f, int nf)
{
    owner *o = &s->own[i];
    size_t before = o->out.n;
    int rc = ps_outbox_put(&o->out, o->pair, f, nf);
    if (rc == PS_EIO)
        ps_error("handing a message to update thread %d failed: %s", i, zmq_strerror(errno));
    else if (rc)
        ps_error("out of memory queueing a message for update thread %d; dropped", i);
    else if (!before && o->out.n)
        ps_debug("update thread %d is behind: reads from the ROUTER pause until it catches up",
                 i);
    s->out_total += o->out.n - before;
}

static void flush_outbox(ps_server *s, int i)
{
    owner *o = &s->own[i];
    size_t before = o->out.n;
    while (ps_outbox_flush(&o->out, o->pair) != 0)
        ps_error("handing a message to update thread %d failed: %s", i, zmq_strerror(errno));
    s->out_total -= before - o->out.n;
}

static void send_cmd(ps_server *s, int owner, int cmd, uint64_t token, const ps_header *h,
                     zmq_msg_t *id, zmq_msg_t *payload)
{
    zmq_msg_t f[3];
    int nf = 1;
    zmq_msg_init_size(&f[0], sizeof(ps_cmd_frame));
    ps_cmd_frame *cf = zmq_msg_data(&f[0]);
    memset(cf, 0, sizeof *cf);
    cf->cmd = cmd;
    cf->token = token;
    if (h)
        cf->h = *h;
    if (id) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], id);
    }
    if (payload) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], payload);
    }
    to_owner(s, owner, f, nf);
}

/* Rank r joins (live 1) or leaves (0) the live set of every owner's shard. */
static void send_live(ps_server *s, int r, int live)
{
    ps_header lh;
    ps_header_init(&lh, PS_MSG_HELLO);
    lh.rank = r;
    for (int i = 0; i < s->cfg.threads; i++)
        send_cmd(s, i, PS_CMD_LIVE, (uint64_t)live, &lh, NULL, NULL);
}

static void io_hello(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    ps_hello mine = my_hello(s);
    char why[256], who[32];
    snprintf(who, sizeof who, h->rank >= 0 ? "worker %d" : "rank %d", h->rank);
    int rc = ps_hello_compare(&mine, "server", &h->hello, who, 1, why, sizeof why);
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
    if (rc) {
        io_error(s, id, h, rc, why);
        return;
    }
    if (h->hello.model_fp && !s->model_fp) {
        s->model_fp = h->hello.model_fp;
        ps_info("model fingerprint %016llx (from %s)", (unsigned long long)s->model_fp, who);
    }
    if (h->rank >= 0) {
        int rejoined;
        if (ps_workers_hello(s->workers, h->rank, zmq_msg_data(id), zmq_msg_size(id),
                             ps_now_ns(), &rejoined) != 0) {
            io_error(s, id, h, PS_ENOMEM, "out of memory recording the worker");
            return;
        }
        if (rejoined) { /* back in the live set before any of its requests reach an owner */
            send_live(s, h->rank, 1);
            ps_barriers_set_live(s->barriers, h->rank, 1);
        }
    } else {
        ps_debug("hello from a tool (rank -1)");
    }
    ps_header r;
    ps_reply_header(&r, PS_MSG_HELLO, h->seq, h->rank, h->key, h->chunk, h->step);
    r.hello = my_hello(s);
    io_send(s, id, &r);
}

static void io_barrier(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    const char *why;
    int rc = ps_barriers_arrive(s->barriers, id, h, &why);
    if (rc)
        io_error(s, id, h, rc, why);
}

/* Apply --on-worker-loss to every worker silent for longer than the timeout. */
static void check_workers(ps_server *s, int64_t now)
{
    for (int r; (r = ps_workers_check(s->workers, now)) >= 0;) {
        send_live(s, r, 0);
        ps_barriers_set_live(s->barriers, r, 0);
    }
}

static void io_stats(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    const char *why;
    uint64_t token;
    int rc = ps_stats_reqs_begin(s->stats, id, h, &token, &why);
    if (rc) {
        io_error(s, id, h, rc, why);
        return;
    }
    for (int i = 0; i < s->cfg.threads; i++)
        send_cmd(s, i, PS_CMD_STATS, token, NULL, NULL, NULL);
}

/* One message from the ROUTER: f[0] identity, f[1] header, f[2] payload;
 * `total` counts every frame received, kept or not. */
static void io_message(ps_server *s, zmq_msg_t *f, int nf, int total)
{
    if (nf < 2) {
        io_drop(s, "no header frame");
        return;
    }
    ps_header h;
    char why[256];
    int rc = ps_proto_decode(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &h, why, sizeof why);
    if (rc) {
        /* a header that got past the version check is a map from a peer we
         * can answer; anything else is too broken to answer */
        if (h.version == 0 && rc != PS_EVERSION) {
            io_drop(s, why);
            return;
        }
        io_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.flags & PS_FLAG_REPLY) {
        ps_errorf(why, sizeof why, "the server takes requests; got a %s reply",
            ps_msg_type_name(h.type));
        io_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    if (h.type == PS_MSG_ERROR) {
        io_error(s, &f[0], &h, PS_EPROTO, "error messages are replies only");
        return;
    }
    size_t pbytes = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    rc = ps_proto_check_payload(&h, total - 2, pbytes, why, sizeof why);
    if (rc) {
        io_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.type == PS_MSG_HELLO) { /* checks the rank after the config */
        io_hello(s, &f[0], &h);
        return;
    }
    if (h.rank >= s->cfg.num_workers) {
        ps_errorf(why, sizeof why, "rank %d is out of range: this server has --num-workers %d",
            h.rank, s->cfg.num_workers);
        io_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    int ws; /* anything from a live worker counts as a sign of life */
    if (h.rank < 0) {
        if (h.type != PS_MSG_STATS && h.type != PS_MSG_SHUTDOWN && h.type != PS_MSG_HEARTBEAT) {
            ps_errorf(why, sizeof why,
                "%s needs a worker rank; rank -1 may send only hello, stats, heartbeat and shutdown",
                ps_msg_type_name(h.type));
            io_error(s, &f[0], &h, PS_ESTATE, why);
            return;
        }
    } else if ((ws = ps_workers_heard(s->workers, h.rank, ps_now_ns())) != PS_WORKER_LIVE) {
        if (ws == PS_WORKER_UNKNOWN)
            ps_errorf(why, sizeof why, "worker %d sent %s before hello; say hello first", h.rank,
                ps_msg_type_name(h.type));
        else
            ps_errorf(why, sizeof why, "worker %d was dropped after %d ms without a message "
                "(--on-worker-loss drop); say hello again to rejoin", h.rank,
                s->cfg.worker_timeout_ms);
        if (h.type == PS_MSG_HEARTBEAT) {
            /* once a second from every such worker: answered, not logged */
            ps_header r;
            ps_reply_error(&r, h.seq, h.rank, h.key, h.chunk, PS_ESTATE, why);
            s->io_errors++;
            io_send(s, &f[0], &r);
        } else {
            io_error(s, &f[0], &h, PS_ESTATE, why);
        }
        return;
    }
    switch (h.type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
        if (h.type != PS_MSG_PULL)
            s->mut++;
        send_cmd(s, ps_server_owner(h.key, h.chunk, s->cfg.threads), PS_CMD_REQ, 0, &h, &f[0],
                 nf >= 3 ? &f[2] : NULL);
        return;
    case PS_MSG_BARRIER:
        io_barrier(s, &f[0], &h);
        return;
    case PS_MSG_STATS:
        io_stats(s, &f[0], &h);
        return;
    case PS_MSG_HEARTBEAT: {
        ps_header r;
        ps_reply_header(&r, PS_MSG_HEARTBEAT, h.seq, h.rank, h.key, h.chunk, h.step);
        io_send(s, &f[0], &r);
        return;
    }
    case PS_MSG_SHUTDOWN: {
        ps_header r;
        ps_reply_header(&r, PS_MSG_SHUTDOWN, h.seq, h.rank, h.key, h.chunk, h.step);
        io_send(s, &f[0], &r);
        ps_info("shutdown requested by rank %d", h.rank);
        set_stopping(s);
        return;
    }
    default:
        io_error(s, &f[0], &h, PS_EPROTO, "unhandled message type");
        return;
    }
}

/* Read up to IO_BATCH messages from the ROUTER.  Returns -1 on a socket error. */
static int io_read_router(ps_server *s)
{
    for (int b = 0; b < IO_BATCH && !s->out_total && !s->stopping; b++) {
        zmq_msg_t f[3];
        if (ps_zmsg_recv(s->router, &f[0], ZMQ_DONTWAIT) < 0) {
            int e = errno;
            if (e == EAGAIN || e == EINTR)
                return 0;
            ps_error("receive on %s failed: %s", s->endpoint, zmq_strerror(e));
            return -1;
        }
        int nf = 1;
        int total = 1 + ps_zmsg_recv_rest(s->router, zmq_msg_more(&f[0]), f, &nf, 3);
        io_message(s, f, nf, total);
        ps_zmsg_close_all(f, nf);
    }
    return 0;
}

/* ================= checkpoints: what the coordinator asks to send ================= */

/* Put the replies a checkpoint made durable on the ROUTER, in arrival order. */
static void send_released(ps_server *s, ps_held_reply *m)
{
    while (m) {
        ps_held_reply *next = m->next;
        ps_zmsg_send_all(s->router, m->f, m->nf, ZMQ_DONTWAIT);
        ps_held_reply_free(m);
        m = next;
    }
}

/* A snapshot starts: every owner serializes its chunks when this reaches it. */
static void send_ckpt(ps_server *s, uint64_t token)
{
    for (int i = 0; i < s->cfg.threads; i++)
        send_cmd(s, i, PS_CMD_CKPT, token, NULL, NULL, NULL);
}

static void ck_maybe(ps_server *s, int64_t now)
{
    uint64_t token;
    if (!s->stopping && ps_ckpt_coord_due(s->ck, now, s->mut, &token))
        send_ckpt(s, token);
}

/* Take everything update thread i has sent.  Its last message (its final
 * counters) sets own[i].stopped. */
static void io_read_pair(ps_server *s, int i)
{
    for (int b = 0; b < IO_BATCH * 4; b++) {
        zmq_msg_t tag;
        if (ps_zmsg_recv(s->own[i].pair, &tag, ZMQ_DONTWAIT) < 0)
            break;
        size_t tlen = zmq_msg_size(&tag);
        const char *td = zmq_msg_data(&tag);
        char t = tlen >= 1 ? td[0] : 0;
        int64_t version = 0;
        if (t == PS_OUT_HELD && tlen == 1 + sizeof version)
            memcpy(&version, td + 1, sizeof version);
        int more = zmq_msg_more(&tag);
        zmq_msg_close(&tag);
        ps_held_reply *m;
        if ((t == PS_OUT_HELD || t == PS_OUT_INIT) && ps_ckpt_coord_hold(s->ck, t, version, &m)) {
            /* [identity, header, payload?] wait until a checkpoint holds them */
            ps_zmsg_recv_rest(s->own[i].pair, more, m ? m->f : NULL, m ? &m->nf : NULL, 3);
            if (!m)
                ps_error("out of memory holding a reply; dropped (the worker resends)");
            continue;
        }
        if (t == PS_OUT_REPLY || t == PS_OUT_HELD || t == PS_OUT_INIT) {
            /* forward [identity, header, payload?] to the ROUTER as they are */
            while (more) {
                zmq_msg_t m;
                if (ps_zmsg_recv(s->own[i].pair, &m, 0) < 0)
                    break;
                more = zmq_msg_more(&m);
                zmq_msg_send(&m, s->router, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
                zmq_msg_close(&m);
            }
            continue;
        }
        union {
            ps_stats_frame of;
            ps_ckpt_frame cf;
            ps_progress_frame pf;
        } u;
        memset(&u, 0, sizeof u);
        size_t want = t == PS_OUT_CKPT       ? sizeof u.cf
                      : t == PS_OUT_PROGRESS ? sizeof u.pf
                                             : sizeof u.of;
        int got = 0;
        while (more) {
            zmq_msg_t m;
            if (ps_zmsg_recv(s->own[i].pair, &m, 0) < 0)
                break;
            more = zmq_msg_more(&m);
            if (!got && zmq_msg_size(&m) == want) {
                memcpy(&u, zmq_msg_data(&m), want);
                got = 1;
            }
            zmq_msg_close(&m);
        }
        if (t == PS_OUT_CKPT) {
            if (got)
                send_released(s, ps_ckpt_coord_part(s->ck, i, &u.cf, s->model_fp,
                                                  ps_workers_hello_flags(s->workers)));
        } else if (t == PS_OUT_PROGRESS) {
            ps_ckpt_coord_progress(s->ck, i, u.pf.min_version, u.pf.have);
        } else if (t == PS_OUT_STATS) {
            ps_stats_reqs_part(s->stats, &u.of, s->io_errors,
                               (uint64_t)ps_workers_seen(s->workers));
        } else if (t == PS_OUT_STOPPED) {
            s->own[i].final = u.of.st;
            s->own[i].stopped = 1;
            if (!s->stopping) {
                ps_error("update thread %d stopped unexpectedly; shutting down", i);
                set_stopping(s);
                s->io_failed = 1;
            }
            break;
        }
    }
}

static void drain_eventfd(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v);
    (void)r;
}

/* The checkpoint writer thread posted its eventfd: a file is written. */
static void ck_writer_signalled(ps_server *s)
{
    send_released(s, ps_ckpt_coord_written(s->ck));
}

/* At stop: what waits for a barrier or for counters gets PS_ECLOSED. */
static void close_waiters(ps_server *s)
{
    if (s->barriers)
        ps_barriers_close(s->barriers);
    if (s->stats)
        ps_stats_reqs_close(s->stats);
}

/* ================= the I/O loop ================= */

/* What one io_pump round listens to, besides the PAIRs of the running owners. */
enum {
    PUMP_ROUTER = 1, /* requests (while no outbox is backed up) and CURVE handshake events */
    PUMP_STOP = 2,   /* ps_server_stop's eventfd */
    PUMP_WRITER = 4  /* the checkpoint writer's eventfd */
};
/* io_pump's results */
enum { PUMP_OK = 0, PUMP_STOP_ASKED = 1, PUMP_EINTR = 2, PUMP_EPOLL = -1, PUMP_EROUTER = -2 };

static int owner_running(const ps_server *s, int i)
{
    return s->own[i].started && !s->own[i].stopped;
}

/* One round of the I/O loop: poll for up to timeout_ms and dispatch what is
 * ready.  A stop request wins over everything else (nothing more is handled
 * in that round); then the writer's wake-up, each running owner's replies
 * and its outbox, the ROUTER's requests and the monitor's events.  Returns
 * PUMP_OK, PUMP_STOP_ASKED, PUMP_EINTR (a signal: nothing dispatched),
 * PUMP_EPOLL (errno says) or PUMP_EROUTER (logged). */
static int io_pump(ps_server *s, int what, long timeout_ms)
{
    zmq_pollitem_t it[PS_SERVER_MAX_THREADS + 4];
    int who[PS_SERVER_MAX_THREADS]; /* it[first + k] is owner who[k] */
    int n = 0, np = 0, stop_at = -1, writer_at = -1, router_at = -1, mon_at = -1;
    if (what & PUMP_STOP) {
        stop_at = n;
        it[n++] = (zmq_pollitem_t){NULL, s->efd, ZMQ_POLLIN, 0};
    }
    if ((what & PUMP_WRITER) && ps_ckpt_coord_fd(s->ck) >= 0) {
        writer_at = n;
        it[n++] = (zmq_pollitem_t){NULL, ps_ckpt_coord_fd(s->ck), ZMQ_POLLIN, 0};
    }
    if (what & PUMP_ROUTER) {
        router_at = n;
        it[n++] = (zmq_pollitem_t){s->router, 0, (short)(s->out_total ? 0 : ZMQ_POLLIN), 0};
        if (s->mon) {
            mon_at = n;
            it[n++] = (zmq_pollitem_t){ps_hs_monitor_socket(s->mon), 0, ZMQ_POLLIN, 0};
        }
    }
    int first = n;
    for (int i = 0; i < s->cfg.threads; i++)
        if (owner_running(s, i)) {
            who[np++] = i;
            short ev = (short)(ZMQ_POLLIN | (s->own[i].out.n ? ZMQ_POLLOUT : 0));
            it[n++] = (zmq_pollitem_t){s->own[i].pair, 0, ev, 0};
        }
    if (zmq_poll(it, n, timeout_ms) < 0)
        return errno == EINTR ? PUMP_EINTR : PUMP_EPOLL;
    if (stop_at >= 0 && (it[stop_at].revents & ZMQ_POLLIN)) {
        drain_eventfd(s->efd);
        return PUMP_STOP_ASKED;
    }
    if (writer_at >= 0 && (it[writer_at].revents & ZMQ_POLLIN))
        ck_writer_signalled(s);
    for (int k = 0; k < np; k++) {
        int i = who[k];
        if (it[first + k].revents & ZMQ_POLLIN)
            io_read_pair(s, i);
        if (s->own[i].out.n)
            flush_outbox(s, i);
    }
    if (router_at >= 0 && (it[router_at].revents & ZMQ_POLLIN) && io_read_router(s) < 0)
        return PUMP_EROUTER;
    if (mon_at >= 0 && (it[mon_at].revents & ZMQ_POLLIN))
        ps_hs_monitor_read(s->mon);
    return PUMP_OK;
}

/* Stop the update threads: they answer their queued pulls (PS_ECLOSED) and
 * send their final counters, which go into s->totals. */
static void stop_threads(ps_server *s)
{
    int T = s->cfg.threads;
    if (!s->threads_running)
        return;
    set_stopping(s);
    for (int i = 0; i < T; i++)
        if (owner_running(s, i))
            send_cmd(s, i, PS_CMD_STOP, 0, NULL, NULL, NULL);
    for (;;) {
        int left = 0;
        for (int i = 0; i < T; i++)
            left += owner_running(s, i);
        if (!left)
            break;
        if (io_pump(s, 0, 100) == PUMP_EPOLL) {
            ps_error("poll failed while stopping: %s", zmq_strerror(errno));
            abort();
        }
    }
    for (int i = 0; i < T; i++) {
        ps_updater_join(s->own[i].upd);
        s->own[i].started = 0;
    }
    s->threads_running = 0;
    int have = 0;
    memset(&s->totals, 0, sizeof s->totals);
    for (int i = 0; i < T; i++)
        ps_stats_add(&s->totals, &have, &s->own[i].final);
    s->totals.errors += s->io_errors;
    s->totals.workers_seen = (uint64_t)ps_workers_seen(s->workers);
}

/* Pump the owners' messages and the writer's wake-up until no checkpoint is
 * being taken or written (at stop).  Gives a snapshot up if an owner died. */
static void ck_wait_idle(ps_server *s)
{
    while (!ps_ckpt_coord_idle(s->ck)) {
        for (int i = 0; i < s->cfg.threads; i++)
            if (s->own[i].stopped && ps_ckpt_coord_collecting(s->ck)) {
                ps_error("checkpoint %llu abandoned: update thread %d is gone",
                         (unsigned long long)ps_ckpt_coord_abandon(s->ck), i);
                return;
            }
        if (io_pump(s, PUMP_WRITER, 100) == PUMP_EPOLL) {
            ps_error("poll failed while writing a checkpoint: %s", zmq_strerror(errno));
            return;
        }
    }
}

/* At stop: one last checkpoint when anything changed since the last one, so
 * a clean stop and --restore lose nothing. */
static void ck_final(ps_server *s)
{
    if (!ps_ckpt_coord_policy(s->ck)->on || !s->threads_running)
        return;
    set_stopping(s);
    ck_wait_idle(s);
    for (int i = 0; i < s->cfg.threads; i++)
        if (s->own[i].stopped)
            return;
    uint64_t token;
    if (!ps_ckpt_coord_final(s->ck, ps_now_ns(), s->mut, &token))
        return;
    send_ckpt(s, token);
    ck_wait_idle(s);
}

int ps_server_run(ps_server *s)
{
    if (s->run_called)
        return PS_ESTATE;
    s->run_called = 1;
    /* a short poll when something is timed: worker silence, checkpoints */
    int ck_on = ps_ckpt_coord_policy(s->ck)->on;
    long tick = s->cfg.worker_timeout_ms > 0 || ck_on ? 100 : 1000;
    int rc = 0;
    while (!s->stopping) {
        int r = io_pump(s, PUMP_ROUTER | PUMP_STOP | PUMP_WRITER, tick);
        if (r == PUMP_EINTR)
            continue;
        if (r == PUMP_STOP_ASKED) {
            ps_info("stop requested");
            break;
        }
        if (r == PUMP_EPOLL)
            ps_error("poll failed: %s", zmq_strerror(errno));
        if (r < 0) {
            rc = PS_EIO;
            break;
        }
        int64_t now = ps_now_ns();
        check_workers(s, now);
        ck_maybe(s, now);
        ps_rlimit_flush(&s->rl, now, 0);
    }
    ck_final(s);
    stop_threads(s);
    close_waiters(s);
    if (s->io_failed)
        rc = PS_EIO;
    ps_rlimit_flush(&s->rl, ps_now_ns(), 1);
    const ps_stats *t = &s->totals;
    char extra[256] = "";
    size_t off = 0;
    if (s->auth)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                ", %llu CURVE handshakes refused",
                                (unsigned long long)(ps_curve_auth_refused(s->auth) +
                                                     ps_hs_monitor_failed(s->mon)));
    uint64_t nlost = ps_workers_lost(s->workers);
    if (nlost && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                ", %llu workers lost, %llu rejoined",
                                (unsigned long long)nlost,
                                (unsigned long long)ps_workers_rejoined(s->workers));
    if (ck_on && off < sizeof extra)
        snprintf(extra + off, sizeof extra - off, ", %llu checkpoints written",
                 (unsigned long long)ps_ckpt_coord_count(s->ck));
    ps_info("stopped: %llu pushes, %llu pulls, %llu inits, %llu updates, %llu duplicates dropped, "
            "%llu error replies, %llu undecodable messages dropped, %llu chunks, versions "
            "%lld..%lld, %llu MiB in, %llu MiB out, %d of %d workers said hello%s",
            (unsigned long long)t->pushes, (unsigned long long)t->pulls,
            (unsigned long long)t->inits, (unsigned long long)t->updates,
            (unsigned long long)t->dup_dropped, (unsigned long long)t->errors,
            (unsigned long long)s->dropped, (unsigned long long)t->chunks,
            (long long)t->min_version, (long long)t->max_version,
            (unsigned long long)(t->bytes_in >> 20), (unsigned long long)(t->bytes_out >> 20),
            ps_workers_seen(s->workers), s->cfg.num_workers, extra);
    return rc;
}

void ps_server_stop(ps_server *s)
{
    uint64_t one = 1;
    ssize_t r = write(s->efd, &one, sizeof one);
    (void)r;
}

void ps_server_totals(const ps_server *s, ps_stats *out) { *out = s->totals; }

const char *ps_server_endpoint(const ps_server *s) { return s->endpoint; }

void ps_server_close(ps_server *s)
{
    if (!s)
        return;
    if (s->threads_running)
        stop_threads(s);
    close_waiters(s);
    /* every frame still held goes before the context */
    ps_barriers_destroy(s->barriers);
    ps_stats_reqs_destroy(s->stats);
    ps_ckpt_coord_destroy(s->ck);
    for (int i = 0; i < s->cfg.threads && s->own; i++)
        ps_outbox_clear(&s->own[i].out);
    for (int i = 0; i < s->cfg.threads && s->own; i++)
        ps_updater_destroy(s->own[i].upd);
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
    /* libzmq 4.3 leaves the socket file of an ipc:// endpoint behind */
    if (strncmp(s->endpoint, "ipc://", 6) == 0 && s->endpoint[6] && s->endpoint[6] != '@')
        unlink(s->endpoint + 6);
    if (s->trace && ps_trace_close(s->trace) != 0)
        ps_error("--timeline %s: cannot finish the file", s->timeline_path);
    ps_workers_destroy(s->workers);
    free(s->own);
    free(s->timeline_path);
    free(s->curve_dir);
    free(s->ckpt_dir);
    free(s);
}

static int set_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

/* --restore: the coordinator fills the shards (threads not started yet); the
 * workers the checkpoint knows are served without a new hello. */
static int restore(ps_server *s, char *why, size_t why_len)
{
    ps_shard *shards[PS_SERVER_MAX_THREADS];
    for (int i = 0; i < s->cfg.threads; i++)
        shards[i] = ps_updater_shard(s->own[i].upd);
    uint8_t *hello = calloc((size_t)s->cfg.num_workers, 1);
    if (!hello)
        return PS_ENOMEM;
    int rc = ps_ckpt_coord_restore(s->ck, shards, s->cfg.threads, hello, &s->model_fp, why,
                                   why_len);
    if (!rc)
        rc = ps_workers_restore(s->workers, hello, ps_now_ns());
    free(hello);
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
    ps_updater_config uc;
    memset(&uc, 0, sizeof uc);
    uc.mode = c->mode;
    uc.num_workers = c->num_workers;
    uc.trace = s->trace;
    uc.hold_inits = pol->on;
    uc.durable = pol->durable;
    uc.defer_acks = pol->defer_acks;
    uc.report_progress = pol->report_progress;
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
        /* handshake failures the ZAP handler never sees (plaintext peers) */
        s->mon = ps_hs_monitor_open(s->ctx, s->router);
    }
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
    s->efd = -1;
    snprintf(s->bind, sizeof s->bind, "%s", c->bind);
    s->cfg.bind = s->bind;
    int fail = 0;
    s->timeline_path = dup_opt(c->timeline, &fail);
    s->curve_dir = dup_opt(c->curve_dir, &fail);
    s->ckpt_dir = dup_opt(c->checkpoint_dir, &fail);
    s->cfg.timeline = s->timeline_path;
    s->cfg.curve_dir = s->curve_dir;
    s->cfg.checkpoint_dir = s->ckpt_dir;
    atomic_init(&s->mem_used, 0);
    int T = c->threads;
    s->own = calloc((size_t)T, sizeof *s->own);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->ctx = zmq_ctx_new();
    ps_reply_to to = {s, reply_hook};
    if (fail || !s->own || s->efd < 0 || !s->ctx ||
        ps_workers_create(c->num_workers, c->worker_timeout_ms, c->on_worker_loss,
                          &s->workers) != 0 ||
        ps_barriers_create(c->num_workers, to, &s->barriers) != 0 ||
        ps_stats_reqs_create(T, to, &s->stats) != 0) {
        ps_errorf(why, why_len, "out of memory or descriptors starting the server");
        ps_server_close(s);
        return PS_ENOMEM;
    }
    if ((rc = ps_ckpt_coord_create(&s->cfg, &s->ck, why, why_len)) != 0) {
        ps_server_close(s);
        return rc;
    }
    if ((rc = open_timeline(s, why, why_len)) != 0 || (rc = open_owners(s, why, why_len)) != 0 ||
        (c->restore && (rc = restore(s, why, why_len)) != 0) ||
        (rc = open_router(s, why, why_len)) != 0) {
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
            stop_threads(s); /* the ones that started */
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
    *out = s;
    return 0;
}
