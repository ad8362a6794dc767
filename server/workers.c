#include "workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/random.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ratelimit.h"
#include "server.h"

/* A rank's connection is live (holds the rank against another connection's
 * hello) for at least this long after its last message: 3 heartbeats. */
#define HOLD_MIN_MS 3000

typedef struct worker_info {
    unsigned char id[256];
    size_t id_len;   /* 0: no connection (known from a restored checkpoint, or it closed) */
    int fd;          /* the connection's socket, -1 unknown */
    char user[128];  /* the CURVE user id of its key ("" without CURVE) */
    uint64_t token;  /* proves a hello comes from the worker that holds the rank */
    int64_t last_ns; /* when anything last came from this rank */
    int64_t conn_ns; /* when anything last came on the holder's connection */
    int silent;      /* PS_LOSS_WAIT: its silence was logged */
    int dropped;     /* PS_LOSS_DROP: out of the live set until it says hello */
} worker_info;

struct ps_workers {
    int num_workers, timeout_ms, on_loss;
    int64_t hold_ns;  /* the hold window */
    worker_info **w;  /* per rank, NULL until its hello or its loss before one */
    uint8_t *hello;   /* per rank: it said hello (here or before a restore) */
    int seen, ndropped;
    int64_t first_ns; /* the first hello of any worker (0: none yet) */
    int64_t wait_log_ns; /* PS_LOSS_WAIT: when the lost ranks were last named */
    uint64_t nlost, nrejoined, nrefused, nforged;
    ps_rlimit rl;     /* refused hellos */
    ps_rlimit rl_forged; /* messages for a rank another connection holds */
};

int ps_workers_create(int num_workers, int timeout_ms, int on_loss, ps_workers **out)
{
    *out = NULL;
    ps_workers *w = calloc(1, sizeof *w);
    if (!w)
        return PS_ENOMEM;
    w->w = calloc((size_t)num_workers, sizeof *w->w);
    w->hello = calloc((size_t)num_workers, 1);
    if (!w->w || !w->hello) {
        free(w->w);
        free(w->hello);
        free(w);
        return PS_ENOMEM;
    }
    w->num_workers = num_workers;
    w->timeout_ms = timeout_ms;
    w->on_loss = on_loss;
    w->hold_ns = (int64_t)(timeout_ms > HOLD_MIN_MS ? timeout_ms : HOLD_MIN_MS) * 1000000LL;
    *out = w;
    return 0;
}

void ps_workers_destroy(ps_workers *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->num_workers; i++)
        free(w->w[i]);
    free(w->w);
    free(w->hello);
    free(w);
}

/* Rank's entry, made when missing (NULL: out of memory). */
static worker_info *entry(ps_workers *w, int rank)
{
    if (w->w[rank])
        return w->w[rank];
    worker_info *wi = calloc(1, sizeof *wi);
    if (!wi)
        return NULL;
    wi->fd = -1;
    w->w[rank] = wi;
    return wi;
}

/* Rank said hello (or a checkpoint says it did): known from now on. */
static worker_info *add(ps_workers *w, int rank)
{
    worker_info *wi = entry(w, rank);
    if (wi && !w->hello[rank]) {
        w->hello[rank] = 1;
        w->seen++;
    }
    return wi;
}

static void id_hex(const unsigned char *p, size_t n, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 3 < len && i < 8; i++)
        o += (size_t)snprintf(out + o, len - o, "%02x", p[i]);
}

/* A fresh token: unpredictable, never 0 (0 is "none"). */
static uint64_t new_token(void)
{
    uint64_t t = 0;
    while (!t)
        if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t) {
            FILE *f = fopen("/dev/urandom", "rb");
            if (!f || fread(&t, sizeof t, 1, f) != 1)
                t = (uint64_t)ps_now_ns() * 0x9e3779b97f4a7c15ull; /* not reached on Linux */
            if (f)
                fclose(f);
        }
    return t;
}

static int same_conn(const worker_info *wi, const ps_conn *c)
{
    return wi->id_len && wi->id_len == c->n && memcmp(wi->id, c->id, c->n) == 0;
}

/* c is the rank's holder: its connection and, under CURVE, its key. */
static int is_holder(const worker_info *wi, const ps_conn *c)
{
    return same_conn(wi, c) && !strcmp(wi->user, c->user ? c->user : "");
}

/* The holder's connection is open and was heard from within the window. */
static int holder_live(const ps_workers *w, const worker_info *wi, int64_t now)
{
    return wi->id_len && now - wi->conn_ns <= w->hold_ns;
}

/* May the connection id take rank r from its holder?  0, or PS_ESTATE with
 * why (and the refusal logged). */
