#include "peers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_hash.h"
#include "ps_log.h"
#include "ps_malloc.h"
#include "ps_time.h"
#include "ratelimit.h"

#define MAX_PEERS 65536
#define IDLE_NS 60000000000LL  /* a peer unheard of this long that holds nothing goes */
#define RELEASE_BYTES (32LL << 20) /* a peer gone that had pinned this much: trim the heap */
#define QUIET_NS 10000000000LL /* one refusal line per peer per 10 s */

struct ps_peer {
    /* dropped by the free callback of a counted payload, on any thread */
    _Atomic int64_t replies, bytes;
    /* the I/O thread's */
    unsigned char id[256];
    size_t id_len;
    uint64_t hash;
    int fd;              /* its connection's socket, -1 unknown */
    int gone;            /* the connection closed */
    int64_t last_ns;     /* last payload admitted or counted */
    int64_t peak_bytes;  /* the most it held unread at once (I/O thread's view) */
    uint64_t unlogged;   /* refusals since its last line */
    int64_t logged_ns;
};

struct ps_peers {
    uint64_t max_replies, max_bytes;
    _Atomic uint64_t *mem_used, *copies;
    ps_peer **slot; /* open addressing, linear probing, cap a power of two */
    size_t cap, n;
    uint64_t refused;
    ps_rlimit rl;
    int64_t now; /* as of the last sweep: a coarse clock, read on the hot path for free */
};

/* The frame that takes a counted payload's place: the payload itself is kept
 * in `orig` until ZeroMQ is done with this one. */
typedef struct ticket {
    zmq_msg_t orig;
    ps_peer *peer;
    int64_t bytes;
} ticket;

static uint64_t id_hash(const void *id, size_t n) { return ps_fnv1a(PS_FNV1A_BASIS, id, n); }

int ps_peers_create(uint64_t max_replies, uint64_t max_bytes, _Atomic uint64_t *mem_used,
                    _Atomic uint64_t *copies, ps_peers **out)
{
    *out = NULL;
    ps_peers *p = calloc(1, sizeof *p);
    if (!p || !(p->slot = calloc(64, sizeof *p->slot))) {
        free(p);
        return PS_ENOMEM;
    }
    p->cap = 64;
    p->max_replies = max_replies;
    p->max_bytes = max_bytes;
    p->mem_used = mem_used;
    p->copies = copies;
    p->now = ps_now_ns();
    *out = p;
    return 0;
}

void ps_peers_destroy(ps_peers *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->cap; i++)
        free(p->slot[i]);
    free(p->slot);
    free(p);
}

static size_t slot_of(const ps_peers *p, const void *id, size_t n, uint64_t h)
{
    size_t i = h & (p->cap - 1);
    while (p->slot[i] && !(p->slot[i]->hash == h && p->slot[i]->id_len == n &&
                           memcmp(p->slot[i]->id, id, n) == 0))
        i = (i + 1) & (p->cap - 1);
    return i;
}

static int grow(ps_peers *p)
{
    size_t ncap = p->cap * 2;
    ps_peer **ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -1;
    for (size_t j = 0; j < p->cap; j++) {
        ps_peer *e = p->slot[j];
        if (!e)
            continue;
        size_t i = e->hash & (ncap - 1);
        while (ns[i])
            i = (i + 1) & (ncap - 1);
        ns[i] = e;
    }
    free(p->slot);
    p->slot = ns;
    p->cap = ncap;
    return 0;
}

/* The peer of identity id, added (fd: its socket, -1 unknown) when new.
 * NULL when out of memory or too many. */
