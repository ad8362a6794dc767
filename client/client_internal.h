/* libps internals: the client's state and what its modules call in each
 * other.  Only client/client*.c include this; the contract for callers is
 * include/ps_client.h.  Names here start with psc_ so they cannot clash
 * with a program that links libps.a.
 *
 * Modules, one job each:
 *  client.c          the public API: options, open, register, start, close;
 *                    posting requests (training thread); blocking helpers
 *  client_requests.c a ps_request's life: parts, completion, waiting; the
 *                    sub-request slots that match replies to requests
 *  client_comm.c     the comm thread: the queue from the training thread,
 *                    sockets, sending a sub-request, receiving replies, held
 *                    push_when ops, the poll loop, closing
 *  client_resend.c   liveness: resending unanswered sub-requests with
 *                    backoff, heartbeats, giving up on a server silent past
 *                    server_timeout_ms, and when the comm thread must wake
 *                    for them
 *  client_rejoin.c   saying hello again to a server that refused a
 *                    sub-request with PS_EHELLO (it dropped or forgot this
 *                    rank), then resending what waited on it
 *  client_token.c    the hello token each server gave (echoed in a later
 *                    hello) and the admin token of a shutdown
 *
 * Threads:
 *  - the training thread posts operations (one per API call) into a
 *    mutex-protected queue and kicks an eventfd;
 *  - the comm thread (one per client) owns every socket: it creates one DEALER
 *    per server, turns each operation into one sub-request per chunk, sends
 *    them, matches replies to sub-requests by request id and completes the
 *    caller's ps_request;
 *  - ZeroMQ's I/O thread calls psc_release_cb when it no longer needs a
 *    zero-copy payload frame;
 *  - ps_client_interrupt (any thread, or a signal handler) sets interrupted
 *    and kicks the eventfd: the comm thread then fails everything, closes
 *    the sockets and ends, as when closing.
 *
 * A ps_request's _priv.pending counts what must still happen before the
 * caller may touch its buffers again: one per chunk reply, plus one per
 * zero-copy frame not yet released.  Whoever takes it to zero (comm thread or
 * I/O thread) marks the request done and wakes waiters.  The public results
 * (status, err, version) are written by the comm thread only, before its own
 * decrement, so a waiter that sees done sees them. */
#ifndef PS_CLIENT_INTERNAL_H
#define PS_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_placement.h"
#include "ps_proto.h"
#include "ps_shm.h"

#define PSC_DEFAULT_CHUNK_BYTES (4u << 20)
#define PSC_DEFAULT_HELLO_MS 10000
/* Request id of heartbeats: never a slot's (generations start at 1), so their
 * replies are recognised and dropped. */
#define PSC_HEARTBEAT_SEQ 0
#define PSC_ERRBUF 512
#define PSC_NO_SLOT UINT32_MAX

/* An operation posted by the training thread.  type 0 is a cancel: fail every
 * sub-request of `req` with code `step` (used when start gives up waiting). */
typedef struct psc_op {
    uint32_t type;    /* PS_MSG_*, or 0 for cancel */
    int server;       /* control messages: the target server */
    uint32_t tensor;  /* data messages: index in the placement */
    const float *src; /* init/push/pushpull payload (read in place) */
    float *dst;       /* pull/pushpull destination */
    int64_t step;
    ps_request *req;
    void *out;        /* HELLO: ps_hello reply; STATS: psc_stats_out */
    ps_ready_fn ready;/* push_when: send once ready(ready_arg) != 0 */
    void *ready_arg;
    int npush;        /* push: how many gradients src sums (ps_client_push_sum) */
} psc_op;

/* Where a STATS reply goes (psc_op.out of a STATS op); either may be NULL. */
typedef struct psc_stats_out {
    ps_stats *stats;
    ps_barrier_info *barrier;
} psc_stats_out;

/* One message in flight to one server.  Indexed by the low 32 bits of the
 * request id; the high 32 bits are the slot's generation, so a reply to a
 * slot that was freed (a duplicate after a resend) is recognised and dropped. */
typedef struct psc_sub {
    ps_request *req; /* NULL when the slot is free */
    uint32_t gen;
    uint32_t next_free;
    uint32_t type;
    int server;
    uint32_t chunk;
    uint64_t key;
    size_t count;    /* elements in the payload / expected reply */
    uint64_t total;  /* INIT: elements of the whole tensor */
    const float *src;
    float *dst;
    int64_t step;
    uint32_t npush;  /* push: gradients summed in the payload (1 usually) */
    void *out;
    int64_t deadline_ns; /* resend time, when resending is on */
    int64_t backoff_ns;
    int parked;      /* refused with PS_EHELLO: waits for the rejoin of its server */
} psc_sub;

/* The comm thread's view of one server. */
typedef struct psc_server {
    uint32_t nlive;        /* live sub-requests to it */
    int64_t heard_ns;      /* when anything last came from it (0: never) */
    int64_t quiet_from_ns; /* silence counts from max(heard_ns, this): when
                              nlive became non-zero, or the process resumed
                              after a pause */
    /* rejoin (client_rejoin.c) */
    int rejoining;         /* a hello of ours to it is in flight */
    int rejoins;           /* rejoins since a request of ours was last served */
    ps_request rj_req;     /* the rejoin hello's request, libps's own */
    ps_hello rj_reply;
} psc_server;

