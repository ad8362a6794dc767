/* shm_bench: push-pull goodput of the same-host data plane against the
 * baselines it must beat, measured in one run: raw ZeroMQ over ipc and over
 * tcp (an echo: N bytes out, N bytes back, zero-copy both ways), a plain
 * memcpy of the same bytes, and our own network path (--shm off) for
 * reference.
 *
 * One operation moves 2N bytes: a push of N bytes of gradient (the server
 * reads it and applies sgd to its weights) and a pull of the N bytes of
 * weights into the worker's buffer; through shared memory neither crosses a
 * socket.  Two tensors are in flight at once (push+pull of one while the
 * other completes).  Variants alternate, `rounds` times; the median of each
 * is reported.  Goals (issue "same-host data plane"): shared memory >= 3x
 * raw ZeroMQ over ipc and over tcp, and >= 0.3x memcpy, at 1, 4 and 16 MiB.
 *
 *   build/bench/shm_bench [--sizes 1M,4M,16M] [--time 0.3] [--rounds 5] [--no-spin]
 *                         [--only-shm]   (the shared-memory rows alone: for a profile)
 */
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_malloc.h"
#include "ps_time.h"
#include "bench_proc.h"

#define MAX_SIZES 8
#define MAX_ROUNDS 31

enum { V_SHM, V_NET, V_IPC, V_TCP, V_MEMCPY, NV };
static const char *vname[NV] = {"shared memory", "ours --shm off (tcp)", "raw ZeroMQ ipc",
                                "raw ZeroMQ tcp", "memcpy"};

static double row_s = 0.3;
static int rounds = 5;


static void no_free(void *d, void *h)
{
    (void)d;
    (void)h;
}

/* ---- raw ZeroMQ echo: what the two directions cost with nothing else ---- */

static int raw_server(const char *ep, size_t max)
{
    void *ctx = zmq_ctx_new(), *r = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(r, ep) != 0)
        return 1;
    char *buf = malloc(max);
    memset(buf, 1, max);
    for (;;) {
        zmq_msg_t id, m;
        zmq_msg_init(&id);
        zmq_msg_init(&m);
        if (zmq_msg_recv(&id, r, 0) < 0 || zmq_msg_recv(&m, r, 0) < 0)
            break;
        size_t n = zmq_msg_size(&m);
        zmq_msg_close(&m);
        if (n == 0) /* stop */
            break;
        zmq_msg_t out;
        zmq_msg_init_data(&out, buf, n, no_free, NULL);
        zmq_msg_send(&id, r, ZMQ_SNDMORE);
        zmq_msg_send(&out, r, 0);
        zmq_msg_close(&id);
    }
    zmq_close(r);
    zmq_ctx_term(ctx);
    return 0;
}

/* GB/s of raw echoes of n bytes, two in flight, for row_s seconds. */
static double run_raw(void *d, const char *src, size_t n)
{
    int64_t t0 = ps_now_ns(), end = t0 + (int64_t)(row_s * 1e9);
    long done = 0, posted = 0;
    for (; posted < 2; posted++) {
        zmq_msg_t m;
        zmq_msg_init_data(&m, (void *)src, n, no_free, NULL);
        zmq_msg_send(&m, d, 0);
    }
    int64_t last = t0;
    while (done < posted) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, d, 0) < 0)
            return 0;
        zmq_msg_close(&m);
        done++;
        last = ps_now_ns();
        if (last < end) {
            zmq_msg_init_data(&m, (void *)src, n, no_free, NULL);
            zmq_msg_send(&m, d, 0);
            posted++;
        }
    }
    return 2.0 * (double)n * (double)done / ((double)(last - t0) * 1e-9) / 1e9;
}

/* ---- ours: a ps_client to one ps_server ---- */

typedef struct ours {
    ps_client *c;
    float *src[2], *dst[2];
    int64_t clock[MAX_SIZES][2]; /* per tensor: pushes made */
} ours;