static int may_take(ps_workers *w, int r, const ps_conn *c, uint64_t token, int64_t now,
                    const char *who, char *why, size_t why_len)
{
    worker_info *wi = w->w[r];
    if (!wi || wi->dropped || same_conn(wi, c) || !holder_live(w, wi, now) ||
        (token && token == wi->token))
        return 0;
    char hex[40];
    id_hex(wi->id, wi->id_len, hex, sizeof hex);
    double ago = (double)(now - wi->conn_ns) * 1e-9;
    ps_errorf(why, why_len, "rank %d is held by another connection, live %.1f s ago; a hello "
        "for it must carry that worker's token (is another process running with rank %d?)",
        r, ago, r);
    w->nrefused++;
    if (ps_rlimit_allow(&w->rl))
        ps_warn("refused a hello for worker %d from %s: the rank is held by connection %s, "
                "heard from %.1f s ago, and the hello has %s", r, who, hex, ago,
                token ? "another token" : "no token");
    return PS_ESTATE;
}

int ps_workers_hello(ps_workers *w, int rank, const ps_conn *c, uint64_t token, int64_t now,
                     const char *who, uint64_t *token_out, int *rejoined, char *why,
                     size_t why_len)
{
    worker_info *wi = w->w[rank];
    char hex[40];
    id_hex(c->id, c->n, hex, sizeof hex);
    *rejoined = 0;
    int rc = may_take(w, rank, c, token, now, who, why, why_len);
    if (rc)
        return rc;
    if (!w->first_ns)
        w->first_ns = now;
    int first = !w->hello[rank];
    if (!(wi = add(w, rank)))
        return PS_ENOMEM;
    if (wi->dropped) {
        wi->dropped = 0;
        w->ndropped--;
        w->nrejoined++;
        *rejoined = 1;
        if (first)
            ps_info("hello at last from worker %d (identity %s), dropped for never saying "
                    "hello: it joins at the current version; rounds and barriers wait for %d "
                    "of %d workers again", rank, hex, w->num_workers - w->ndropped,
                    w->num_workers);
        else
            ps_info("worker %d said hello again (identity %s): rejoined at the current "
                    "version; rounds and barriers wait for %d of %d workers again",
                    rank, hex, w->num_workers - w->ndropped, w->num_workers);
    } else if (first) {
        ps_info("hello from worker %d (identity %s), %d of %d workers", rank, hex, w->seen,
                w->num_workers);
    } else if (!same_conn(wi, c)) {
        ps_info("hello again from worker %d with a new connection (identity %s%s)", rank, hex,
                !wi->id_len ? "; its old connection closed, or none since a restore"
                : token && token == wi->token ? "; its token proves it is the same worker"
                : "; the old connection was silent");
    } else {
        ps_debug("hello again from worker %d", rank);
    }
    /* a new holder gets a new token, unless it proved it is the holder */
    if (!wi->token || !(same_conn(wi, c) || (token && token == wi->token)))
        wi->token = new_token();
    wi->id_len = c->n < sizeof wi->id ? c->n : sizeof wi->id;
    memcpy(wi->id, c->id, wi->id_len);
    wi->fd = c->fd;
    snprintf(wi->user, sizeof wi->user, "%s", c->user ? c->user : "");
    wi->last_ns = wi->conn_ns = now;
    wi->silent = 0;
    *token_out = wi->token;
    return 0;
}

void ps_workers_gone(ps_workers *w, int fd)
{
    for (int r = 0; fd >= 0 && r < w->num_workers; r++) {
        worker_info *wi = w->w[r];
        if (wi && wi->id_len && wi->fd == fd) {
            ps_debug("worker %d's connection closed: its rank is free for the next hello", r);
            wi->id_len = 0;
            wi->fd = -1;
        }
    }
}

int ps_workers_restore(ps_workers *w, const uint8_t *hello, int64_t now)
{
    for (int r = 0; r < w->num_workers; r++) {
        if (!hello[r] || w->hello[r])
            continue;
        worker_info *wi = add(w, r);
        if (!wi)
            return PS_ENOMEM;
        wi->last_ns = now;
    }
    return 0;
}