static ps_peer *find_add(ps_peers *p, const zmq_msg_t *idm, int fd)
{
    const void *id = zmq_msg_data((zmq_msg_t *)idm);
    size_t n = zmq_msg_size((zmq_msg_t *)idm);
    if (n > sizeof p->slot[0]->id)
        n = sizeof p->slot[0]->id;
    uint64_t h = id_hash(id, n);
    size_t i = slot_of(p, id, n, h);
    if (p->slot[i]) {
        if (fd >= 0)
            p->slot[i]->fd = fd;
        return p->slot[i];
    }
    if (p->n >= MAX_PEERS)
        return NULL;
    if ((p->n + 1) * 2 > p->cap) {
        if (grow(p) != 0)
            return NULL;
        i = slot_of(p, id, n, h);
    }
    ps_peer *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    memcpy(e->id, id, n);
    e->id_len = n;
    e->hash = h;
    e->fd = fd;
    atomic_init(&e->replies, 0);
    atomic_init(&e->bytes, 0);
    p->slot[i] = e;
    p->n++;
    return e;
}

static uint64_t byte_limit(const ps_peers *p)
{
    if (p->max_bytes)
        return p->max_bytes;
    uint64_t used = atomic_load_explicit(p->mem_used, memory_order_relaxed);
    uint64_t cp = atomic_load_explicit(p->copies, memory_order_relaxed);
    uint64_t chunks = used > cp ? used - cp : 0;
    return 2 * chunks > PS_PEERS_MIN_BYTES ? 2 * chunks : PS_PEERS_MIN_BYTES;
}

uint64_t ps_peers_byte_limit(const ps_peers *p) { return byte_limit(p); }

int ps_peers_admit(ps_peers *p, const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *why,
                   size_t why_len)
{
    ps_peer *e = find_add(p, id, frame ? zmq_msg_get(frame, ZMQ_SRCFD) : -1);
    if (!e) {
        p->refused++;
        ps_errorf(why, why_len, "the server counts the unread replies of %d connections at "
            "most, and has no room for this one's", MAX_PEERS);
        return PS_ENOMEM;
    }
    e->last_ns = p->now;
    int64_t r = atomic_load_explicit(&e->replies, memory_order_relaxed);
    int64_t b = atomic_load_explicit(&e->bytes, memory_order_relaxed);
    uint64_t lim = byte_limit(p);
    if ((uint64_t)r < p->max_replies && (uint64_t)b < lim)
        return 0;
    p->refused++;
    double mib = (double)b / 1048576.0, lim_mib = (double)lim / 1048576.0;
    ps_errorf(why, why_len, "this connection has %lld replies (%.1f MiB) it has not read; the "
        "server answers more pulls once it reads them (limits: %llu replies, %.1f MiB)",
        (long long)r, mib, (unsigned long long)p->max_replies, lim_mib);
    int64_t now = ps_now_ns();
    if (now - e->logged_ns >= QUIET_NS && ps_rlimit_allow(&p->rl)) {
        char more[64] = "", who[256];
        ps_peer_name(id, frame, rank, who, sizeof who);
        if (e->unlogged)
            snprintf(more, sizeof more, " (%llu more refusals since the last line)",
                     (unsigned long long)e->unlogged);
        ps_warn("%s has %lld replies (%.1f MiB) it has not read: refusing its pulls until it "
                "reads them (limits --max-peer-replies %llu, --max-peer-bytes %.1f MiB)%s", who,
                (long long)r, mib, (unsigned long long)p->max_replies, lim_mib, more);
        e->logged_ns = now;
        e->unlogged = 0;
    } else {
        e->unlogged++;
    }
    return PS_ETOOBIG;
}

/* ZeroMQ is done with a counted payload: any thread. */
static void ticket_free(void *data, void *hint)
{
    (void)data;
    ticket *t = hint;
    ps_peer *e = t->peer;
    zmq_msg_close(&t->orig); /* the weight buffer's pin, or the copy, goes */
    atomic_fetch_sub_explicit(&e->bytes, t->bytes, memory_order_relaxed);
    free(t);
    /* last: from here on the I/O thread may free e */
    atomic_fetch_sub_explicit(&e->replies, 1, memory_order_release);
}