static pid_t start_server(const char *ep, const char *shm)
{
    pid_t p = fork();
    if (p == 0) {
        const char *bin = getenv("PS_BIN_DIR") ? getenv("PS_BIN_DIR") : "bin";
        char path[512];
        snprintf(path, sizeof path, "%s/ps_server", bin);
        execl(path, path, "--bind", ep, "--num-workers", "1", "--mode", "async", "--optimizer",
              "sgd", "--lr", "1e-6", "--shm", shm, "--quiet", (char *)NULL);
        _exit(127);
    }
    return p;
}

static int ours_open(ours *o, const char *ep, int shm, const size_t *sizes, int nsizes)
{
    memset(o, 0, sizeof *o);
    ps_client_options opt;
    ps_client_options_default(&opt);
    opt.servers = ep;
    opt.mode = PS_MODE_ASYNC;
    opt.shm = shm;
    opt.hello_timeout_ms = 20000;
    opt.chunk_bytes = 64u << 20; /* one chunk per tensor: one message each way */
    size_t max = 0;
    for (int k = 0; k < nsizes; k++)
        max = sizes[k] > max ? sizes[k] : max;
    opt.shm_bytes = 4 * max + (1 << 20);
    if (ps_client_open(&opt, &o->c))
        return -1;
    /* two tensors per size: keys 2k+1 and 2k+2 */
    for (int k = 0; k < nsizes; k++)
        for (int j = 0; j < 2; j++)
            if (ps_client_register(o->c, (uint64_t)(2 * k + j + 1), sizes[k] / sizeof(float)))
                return -1;
    if (ps_client_start(o->c)) {
        fprintf(stderr, "shm_bench: %s\n", ps_client_last_error(o->c));
        return -1;
    }
    for (int j = 0; j < 2; j++) {
        o->src[j] = shm ? ps_client_shm_alloc(o->c, max) : aligned_alloc(4096, max);
        o->dst[j] = shm ? ps_client_shm_alloc(o->c, max) : aligned_alloc(4096, max);
        if (!o->src[j] || !o->dst[j])
            return -1;
        for (size_t i = 0; i < max / sizeof(float); i++)
            o->src[j][i] = 1e-3f;
        memset(o->dst[j], 0, max);
    }
    for (int k = 0; k < nsizes; k++)
        for (int j = 0; j < 2; j++) {
            ps_request r;
            if (ps_client_init(o->c, (uint64_t)(2 * k + j + 1), o->dst[j], &r) ||
                ps_request_wait(&r))
                return -1;
        }
    return 0;
}

static int ours_post(ours *o, int k, int j, ps_request *push, ps_request *pull)
{
    uint64_t key = (uint64_t)(2 * k + j + 1);
    int64_t t = o->clock[k][j]++;
    return ps_client_push(o->c, key, o->src[j], t, push) ||
           ps_client_pull(o->c, key, o->dst[j], t + 1, pull);
}

static double run_ours(ours *o, int k, size_t n)
{
    ps_request push[2], pull[2];
    memset(push, 0, sizeof push);
    memset(pull, 0, sizeof pull);
    int64_t t0 = ps_now_ns(), end = t0 + (int64_t)(row_s * 1e9), last = t0;
    long done = 0, posted = 0;
    for (int j = 0; j < 2; j++, posted++)
        if (ours_post(o, k, j, &push[j], &pull[j]))
            return 0;
    for (int j = 0; done < posted; j ^= 1) {
        if (ps_request_wait(&push[j]) || ps_request_wait(&pull[j])) {
            fprintf(stderr, "shm_bench: %s %s\n", push[j].err, pull[j].err);
            /* the other slot's requests still belong to libps: let them end */
            ps_request_wait(&push[j ^ 1]);
            ps_request_wait(&pull[j ^ 1]);
            return 0;
        }
        done++;
        last = ps_now_ns();
        if (last < end) {
            if (ours_post(o, k, j, &push[j], &pull[j]))
                return 0;
            posted++;
        }
    }
    return 2.0 * (double)n * (double)done / ((double)(last - t0) * 1e-9) / 1e9;
}