int ps_workers_heard(ps_workers *w, int rank, const ps_conn *c, int64_t now, char *why,
                     size_t why_len)
{
    worker_info *wi = w->w[rank];
    if (!w->hello[rank])
        return PS_WORKER_UNKNOWN;
    if (wi->dropped)
        return PS_WORKER_DROPPED;
    if (!is_holder(wi, c)) {
        /* not a sign of life of the rank: its holder's messages are */
        if (!holder_live(w, wi, now)) {
            ps_errorf(why, why_len, "this connection did not say hello for worker %d; say "
                "hello on it first (the rank's old connection %s)", rank,
                wi->id_len ? "went silent" : "closed, or none since a restore");
            return PS_WORKER_UNHELD;
        }
        char mine[40], theirs[40];
        id_hex(wi->id, wi->id_len, mine, sizeof mine);
        id_hex(c->id, c->n, theirs, sizeof theirs);
        int key = same_conn(wi, c); /* same connection, another key: not reached with ZeroMQ */
        ps_errorf(why, why_len, "worker %d is held by another %s, live %.1f s ago; only the "
            "connection whose hello was accepted may send for it (is another process running "
            "with rank %d? a worker that restarted says hello again)", rank,
            key ? "CURVE key" : "connection", (double)(now - wi->conn_ns) * 1e-9, rank);
        w->nforged++;
        if (ps_rlimit_allow(&w->rl_forged))
            ps_warn("refused a message for worker %d from connection %s%s%s: the rank is held "
                    "by connection %s%s%s (%llu such messages so far)", rank, theirs,
                    c->user && *c->user ? ", key " : "", c->user ? c->user : "", mine,
                    *wi->user ? ", key " : "", wi->user, (unsigned long long)w->nforged);
        return PS_WORKER_FORGED;
    }
    wi->conn_ns = now;
    if (wi->silent)
        ps_info("worker %d is heard from again after %.1f s", rank,
                (double)(now - wi->last_ns) * 1e-9);
    wi->silent = 0;
    wi->last_ns = now;
    return PS_WORKER_LIVE;
}

/* PS_LOSS_WAIT: name every rank it waits for, at most every
 * PS_WORKERS_WAIT_LOG_MS. */
static void log_waiting(ps_workers *w, int64_t now)
{
    if (now - w->wait_log_ns < (int64_t)PS_WORKERS_WAIT_LOG_MS * 1000000LL)
        return;
    char list[512];
    size_t off = 0;
    int n = 0;
    list[0] = 0;
    for (int r = 0; r < w->num_workers; r++) {
        const worker_info *wi = w->w[r];
        if (!wi || !wi->silent)
            continue;
        if (off < sizeof list && n < 16)
            off += w->hello[r]
                ? (size_t)snprintf(list + off, sizeof list - off, "%s%d (silent %.0f s)",
                                   n ? ", " : "", r, (double)(now - wi->last_ns) * 1e-9)
                : (size_t)snprintf(list + off, sizeof list - off, "%s%d (never said hello)",
                                   n ? ", " : "", r);
        n++;
    }
    if (!n)
        return;
    w->wait_log_ns = now;
    ps_warn("waiting for %d worker%s: %s%s (--on-worker-loss wait; --on-worker-loss drop "
            "goes on without them)", n, n == 1 ? "" : "s", list, n > 16 ? ", ..." : "");
}

int ps_workers_check(ps_workers *w, int64_t now)
{
    if (w->timeout_ms <= 0)
        return -1;
    int64_t limit = (int64_t)w->timeout_ms * 1000000LL;
    for (int r = 0; r < w->num_workers; r++) {
        worker_info *wi = w->w[r];
        /* a rank that never said hello: silent since the first hello of any */
        int never = !w->hello[r];
        int64_t since = never ? w->first_ns : wi ? wi->last_ns : 0;
        if ((never && !since) || (wi && (wi->dropped || wi->silent)) || now - since <= limit)
            continue;
        if (never && !(wi = entry(w, r)))
            continue; /* out of memory: tried again next time */
        double silent_s = (double)(now - since) * 1e-9;
        w->nlost++;
        wi->last_ns = since;
        char what[96];
        if (never)
            snprintf(what, sizeof what, "never said hello, %.1f s after the first worker did",
                     silent_s);
        else
            snprintf(what, sizeof what, "silent for %.1f s", silent_s);
        if (w->on_loss == PS_LOSS_DROP) {
            wi->dropped = 1;
            w->ndropped++;
            ps_warn("worker %d %s: dropped; rounds continue with %d of %d workers", r, what,
                    w->num_workers - w->ndropped, w->num_workers);
            return r;
        }
        wi->silent = 1;
        ps_warn("worker %d %s; rounds and barriers keep waiting for it (--on-worker-loss "
                "wait)", r, what);
    }
    if (w->on_loss == PS_LOSS_WAIT)
        log_waiting(w, now);
    return -1;
}

const uint8_t *ps_workers_hello_flags(const ps_workers *w) { return w->hello; }

int ps_workers_seen(const ps_workers *w) { return w->seen; }

uint64_t ps_workers_lost(const ps_workers *w) { return w->nlost; }

uint64_t ps_workers_rejoined(const ps_workers *w) { return w->nrejoined; }

uint64_t ps_workers_refused(const ps_workers *w) { return w->nrefused; }

uint64_t ps_workers_forged(const ps_workers *w) { return w->nforged; }
