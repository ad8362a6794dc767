/* Replicas and failover on the server (docs/DESIGN.md "Replicas and
 * failover"): the members of a shard group, which of them is the primary,
 * the primary's stream to the others, and the replies held until every live
 * member has what they acknowledge.
 *
 * A shard group is what server rank g holds (its chunks and table
 * partitions).  With --group a|b[|c] it has one ps_server process per
 * member, all of rank g, each at its own endpoint; member 0 starts as the
 * primary.  Who is the primary, and which members hold the group's state,
 * is the group's configuration in etcd (coord/ps_group.h), with an epoch
 * that every change raises; a change is a compare-and-swap, so two servers
 * that decide at once cannot both win.
 *
 *  - The primary alone serves workers.  Every request that changes the
 *    group's state (init, push, pushpull as a push, assign, setstate, their
 *    table forms, a table's declaration, a hyper-parameter change, a worker
 *    that leaves or comes back) is sent on to every other member as the I/O
 *    thread hands it to its update thread, on one DEALER per member, flagged
 *    PS_FLAG_REPL with the epoch and a stream sequence number in `q`.  A
 *    member applies the stream in order, so each update thread of it sees
 *    the same requests in the same order as the primary's: the same state
 *    (sync: bitwise).  A member acknowledges what its I/O thread took, all
 *    up to a number at once (a HEARTBEAT reply, PS_FLAG_REPL, q the last
 *    one, after each read: ps_repl_flush_acks); the numbers come one after
 *    the other, and a member that finds a gap stops (it lost a message).
 *  - The reply to a worker's mutation waits (ps_repl_hold) until every
 *    member of the current configuration acknowledged it; a member removed
 *    from the configuration is no longer waited for.  In sync mode every
 *    reply of an update thread waits until the members hold all that was
 *    forwarded before it (a pull may show a round that another worker's
 *    push closed: no worker sees a round the next primary could lack).
 *  - A member refuses a stream whose epoch is older than the one it holds,
 *    or that comes on another connection than the primary's hello: a
 *    deposed primary cannot have anything acknowledged.
 *  - Failure: a member silent for failure_timeout_ms (the primary sends
 *    heartbeats at a quarter of it), or whose connection closed, is taken
 *    as lost.  The primary then removes it from the configuration; a member
 *    that lost its primary promotes itself.  Both are compare-and-swaps on
 *    the configuration (server/repl_coord.h, a thread of its own): the
 *    loser reads what the winner wrote and follows it, or, when it is no
 *    longer a member, stops (exit 1: the supervisor replaces it).
 *  - A server that is not the primary answers a worker's request with
 *    PS_ENOTPRIMARY naming the primary it knows (`mb`) and the epoch
 *    (`ep`); libps moves there (client/client_route.c).
 *  - A process that starts for a slot its configuration does not list (a
 *    replacement) asks the primary for the group's state (REPL_JOIN): a
 *    snapshot of every update thread (the checkpoint views), then the
 *    stream; once it has loaded the snapshot it is added to the members.
 *
 * Every function runs on the I/O thread (the agent thread is behind
 * repl_coord.h); ps_repl owns its DEALERs and the held replies. */
#ifndef PS_REPL_H
#define PS_REPL_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ps_proto.h"
#include "updater_frames.h"

typedef struct ps_server ps_server;
typedef struct ps_repl ps_repl;

/* The roles of this server in its group. */
enum { PS_REPL_PRIMARY = 1, PS_REPL_MEMBER = 2, PS_REPL_JOINING = 3, PS_REPL_DEPOSED = 4 };

/* Start replication for s (its config has `group`): etcd, this process's
 * lease and claim, the role.  Blocks up to a few seconds (etcd).  0, or
 * PS_EINVAL (bad --group or --member), PS_EIO (etcd), PS_ESTATE; why says. */
int ps_repl_open(ps_server *s, ps_repl **out, char *why, size_t why_len);
/* Drop what is held, close the DEALERs (before the context), stop the
 * agent.  NULL is fine. */
void ps_repl_close(ps_repl *r);

int ps_repl_role(const ps_repl *r);
/* This server takes workers' requests: no replicas, or the primary. */
int ps_repl_serves(const ps_repl *r);

/* ---- the I/O loop ---- */

/* The sockets and descriptors to poll: up to PS_REPL_MAX_POLL items from
 * it[*n] on (the caller's array has room); *n grows by their count. */
#define PS_REPL_MAX_POLL 8
void ps_repl_poll_items(ps_repl *r, zmq_pollitem_t *it, int *n);
/* After the poll: what came on those items (it: the array, first: where
 * ps_repl_poll_items put them), then the timers (heartbeats, silence).  */