/* ---- memcpy of the same bytes ---- */

static double run_memcpy(char *a, char *b, size_t n)
{
    int64_t t0 = ps_now_ns(), end = t0 + (int64_t)(row_s * 1e9), now;
    long done = 0;
    do {
        memcpy(b, a, n); /* the gradient to the server ... */
        memcpy(a, b, n); /* ... and the weights back */
        done++;
        now = ps_now_ns();
    } while (now < end);
    return 2.0 * (double)n * (double)done / ((double)(now - t0) * 1e-9) / 1e9;
}

/* SCHED_IDLE busy loops keep the CPUs from halting between wake-ups, which
 * in a VM penalizes whichever side idles more (see transport_bench). */
static int spin(pid_t *p, int max)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n < 1 ? 1 : n > max ? max : n;
    for (long i = 0; i < n; i++)
        if ((p[i] = fork()) == 0) {
            struct sched_param sp = {0};
            if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0 && nice(19) < 0)
                _exit(1);
            for (volatile unsigned long x = 0;; x++)
                ;
        }
    return (int)n;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {1u << 20, 4u << 20, 16u << 20};
    int nsizes = 3, do_spin = 1, only_shm = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--time") && i + 1 < argc)
            row_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-spin"))
            do_spin = 0;
        else if (!strcmp(argv[i], "--only-shm"))
            only_shm = 1;
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            nsizes = 0;
            char *dup = strdup(argv[++i]), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && nsizes < MAX_SIZES;
                 t = strtok_r(NULL, ",", &save))
                sizes[nsizes++] = ((size_t)(atof(t) * (strchr(t, 'K') ? 1024 : 1048576))) & ~3ul;
            free(dup);
        } else {
            fprintf(stderr, "usage: shm_bench [--sizes 1M,4M,16M] [--time S] [--rounds R] "
                            "[--no-spin] [--only-shm]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || row_s <= 0 || nsizes < 1)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    /* the allocator as in ps_server and ps_worker, for every variant: the
     * raw servers are forks of this process */
    ps_malloc_keep_large();
    size_t max = 0;
    for (int k = 0; k < nsizes; k++)
        max = sizes[k] > max ? sizes[k] : max;
    char ep_shm[64], ep_net[64], ep_tcp[64], ep_ipc[128];
    snprintf(ep_shm, sizeof ep_shm, "tcp://127.0.0.1:%d", free_port());
    snprintf(ep_net, sizeof ep_net, "tcp://127.0.0.1:%d", free_port());
    snprintf(ep_tcp, sizeof ep_tcp, "tcp://127.0.0.1:%d", free_port());
    snprintf(ep_ipc, sizeof ep_ipc, "ipc:///tmp/ps_shm_bench_%d", (int)getpid());
    pid_t procs[4];
    procs[0] = start_server(ep_shm, "auto");
    procs[1] = start_server(ep_net, "off");
    if ((procs[2] = fork()) == 0)
        _exit(raw_server(ep_tcp, max));
    if ((procs[3] = fork()) == 0)
        _exit(raw_server(ep_ipc, max));
    ours shm, net;
    int rc = ours_open(&shm, ep_shm, 1, sizes, nsizes) || ours_open(&net, ep_net, 0, sizes, nsizes);
    if (!rc && ps_client_shm_servers(shm.c) != 1) {
        fprintf(stderr, "shm_bench: the server did not take the shared memory\n");
        rc = 1;
    }
    void *zctx = zmq_ctx_new(), *dtcp = zmq_socket(zctx, ZMQ_DEALER),
         *dipc = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(dtcp, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dipc, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(dtcp, ep_tcp);
    zmq_connect(dipc, ep_ipc);
    char *a = aligned_alloc(4096, max), *b = aligned_alloc(4096, max);
    memset(a, 1, max);
    memset(b, 2, max);
    pid_t spinners[64];
    int nspin = do_spin ? spin(spinners, 64) : 0;
    double med[MAX_SIZES][NV];
    for (int k = 0; k < nsizes && !rc; k++) {
        double got[NV][MAX_ROUNDS];
        /* warm up every path once */
        run_ours(&shm, k, sizes[k]);
        run_ours(&net, k, sizes[k]);
        run_raw(dipc, a, sizes[k]);
        run_raw(dtcp, a, sizes[k]);
        for (int r = 0; r < rounds && only_shm; r++)
            fprintf(stderr, "  %zu KiB: shm %.2f GB/s\n", sizes[k] >> 10,
                    run_ours(&shm, k, sizes[k]));
        for (int r = 0; r < rounds && !only_shm; r++) {
            got[V_SHM][r] = run_ours(&shm, k, sizes[k]);
            got[V_NET][r] = run_ours(&net, k, sizes[k]);
            got[V_IPC][r] = run_raw(dipc, a, sizes[k]);
            got[V_TCP][r] = run_raw(dtcp, a, sizes[k]);
            got[V_MEMCPY][r] = run_memcpy(a, b, sizes[k]);
        }
        if (only_shm)
            continue;
        for (int v = 0; v < NV; v++) {
            qsort(got[v], (size_t)rounds, sizeof(double), cmpd);
            med[k][v] = got[v][rounds / 2];
            if (med[k][v] <= 0)
                rc = 1;
        }
        fprintf(stderr, "  %zu KiB: shm %.2f, off %.2f, ipc %.2f, tcp %.2f, memcpy %.2f GB/s\n",
                sizes[k] >> 10, med[k][V_SHM], med[k][V_NET], med[k][V_IPC], med[k][V_TCP],
                med[k][V_MEMCPY]);
    }
    for (int i = 0; i < nspin; i++) {
        kill(spinners[i], SIGKILL);
        waitpid(spinners[i], NULL, 0);
    }
    zmq_send(dtcp, "", 0, 0);
    zmq_send(dipc, "", 0, 0);
    usleep(100000);
    zmq_close(dtcp);
    zmq_close(dipc);
    zmq_ctx_term(zctx);
    ps_client_close(shm.c);
    ps_client_close(net.c);
    for (int i = 0; i < 4; i++) {
        kill(procs[i], SIGTERM);
        waitpid(procs[i], NULL, 0);
    }
    unlink(ep_ipc + 6);
    if (rc) {
        fprintf(stderr, "shm_bench: a measurement failed\n");
        return 1;
    }
    if (only_shm)
        return 0;
    printf("Push-pull goodput on one host, GB/s (2N bytes per operation: N of gradient to the "
           "server, N of weights back; medians of %d alternating rounds of %.2f s):\n\n",
           rounds, row_s);
    printf("| size | %s | %s | %s | %s | %s | shm / ipc | shm / tcp | shm / memcpy |\n",
           vname[0], vname[1], vname[2], vname[3], vname[4]);
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int met = 1;
    for (int k = 0; k < nsizes; k++) {
        double ri = med[k][V_SHM] / med[k][V_IPC], rt = med[k][V_SHM] / med[k][V_TCP],
               rm = med[k][V_SHM] / med[k][V_MEMCPY];
        met &= ri >= 3 && rt >= 3 && rm >= 0.3;
        printf("| %zu %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
               sizes[k] >= (1u << 20) ? sizes[k] >> 20 : sizes[k] >> 10,
               sizes[k] >= (1u << 20) ? "MiB" : "KiB", med[k][V_SHM], med[k][V_NET], med[k][V_IPC], med[k][V_TCP],
               med[k][V_MEMCPY], ri, rt, rm);
    }
    printf("\nGOAL shm: >= 3x raw ZeroMQ over ipc and tcp, >= 0.3x memcpy: %s\n",
           met ? "MET" : "MISSED");
    return 0;
}
