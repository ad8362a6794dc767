/* transport_bench: push, pull and push-pull goodput through real ps_server
 * processes and libps, against a raw ZeroMQ baseline that moves the same
 * bytes between the same number of processes in the same run.
 *
 * Layout of one (transport, topology) block:
 *   - S `ps_server` processes (async, sgd), started from PS_BIN_DIR;
 *   - S raw server processes (forked copies of this program): a ROUTER that
 *     acks a push, sends N bytes back for a pull, and for a push-pull receives
 *     N bytes and sends N back (replies zero-copy from a preallocated buffer);
 *   - C client processes (forked copies), each with one ps_client (all S
 *     servers) and one DEALER per raw server.  Both sides cut a tensor into
 *     the same chunks (4 MiB default) on the same servers (ps_placement).
 * The parent tells every client, over a pipe, which row to run; they start
 * together, run for a bounded time with a few operations in flight, and send
 * back bytes and elapsed time.  For each row ours and raw alternate `rounds`
 * times and the best of each is kept (the machine is shared and noisy).
 *
 * Goodput counts payload bytes that crossed the transport: push = N, pull =
 * N, push-pull = 2N per operation, summed over clients, divided by the
 * longest client's elapsed time. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_malloc.h"
#include "ps_placement.h"
#include "ps_time.h"
#include "optimizer.h"

#define MAX_PROCS 8
#define MAX_SIZES 8
#define MAX_DEPTH 8

enum { OP_PUSH = 0, OP_PULL = 1, OP_PUSHPULL = 2, OP_STOP = 3 };
/* ours: libps + ps_server; raw: ZeroMQ, received bytes left in ZeroMQ's
 * message; rawcopy: raw, plus the client copies what it receives into its own
 * buffer, as any API that delivers into a caller's buffer must */
/* rawwork: raw+copy, plus the raw server does the same passes over the bytes
 * as ps_server: sgd on a push into its weights, weights copied into a fresh
 * message for a reply; what is left between it and ours is libps and
 * ps_server themselves (headers, threads, the inproc hop, chunk bookkeeping) */
enum { VAR_OURS = 0, VAR_RAW = 1, VAR_RAWCOPY = 2, VAR_RAWWORK = 3, NVAR = 4 };
static const char *var_name[] = {"ours", "raw", "raw+copy", "raw+work"};
static const char *op_name[] = {"push", "pull", "pushpull"};

typedef struct bench_cfg {
    const char *bin_dir;
    double row_s;     /* seconds per measurement */
    int rounds;       /* ours/raw alternations per row; best kept */
    int min_iters;
    size_t chunk_bytes;
    size_t sizes[MAX_SIZES];
    int nsizes;
    int tcp, ipc;
    int topo_1x1, topo_2x2;
    int ops_mask;
    int var_mask;
    int depth;        /* operations in flight per client; 0: 4 below 4 MiB, else 2 */
    int spin;         /* keep every CPU busy with SCHED_IDLE spinners while measuring */
} bench_cfg;

/* parent -> client */
typedef struct cmd {
    int op;      /* OP_* */
    int raw;     /* VAR_* */
    int size_idx;
    int depth;
    double seconds;
    int min_iters;
} cmd;

/* client -> parent */
typedef struct result {
    int ok;
    double bytes;
    double seconds;
    long iters;
    char err[400];
} result;

/* ---------------------------------------------------------------- helpers */

static int free_tcp_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int read_full(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void *alloc_touched(size_t bytes, int byte)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 64) != 0)
        return NULL;
    memset(p, byte, bytes);
    return p;
}

static void no_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/* ------------------------------------------------------------ raw server */

typedef struct raw_hdr {
    uint32_t op;
    uint32_t slot;
    uint64_t bytes;
    uint64_t offset; /* of the chunk in the tensor, in floats (echoed back) */
    uint32_t work;   /* 1: the server does what ps_server does with the bytes */
    uint32_t pad;
} raw_hdr;