void ps_repl_dispatch(ps_repl *r, const zmq_pollitem_t *it, int first, int64_t now);
/* A member: acknowledge what came from the primary's stream so far (once
 * per round of the loop, after the ROUTER was read). */
void ps_repl_flush_acks(ps_repl *r);
/* The longest the loop may sleep (ms) before ps_repl_dispatch is due. */
long ps_repl_timeout_ms(const ps_repl *r, int64_t now);

/* ---- messages from the ROUTER ---- */

/* A worker's request (rank >= 0, not from the stream) reached a server
 * that does not serve: answer PS_ENOTPRIMARY naming the primary (f[0]: its
 * route). */
void ps_repl_not_primary(ps_repl *r, zmq_msg_t *id, const ps_header *h);
/* A message flagged PS_FLAG_REPL (f: route, header): 0 when it comes from
 * the primary's connection at the current epoch (take it as a worker's), or
 * a refusal was sent (-1). */
int ps_repl_accept(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h);
/* REPL_HELLO, REPL_LIVE, REPL_JOIN, REPL_SNAP (the handler of their rows). */
void ps_repl_on_message(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h);
/* The ROUTER connection on fd closed. */
void ps_repl_conn_gone(ps_repl *r, int fd);

/* ---- the primary's stream ---- */

/* The primary hands request h (frames f[2..nf-1], or in the worker's arena
 * at arena_bytes) to its update thread: send it on to the members.
 * Returns its stream number (the command's rseq: the owner tags its reply
 * with it, and ps_repl_hold holds the reply when members must acknowledge
 * it first), or 0 when it was not sent (no replicas, not the primary, not
 * a mutation).  f is not consumed (payloads are shared, not copied). */
uint64_t ps_repl_forward(ps_repl *r, const zmq_msg_t *f, int nf, const ps_header *h,
                         const void *arena_bytes);
/* The same for a message the I/O thread answers itself (TABLE, HYPER,
 * LEAVE): its reply is then held with ps_repl_hold_io. */
uint64_t ps_repl_forward_io(ps_repl *r, const ps_header *h);
/* The primary's stream: live worker rank's membership starts at step
 * (REPL_LIVE with c = 3). */
void ps_repl_forward_join(ps_repl *r, int rank, int64_t step);
/* A worker leaves (live 0) or comes back (1) to the live sets. */
void ps_repl_forward_live(ps_repl *r, int rank, int live);

/* A reply of an update thread tagged rseq (0: none): frames [identity,
 * header, payload?] (moved in when held).  tag and version: what the
 * checkpoint coordinator is then asked (PS_OUT_REPLY when nothing).  1: held
 * until the members acknowledged it (sync mode: everything forwarded so
 * far), released through srv_reply_out, or a member's own reply to the
 * stream (dropped: it acknowledges at receipt); 0: send it. */
int ps_repl_hold(ps_repl *r, uint64_t rseq, int tag, int64_t version, zmq_msg_t *f, int nf);
/* The same for a reply the I/O thread makes: [id, h]. */
int ps_repl_hold_io(ps_repl *r, uint64_t rseq, zmq_msg_t *id, const ps_header *h);

/* An update thread's snapshot part for a joining member (token: the ckpt
 * frame's, PS_REPL_SNAP_TOKEN set). */
#define PS_REPL_SNAP_TOKEN (1ull << 63)
void ps_repl_snap_part(ps_repl *r, int owner, ps_ckpt_frame *cf);
/* An update thread loaded its part of a snapshot (a joining member). */
void ps_repl_loaded(ps_repl *r, int owner, int rc);

/* ---- what operators see ---- */

/* One line: the role, epoch, members and each one's lag ("-" without
 * replicas). */
void ps_repl_describe(const ps_repl *r, char *out, size_t cap);
/* The figures the metrics show (server_metrics.h: role, epoch, counts,
 * each member's lag).  NULL r: none (role 0). */
struct ps_srv_io_figures;
void ps_repl_figures(const ps_repl *r, struct ps_srv_io_figures *f);
/* For STATS: the epoch and the most messages a member has not
 * acknowledged (0, 0 without replicas). */
void ps_repl_stats(const ps_repl *r, uint64_t *epoch, uint64_t *lag);
/* Member m's lag: stream messages sent and not yet acknowledged, and the
 * age of the oldest (ns); -1 when m is not a member this primary sends to. */
int64_t ps_repl_lag(const ps_repl *r, int m, int64_t now, int64_t *oldest_ns);

#endif
