/* One ROUTER message's way to its handler (server_internal.h): decode,
 * the type's checks from its row of proto/ps_msg_table.h (who may send it,
 * its frames), replicas' and moved objects' answers, then server_msg.c's
 * handler; the ROUTER's and the monitor's reads.  I/O thread only. */
#include "server_internal.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "admin.h"
#include "hs_monitor.h"
#include "peers.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ratelimit.h"
#include "zmsg.h"

static void io_drop(ps_server *s, const char *why)
{
    s->dropped++;
    if (ps_rlimit_allow(&s->rl))
        ps_warn("dropped a message with no usable header: %s", why);
}

/* ================= the dispatch ================= */

/* The types rank -1 may send. */
static int from_a_tool(const ps_msg_info *m)
{
    return m->from != PS_FROM_WORKER && m->from != PS_FROM_NOBODY && m->from != PS_FROM_PEER &&
           m->from != PS_FROM_SERVER;
}

/* The types a reader key may send (as rank -1): hello and rank -1's. */
static int from_a_reader(const ps_msg_info *m)
{
    return m->from == PS_FROM_ANY || m->from == PS_FROM_LIVE;
}

/* May h's sender send it, by its type's `from`?  0, or a refusal sent. */
static int io_sender_may(ps_server *s, zmq_msg_t *f, const ps_header *h, const ps_msg_info *m)
{
    char why[256];
    /* under CURVE a reader key (DIR/reader/NAME.pub) reads, nothing else */
    const char *user = s->auth ? zmq_msg_gets(&f[1], "User-Id") : NULL;
    if (user && !strncmp(user, PS_CURVE_READER_PREFIX, strlen(PS_CURVE_READER_PREFIX)) &&
        (h->rank >= 0 || !from_a_reader(m))) {
        char list[160];
        ps_errorf(why, sizeof why, "%s is a reader key: it may send only %s, as rank -1 (not a "
            "%s%s)", user, ps_msg_names(list, sizeof list, from_a_reader), m->name,
            h->rank >= 0 ? " under a worker rank" : "");
        srv_refuse(s, &f[0], h, PS_EAUTH, why);
        return -1;
    }
    if (m->from == PS_FROM_ANY) /* hello: it checks the rank itself, after the config */
        return 0;
    if (m->from == PS_FROM_SERVER && h->rank == -1) {
        /* another server of the job: plaintext only (move.h) */
        if (s->curve_dir) {
            ps_errorf(why, sizeof why, "%s is for the servers of a job, in plaintext (moves are "
                "not made under --curve-keys)", m->name);
            srv_refuse(s, &f[0], h, PS_EAUTH, why);
            return -1;
        }
        return 0;
    }
    if (m->from == PS_FROM_PEER && h->rank == -1) {
        /* the group's members (repl.h checks which); under CURVE only a peer
         * that holds this server's key, as its members do */
        char own[32];
        snprintf(own, sizeof own, "server-%d", s->cfg.rank);
        const char *uid = s->curve_dir ? zmq_msg_gets(&f[1], "User-Id") : own;
        if (uid && !strcmp(uid, own))
            return 0;
        ps_errorf(why, sizeof why, "%s is for the members of a shard group, which hold its "
            "server key (%s); this peer's key is %s", m->name, own, uid ? uid : "unknown");
        srv_refuse(s, &f[0], h, PS_EAUTH, why);
        return -1;
    }
    if (h->rank >= s->cfg.num_workers) {
        ps_errorf(why, sizeof why, "rank %d is out of range: this server has --num-workers %d",
            h->rank, s->cfg.num_workers);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
        return -1;
    }
    int ws; /* anything from a worker's own connection counts as a sign of life */
    ps_conn c = srv_conn_of(f);
    if (h->rank < 0) {
        if (m->from == PS_FROM_WORKER) {
            char list[128];
            ps_errorf(why, sizeof why, "%s needs a worker rank; rank -1 may send only %s",
                m->name, ps_msg_names(list, sizeof list, from_a_tool));
            srv_refuse(s, &f[0], h, PS_ESTATE, why);
            return -1;
        }
    } else if ((ws = ps_workers_heard(s->workers, h->rank, &c, ps_now_ns(), why, sizeof why)) !=
               PS_WORKER_LIVE) {
        if (ws == PS_WORKER_UNKNOWN)
            ps_errorf(why, sizeof why, "worker %d sent %s before hello; say hello first", h->rank,
                m->name);
        else if (ws == PS_WORKER_DROPPED)
            ps_errorf(why, sizeof why, "worker %d was dropped after %d ms without a message "
                "(--on-worker-loss drop); say hello again to rejoin", h->rank,
                s->cfg.worker_timeout_ms);
        /* PS_EPERM: the rank is another connection's (logged by the table,
         * rate-limited); PS_EHELLO: libps says hello again on it and
         * resends (rejoins; libps does the same on PS_EPERM, with the rank's
         * token, so a worker whose old connection the server has not seen
         * close yet gets its rank back); a heartbeat comes once a second
         * from every such worker: answered, not logged */
        int code = ws == PS_WORKER_FORGED ? PS_EPERM : PS_EHELLO;
        if (h->type == PS_MSG_HEARTBEAT || ws == PS_WORKER_FORGED)
            srv_refuse_quiet(s, &f[0], h, code, why);
        else
            srv_refuse(s, &f[0], h, code, why);
        return -1;
    }
    if (m->from == PS_FROM_SERVER) { /* a live worker: not its to send */
        ps_errorf(why, sizeof why, "%s is for the servers of a job, which send it as rank -1",
            m->name);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
        return -1;
    }
    if (m->from == PS_FROM_ADMIN &&
        ps_admin_check(s->admin, h, zmq_msg_gets(&f[1], "User-Id"), why, sizeof why)) {
        /* every refusal is logged with the peer, on a log budget of its own */
        char who[256];
        ps_peer_name(&f[0], &f[1], h->rank, who, sizeof who);
        srv_refuse_quiet(s, &f[0], h, PS_EAUTH, why);
        s->shutdowns_refused++;
        if (ps_rlimit_allow(&s->rl_admin))
            ps_warn("refused a %s from %s: %s", m->name, who, why);
        return -1;
    }
    return 0;
}

