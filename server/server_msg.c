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
    h.wire_dtype = s->cfg.wire_dtype;
    return h;
}

/* ================= I/O thread ================= */

void srv_send(ps_server *s, zmq_msg_t *id, const ps_header *h)
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
void srv_reply_hook(void *user, zmq_msg_t *id, const ps_header *h) { srv_send(user, id, h); }

void srv_error(ps_server *s, zmq_msg_t *id, const ps_header *req, int code, const char *why)
{
    ps_header h;
    ps_reply_error(&h, req->seq, req->rank, req->key, req->chunk, code, why);
    h.seq_negative = req->seq_negative;
    s->io_errors++;
    if (ps_rlimit_allow(&s->rl))
        ps_warn("refused %s from rank %d: %s: %s", ps_msg_type_name(req->type), req->rank,
                ps_strerror(code), why);
    srv_send(s, id, &h);
}

static void io_drop(ps_server *s, const char *why)
{
    s->dropped++;
    if (ps_rlimit_allow(&s->rl))
        ps_warn("dropped a message with no usable header: %s", why);
}

/* Hand a message to an owner, or queue it while its PAIR is full (reads from
 * the ROUTER pause meanwhile: out_total). */
static void srv_to_owner(ps_server *s, int i, zmq_msg_t *f, int nf)
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

void srv_flush_outbox(ps_server *s, int i)
{
    owner *o = &s->own[i];
    size_t before = o->out.n;
    while (ps_outbox_flush(&o->out, o->pair) != 0)
        ps_error("handing a message to update thread %d failed: %s", i, zmq_strerror(errno));
    s->out_total -= before - o->out.n;
}

void srv_send_cmd(ps_server *s, int owner, int cmd, uint64_t token, const ps_header *h,
                  zmq_msg_t *id, zmq_msg_t *payload)
{
    srv_send_cmd_shm(s, owner, cmd, token, h, NULL, id, payload);
}

void srv_send_cmd_shm(ps_server *s, int owner, int cmd, uint64_t token, const ps_header *h,
                      ps_shm_peer *shm, zmq_msg_t *id, zmq_msg_t *payload)
{
    zmq_msg_t f[3];
    int nf = 1;
    zmq_msg_init_size(&f[0], sizeof(ps_cmd_frame));
    ps_cmd_frame *cf = zmq_msg_data(&f[0]);
    memset(cf, 0, sizeof *cf);
    cf->cmd = cmd;
    cf->token = token;
    cf->shm = shm;
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
    srv_to_owner(s, owner, f, nf);
}

/* Rank r joins (live 1) or leaves (0) the live set of every owner's shard. */
static void send_live(ps_server *s, int r, int live)
{
    ps_header lh;
    ps_header_init(&lh, PS_MSG_HELLO);
    lh.rank = r;
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, PS_CMD_LIVE, (uint64_t)live, &lh, NULL, NULL);
}

static void io_hello(ps_server *s, zmq_msg_t *id, zmq_msg_t *hf, const ps_header *h)
{
    ps_hello mine = my_hello(s);
    char why[256], who[32];
    snprintf(who, sizeof who, h->rank >= 0 ? "worker %d" : "rank %d", h->rank);
    ps_hello theirs = h->hello;
    if (h->rank < 0) /* a tool moves no payloads: its wire dtype does not matter */
        theirs.wire_dtype = mine.wire_dtype;
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
    if (rc) {
        srv_error(s, id, h, rc, why);
        return;
    }
    uint64_t token = 0;
    if (h->rank >= 0) {
        int rejoined;
        char peer[256];
        ps_peer_name(id, hf, h->rank, peer, sizeof peer);
        /* a holder that just hung up is gone by now, not live */
        srv_read_monitor(s);
        rc = ps_workers_hello(s->workers, h->rank, zmq_msg_data(id), zmq_msg_size(id),
                              zmq_msg_get(hf, ZMQ_SRCFD), h->hello.token, ps_now_ns(), peer,
                              &token, &rejoined, why, sizeof why);
        if (rc) { /* logged by the table, rate-limited */
            ps_header r;
            ps_reply_error(&r, h->seq, h->rank, h->key, h->chunk, rc, why);
            s->io_errors++;
            srv_send(s, id, &r);
            return;
        }
        if (rejoined) { /* back in the live set before any of its requests reach an owner */
            send_live(s, h->rank, 1);
            ps_barriers_set_live(s->barriers, h->rank, 1);
        }
    } else {
        ps_debug("hello from a tool (rank -1)");
    }
    /* the first fingerprint an accepted worker gives is the model's */
    if (h->hello.model_fp && !s->model_fp) {
        s->model_fp = h->hello.model_fp;
        ps_info("model fingerprint %016llx (from %s)", (unsigned long long)s->model_fp, who);
    }
    ps_header r;
    ps_reply_header(&r, PS_MSG_HELLO, h->seq, h->rank, h->key, h->chunk, h->step);
    r.hello = my_hello(s);
    r.hello.token = token;
    if (h->rank >= 0) /* does it move payloads through shared memory? */
        ps_shm_table_hello(s->shm, h->rank, &h->hello, &r.hello);
    srv_send(s, id, &r);
}

