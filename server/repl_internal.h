/* What the replicas' files share (server/repl.h has the contract):
 *   repl.c        roles, the configuration, failure detection, the members'
 *                 messages, open and close
 *   repl_stream.c the primary's stream to the members, the replies held for
 *                 it, the DEALERs, each member's lag
 *   repl_join.c   a replacement member: the snapshot it asks for, loads and
 *                 catches up from; the primary's side of it
 *   repl_coord.c  the agent thread between them and etcd
 * Only the repl*.c files include this; everything here runs on the I/O
 * thread. */
#ifndef PS_REPL_INTERNAL_H
#define PS_REPL_INTERNAL_H

#include <stdint.h>
#include <zmq.h>

#include "ps_group.h"
#include "ratelimit.h"
#include "repl.h"
#include "repl_coord.h"
#include "updater_frames.h"

/* What a change asked of etcd was for (the agent's tag). */
enum {
    REPL_CAS_PROMOTE = 1, /* this member becomes the primary */
    REPL_CAS_REMOVE,      /* the primary drops a lost member */
    REPL_CAS_ADD,         /* the primary adds a replacement that caught up */
    REPL_LOAD_HELLO,      /* a primary's hello names a later epoch */
    REPL_LOAD_REFRESH     /* the stream's epoch moved, or a member refused ours */
};
#define REPL_POLL_JOIN (-2)

/* Another member, as this server sees it. */
typedef struct repl_member {
    char ep[256];
    void *dealer;     /* the primary's stream to it (NULL: none) */
    int in_cfg;       /* a member of the configuration: replies wait for it */
    int joining;      /* a replacement catching up: gets the stream, not waited for */
    int asked;        /* the replacement's join is under way (repl_join.c) */
    int64_t heard_ns; /* when anything last came from it (0: never) */
    int64_t since_ns; /* when we began to expect it */
    uint64_t sent, acked;
    uint64_t acked_upto; /* every stream message up to it acknowledged */
} repl_member;

/* A reply held until the members acknowledged its stream message rseq. */
typedef struct held {
    uint64_t rseq;  /* 0: a free entry */
    unsigned need;  /* members (bits by slot) that have not acknowledged it */
    int have;       /* the reply is here: frames f[0..nf-1] */
    int tag;        /* then what the checkpoint coordinator is asked (PS_OUT_*) */
    int64_t version;
    int nf;
    zmq_msg_t f[3];
    int64_t t0;     /* when it was sent to the members */
} held;

/* A reply of sync mode, held until the members acknowledged every stream
 * message up to `upto` (all that came before the round it may show). */
typedef struct waited {
    struct waited *next;
    uint64_t upto;
    unsigned need;
    int tag;
    int64_t version;
    int nf;
    zmq_msg_t f[3];
    int64_t t0;
} waited;

/* A message kept while its sender's hello is checked. */
typedef struct repl_msg {
    struct repl_msg *next;
    int nf;
    zmq_msg_t f[PS_CMD_MAX_FRAMES];
} repl_msg;

/* A replacement's join, on both sides (repl_join.c). */
typedef struct repl_join repl_join;