struct ps_client {
    /* set by open, read-only afterwards (both threads read them) */
    ps_client_options opt; /* servers and curve_dir NULL: our copies below */
    char *servers_str;
    char *curve_dir;       /* NULL: plaintext */
    char **endpoints;      /* into servers_str, checked by ps_endpoint_check */
    int nservers;
    size_t chunk_elems;

    /* registration and placement: written by the training thread before
     * start, read-only afterwards (the queue mutex orders it for the comm
     * thread) */
    ps_tensor_spec *specs;
    size_t nspecs, cap_specs;
    ps_placement place;
    int have_place;
    uint64_t *kmap_keys; /* open addressing: key -> tensor index + 1 */
    uint32_t *kmap_val;
    size_t kmap_mask;
    ps_hello hello_req;  /* template; server_rank filled per server */
    uint32_t wire_dtype; /* pushes' and pulls' payload frames (ps_client_set_wire_dtype) */
    char *admin_token;   /* copy of opt.admin_token, or NULL */
    uint64_t *hello_tokens; /* per server: the token its hello reply gave (comm thread) */
    int started;
    /* the same-host data plane (client_shm.c): set up by start, read-only
     * afterwards (the comm thread reads them) */
    ps_shm_arena arena;  /* base NULL: none */
    unsigned char *shm_on; /* per server: its payloads go through the arena */
    int shm_servers;
    /* the training thread's, except that the comm thread writes why the
     * sockets failed before it publishes ready = -1 */
    char last_error[PSC_ERRBUF];

    /* training thread -> comm thread (client_comm.c) */
    pthread_mutex_t qmu;
    psc_op *queue;
    size_t qhead, qlen, qcap; /* ring buffer */
    int stopping;
    int efd;

    /* completions (client_requests.c) */
    pthread_mutex_t done_mu;
    pthread_cond_t done_cv;
    int nwaiters; /* threads in psc_wait_until (atomic) */

    /* the comm thread's own, apart from ready */
    void *zctx;
    pthread_t thread;
    int thread_started;
    int ready; /* 1 sockets up, -1 failed; guarded by done_mu */
    void **socks;
    psc_sub *subs;
    uint32_t nsubs, cap_subs, free_head, live;
    psc_op *batch;
    size_t batch_cap;
    /* ops held behind a push_when whose data is not ready yet, in post order */
    psc_op *held;
    size_t held_head, held_len, held_cap;
    int64_t next_resend_check;
    int hb_on;           /* set by start (atomic): heartbeats may go, silent
                            servers are given up on, refusals lead to rejoins */
    int64_t next_hb_ns;  /* when the next heartbeats are due */
    psc_server *srv;     /* per server, nservers of them */
    zmq_pollitem_t *poll_items; /* the loop's: one per socket, then the eventfd */
    int64_t wake_by_ns;  /* the latest the poll should have returned (pause check) */

    /* ps_client_interrupt (atomic, any thread or a signal handler): the comm
     * thread fails everything and ends, as when closing */
    int interrupted;
};

/* ---- client_requests.c: a request's life ---- */

/* Training thread, before posting r: it completes after `pending` parts. */
void psc_req_reset(ps_client *c, ps_request *r, int pending);
/* Training thread: complete r at once with code and text (a post that
 * failed); r was never handed to the comm thread. */
