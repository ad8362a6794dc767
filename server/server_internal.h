/* The state of a ps_server and what its I/O-thread files call in each
 * other (server.h has the picture).  Only the files below include this;
 * every function here runs on the I/O thread.  Calls go one way (open ->
 * loop -> dispatch -> messages -> io), never back:
 *   server_open.c  open and close
 *   server.c       the loop: io_pump, the owners' replies, checkpoints, stop
 *   server_dispatch.c  one ROUTER message: decode, check its type's row
 *                  (proto/ps_msg_table.h), to its handler
 *   server_msg.c   the handler of each type: answer, or hand to an owner
 *   server_io.c    what the loop and the messages both do: send on the
 *                  ROUTER, hand a command to an owner, mark stopping
 * membership.c (an elastic job's membership) runs on the I/O thread too.
 * The replicas' files (repl.c, repl_join.c: server/repl.h) include it too:
 * they run on the I/O thread and call the srv_ functions below. */
#ifndef PS_SERVER_INTERNAL_H
#define PS_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "admin.h"
#include "barrier.h"
#include "ckpt_coord.h"
#include "collective.h"
#include "hs_monitor.h"
#include "move.h"
#include "outbox.h"
#include "peers.h"
#include "ps_curve.h"
#include "ps_trace.h"
#include "ratelimit.h"
#include "repl.h"
#include "server.h"
#include "server_metrics.h"
#include "shm_table.h"
#include "stats_req.h"
#include "updater.h"
#include "workers.h"

/* ROUTER messages handled per poll round before looking at replies again. */
#define IO_BATCH 256

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

/* A table declared on this server: the first declaration (normalized), or
 * the checkpoint's. */
typedef struct srv_table {
    uint64_t key;
    ps_table_options decl;
    int restored;     /* from --restore: a worker's other declaration is refused naming
                         the checkpoint */
    ps_table_counts total; /* at stop: the counters of its partitions, summed */
    char name[PS_TABLE_NAME_MAX + 1]; /* for logs: a declaration's `nm`; "" none */
    ps_opt_config opt_now; /* its optimizer as it runs now (HYPER with its key) */
} srv_table;

/* ---- I/O thread state ---- */
struct ps_server {
    ps_server_config cfg;
    char bind[256], endpoint[256];
    void *ctx, *router;
    owner *own;
    size_t out_total;        /* messages waiting in every owner's outbox */
    int efd;
    _Atomic uint64_t mem_used;   /* chunks and large reply copies (--max-memory) */
    _Atomic uint64_t *worker_mem; /* per worker: the table rows it made (their share,
                                     --table-memory-per-worker) */
    _Atomic uint64_t copies;     /* of which reply copies */
    ps_peers *peers;             /* what each peer's unread replies hold */
    uint64_t model_fp;
    uint64_t tables_fp;      /* the first accepted worker's, or the restored tables' */
    ps_workers *workers;
    ps_barriers *barriers;
    ps_colls *colls;         /* ALLREDUCE and BROADCAST (on server 0) */
    uint8_t *left;           /* per rank: said LEAVE (join) and is out of the live sets */
    ps_opt_config opt_now;   /* the optimizer as HYPER changed it (cfg.opt: as started,
                                what hellos compare) */
    ps_stats_reqs *stats;
    ps_shm_table *shm;       /* the workers' arenas this server mapped */
    uint64_t io_errors, dropped;
    ps_rlimit rl;
    ps_stats totals;
    ps_admin *admin;         /* who may stop the server with a message */
    ps_rlimit rl_admin;      /* refused shutdowns: their own log budget */
    uint64_t shutdowns_refused;
    int threads_running, run_called, stopping, io_failed;
    /* options */
    char *timeline_path, *curve_dir, *ckpt_dir, *group, *coord, *job;
    ps_trace *trace;
    ps_curve_auth *auth;
    ps_hs_monitor *mon;      /* CURVE: handshakes the ZAP handler never sees */
    /* checkpoints */
    ps_ckpt_coord *ck;
    uint64_t mut;            /* inits and pushes forwarded to the owners */
    /* tables, in declaration order */
    srv_table *tables;
    size_t ntables, cap_tables;
    ps_srv_metrics *met;     /* --metrics-port (server_metrics.h); NULL: off */
    ps_repl *repl;           /* --group: replicas and failover (repl.h); NULL: off */
    /* exports: the snapshot session (export.h) */
    struct ps_export *exp;
    ps_move *move;           /* objects moved between servers (move.h) */
};

/* ---- server_io.c ---- */

/* Put [id, h] on the ROUTER (id is emptied). */
void srv_send(ps_server *s, zmq_msg_t *id, const ps_header *h);
/* The same with a payload frame after the header (moved; NULL: none). */
void srv_send_payload(ps_server *s, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload);
/* The same, as the ps_reply_to of barriers and stats requests (user: s). */
void srv_reply_hook(void *user, zmq_msg_t *id, const ps_header *h);
/* Hand [cmd, id?, payload?] to update thread `owner` (cmd copied; id and
 * payload moved; a cmd->shm reference goes with the frame). */
