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

/* A snapshot starts: every owner serializes its chunks and table
 * partitions when this reaches it, so it holds every table declared so far. */
static void send_ckpt(ps_server *s, uint64_t seq)
{
    ps_cmd_frame cmd = {.cmd = PS_CMD_CKPT, .ckpt_seq = seq,
                        .ckpt_full = ps_ckpt_coord_full(s->ck)};
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
}

/* Answer the request of held reply m with an error (PS_EIO, text: what
 * happened to checkpoints and what the server does about it, then why). */
static void answer_held(ps_server *s, const ps_held_reply *m, const char *what, const char *why)
{
    ps_header h, r;
    char text[PS_ERR_TEXT_MAX + 1];
    if (m->nf < 2 || ps_proto_decode(zmq_msg_data((zmq_msg_t *)&m->f[1]),
                                     zmq_msg_size((zmq_msg_t *)&m->f[1]), &h, NULL, 0) != 0)
        return;
    snprintf(text, sizeof text, "server %d: %s: %s", s->cfg.rank, what, why);
    ps_reply_error(&r, h.seq, h.rank, h.key, h.chunk, PS_EIO, text);
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, (zmq_msg_t *)&m->f[0]);
    srv_send(s, &id, &r);
    zmq_msg_close(&id);
    s->io_errors++;
}

/* A reply held for a checkpoint while writes fail (stall): its worker is
 * told why it waits.  The reply itself stays held. */
static void ck_notice(void *user, const ps_held_reply *m)
{
    ps_server *s = user;
    char why[512], what[160];
    int64_t since = 0;
    if (!ps_ckpt_coord_failing(s->ck, why, sizeof why, &since))
        return;
    snprintf(what, sizeof what, "checkpoint writes failing for %.0f s, this reply is held "
             "until one is written (--on-checkpoint-failure stall)",
             (double)(ps_now_ns() - since) * 1e-9);
    answer_held(s, m, what, why);
}

/* --on-checkpoint-failure exit: what waits for a checkpoint is told why the
 * server goes, and it goes (exit 1). */
static void ck_give_up(ps_server *s)
{
    char why[512];
    int64_t since = 0;
    ps_ckpt_coord_failing(s->ck, why, sizeof why, &since);
    ps_error("checkpoint writes to %s have failed for %.0f s (%s): stopping "
             "(--on-checkpoint-failure exit)", s->ckpt_dir,
             (double)(ps_now_ns() - since) * 1e-9, why);
    for (ps_held_reply *m = ps_ckpt_coord_take_held(s->ck), *next; m; m = next) {
        next = m->next;
        answer_held(s, m, "stopping: checkpoint writes keep failing "
                    "(--on-checkpoint-failure exit)", why);
        ps_held_reply_free(m);
    }
    s->io_failed = 1;
    srv_set_stopping(s);
}

static void ck_maybe(ps_server *s, int64_t now)
{
    uint64_t token;
    if (!s->stopping && ps_ckpt_coord_due(s->ck, now, s->mut, &token))
        send_ckpt(s, token);
    ps_ckpt_coord_overdue(s->ck, now, ck_notice, s);
    if (!s->stopping && ps_ckpt_coord_give_up(s->ck, now))
        ck_give_up(s);
}

/* An update thread's last counters of its table partitions (PS_OUT_STOPPED:
 * an array of ps_table_total) go into each table's total. */
static void add_table_totals(ps_server *s, const void *data, size_t len)
{
    for (size_t k = 0; k + sizeof(ps_table_total) <= len; k += sizeof(ps_table_total)) {
        ps_table_total tt;
        memcpy(&tt, (const char *)data + k, sizeof tt);
        srv_table *t = srv_find_table(s, tt.key);
        if (!t)
            continue;
        t->total.rows += tt.c.rows;
        t->total.bytes += tt.c.bytes;
        t->total.evicted += tt.c.evicted;
        t->total.filtered_pulls += tt.c.filtered_pulls;
        t->total.filtered_pushes += tt.c.filtered_pushes;
        t->total.updated += tt.c.updated;
    }
}

/* The I/O thread's own counters, as STATS and the totals add them to the
 * owners': none holds chunks, so the version range is the owners'. */