void psc_req_fail(ps_request *r, int code, const char *text);
/* Comm thread only; the first error wins. */
void psc_set_error(ps_request *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One part of r finished.  After this call the caller must not touch r. */
void psc_part_done(ps_client *c, ps_request *r);
/* Comm thread: complete an op that will never be sent, with PS_ECLOSED
 * unless an error is set already (cancels are ignored). */
void psc_fail_unsent(ps_client *c, const psc_op *o);
/* The free function of a zero-copy payload frame whose hint is its request:
 * counts the release as one part of it (ZeroMQ's I/O thread, or the comm
 * thread when a send fails). */
void psc_release_cb(void *data, void *hint);
/* Wait for r until deadline_ns (INT64_MAX: forever); 1 when done. */
int psc_wait_until(ps_request *r, int64_t deadline_ns);

/* Comm thread: sub-request slots. */
/* A new slot for one message of op o to `server`, with o's request, type,
 * step and out; PSC_NO_SLOT when out of memory. */
uint32_t psc_slot_new(ps_client *c, const psc_op *o, int server);
/* The request id of slot i (the header's seq). */
uint64_t psc_slot_id(const ps_client *c, uint32_t i);
/* The live slot that a reply with request id `seq` from `server` answers;
 * PSC_NO_SLOT when there is none (already complete, or not ours). */
uint32_t psc_slot_find(const ps_client *c, uint64_t seq, int server);
/* Free slot i and count the reply part of its request as done (any error
 * was set before). */
void psc_slot_finish(ps_client *c, uint32_t i);

/* ---- client_comm.c: the comm thread ---- */

/* Start the comm thread and wait until its sockets are up: 0, or a PS_E*
 * code with the reason in c->last_error (the thread has ended then). */
int psc_comm_start(ps_client *c);
/* Training thread: stop the comm thread (what is queued or in flight
 * completes with PS_ECLOSED) and join it. */
void psc_comm_stop(ps_client *c);
/* Training thread: queue an op for the comm thread; PS_ECLOSED once
 * stopping, PS_ENOMEM. */
int psc_post(ps_client *c, const psc_op *o);
/* Wake the comm thread. */
void psc_kick(ps_client *c);
/* Comm thread: send sub-request i (first time or a resend).  The caller has
 * already counted the payload's release in its request's pending.  On
 * failure the sub-request is finished with the error. */
void psc_sub_send(ps_client *c, uint32_t i);
/* Send one frame without blocking (EINTR retried): 0, or -1 with errno. */
int psc_zsend(void *sock, const void *buf, size_t len, int flags);
/* Close the socket of server s and connect a new one: ZeroMQ drops what it
 * still queued for s, releasing those payloads, so requests given up on can
 * complete; a server that comes back later gets a fresh connection. */
void psc_socket_reset(ps_client *c, int s);

/* ---- client_shm.c: the same-host data plane ---- */

/* Training thread, in start before the hellos: create the arena (options.shm)
 * and name it in the hello template.  A failure is logged and the client
 * goes on without one.  0, or PS_ENOMEM. */
int psc_shm_setup(ps_client *c);
/* Server s answered a hello with rep: note whether its payloads go through
 * the arena, and log which path they take. */
void psc_shm_hello_reply(ps_client *c, int s, const ps_hello *rep);
/* Comm thread: does sub-request i's payload (push, init) or destination
 * (pull) lie in the arena, for a server that maps it?  Then *off is where
 * (a pushpull: both, the gradient at *off, the destination at *dst_off). */
int psc_shm_use(const ps_client *c, const psc_sub *s, uint64_t *off, uint64_t *dst_off);
/* Unmap and unlink the arena (after the comm thread stopped). */
void psc_shm_close(ps_client *c);

/* ---- client_token.c: what a request proves (comm thread) ---- */

/* Put into h, a request to `server`, the token it needs: a hello the token
 * that server's last hello reply gave this worker (so it knows a hello again
 * comes from the same worker, not from another process taking its rank); a
 * shutdown the admin token of the options. */
void psc_tokens_fill(const ps_client *c, int server, ps_header *h);
/* A hello reply from `server`: keep the token it gives for later hellos. */
void psc_tokens_keep(ps_client *c, int server, const ps_hello *reply);

/* ---- client_resend.c: resends and heartbeats (comm thread) ---- */

/* Slot i was just sent: when resending is on, set when to resend it. */
void psc_resend_arm(ps_client *c, uint32_t i);
/* Resend every sub-request whose deadline has passed, doubling its backoff. */
void psc_resend_due(ps_client *c, int64_t now);
/* Something came from server s at now. */
void psc_server_heard(ps_client *c, int s, int64_t now);
/* Fail the sub-requests of every server that has been silent for longer than
 * server_timeout_ms while they waited (PS_ETIMEDOUT, logged once per server
 * and episode).  First psc_pause_check. */
void psc_server_timeout_due(ps_client *c, int64_t now);
/* The loop is at now; its poll was due back by c->wake_by_ns.  Much later
 * means the process was stopped (SIGSTOP, a suspended VM): silence is
 * counted afresh from now, so a resumed worker does not give up on servers
 * whose replies are still on their way. */
void psc_pause_check(ps_client *c, int64_t now);
/* Send the heartbeats when they are due. */
void psc_heartbeat_due(ps_client *c, int64_t now);
/* How long the poll may sleep before resends or heartbeats are due: ms, or
 * -1 when nothing is due. */
long psc_liveness_timeout_ms(const ps_client *c, int64_t now);

/* ---- client_rejoin.c: hello again after PS_EHELLO (comm thread) ---- */

/* Sub-request i was refused with PS_EHELLO (its server dropped or forgot
 * this rank): park it and say hello again to its server, unless a hello is
 * already on its way; once that is answered the parked sub-requests are
 * resent.  0 when parked; -1 when the caller should fail it instead (before
 * start, or the server kept refusing us right after each hello). */
int psc_rejoin_refused(ps_client *c, uint32_t i, const ps_header *h);
/* A heartbeat of ours was refused with PS_EHELLO: say hello again to
 * `server` now, before a request runs into the refusal. */
void psc_rejoin_heartbeat_refused(ps_client *c, int server, const ps_header *h);
/* A reply of server `server` to one of our requests was served: the rank
 * is live there. */
void psc_rejoin_served(ps_client *c, int server);
/* Sub-request i is a rejoin hello: take its reply h (NULL: it failed with
 * the error already set on its request) and finish the slot.  1 when i was
 * one (handled), 0 otherwise. */
int psc_rejoin_reply(ps_client *c, uint32_t i, const ps_header *h);

#endif
