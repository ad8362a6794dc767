/* libps: a request's life and the sub-request slots (client_requests.c).
 *
 * Completion (c->waits, opaque) is any thread's: the comm thread and
 * ZeroMQ's I/O thread complete parts, any thread waits.  The slot table
 * (c->slots) is the comm thread's alone: no lock. */
#ifndef PS_CLIENT_REQUESTS_H
#define PS_CLIENT_REQUESTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "client_internal.h"

#define PSC_NO_SLOT UINT32_MAX

/* What a sparse request's slots share (client_sparse.c): where its pulled
 * rows go.  One block with its arrays after it; the last slot freed frees
 * it. */
typedef struct psc_sparse_op {
    int refs;        /* slots that point at it */
    uint32_t dim;
    float *dst;      /* the caller's rows: a row per position of its pulled ids */
    int64_t *first;  /* per unique pulled id: its first position, -1 none */
    int64_t *next;   /* per position: the next with the same id, -1 none */
} psc_sparse_op;

/* What one sparse slot sends (client_sparse.c): one block with its arrays
 * after it, freed with the slot. */
typedef struct psc_sparse_sub {
    psc_sparse_op *op;  /* the pull's scatter; NULL: nothing pulled */
    uint32_t table;     /* in c->tables */
    int versioned;      /* its reply's version counts in the request's (a pushpull's
                           acknowledgements of pushes alone do not) */
    size_t npush, npull;
    uint64_t *push_ids; /* npush ids */
    float *rows;        /* their npush x dim gradient rows (float32) */
    uint64_t *pull_ids; /* npull ids */
    uint32_t *pull_u;   /* each one's unique index in op */
    /* same host: its block of the arena's stage (blk_len 0: none), how many
     * times it went through it, and whether a reply came (the server is
     * done with the block: it is given back then, unless a resend of it may
     * still be on its way) */
    uint64_t blk_off, blk_len;
    uint32_t shm_sends;
    int answered;
} psc_sparse_sub;

/* One message in flight to one server.  Indexed by the low 32 bits of the
 * request id; the high 32 bits are the slot's generation, so a reply to a
 * slot that was freed (a duplicate after a resend) is recognised and dropped. */
typedef struct psc_sub {
    /* the slot table's */
    ps_request *req; /* NULL when the slot is free */
    uint32_t gen;
    uint32_t next_free;
    /* the message: psc_slot_new sets type and server, client_send.c the rest */
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
    void *out;       /* HELLO: ps_hello reply; STATS: psc_stats_out */
    psc_sparse_sub *sp; /* SPULL, SPUSH, SPUSHPULL: what it sends; NULL otherwise */
    void *own;       /* LOOKUP: what it sends and where its rows go (client_read.c),
                        one block freed with the slot; NULL otherwise */
    /* client_resend.c's: when to resend, when resending is on */
    int64_t deadline_ns;
    int64_t backoff_ns;
    /* client_rejoin.c's */
    int parked;      /* refused with PS_EHELLO: waits for the rejoin of its server */
    /* what it is about, for one that follows its object when that moves
     * (client_moved.h); set by whoever makes the slot */
    int obj_kind;    /* PSC_OBJ_*: NONE (0) for control messages */
    int home;        /* its object's home server: the placement's, the partition's */
    uint32_t obj;    /* the chunk's flat index, the partition's flat home index */
    uint32_t obj_table; /* a partition's table (PSC_ALL_TABLES: a lookup of several) */
    /* the comm loop's, following PS_EMOVED replies */
    uint32_t hops;   /* redirects to another slot followed */
    uint32_t loads;  /* "on its way to this slot" answers in a row */
    int64_t load_since_ns; /* the first of them */
    int retry;       /* client_resend.c's: a delayed retry is due at deadline_ns */
} psc_sub;

/* What waits on one server. */
typedef struct psc_slot_server {
    uint32_t nlive;          /* live slots to it */
    int64_t busy_since_ns;   /* when nlive last became non-zero */
} psc_slot_server;

/* The slot table (comm thread only). */
struct psc_slots {
    psc_sub *sub;            /* sub[i]: slot i, live or free */
    uint32_t n, cap;         /* slots made; room for */
    uint32_t free_head;      /* the free slots, linked by next_free */
    uint32_t live;           /* live slots */
    psc_slot_server *server; /* per server slot, nserver of them */
    int nserver;
    /* frees a slot's sparse part (client_sparse.c's psc_sparse_sub_free,
     * handed in at open: the slot table sits below the sparse requests) */
    void (*sp_free)(ps_client *c, psc_sparse_sub *sp);
};

/* Open (c->nservers set): completions and the slot table, whose slots'
 * sparse parts sp_free frees.  0 or PS_ENOMEM. */
int psc_requests_new(ps_client *c, void (*sp_free)(ps_client *c, psc_sparse_sub *sp));
/* Close, once nothing completes a request any more. */
void psc_requests_free(ps_client *c);

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
/* Comm thread: complete r, which will never be sent, at once, whatever
 * parts it waits for: with PS_ECLOSED unless an error is set already. */
void psc_req_unsent(ps_client *c, ps_request *r);
/* The free function of a zero-copy payload frame whose hint is its request:
 * counts the release as one part of it (ZeroMQ's I/O thread, or the comm
 * thread when a send fails). */
void psc_release_cb(void *data, void *hint);
/* Wait for r until deadline_ns (INT64_MAX: forever); 1 when done. */
int psc_wait_until(ps_request *r, int64_t deadline_ns);

/* Comm thread: sub-request slots. */
/* A new slot for a `type` message of r to `server`; its other fields are
 * zero (step, out ...) or unset (deadline_ns INT64_MAX); PSC_NO_SLOT when
 * out of memory. */
uint32_t psc_slot_new(ps_client *c, int server, uint32_t type, ps_request *r);
/* The request id of slot i (the header's seq). */
uint64_t psc_slot_id(const ps_client *c, uint32_t i);
/* The live slot that a reply with request id `seq` from `server` answers;
 * PSC_NO_SLOT when there is none (already complete, or not ours). */
uint32_t psc_slot_find(const ps_client *c, uint64_t seq, int server);
/* Free slot i and count the reply part of its request as done (any error
 * was set before). */
void psc_slot_finish(ps_client *c, uint32_t i);
/* Free slot i, which was never sent and counts for nothing in its request. */
void psc_slot_drop(ps_client *c, uint32_t i);
/* Slot i waits on server slot `to` from now on (its object moved there). */
void psc_slot_move(ps_client *c, uint32_t i, int to);
/* Room for nslots server slots (client_moved.h): 0 or PS_ENOMEM. */
int psc_requests_grow(ps_client *c, int nslots);

#endif