static int raw_server(const char *endpoint, size_t max_bytes)
{
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(r, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(r, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(r, endpoint) != 0) {
        fprintf(stderr, "raw server: bind %s: %s\n", endpoint, zmq_strerror(errno));
        return 1;
    }
    char *buf = alloc_touched(max_bytes, 1);
    if (!buf)
        return 1;
    for (;;) {
        zmq_msg_t id, h, pl;
        zmq_msg_init(&id);
        zmq_msg_init(&h);
        zmq_msg_init(&pl);
        if (zmq_msg_recv(&id, r, 0) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        zmq_msg_recv(&h, r, 0);
        if (zmq_msg_more(&h))
            zmq_msg_recv(&pl, r, 0);
        raw_hdr hd;
        if (zmq_msg_size(&h) != sizeof hd) {
            zmq_msg_close(&id);
            zmq_msg_close(&h);
            zmq_msg_close(&pl);
            continue;
        }
        memcpy(&hd, zmq_msg_data(&h), sizeof hd);
        int fits = hd.offset * sizeof(float) + hd.bytes <= max_bytes;
        if (hd.work && fits && hd.op != OP_PULL && zmq_msg_size(&pl) == hd.bytes &&
            (uintptr_t)zmq_msg_data(&pl) % sizeof(float) == 0)
            ps_opt_sgd((float *)(buf + hd.offset * sizeof(float)), zmq_msg_data(&pl),
                       hd.bytes / sizeof(float), 1e-3f, 0.0f);
        zmq_msg_close(&pl); /* the pushed bytes: received, then dropped */
        if (hd.op == OP_STOP) {
            zmq_msg_close(&id);
            zmq_msg_close(&h);
            break;
        }
        zmq_msg_send(&id, r, ZMQ_SNDMORE);
        if (hd.op == OP_PUSH || hd.bytes > max_bytes) {
            /* push: the ack only */
            zmq_msg_send(&h, r, 0);
        } else {
            zmq_msg_send(&h, r, ZMQ_SNDMORE);
            zmq_msg_t out;
            /* from the chunk's own place in a tensor-sized buffer, as a
             * server holding the weights would (not one cache-hot block) */
            const char *from = fits ? buf + hd.offset * sizeof(float) : buf;
            if (hd.work) {
                zmq_msg_init_size(&out, hd.bytes);
                memcpy(zmq_msg_data(&out), from, hd.bytes);
            } else {
                zmq_msg_init_data(&out, (void *)from, hd.bytes, no_free, NULL);
            }
            zmq_msg_send(&out, r, 0);
            zmq_msg_close(&out);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&h);
    }
    zmq_close(r);
    zmq_ctx_term(ctx);
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- client */

typedef struct client_ctx {
    const bench_cfg *cfg;
    int rank, nclients, nservers;
    ps_client *ps;
    ps_placement place;
    void *zctx;
    void **deal;
    float *src;              /* gradient, largest size */
    float *dst[MAX_DEPTH];   /* pull destinations */
    int64_t clock[MAX_SIZES];
} client_ctx;

static int ours_post(client_ctx *c, int op, int k, int slot, ps_request *req)
{
    uint64_t key = (uint64_t)k + 1;
    switch (op) {
    case OP_PUSH:
        return ps_client_push(c->ps, key, c->src, c->clock[k]++, req);
    case OP_PULL:
        return ps_client_pull(c->ps, key, c->dst[slot], 0, req);
    default:
        return ps_client_pushpull(c->ps, key, c->src, c->dst[slot], c->clock[k]++, req);
    }
}

static double op_bytes(int op, size_t bytes) { return op == OP_PUSHPULL ? 2.0 * bytes : (double)bytes; }

static void run_ours(client_ctx *c, const cmd *m, result *res)
{
    ps_request req[MAX_DEPTH];
    memset(req, 0, sizeof req); /* never posted: ps_request_wait returns at once */
    int d = m->depth;
    size_t bytes = c->cfg->sizes[m->size_idx];
    /* one untimed operation: first-touch and connection warm-up */
    int rc = ours_post(c, m->op, m->size_idx, 0, &req[0]);
    if (!rc)
        rc = ps_request_wait(&req[0]);
    if (rc) {
        snprintf(res->err, sizeof res->err, "warm-up %s: %s (%.250s)", op_name[m->op], ps_strerror(rc),
                 req[0].err);
        return;
    }
    int64_t t0 = ps_now_ns(), end = t0 + (int64_t)(m->seconds * 1e9);
    long posted = 0, done = 0;
    for (int i = 0; i < d; i++, posted++)
        if ((rc = ours_post(c, m->op, m->size_idx, i, &req[i])))
            break;
    int64_t last = t0;
    for (int i = 0; !rc && done < posted; i = (i + 1) % d) {
        if ((rc = ps_request_wait(&req[i]))) {
            snprintf(res->err, sizeof res->err, "%s: %s (%.250s)", op_name[m->op], ps_strerror(rc),
                     req[i].err);
            break;
        }
        done++;
        last = ps_now_ns();
        if (last < end || posted < m->min_iters) {
            if ((rc = ours_post(c, m->op, m->size_idx, i, &req[i])))
                break;
            posted++;
        }
    }
    if (rc) {
        /* let anything still posted finish before the buffers are reused */
        for (int i = 0; i < d; i++)
            ps_request_wait(&req[i]);
        if (!res->err[0])
            snprintf(res->err, sizeof res->err, "post %s: %s", op_name[m->op], ps_strerror(rc));
        return;
    }
    res->ok = 1;
    res->iters = done;
    res->bytes = (double)done * op_bytes(m->op, bytes);
    res->seconds = (double)(last - t0) * 1e-9;
}

/* raw: one operation = every chunk of the tensor sent to its server at once;
 * it completes when every chunk's reply has arrived. */
static int raw_post(client_ctx *c, int op, int k, uint32_t slot, int work)
{
    size_t first = c->place.first_chunk[k], n = c->place.tensor_chunks[k];
    for (size_t j = 0; j < n; j++) {
        const ps_chunk_place *cp = &c->place.chunks[first + j];
        size_t b = cp->count * sizeof(float);
        raw_hdr h = {(uint32_t)op, slot, (uint64_t)b, (uint64_t)cp->offset, (uint32_t)work, 0};
        void *s = c->deal[cp->server];
        if (zmq_send(s, &h, sizeof h, op == OP_PULL ? 0 : ZMQ_SNDMORE) < 0)
            return -1;
        if (op != OP_PULL) {
            zmq_msg_t m;
            zmq_msg_init_data(&m, c->src + cp->offset, b, no_free, NULL);
            if (zmq_msg_send(&m, s, 0) < 0) {
                zmq_msg_close(&m);
                return -1;
            }
        }
    }
    return (int)n;
}

static void run_raw(client_ctx *c, const cmd *m, result *res)
{
    int d = m->depth;
    size_t bytes = c->cfg->sizes[m->size_idx];
    int left[MAX_DEPTH];
    zmq_pollitem_t items[MAX_PROCS];
    for (int s = 0; s < c->nservers; s++)
        items[s] = (zmq_pollitem_t){c->deal[s], 0, ZMQ_POLLIN, 0};
    long posted = 0, done = 0;
    int64_t t0 = 0, end = 0, last = 0;
    int warm = 1; /* first: one untimed operation, as for ours */
    int work = m->raw == VAR_RAWWORK;
    for (int i = 0; i < MAX_DEPTH; i++)
        left[i] = 0;
    if ((left[0] = raw_post(c, m->op, m->size_idx, 0, work)) < 0)
        goto fail;
    posted = 1;
    while (done < posted) {
        if (zmq_poll(items, c->nservers, -1) < 0) {
            if (errno == EINTR)
                continue;
            goto fail;
        }
        for (int s = 0; s < c->nservers; s++) {
            for (;;) {
                zmq_msg_t h, pl;
                zmq_msg_init(&h);
                if (zmq_msg_recv(&h, c->deal[s], ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&h);
                    break;
                }
                raw_hdr hd;
                memcpy(&hd, zmq_msg_data(&h), sizeof hd);
                if (zmq_msg_more(&h)) {
                    zmq_msg_init(&pl);
                    zmq_msg_recv(&pl, c->deal[s], 0);
                    if (m->raw >= VAR_RAWCOPY && zmq_msg_size(&pl) == hd.bytes &&
                        hd.offset * sizeof(float) + hd.bytes <= bytes)
                        memcpy(c->dst[hd.slot] + hd.offset, zmq_msg_data(&pl), hd.bytes);
                    zmq_msg_close(&pl);
                }
                zmq_msg_close(&h);
                if (--left[hd.slot] > 0)
                    continue;
                done++;
                last = ps_now_ns();
                if (warm) {
                    warm = 0;
                    done = posted = 0;
                    t0 = last;
                    end = t0 + (int64_t)(m->seconds * 1e9);
                    for (int i = 0; i < d; i++, posted++)
                        if ((left[i] = raw_post(c, m->op, m->size_idx, (uint32_t)i, work)) < 0)
                            goto fail;
                    continue;
                }
                if (last < end || posted < m->min_iters) {
                    if ((left[hd.slot] = raw_post(c, m->op, m->size_idx, hd.slot, work)) < 0)
                        goto fail;
                    posted++;
                }
            }
        }
    }
    res->ok = 1;
    res->iters = done;
    res->bytes = (double)done * op_bytes(m->op, bytes);
    res->seconds = (double)(last - t0) * 1e-9;
    return;
fail:
    snprintf(res->err, sizeof res->err, "raw %s: %s", op_name[m->op], zmq_strerror(errno));
}

static int client_main(const bench_cfg *cfg, int rank, int nclients, int nservers,
                       const char *ours_eps, char raw_eps[][256], int cmd_fd, int res_fd)
{
    ps_log_init("transport_bench", rank);
    ps_log_set_level(PS_LOG_WARN);
    client_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = cfg;
    c.rank = rank;
    c.nclients = nclients;
    c.nservers = nservers;
    result res;
    memset(&res, 0, sizeof res);
    size_t maxb = 0;
    for (int k = 0; k < cfg->nsizes; k++)
        if (cfg->sizes[k] > maxb)
            maxb = cfg->sizes[k];
    c.src = alloc_touched(maxb, 0);
    for (int i = 0; i < MAX_DEPTH; i++)
        c.dst[i] = alloc_touched(maxb, 0);
    /* small, finite gradient values: the server's sgd stays cheap and exact */
    for (size_t i = 0; i < maxb / sizeof(float); i++)
        c.src[i] = 1e-3f;

    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ours_eps;
    o.rank = rank;
    o.num_workers = nclients;
    o.mode = PS_MODE_ASYNC;
    o.chunk_bytes = cfg->chunk_bytes;
    o.hello_timeout_ms = 20000;
    int rc = ps_client_open(&o, &c.ps);
    ps_tensor_spec specs[MAX_SIZES];
    for (int k = 0; !rc && k < cfg->nsizes; k++) {
        specs[k].key = (uint64_t)k + 1;
        specs[k].count = cfg->sizes[k] / sizeof(float);
        rc = ps_client_register(c.ps, specs[k].key, specs[k].count);
    }
    if (!rc && (rc = ps_client_start(c.ps)))
        snprintf(res.err, sizeof res.err, "start: %.300s", ps_client_last_error(c.ps));
    for (int k = 0; !rc && k < cfg->nsizes; k++) {
        ps_request r;
        if ((rc = ps_client_init(c.ps, specs[k].key, c.dst[0], &r)) == 0)
            rc = ps_request_wait(&r);
        if (rc)
            snprintf(res.err, sizeof res.err, "init: %.250s", r.err);
    }
    if (!rc && ps_placement_build(specs, (size_t)cfg->nsizes, cfg->chunk_bytes / sizeof(float),
                                  nservers, &c.place) != 0)
        rc = PS_ENOMEM;
    if (!rc) {
        c.zctx = zmq_ctx_new();
        c.deal = calloc((size_t)nservers, sizeof *c.deal);
        for (int s = 0; s < nservers; s++) {
            c.deal[s] = zmq_socket(c.zctx, ZMQ_DEALER);
            int zero = 0;
            zmq_setsockopt(c.deal[s], ZMQ_SNDHWM, &zero, sizeof zero);
            zmq_setsockopt(c.deal[s], ZMQ_RCVHWM, &zero, sizeof zero);
            zmq_setsockopt(c.deal[s], ZMQ_LINGER, &zero, sizeof zero);
            if (zmq_connect(c.deal[s], raw_eps[s]) != 0) {
                snprintf(res.err, sizeof res.err, "connect %.200s: %s", raw_eps[s], zmq_strerror(errno));
                rc = PS_EIO;
            }
        }
    }
    /* ready (or not) */
    res.ok = rc == 0;
    if (rc && !res.err[0])
        snprintf(res.err, sizeof res.err, "set-up: %s", ps_strerror(rc));
    write_full(res_fd, &res, sizeof res);
    if (rc)
        return 1;
    cmd m;
    while (read_full(cmd_fd, &m, sizeof m) == 0 && m.op != OP_STOP) {
        memset(&res, 0, sizeof res);
        if (m.raw)
            run_raw(&c, &m, &res);
        else
            run_ours(&c, &m, &res);
        write_full(res_fd, &res, sizeof res);
    }
    /* the parent stops the servers with SIGTERM (a shutdown message needs an
     * admin token, which the bench does not give them) */
    ps_client_close(c.ps);
    for (int s = 0; s < nservers; s++) {
        raw_hdr h = {OP_STOP, 0, 0, 0, 0, 0};
        if (rank == 0)
            zmq_send(c.deal[s], &h, sizeof h, 0);
    }
    /* give the stop messages a moment to leave */
    if (rank == 0)
        usleep(100000);
    for (int s = 0; s < nservers; s++)
        zmq_close(c.deal[s]);
    zmq_ctx_term(c.zctx);
    ps_placement_free(&c.place);
    return 0;
}

/* ---------------------------------------------------------------- parent */

typedef struct block {
    int nservers, nclients;
    pid_t ours_srv[MAX_PROCS], raw_srv[MAX_PROCS], cli[MAX_PROCS];
    int cmd_fd[MAX_PROCS], res_fd[MAX_PROCS];
} block;

static pid_t spawn_ps_server(const bench_cfg *cfg, const char *bind, int rank, int ns, int nw)
{
    char path[1024], r[16], s[16], w[16];
    snprintf(path, sizeof path, "%s/ps_server", cfg->bin_dir);
    snprintf(r, sizeof r, "%d", rank);
    snprintf(s, sizeof s, "%d", ns);
    snprintf(w, sizeof w, "%d", nw);
    pid_t p = fork();
    if (p == 0) {
        execl(path, path, "--bind", bind, "--rank", r, "--num-servers", s, "--num-workers", w,
              "--mode", "async", "--optimizer", "sgd", "--lr", "0.001", "--quiet", (char *)NULL);
        fprintf(stderr, "transport_bench: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    return p;
}

static void stop_block(block *b, int kill_all)
{
    for (int i = 0; i < b->nclients; i++) {
        if (b->cmd_fd[i] >= 0) {
            cmd m = {.op = OP_STOP};
            write_full(b->cmd_fd[i], &m, sizeof m);
            close(b->cmd_fd[i]);
            b->cmd_fd[i] = -1;
        }
    }
    for (int i = 0; i < b->nclients; i++) {
        if (b->cli[i] > 0) {
            if (kill_all)
                kill(b->cli[i], SIGKILL);
            waitpid(b->cli[i], NULL, 0);
        }
        if (b->res_fd[i] >= 0)
            close(b->res_fd[i]);
    }
    /* the clients are gone; now the servers */
    usleep(200000);
    for (int i = 0; i < b->nservers; i++) {
        if (b->ours_srv[i] > 0)
            kill(b->ours_srv[i], SIGTERM);
        if (b->raw_srv[i] > 0)
            kill(b->raw_srv[i], SIGTERM);
    }
    for (int i = 0; i < b->nservers; i++) {
        if (b->ours_srv[i] > 0)
            waitpid(b->ours_srv[i], NULL, 0);
        if (b->raw_srv[i] > 0)
            waitpid(b->raw_srv[i], NULL, 0);
    }
}

/* Run one measurement on every client at once; aggregate.  0 or -1. */
static int run_row(block *b, const cmd *m, double *gbps, char *err, size_t elen)
{
    for (int i = 0; i < b->nclients; i++)
        if (write_full(b->cmd_fd[i], m, sizeof *m) != 0) {
            snprintf(err, elen, "client %d is gone", i);
            return -1;
        }
    double bytes = 0, secs = 0;
    int bad = 0;
    for (int i = 0; i < b->nclients; i++) {
        result r;
        if (read_full(b->res_fd[i], &r, sizeof r) != 0) {
            snprintf(err, elen, "client %d died", i);
            return -1;
        }
        if (!r.ok) {
            snprintf(err, elen, "client %d: %.400s", i, r.err);
            bad = 1;
        }
        bytes += r.bytes;
        if (r.seconds > secs)
            secs = r.seconds;
    }
    if (bad)
        return -1;
    *gbps = secs > 0 ? bytes / secs / 1e9 : 0;
    return 0;
}

static const char *size_label(size_t b, char *buf, size_t len)
{
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, len, "%zu KiB", b >> 10);
    else
        snprintf(buf, len, "%zu B", b);
    return buf;
}

typedef struct row_out {
    char transport[8];
    int ns, nc;
    size_t size;
    int op;
    double ours, raw, rawcopy, rawwork;
} row_out;

static row_out rows[256];
static int nrows;

static int run_block(const bench_cfg *cfg, int tcp, int ns, int nc, const char *tmpdir)
{
    block b;
    memset(&b, 0, sizeof b);
    b.nservers = ns;
    b.nclients = nc;
    for (int i = 0; i < MAX_PROCS; i++)
        b.cmd_fd[i] = b.res_fd[i] = -1;
    char ours_eps[MAX_PROCS * 256] = "", raw_eps[MAX_PROCS][256], bind[256];
    size_t off = 0;
    for (int s = 0; s < ns; s++) {
        if (tcp) {
            int p1 = free_tcp_port(), p2 = free_tcp_port();
            while (p2 == p1)
                p2 = free_tcp_port();
            snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", p1);
            snprintf(raw_eps[s], sizeof raw_eps[s], "tcp://127.0.0.1:%d", p2);
        } else {
            snprintf(bind, sizeof bind, "ipc://%s/ps%d-%d", tmpdir, ns, s);
            snprintf(raw_eps[s], sizeof raw_eps[s], "ipc://%s/raw%d-%d", tmpdir, ns, s);
        }
        off += (size_t)snprintf(ours_eps + off, sizeof ours_eps - off, "%s%s", s ? "," : "", bind);
        b.ours_srv[s] = spawn_ps_server(cfg, bind, s, ns, nc);
        size_t maxb = 0; /* the largest tensor: replies come from its chunk's place */
        for (int k = 0; k < cfg->nsizes; k++)
            if (cfg->sizes[k] > maxb)
                maxb = cfg->sizes[k];
        pid_t p = fork();
        if (p == 0)
            _exit(raw_server(raw_eps[s], maxb));
        b.raw_srv[s] = p;
    }
    for (int i = 0; i < nc; i++) {
        int c2p[2], p2c[2];
        if (pipe(c2p) || pipe(p2c)) {
            perror("pipe");
            stop_block(&b, 1);
            return -1;
        }
        pid_t p = fork();
        if (p == 0) {
            close(c2p[0]);
            close(p2c[1]);
            for (int j = 0; j < i; j++) {
                close(b.cmd_fd[j]);
                close(b.res_fd[j]);
            }
            _exit(client_main(cfg, i, nc, ns, ours_eps, raw_eps, p2c[0], c2p[1]));
        }
        close(c2p[1]);
        close(p2c[0]);
        b.cli[i] = p;
        b.cmd_fd[i] = p2c[1];
        b.res_fd[i] = c2p[0];
    }
    for (int i = 0; i < nc; i++) {
        result r;
        if (read_full(b.res_fd[i], &r, sizeof r) != 0 || !r.ok) {
            fprintf(stderr, "transport_bench: client %d could not start: %s\n", i,
                    r.err[0] ? r.err : "died");
            stop_block(&b, 1);
            return -1;
        }
    }
    const char *tname = tcp ? "tcp" : "ipc";
    int rc = 0;
    for (int k = 0; k < cfg->nsizes && !rc; k++) {
        for (int op = 0; op < 3 && !rc; op++) {
            if (!(cfg->ops_mask & (1 << op)))
                continue;
            cmd m = {.op = op, .size_idx = k, .seconds = cfg->row_s, .min_iters = cfg->min_iters};
            m.depth = cfg->depth ? cfg->depth : cfg->sizes[k] >= (4u << 20) ? 2 : 4;
            double best[NVAR] = {0, 0, 0, 0};
            char err[512];
            for (int r = 0; r < cfg->rounds && !rc; r++) {
                for (int raw = 0; raw < NVAR && !rc; raw++) {
                    double g = 0;
                    if (!(cfg->var_mask & (1 << raw)))
                        continue;
                    m.raw = raw;
                    if (run_row(&b, &m, &g, err, sizeof err) != 0) {
                        fprintf(stderr, "transport_bench: %s %dx%d %zu %s %s: %s\n", tname, ns, nc,
                                cfg->sizes[k], op_name[op], var_name[raw], err);
                        rc = -1;
                    }
                    if (g > best[raw])
                        best[raw] = g;
                }
            }
            if (rc)
                break;
            row_out *ro = &rows[nrows++];
            snprintf(ro->transport, sizeof ro->transport, "%s", tname);
            ro->ns = ns;
            ro->nc = nc;
            ro->size = cfg->sizes[k];
            ro->op = op;
            ro->ours = best[0];
            ro->raw = best[1];
            ro->rawcopy = best[2];
            ro->rawwork = best[3];
            char sl[32];
            fprintf(stderr, "  %s %dx%d %8s %-8s ours %6.3f GB/s  raw %6.3f  raw+copy %6.3f  "
                    "raw+work %6.3f  ratio %.2f\n", tname, ns, nc,
                    size_label(cfg->sizes[k], sl, sizeof sl), op_name[op], best[0], best[1],
                    best[2], best[3], best[1] > 0 ? best[0] / best[1] : 0);
        }
    }
    stop_block(&b, rc != 0);
    return rc;
}

/* One busy process per CPU under SCHED_IDLE: it runs only when nothing else
 * wants that CPU, so it takes next to no time from the bench, but the CPU
 * never halts.  In a VM a halted vCPU takes long to wake, which penalizes
 * whichever side idles more (the raw baseline, whose CPUs wait on each
 * other's wake-ups); with the spinners both sides are measured CPU-bound. */
static int start_spinners(pid_t *pids, int max)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    if (n > max)
        n = max;
    for (long i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            struct sched_param sp = {0};
            if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0 && nice(19) < 0)
                _exit(1);
            for (volatile unsigned long x = 0;; x++)
                ;
        }
        pids[i] = p;
    }
    return (int)n;
}

static void stop_spinners(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
}

static int parse_sizes(const char *s, bench_cfg *cfg)
{
    cfg->nsizes = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t && cfg->nsizes < MAX_SIZES;
         t = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(t, &end);
        size_t mul = 1;
        if (*end == 'K' || *end == 'k')
            mul = 1024;
        else if (*end == 'M' || *end == 'm')
            mul = 1u << 20;
        if (v <= 0) {
            free(dup);
            return -1;
        }
        size_t b = (size_t)(v * (double)mul);
        cfg->sizes[cfg->nsizes++] = b & ~(size_t)3;
    }
    free(dup);
    return cfg->nsizes ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: transport_bench [--time S] [--rounds R] [--sizes 64K,1M,4M,16M,64M]\n"
            "                       [--transports tcp,ipc] [--topos 1x1,2x2] [--ops push,pull,pushpull]\n"
            "                       [--chunk BYTES] [--bin-dir DIR] [--variants ours,raw,raw+copy,raw+work]\n"
            "                       [--depth N (operations in flight; default 4 below 4 MiB, else 2)]\n"
            "                       [--spin (keep the CPUs from idling: SCHED_IDLE busy loops)]\n"
            "Goodput of push/pull/pushpull through bin/ps_server vs raw ZeroMQ; prints a\n"
            "markdown table.  --bin-dir defaults to $PS_BIN_DIR, else bin.\n");
}