void srv_send_cmd(ps_server *s, int owner, const ps_cmd_frame *cmd, zmq_msg_t *id,
                  zmq_msg_t *payload);
/* The same with nframes (<= PS_CMD_MAX_FRAMES - 2) frames after the
 * identity, moved. */
void srv_send_cmd_frames(ps_server *s, int owner, const ps_cmd_frame *cmd, zmq_msg_t *id,
                         zmq_msg_t *frames, int nframes);
/* The table declared as `key`, or NULL. */
srv_table *srv_find_table(ps_server *s, uint64_t key);
/* Add a declared table (normalized here): its entry, or NULL when out of
 * memory. */
srv_table *srv_add_table(ps_server *s, uint64_t key, const ps_table_options *decl,
                         int restored);
/* "table 'emb_l.0' (key 92233...)" or "table 92233..." (no name) into buf. */
const char *srv_table_label(const srv_table *t, char *buf, size_t len);
/* What the update threads' table partitions are made with. */
ps_tparts_config srv_tparts_config(ps_server *s);
/* The tables' fingerprint of the tables declared here (a hello's `tfp`). */
uint64_t srv_tables_fp(const ps_server *s);
/* A reply for the ROUTER, frames [identity, header, payload?] (moved): held
 * by the checkpoint coordinator when tag (PS_OUT_HELD, _INIT, _ACK with
 * version) says it waits for a checkpoint, else sent now. */
void srv_reply_out(ps_server *s, int tag, int64_t version, zmq_msg_t *f, int nf);
/* Give update thread i what its outbox holds, as far as its PAIR takes it. */
void srv_flush_outbox(ps_server *s, int i);
/* No checkpoint is started by schedule from here on; one that completes is
 * written at once (the last one at stop). */
void srv_set_stopping(ps_server *s);

/* ---- server_msg.c: one handler per message type ---- */

/* Run the handler of h's type (a request the dispatch checked). */
void srv_handle(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
/* Rank r joins (live 1) or leaves (0) every owner's and the barriers' live
 * sets, and the group's stream says so. */
void srv_set_live(ps_server *s, int r, int live);
/* The connection a message came on (f[0] its route, f[1] its header), as
 * workers.h takes it; borrows f. */
ps_conn srv_conn_of(zmq_msg_t *f);

/* An ERROR reply to req (code, why), counted; srv_refuse also logs it
 * (rate-limited). */
void srv_refuse(ps_server *s, zmq_msg_t *id, const ps_header *req, int code, const char *why);
void srv_refuse_quiet(ps_server *s, zmq_msg_t *id, const ps_header *req, int code,
                      const char *why);

/* Apply --on-worker-loss to every worker silent for longer than the timeout. */
void srv_check_workers(ps_server *s, int64_t now);
/* Where the collectives (collective.h) send their answers. */
ps_coll_to srv_coll_to(ps_server *s);
/* This server's side of a hello: its config. */
ps_hello srv_my_hello(const ps_server *s);
/* The group's stream: worker `rank` leaves (0), comes back (1) or left (2,
 * a LEAVE) the live sets. */
void srv_stream_live(ps_server *s, int rank, int live);
/* membership.c: an elastic job (--num-workers MIN:MAX with MIN < MAX)? */
int srv_elastic(const ps_server_config *c);
/* At open, before any message: an elastic job's ranks out of the barriers'
 * and collectives' live sets, the barriers' MIN, the workers' table told. */
void srv_membership_open(ps_server *s);
/* Live worker rank's membership starts at step (a JOIN, or the group's
 * stream): every owner (PS_CMD_JOIN), the group's members, logged. */
void srv_stream_join(ps_server *s, int rank, int64_t step);
/* ---- server_dispatch.c: a ROUTER message to its handler ---- */

/* Handle message f (route, header, frames) as if it came on the ROUTER now
 * (replicas: what was kept while its sender's hello was checked). */
void srv_deliver(ps_server *s, zmq_msg_t *f, int nf);
/* A stream message a joining member kept (f: route, header, frames): handle
 * it now as it would have been (its sender was checked then). */
void srv_stream_dispatch(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
/* Read up to IO_BATCH messages from the ROUTER.  -1 on a socket error. */
int srv_read_router(ps_server *s);
/* Take the connection events that came (disconnects, handshake failures). */
void srv_read_monitor(ps_server *s);

/* ---- server.c ---- */

/* Stop the update threads; their final counters go into s->totals. */
void srv_stop_threads(ps_server *s);
/* What waits for a barrier or for counters gets PS_ECLOSED. */
void srv_close_waiters(ps_server *s);

/* ---- server_export.c: readers and exports ---- */

/* LOOKUP, SNAPSHOT, SNAPREAD (their rows of proto/ps_msg_table.h). */
void srv_on_lookup(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
void srv_on_snapshot(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
void srv_on_snapread(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
/* Update thread i's PS_OUT_SNAP. */
void srv_export_part(ps_server *s, int i, ps_snap_frame *sf);
/* Every pump round: an export's wait that ran out. */
void srv_export_tick(ps_server *s, int64_t now);

#endif