static void io_barrier(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    const char *why;
    int rc = ps_barriers_arrive(s->barriers, id, h, &why);
    if (rc)
        srv_error(s, id, h, rc, why);
}

/* Apply --on-worker-loss to every worker silent for longer than the timeout. */
void srv_check_workers(ps_server *s, int64_t now)
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
        srv_error(s, id, h, rc, why);
        return;
    }
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, PS_CMD_STATS, token, NULL, NULL, NULL);
}

/* SHUTDOWN: only from a peer with authority (server/admin.h); every refusal
 * is logged with the peer (rate-limited) and answered with PS_EAUTH. */
static void io_shutdown(ps_server *s, zmq_msg_t *f, const ps_header *h)
{
    char why[256], who[256];
    ps_peer_name(&f[0], &f[1], h->rank, who, sizeof who);
    if (ps_admin_check(s->admin, h, zmq_msg_gets(&f[1], "User-Id"), why, sizeof why)) {
        ps_header r;
        ps_reply_error(&r, h->seq, h->rank, h->key, h->chunk, PS_EAUTH, why);
        s->io_errors++;
        s->shutdowns_refused++;
        if (ps_rlimit_allow(&s->rl_admin))
            ps_warn("refused a shutdown from %s: %s", who, why);
        srv_send(s, &f[0], &r);
        return;
    }
    ps_header r;
    ps_reply_header(&r, PS_MSG_SHUTDOWN, h->seq, h->rank, h->key, h->chunk, h->step);
    srv_send(s, &f[0], &r);
    ps_info("shutdown requested by %s", who);
    srv_set_stopping(s);
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
        srv_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.flags & PS_FLAG_REPLY) {
        ps_errorf(why, sizeof why, "the server takes requests; got a %s reply",
            ps_msg_type_name(h.type));
        srv_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    if (h.type == PS_MSG_ERROR) {
        srv_error(s, &f[0], &h, PS_EPROTO, "error messages are replies only");
        return;
    }
    size_t pbytes = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    rc = ps_proto_check_payload(&h, total - 2, pbytes, why, sizeof why);
    if (rc) {
        srv_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.type == PS_MSG_HELLO) { /* checks the rank after the config */
        io_hello(s, &f[0], &f[1], &h);
        return;
    }
    if (h.rank >= s->cfg.num_workers) {
        ps_errorf(why, sizeof why, "rank %d is out of range: this server has --num-workers %d",
            h.rank, s->cfg.num_workers);
        srv_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    int ws; /* anything from a live worker counts as a sign of life */
    if (h.rank < 0) {
        if (h.type != PS_MSG_STATS && h.type != PS_MSG_SHUTDOWN && h.type != PS_MSG_HEARTBEAT) {
            ps_errorf(why, sizeof why,
                "%s needs a worker rank; rank -1 may send only hello, stats, heartbeat and shutdown",
                ps_msg_type_name(h.type));
            srv_error(s, &f[0], &h, PS_ESTATE, why);
            return;
        }
    } else if ((ws = ps_workers_heard(s->workers, h.rank, zmq_msg_data(&f[0]),
                                      zmq_msg_size(&f[0]), ps_now_ns())) != PS_WORKER_LIVE) {
        if (ws == PS_WORKER_UNKNOWN)
            ps_errorf(why, sizeof why, "worker %d sent %s before hello; say hello first", h.rank,
                ps_msg_type_name(h.type));
        else
            ps_errorf(why, sizeof why, "worker %d was dropped after %d ms without a message "
                "(--on-worker-loss drop); say hello again to rejoin", h.rank,
                s->cfg.worker_timeout_ms);
        /* PS_EHELLO: libps says hello again on it and resends (rejoins) */
        if (h.type == PS_MSG_HEARTBEAT) {
            /* once a second from every such worker: answered, not logged */
            ps_header r;
            ps_reply_error(&r, h.seq, h.rank, h.key, h.chunk, PS_EHELLO, why);
            s->io_errors++;
            srv_send(s, &f[0], &r);
        } else {
            srv_error(s, &f[0], &h, PS_EHELLO, why);
        }
        return;
    }
    switch (h.type) {
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
        /* a peer that does not read its replies gets no more payloads */
        if ((rc = ps_peers_admit(s->peers, &f[0], &f[1], h.rank, why, sizeof why)) != 0) {
            ps_header r;
            ps_reply_error(&r, h.seq, h.rank, h.key, h.chunk, rc, why);
            s->io_errors++;
            srv_send(s, &f[0], &r);
            return;
        }
        /* fall through */
    case PS_MSG_INIT:
    case PS_MSG_PUSH: {
        ps_shm_peer *shm = NULL;
        if ((h.flags & PS_FLAG_SHM) && h.dtype != PS_DTYPE_F32) {
            ps_errorf(why, sizeof why, "payloads in shared memory are float32 (d = %d), got d = "
                "%u", PS_DTYPE_F32, h.dtype);
            srv_error(s, &f[0], &h, PS_EPROTO, why);
            return;
        }
        /* PS_EHELLO: the rank said hello to another process of this server:
         * it says hello again (with its arena) and resends */
        if ((h.flags & PS_FLAG_SHM) &&
            (rc = ps_shm_table_take(s->shm, h.rank, h.shm_off, h.count * sizeof(float), &shm,
                                    why, sizeof why)) != 0) {
            srv_error(s, &f[0], &h, rc, why);
            return;
        }
        /* a pushpull's weights go to a second place of the arena */
        if (shm && h.type == PS_MSG_PUSHPULL &&
            !ps_shm_peer_at(shm, h.shm_dst, h.count * sizeof(float))) {
            ps_shm_peer_unref(shm);
            ps_errorf(why, sizeof why, "worker %d: the pushpull's destination [%llu, +%llu) is "
                "outside its arena", h.rank, (unsigned long long)h.shm_dst,
                (unsigned long long)(h.count * sizeof(float)));
            srv_error(s, &f[0], &h, PS_EPROTO, why);
            return;
        }
        if (h.type != PS_MSG_PULL)
            s->mut++;
        srv_send_cmd_shm(s, ps_server_owner(h.key, h.chunk, s->cfg.threads), PS_CMD_REQ,
                         h.type != PS_MSG_PULL ? s->mut : 0, &h, shm, &f[0],
                         nf >= 3 ? &f[2] : NULL);
        return;
    }
    case PS_MSG_BARRIER:
        io_barrier(s, &f[0], &h);
        return;
    case PS_MSG_STATS:
        io_stats(s, &f[0], &h);
        return;
    case PS_MSG_HEARTBEAT: {
        ps_header r;
        ps_reply_header(&r, PS_MSG_HEARTBEAT, h.seq, h.rank, h.key, h.chunk, h.step);
        srv_send(s, &f[0], &r);
        return;
    }
    case PS_MSG_SHUTDOWN:
        io_shutdown(s, f, &h);
        return;
    default:
        srv_error(s, &f[0], &h, PS_EPROTO, "unhandled message type");
        return;
    }
}

/* A connection closed: what it held goes. */
static void conn_gone(void *user, int fd)
{
    ps_server *s = user;
    ps_workers_gone(s->workers, fd);
    ps_peers_gone(s->peers, fd);
}

void srv_read_monitor(ps_server *s) { ps_hs_monitor_read(s->mon, conn_gone, s); }

/* Read up to IO_BATCH messages from the ROUTER.  Returns -1 on a socket error. */
int srv_read_router(ps_server *s)
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