static ps_stats srv_io_stats(const ps_server *s)
{
    ps_stats io;
    memset(&io, 0, sizeof io);
    io.errors = s->io_errors;
    io.workers_seen = (uint64_t)ps_workers_seen(s->workers);
    io.forged = ps_workers_forged(s->workers);
    ps_repl_stats(s->repl, &io.repl_epoch, &io.repl_lag);
    return io;
}

void srv_reply_out(ps_server *s, int tag, int64_t version, zmq_msg_t *f, int nf)
{
    ps_held_reply *m;
    if (tag != PS_OUT_REPLY && ps_ckpt_coord_hold(s->ck, tag, version, ps_now_ns(), &m)) {
        /* they wait until a checkpoint holds them */
        if (m) {
            for (int k = 0; k < nf; k++) {
                zmq_msg_init(&m->f[k]);
                zmq_msg_move(&m->f[k], &f[k]);
            }
            m->nf = nf;
        } else {
            ps_error("out of memory holding a reply; dropped (the worker resends)");
        }
        ps_zmsg_close_all(f, nf);
        return;
    }
    ps_zmsg_send_all(s->router, f, nf, ZMQ_DONTWAIT);
    ps_zmsg_close_all(f, nf);
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
        int64_t version = 0; /* HELD, INIT, ACK: what a checkpoint must hold */
        uint64_t rseq = 0;   /* a mutation the group's members must acknowledge first */
        if (tlen >= 1 + sizeof version)
            memcpy(&version, td + 1, sizeof version);
        if (tlen == 1 + sizeof version + sizeof rseq)
            memcpy(&rseq, td + 1 + sizeof version, sizeof rseq);
        int more = zmq_msg_more(&tag);
        zmq_msg_close(&tag);
        if (t == PS_OUT_REPLY || t == PS_OUT_HELD || t == PS_OUT_INIT || t == PS_OUT_ACK) {
            /* [identity, header, payload?]: a payload counts against its peer
             * (server/peers.h) from here until ZeroMQ has sent it */
            zmq_msg_t f[3];
            int nf = 0;
            ps_zmsg_recv_rest(s->own[i].pair, more, f, &nf, 3);
            if (nf == 3)
                ps_peers_count(s->peers, &f[0], &f[2]);
            if (s->repl && ps_repl_hold(s->repl, rseq, t, version, f, nf))
                continue; /* moved: the members acknowledge it first */
            srv_reply_out(s, t, version, f, nf);
            continue;
        }
        if (t == PS_OUT_LOADED) {
            int rc = PS_EIO;
            zmq_msg_t m;
            if (more && ps_zmsg_recv(s->own[i].pair, &m, 0) == 0) {
                if (zmq_msg_size(&m) == sizeof rc)
                    memcpy(&rc, zmq_msg_data(&m), sizeof rc);
                zmq_msg_close(&m);
            }
            ps_repl_loaded(s->repl, i, rc);
            continue;
        }
        if (t == PS_OUT_TAKEN || t == PS_OUT_MOVED_IN || t == PS_OUT_OBJECTS) {
            /* servers added and removed (move.h): one frame, its blocks ours */
            union {
                ps_move_frame mf;
                ps_objects_frame of;
            } v;
            size_t want = t == PS_OUT_OBJECTS ? sizeof v.of : sizeof v.mf;
            int got = 0;
            zmq_msg_t m;
            while (more && ps_zmsg_recv(s->own[i].pair, &m, 0) == 0) {
                more = zmq_msg_more(&m);
                if (!got && zmq_msg_size(&m) == want) {
                    memcpy(&v, zmq_msg_data(&m), want);
                    got = 1;
                }
                zmq_msg_close(&m);
            }
            if (!got)
                ps_error("update thread %d: a malformed '%c' frame; dropped", i, t);
            else if (t == PS_OUT_TAKEN)
                ps_move_taken(s, i, &v.mf);
            else if (t == PS_OUT_MOVED_IN)
                ps_move_loaded(s, i, &v.mf);
            else
                ps_move_objects(s, i, &v.of);
            continue;
        }
        union {
            ps_stats_frame of;
            ps_ckpt_frame cf;
            ps_progress_frame pf;
            ps_snap_frame sf;
        } u;
        memset(&u, 0, sizeof u);
        size_t want = t == PS_OUT_CKPT       ? sizeof u.cf
                      : t == PS_OUT_PROGRESS ? sizeof u.pf
                      : t == PS_OUT_SNAP     ? sizeof u.sf
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
            } else if (got && t == PS_OUT_STOPPED) {
                add_table_totals(s, zmq_msg_data(&m), zmq_msg_size(&m));
            }
            zmq_msg_close(&m);
        }
        if (t == PS_OUT_CKPT && got && (u.cf.token & PS_REPL_SNAP_TOKEN)) {
            ps_repl_snap_part(s->repl, i, &u.cf); /* a replacement member's */
        } else if (t == PS_OUT_CKPT) {
            if (got)
                send_released(s, ps_ckpt_coord_part(s->ck, i, &u.cf, s->model_fp,
                                                  ps_workers_hello_flags(s->workers)));
        } else if (t == PS_OUT_SNAP) {
            if (got)
                srv_export_part(s, i, &u.sf);
        } else if (t == PS_OUT_PROGRESS) {
            ps_ckpt_coord_progress(s->ck, i, u.pf.min_version, u.pf.have);
        } else if (t == PS_OUT_STATS) {
            ps_stats io = srv_io_stats(s);
            ps_stats_reqs_part(s->stats, &u.of, &io, s->barriers);
        } else if (t == PS_OUT_STOPPED) {
            s->own[i].final = u.of.st;
            s->own[i].stopped = 1;
            if (!s->stopping) {
                ps_error("update thread %d stopped unexpectedly; shutting down", i);
                srv_set_stopping(s);
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
void srv_close_waiters(ps_server *s)
{
    if (s->barriers)
        ps_barriers_close(s->barriers);
    if (s->colls)
        ps_colls_close(s->colls);
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
    zmq_pollitem_t it[PS_SERVER_MAX_THREADS + 4 + PS_REPL_MAX_POLL + PS_MOVE_MAX_POLL];
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
    int move_at = -1;
    if ((what & PUMP_ROUTER) && s->move) {
        move_at = n;
        ps_move_poll_items(s->move, it, &n);
        long mt = ps_move_timeout_ms(s->move, ps_now_ns());
        if (mt >= 0 && (timeout_ms < 0 || mt < timeout_ms))
            timeout_ms = mt;
    }
    int repl_at = -1;
    if ((what & PUMP_ROUTER) && s->repl) {
        repl_at = n;
        ps_repl_poll_items(s->repl, it, &n);
        long rt = ps_repl_timeout_ms(s->repl, ps_now_ns());
        if (timeout_ms < 0 || rt < timeout_ms)
            timeout_ms = rt;
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
            srv_flush_outbox(s, i);
    }
    /* disconnects first: a worker restarted at once finds its rank free */
    if (mon_at >= 0 && (it[mon_at].revents & ZMQ_POLLIN))
        srv_read_monitor(s);
    if (repl_at >= 0)
        ps_repl_dispatch(s->repl, it, repl_at, ps_now_ns());
    if (move_at >= 0)
        ps_move_dispatch(s, it, move_at, ps_now_ns());
    if (router_at >= 0 && (it[router_at].revents & ZMQ_POLLIN) && srv_read_router(s) < 0)
        return PUMP_EROUTER;
    ps_repl_flush_acks(s->repl);
    return PUMP_OK;
}

/* Stop the update threads: they answer their queued pulls (PS_ECLOSED) and
 * send their final counters, which go into s->totals. */
void srv_stop_threads(ps_server *s)
{
    int T = s->cfg.threads;
    if (!s->threads_running)
        return;
    srv_set_stopping(s);
    ps_cmd_frame stop = {.cmd = PS_CMD_STOP};
    for (int i = 0; i < T; i++)
        if (owner_running(s, i))
            srv_send_cmd(s, i, &stop, NULL, NULL);
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
    ps_stats io = srv_io_stats(s);
    ps_stats_add(&s->totals, &have, &io);
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
    srv_set_stopping(s);
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

/* --metrics-port: the I/O thread's figures, where a scrape reads them. */
static void publish_io(ps_server *s)
{
    ps_srv_io_figures f = {0};
    ps_stats io = srv_io_stats(s);
    f.errors = io.errors;
    f.forged = io.forged;
    f.dropped = s->dropped;
    f.workers_seen = io.workers_seen;
    f.workers_lost = ps_workers_lost(s->workers);
    f.workers_rejoined = ps_workers_rejoined(s->workers);
    f.hellos_refused = ps_workers_refused(s->workers);
    f.peer_refused = ps_peers_refused(s->peers);
    f.shutdowns_refused = s->shutdowns_refused;
    if (s->auth)
        f.curve_refused = ps_curve_auth_refused(s->auth) + ps_hs_monitor_failed(s->mon);
    f.checkpoints = ps_ckpt_coord_count(s->ck);
    f.checkpoint_failures = ps_ckpt_coord_failures(s->ck);
    ps_ckpt_coord_last(s->ck, &f.checkpoint_done_ns, &f.checkpoint_took_ns);
    ps_repl_figures(s->repl, &f);
    ps_srv_metrics_io(s->met, &f);
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
        /* an export's wait is timed too */
        int r = io_pump(s, PUMP_ROUTER | PUMP_STOP | PUMP_WRITER,
                        ps_export_busy(s->exp) && tick > 100 ? 100 : tick);
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
        if (ps_move_left_done(s->move, now)) {
            ps_info("removed from the job and every worker told: exiting");
            break;
        }
        srv_check_workers(s, now);
        ps_peers_sweep(s->peers, now);
        ck_maybe(s, now);
        srv_export_tick(s, now);
        ps_rlimit_flush(&s->rl, now, 0);
        if (s->met)
            publish_io(s);
    }
    ck_final(s);
    srv_stop_threads(s);
    srv_close_waiters(s);
    if (s->met) /* the last checkpoint's figures too */
        publish_io(s);
    if (s->io_failed)
        rc = PS_EIO;
    ps_rlimit_flush(&s->rl, ps_now_ns(), 1);
    const ps_stats *t = &s->totals;
    char extra[512] = "";
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
    if (ps_workers_refused(s->workers) && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                ", %llu hellos refused (rank held by another connection)",
                                (unsigned long long)ps_workers_refused(s->workers));
    if (t->forged && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                ", %llu requests refused (their rank held by another "
                                "connection)", (unsigned long long)t->forged);
    if (ps_peers_refused(s->peers) && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                ", %llu pulls refused to peers not reading their replies",
                                (unsigned long long)ps_peers_refused(s->peers));
    if (s->shutdowns_refused && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off, ", %llu shutdowns refused",
                                (unsigned long long)s->shutdowns_refused);
    if (t->nonfinite && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off, ", %llu pushes held NaN or Inf",
                                (unsigned long long)t->nonfinite);
    if (ck_on && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off, ", %llu checkpoints written",
                                (unsigned long long)ps_ckpt_coord_count(s->ck));
    if (ps_ckpt_coord_failures(s->ck) && off < sizeof extra)
        off += (size_t)snprintf(extra + off, sizeof extra - off, ", %llu checkpoint writes failed",
                                (unsigned long long)ps_ckpt_coord_failures(s->ck));
    if (s->ntables && off < sizeof extra)
        snprintf(extra + off, sizeof extra - off, ", %zu tables: %llu rows (%llu MiB), %llu "
                 "evicted, %llu filtered", s->ntables, (unsigned long long)t->rows,
                 (unsigned long long)(t->table_bytes >> 20), (unsigned long long)t->evicted,
                 (unsigned long long)t->filtered);
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
    for (size_t i = 0; i < s->ntables; i++) {
        const ps_table_counts *c = &s->tables[i].total;
        char label[128];
        ps_info("%s: %llu rows (%.1f MiB), %llu row updates, %llu evicted, %llu "
                "filtered (pulls of ids not admitted yet) and %llu gradient rows dropped for them",
                srv_table_label(&s->tables[i], label, sizeof label), (unsigned long long)c->rows,
                (double)c->bytes / 1048576.0, (unsigned long long)c->updated,
                (unsigned long long)c->evicted, (unsigned long long)c->filtered_pulls,
                (unsigned long long)c->filtered_pushes);
    }
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

struct ps_metrics *ps_server_metrics(ps_server *s) { return ps_srv_metrics_registry(s->met); }