/* One message from the ROUTER: f[0] identity, f[1] header, f[2..] payload;
 * `total` counts every frame received, kept or not.  Every check that
 * depends on the type reads its row of proto/ps_msg_table.h. */
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
        srv_refuse(s, &f[0], &h, rc, why);
        return;
    }
    const ps_msg_info *m = ps_msg_info_of(h.type); /* decode took only types of the table */
    if (h.flags & PS_FLAG_REPLY) {
        ps_errorf(why, sizeof why, "the server takes requests; got a %s reply", m->name);
        srv_refuse(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    if (m->from == PS_FROM_NOBODY) {
        ps_errorf(why, sizeof why, "%s messages are replies only", m->name);
        srv_refuse(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    size_t bytes[PS_CMD_MAX_FRAMES - 2] = {0};
    for (int i = 2; i < nf; i++)
        bytes[i - 2] = zmq_msg_size(&f[i]);
    rc = ps_proto_check_frames(&h, total - 2, bytes, why, sizeof why);
    if (rc) {
        srv_refuse(s, &f[0], &h, rc, why);
        return;
    }
    if ((h.flags & PS_FLAG_REPL) && m->from != PS_FROM_PEER) {
        /* the group's stream: the primary checked the worker's request */
        if (!s->repl)
            srv_refuse(s, &f[0], &h, PS_ESTATE, "this server has no replicas (no --group)");
        else if (ps_repl_accept(s->repl, f, nf, &h) == 0)
            srv_handle(s, f, nf, &h);
        return;
    }
    if (h.rank >= 0 && !ps_repl_serves(s->repl)) {
        ps_repl_not_primary(s->repl, &f[0], &h); /* libps goes to the primary */
        return;
    }
    if (io_sender_may(s, f, &h, m) == 0 && !ps_move_redirect(s, &f[0], &h))
        srv_handle(s, f, nf, &h);
}

void srv_deliver(ps_server *s, zmq_msg_t *f, int nf) { io_message(s, f, nf, nf); }

void srv_stream_dispatch(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    srv_handle(s, f, nf, h);
}

/* A connection closed: what it held goes. */
static void conn_gone(void *user, int fd)
{
    ps_server *s = user;
    for (int r; (r = ps_workers_gone(s->workers, fd)) >= 0;) {
        srv_set_live(s, r, 0); /* elastic: a member whose process ended */
        ps_colls_set_live(s->colls, r, 0);
    }
    ps_peers_gone(s->peers, fd);
    ps_repl_conn_gone(s->repl, fd);
}

void srv_read_monitor(ps_server *s) { ps_hs_monitor_read(s->mon, conn_gone, s); }

/* Read up to IO_BATCH messages from the ROUTER.  Returns -1 on a socket error. */
int srv_read_router(ps_server *s)
{
    for (int b = 0; b < IO_BATCH && !s->out_total && !s->stopping; b++) {
        zmq_msg_t f[PS_CMD_MAX_FRAMES]; /* identity, header, at most three more */
        if (ps_zmsg_recv(s->router, &f[0], ZMQ_DONTWAIT) < 0) {
            int e = errno;
            if (e == EAGAIN || e == EINTR)
                return 0;
            ps_error("receive on %s failed: %s", s->endpoint, zmq_strerror(e));
            return -1;
        }
        int nf = 1;
        int total = 1 + ps_zmsg_recv_rest(s->router, zmq_msg_more(&f[0]), f, &nf,
                                          PS_CMD_MAX_FRAMES);
        io_message(s, f, nf, total);
        ps_zmsg_close_all(f, nf);
    }
    return 0;
}