struct ps_repl {
    ps_server *s;
    int g, me, n;        /* group (the server's rank), our slot, members */
    char job[128];
    int failure_ms;
    int64_t hb_ns;       /* the primary's heartbeats to the members */
    int role;            /* PS_REPL_* */
    uint64_t inc;        /* this process's incarnation: its etcd lease */
    ps_group_cfg cfg;    /* the configuration we act on */
    repl_member m[PS_GROUP_MAX_MEMBERS];
    ps_repl_coord *agent;
    int cas_busy;        /* REPL_CAS_* of ours in flight, 0 none */
    int load_busy;       /* a read in flight */
    int64_t cas_seen_ns; /* when the failure that asked for it was seen */
    char cas_why[200];
    ps_rlimit rl;
    uint64_t dealers_made; /* each DEALER's identity is its own */
    /* a member: the primary's connection (its REPL_HELLO's route and fd), the
     * last stream number taken from it, and an acknowledgement to send */
    zmq_msg_t pid;
    int have_pid, pfd;
    uint64_t recv_hi;
    int ack_due;
    int64_t p_heard_ns, p_since_ns, p_gone_ns;
    /* a hello of a later epoch, kept until etcd answers, and what came after
     * it on its connection */
    int pend_hello;
    zmq_msg_t pend_id, pend_hdr;
    ps_header pend_h;
    repl_msg *pq_head, *pq_tail;
    /* the primary: the stream's numbers and the replies held for them,
     * ring[q & (cap - 1)] for q in [base, rseq] */
    uint64_t rseq, base;
    held *ring;
    size_t cap, nheld;
    waited *wq_head, *wq_tail; /* sync mode: replies in the order they came */
    int64_t next_hb_ns;
    uint64_t unheld, member_errors, redirects;
    uint64_t snaps;      /* snapshots made for replacements */
    uint64_t promotions, caught_up;
    /* the poll items ps_repl_poll_items added: their member slots (-1 the
     * agent, REPL_POLL_JOIN the join's DEALER) */
    int poll_slot[PS_REPL_MAX_POLL];
    int npoll;
    void *join_dealer;   /* a replacement: to the primary */
    repl_join *join;
};

/* repl.c */
const char *repl_role_name(int role);

/* repl_stream.c */
void *repl_dealer(ps_repl *r, int slot, char *why, size_t why_len);
void repl_send(void *d, const ps_header *h, const zmq_msg_t *frames, int nframes);
int repl_open_member(ps_repl *r, int slot, int joining, int64_t now);
/* The primary's hello to member slot (its stream on that connection). */
void repl_send_hello(ps_repl *r, int slot);
/* Close the DEALER to member slot; it is no longer waited for or sent to. */
void repl_close_member(ps_repl *r, int slot);
/* Member slot acknowledged stream message q (its reply came), or every one
 * up to q. */
void repl_held_ack(ps_repl *r, uint64_t q, int slot);
void repl_held_ack_upto(ps_repl *r, uint64_t q, int slot);
/* Member slot is no longer waited for: what waited only for it goes out. */
void repl_held_drop_member(ps_repl *r, int slot);
/* Sync mode: send the held replies whose members acknowledged enough; with
 * late_ns, remove a member that leaves the oldest unacknowledged that long
 * while it answers. */
void repl_waited_release(ps_repl *r, int64_t now, int64_t late_ns);
/* Everything held is dropped, not sent (the workers resend to the next
 * primary). */
void repl_held_drop_all(ps_repl *r);

/* repl.c */
void repl_propose(ps_repl *r, const ps_group_cfg *next, int what, const char *why, int64_t seen);
void repl_remove(ps_repl *r, int slot, const char *why, int64_t seen);
void repl_apply(ps_repl *r, const ps_group_cfg *c, int64_t now);
void repl_pending_hello(ps_repl *r, int64_t now);
/* A message from the connection whose hello is being checked: kept (a
 * copy) for after it, 1; else 0. */
int repl_keep_pending(ps_repl *r, zmq_msg_t *f, int nf);
/* This server leaves its group (exit 1; why says why). */
void repl_step_down(ps_repl *r, const char *why);

/* repl_join.c: the replacement's side */
/* Start catching up (role JOINING at open): ask the primary. */
int repl_join_start(ps_repl *r, int64_t now, char *why, size_t why_len);
/* A stream message from the primary while joining: 0 take it now, -1
 * kept for after the snapshot (or refused). */
int repl_join_stream(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h);
/* What came on the DEALER to the primary. */
void repl_join_read(ps_repl *r, int64_t now);
/* REPL_JOIN (the primary's side) and REPL_SNAP (the replacement's). */
void repl_join_message(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h, int64_t now);
/* The primary: the replacement in slot went silent while joining. */
void repl_join_failed(ps_repl *r, int slot, const char *why);
/* Timers of a join on either side. */
void repl_join_timers(ps_repl *r, int64_t now);
void repl_join_close(ps_repl *r);

#endif