void ps_peers_count(ps_peers *p, const zmq_msg_t *id, zmq_msg_t *payload)
{
    ps_peer *e = find_add(p, id, -1);
    ticket *t = e ? malloc(sizeof *t) : NULL;
    if (!t)
        return;
    size_t n = zmq_msg_size(payload);
    zmq_msg_init(&t->orig);
    zmq_msg_move(&t->orig, payload);
    t->peer = e;
    t->bytes = (int64_t)n;
    atomic_fetch_add_explicit(&e->replies, 1, memory_order_relaxed);
    int64_t held = atomic_fetch_add_explicit(&e->bytes, (int64_t)n, memory_order_relaxed) +
                   (int64_t)n;
    if (held > e->peak_bytes)
        e->peak_bytes = held;
    e->last_ns = p->now;
    if (zmq_msg_init_data(payload, zmq_msg_data(&t->orig), n, ticket_free, t) != 0) {
        atomic_fetch_sub(&e->bytes, (int64_t)n);
        atomic_fetch_sub(&e->replies, 1);
        zmq_msg_init(payload);
        zmq_msg_move(payload, &t->orig);
        free(t);
    }
}

void ps_peers_gone(ps_peers *p, int fd)
{
    for (size_t i = 0; fd >= 0 && i < p->cap; i++)
        if (p->slot[i] && p->slot[i]->fd == fd)
            p->slot[i]->gone = 1;
}

/* Take slot i out, moving later entries of its probe run back into place. */
static void remove_at(ps_peers *p, size_t i)
{
    free(p->slot[i]);
    p->slot[i] = NULL;
    p->n--;
    for (size_t j = (i + 1) & (p->cap - 1); p->slot[j]; j = (j + 1) & (p->cap - 1)) {
        size_t home = p->slot[j]->hash & (p->cap - 1);
        /* move j to i when its home is not cyclically in (i, j] */
        if (((j - home) & (p->cap - 1)) >= ((j - i) & (p->cap - 1))) {
            p->slot[i] = p->slot[j];
            p->slot[j] = NULL;
            i = j;
        }
    }
}

void ps_peers_sweep(ps_peers *p, int64_t now)
{
    p->now = now;
    int64_t freed = 0;
    for (size_t i = 0; i < p->cap;) {
        ps_peer *e = p->slot[i];
        if (e && (e->gone || now - e->last_ns > IDLE_NS) &&
            atomic_load_explicit(&e->replies, memory_order_acquire) == 0) {
            freed += e->peak_bytes;
            remove_at(p, i); /* slot i may hold another entry now: look again */
            continue;
        }
        i++;
    }
    /* the process keeps freed memory for the next messages
     * (ps_malloc_keep_large); a peer that pinned much of it has gone: give
     * it back */
    if (freed >= RELEASE_BYTES)
        ps_malloc_release();
}

uint64_t ps_peers_refused(const ps_peers *p) { return p ? p->refused : 0; }

void ps_peers_unread(const ps_peers *p, uint64_t *replies, uint64_t *bytes)
{
    *replies = *bytes = 0;
    for (size_t i = 0; p && i < p->cap; i++)
        if (p->slot[i]) {
            *replies += (uint64_t)atomic_load(&p->slot[i]->replies);
            *bytes += (uint64_t)atomic_load(&p->slot[i]->bytes);
        }
}

void ps_peer_name(const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *out, size_t len)
{
    char hex[2 * 16 + 3] = "";
    const unsigned char *d = zmq_msg_data((zmq_msg_t *)id);
    size_t n = zmq_msg_size((zmq_msg_t *)id), o = 0;
    for (size_t i = 0; i < n && i < 16; i++)
        o += (size_t)snprintf(hex + o, sizeof hex - o, "%02x", d[i]);
    if (n > 16)
        snprintf(hex + o, sizeof hex - o, "..");
    const char *addr = frame ? zmq_msg_gets((zmq_msg_t *)frame, "Peer-Address") : NULL;
    const char *user = frame ? zmq_msg_gets((zmq_msg_t *)frame, "User-Id") : NULL;
    snprintf(out, len, "rank %d, routing id %s%s%s%s%s", rank, hex[0] ? hex : "(empty)",
             addr ? ", from " : "", addr ? addr : "", user && *user ? ", CURVE key " : "",
             user && *user ? user : "");
}