int main(int argc, char **argv)
{
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    /* the clients stand for ps_worker, which keeps large buffers the same way
     * (the raw baseline's processes are forks of this one: they do too) */
    ps_malloc_keep_large();
    cfg.bin_dir = getenv("PS_BIN_DIR") ? getenv("PS_BIN_DIR") : "bin";
    cfg.row_s = 0.3;
    cfg.rounds = 2;
    cfg.min_iters = 4;
    cfg.chunk_bytes = 4u << 20;
    cfg.tcp = cfg.ipc = 1;
    cfg.topo_1x1 = cfg.topo_2x2 = 1;
    cfg.ops_mask = 7;
    cfg.var_mask = (1 << NVAR) - 1;
    parse_sizes("64K,1M,4M,16M,64M", &cfg);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!v && strcmp(a, "--spin")) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--time"))
            cfg.row_s = atof(v);
        else if (!strcmp(a, "--rounds"))
            cfg.rounds = atoi(v);
        else if (!strcmp(a, "--sizes")) {
            if (parse_sizes(v, &cfg)) {
                usage();
                return 2;
            }
        } else if (!strcmp(a, "--chunk"))
            cfg.chunk_bytes = (size_t)atol(v) & ~(size_t)3;
        else if (!strcmp(a, "--spin")) {
            cfg.spin = 1;
            i--; /* no value */
        } else if (!strcmp(a, "--depth"))
            cfg.depth = atoi(v);
        else if (!strcmp(a, "--bin-dir"))
            cfg.bin_dir = v;
        else if (!strcmp(a, "--transports")) {
            cfg.tcp = strstr(v, "tcp") != NULL;
            cfg.ipc = strstr(v, "ipc") != NULL;
        } else if (!strcmp(a, "--topos")) {
            cfg.topo_1x1 = strstr(v, "1x1") != NULL;
            cfg.topo_2x2 = strstr(v, "2x2") != NULL;
        } else if (!strcmp(a, "--ops")) {
            cfg.ops_mask = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
                for (int op = 0; op < 3; op++)
                    if (!strcmp(t, op_name[op]))
                        cfg.ops_mask |= 1 << op;
            free(dup);
        } else if (!strcmp(a, "--variants")) {
            cfg.var_mask = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
                for (int x = 0; x < NVAR; x++)
                    if (!strcmp(t, var_name[x]))
                        cfg.var_mask |= 1 << x;
            free(dup);
        } else {
            usage();
            return 2;
        }
    }
    if (cfg.row_s <= 0 || cfg.rounds < 1 || cfg.chunk_bytes < 4 || !cfg.ops_mask ||
        cfg.depth < 0 || cfg.depth > MAX_DEPTH) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char tmpdir[] = "/tmp/ps_tbench.XXXXXX";
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    fprintf(stderr, "transport_bench: %.2f s per measurement, best of %d, chunk %zu bytes, servers "
            "from %s%s\n", cfg.row_s, cfg.rounds, cfg.chunk_bytes, cfg.bin_dir,
            cfg.spin ? ", CPUs kept busy (--spin)" : "");
    pid_t spinners[64];
    int nspin = cfg.spin ? start_spinners(spinners, 64) : 0;
    int rc = 0;
    for (int t = 0; t < 2 && !rc; t++) {
        int tcp = t == 0;
        if ((tcp && !cfg.tcp) || (!tcp && !cfg.ipc))
            continue;
        if (cfg.topo_1x1 && !rc)
            rc = run_block(&cfg, tcp, 1, 1, tmpdir);
        if (cfg.topo_2x2 && !rc)
            rc = run_block(&cfg, tcp, 2, 2, tmpdir);
    }
    stop_spinners(spinners, nspin);
    char cmdline[512];
    snprintf(cmdline, sizeof cmdline, "rm -rf '%s'", tmpdir);
    if (system(cmdline) != 0)
        fprintf(stderr, "transport_bench: could not remove %s\n", tmpdir);

    printf("| transport | servers x clients | size | op | ours GB/s | raw ZeroMQ GB/s | ours/raw "
           "| raw+copy GB/s | ours/(raw+copy) | raw+work GB/s | ours/(raw+work) |\n");
    printf("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int goal_rows = 0, goal_met = 0;
    double worst = 1e9;
    for (int i = 0; i < nrows; i++) {
        row_out *r = &rows[i];
        char sl[32];
        double ratio = r->raw > 0 ? r->ours / r->raw : 0;
        int goal = r->op == OP_PUSHPULL && r->size >= (4u << 20);
        if (goal) {
            goal_rows++;
            goal_met += ratio >= 0.85;
            if (ratio < worst)
                worst = ratio;
        }
        double rc2 = r->rawcopy > 0 ? r->ours / r->rawcopy : 0;
        double rc3 = r->rawwork > 0 ? r->ours / r->rawwork : 0;
        printf("| %s | %dx%d | %s | %s | %.3f | %.3f | %.2f%s | %.3f | %.2f | %.3f | %.2f |\n",
               r->transport, r->ns, r->nc, size_label(r->size, sl, sizeof sl), op_name[r->op],
               r->ours, r->raw, ratio,
               goal ? (ratio >= 0.85 ? " (goal met)" : " (**goal missed**)") : "", r->rawcopy, rc2,
               r->rawwork, rc3);
    }
    if (goal_rows)
        printf("\nGOAL transport: push-pull >= 4 MiB at >= 0.85 of raw ZeroMQ: %s (%d of %d rows; "
               "lowest ratio %.2f)\n", goal_met == goal_rows ? "MET" : "MISSED", goal_met,
               goal_rows, worst);
    return rc ? 1 : 0;
}
