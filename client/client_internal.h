/* libps internals: the client's shared state, and the parts each module
 * owns.  Only client/client*.c include this; the contract for callers is
 * include/ps_client.h.  Names here start with psc_ so they cannot clash
 * with a program that links libps.a.
 *
 * Modules, one job each, each with its header:
 *  client.c          the public API: options, open, close; posting
 *                    requests (training thread); blocking helpers
 *  client_start.c    registering tensors and starting: placement, the
 *                    hellos checked, tables declared (it shares
 *                    client_api_internal.h with client.c)
 *  client_requests.c a ps_request's life: parts, completion, waiting; the
 *                    sub-request slots that match replies to requests
 *  client_comm.c     the comm thread: the queue from the training thread,
 *                    sockets, receiving replies, held push_when ops, the
 *                    poll loop, closing
 *  client_send.c     the comm thread's sending: ops turned into messages,
 *                    a sub-request's header and payload; with
 *                    client_comm.c the only files that send (they share
 *                    client_comm_internal.h)
 *  client_resend.c   liveness: when to resend an unanswered sub-request
 *                    (with backoff), when heartbeats are due, when to give
 *                    up on a server silent past server_timeout_ms, and when
 *                    the comm thread must wake for them
 *  client_rejoin.c   whether to say hello again to a server that refused a
 *                    sub-request with PS_EHELLO (it dropped or forgot this
 *                    rank), and what waited on it, to resend once it took
 *                    us back
 *  client_token.c    the hello token each server gave (echoed in a later
 *                    hello) and the admin token of a shutdown
 *  client_shm.c      the same-host data plane: the arena and which servers
 *                    map it
 *  client_sparse.c   the tables' requests: duplicate ids removed, split by
 *                    (server, partition), rows written back in the caller's
 *                    order
 *  client_metrics.c  the Prometheus exporter a client asks for (metrics_port)
 *                    and the client's counters
 *  client_route.c    replicated servers: each group's members, which one is
 *                    the primary, when to move to another
 *  client_moved.c    servers added and removed while training goes on: which
 *                    server slot holds each moved object (a chunk, a table
 *                    partition) now, the slots added (their endpoints, whether
 *                    they took our hello) and removed; the comm loop asks it
 *                    where to send and tells it what PS_EMOVED replies say
 *  Calls go one way: client.c (client_start.c) -> client_comm.c
 *  (client_send.c) -> client_resend.c, client_rejoin.c and client_sparse.c
 *  -> client_requests.c (token, shm and moved call none of them).
 *  Resend and rejoin decide; the comm loop sends what they name.
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

#include <stddef.h>
#include <stdint.h>

#include "ps_client.h"
#include "ps_placement.h"
#include "ps_proto.h"

#define PSC_DEFAULT_CHUNK_BYTES (4u << 20)

/* A registered table: its key and declaration (normalized). */
typedef struct psc_table {
    uint64_t key;
    ps_table_options opts;
    char name[PS_TABLE_NAME_MAX + 1]; /* sent with its declaration ("" none) */
} psc_table;
#define PSC_DEFAULT_HELLO_MS 10000
#define PSC_ERRBUF 512

/* The client.  What every module reads is here; the rest is in parts, one
 * per module, declared in that module's header (or only in its .c), so a
 * file sees the members of the parts whose headers it includes. */
struct ps_client {
    /* Set by open, read-only afterwards (every thread reads them). */
    ps_client_options opt; /* servers, curve_dir, admin_token NULL: our copies
                              are below and in tokens */
    char *servers_str;
    char *curve_dir;       /* NULL: plaintext */
    char **endpoints;      /* into servers_str, checked by ps_endpoint_check */
    int nservers;
    size_t chunk_elems;

    /* The model (client_start.c): registered tensors, their placement, the hello
     * template.  Written by the training thread before start, read-only
     * afterwards; the comm thread reads place, specs, wire_dtype and
     * hello_req (the queue mutex orders them before its first op). */
    ps_tensor_spec *specs;
    size_t nspecs, cap_specs;
    ps_placement place;
    int have_place;
    uint64_t *kmap_keys;   /* open addressing: key -> tensor index + 1 */
    uint32_t *kmap_val;
    size_t kmap_mask;
    ps_hello hello_req;    /* template; server_rank filled per server */
    /* The tables (client.c): registered before start, read-only afterwards;
     * server_parts (per server: its partitions, from its hello reply) set by
     * start. */
    psc_table *tables;
    size_t ntables, cap_tables;
    uint32_t *server_parts;
    ps_opt_config hyper;   /* the change a HYPER request carries (ps_client_hyper, one
                              at a time; the queue mutex orders it before the comm
                              thread reads it) */
    uint64_t hyper_key;    /* the key it names: 0 the dense optimizer, else a table's
                              (ps_client_table_hyper) */
    uint32_t wire_dtype;   /* pushes' and pulls' payload frames (ps_client_set_wire_dtype) */
    /* Set once by start when every server answered its hello (atomic: the
     * comm thread reads it): from then on heartbeats go, silent servers are
     * given up on, and refusals lead to rejoins. */
    int started;
    /* The training thread's, except that the comm thread writes why its
     * sockets failed before start is told so. */
    char last_error[PSC_ERRBUF];

    /* The parts (each made by open, freed by close, unless said). */
    struct psc_comm *comm;      /* client_comm.c: the queue from the training
                                   thread (mutex); sockets and the loop's
                                   state (comm thread) */
    struct psc_waits *waits;    /* client_requests.c: completions (any thread) */
    struct psc_slots *slots;    /* client_requests.h: sub-requests in flight
                                   (comm thread) */
    struct psc_liveness *live;  /* client_resend.c: resend, heartbeat and
                                   silence clocks (comm thread) */
    struct psc_rejoin **rejoin; /* client_rejoin.c: hellos again, per server
                                   slot (comm thread) */
    int nrejoin;
    struct psc_tokens *tokens;  /* client_token.c: hello tokens (comm thread);
                                   the admin token (read-only) */
    struct psc_shm *shm;        /* client_shm.c: made by start (training
                                   thread), read by the comm thread; NULL
                                   before */
    struct psc_sparse *sparse;  /* client_sparse.c: its scratch (comm
                                   thread); made on first use */
    struct psc_metrics *metrics;/* client_metrics.c: the registry, its exporter and
                                   the client's counters; NULL with metrics off */
    struct psc_route *route;    /* client_route.c: each server group's members and
                                   the one libps talks to (comm thread after start) */
    struct psc_moved *moved;    /* client_moved.c: where moved objects are, the
                                   server slots added and removed (comm thread) */
    int moved_any;              /* client_moved.c's (comm thread): 1 once an object
                                   moved or a slot was added or removed; until then
                                   requests go to their homes without a look-up */
};

#endif
