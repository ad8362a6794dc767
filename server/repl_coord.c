#include "repl_coord.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

#define QCAP 32

typedef struct req {
    int kind;
    uint64_t tag;
    int64_t expect_rev;
    ps_group_cfg next;
} req;

struct ps_repl_coord {
    ps_etcd *e;
    char job[128];
    int g, slots;
    int64_t lease;
    int ttl_s;
    int efd;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    req q[QCAP];
    int qhead, qlen;
    ps_repl_coord_result res[QCAP];
    int rhead, rlen;
    int busy; /* requests taken and not answered */
};

static void post(ps_repl_coord *c, const ps_repl_coord_result *r)
{
    pthread_mutex_lock(&c->mu);
    if (c->rlen < QCAP) {
        c->res[(c->rhead + c->rlen) % QCAP] = *r;
        c->rlen++;
    } else {
        ps_error("replicas: the agent's results overflowed; one was dropped");
    }
    pthread_mutex_unlock(&c->mu);
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof one);
    (void)w;
}

static void run(ps_repl_coord *c, const req *q)
{
    ps_repl_coord_result r;
    memset(&r, 0, sizeof r);
    r.kind = q->kind;
    r.tag = q->tag;
    int64_t t0 = ps_now_ns();
    if (q->kind == PS_RC_LOAD) {
        r.rc = ps_group_load(c->e, c->job, c->g, c->slots, &r.cfg, r.why, sizeof r.why);
    } else {
        r.cfg = q->next;
        r.rc = ps_group_cas(c->e, c->job, c->g, c->slots, q->expect_rev, &r.cfg, &r.cfg, r.why,
                            sizeof r.why);
    }
    r.took_ns = ps_now_ns() - t0;
    post(c, &r);
}

static void *agent_main(void *arg)
{
    ps_repl_coord *c = arg;
    int64_t period_ns = (int64_t)c->ttl_s * 1000000000LL / 3;
    int64_t next_ka = ps_now_ns() + period_ns, last_ok = ps_now_ns();
    int lost = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (c->qlen) {
            req q = c->q[c->qhead];
            c->qhead = (c->qhead + 1) % QCAP;
            c->qlen--;
            pthread_mutex_unlock(&c->mu);
            run(c, &q);
            pthread_mutex_lock(&c->mu);
            c->busy--;
            continue;
        }
        int64_t now = ps_now_ns();
        if (now >= next_ka && !lost) {
            pthread_mutex_unlock(&c->mu);
            char why[256];
            int ttl = 0;
            int rc = ps_etcd_lease_keepalive(c->e, c->lease, &ttl, why, sizeof why);
            now = ps_now_ns();
            if (rc == 0) {
                last_ok = now;
            } else if (rc == PS_ENOTFOUND || now - last_ok > (int64_t)c->ttl_s * 1000000000LL) {
                ps_repl_coord_result r;
                memset(&r, 0, sizeof r);
                r.kind = PS_RC_LEASE_LOST;
                r.rc = rc;
                snprintf(r.why, sizeof r.why, "%s", why);
                post(c, &r);
                lost = 1;
            } else {
                ps_warn("replicas: cannot renew this server's etcd lease (%s); trying again",
                        why);
            }
            /* a failed renewal is tried again sooner */
            next_ka = now + (rc == 0 ? period_ns : period_ns / 4);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t wait = next_ka - now;
        if (wait < 1000000)
            wait = 1000000;
        if (lost)
            wait = 1000000000LL;
        ts.tv_sec += (time_t)(wait / 1000000000LL);
        ts.tv_nsec += (long)(wait % 1000000000LL);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int ps_repl_coord_start(ps_etcd *e, const char *job, int g, int slots, int64_t lease, int ttl_s,
                        ps_repl_coord **out)
{
    *out = NULL;
    ps_repl_coord *c = calloc(1, sizeof *c);
    if (!c) {
        ps_etcd_close(e);
        return PS_ENOMEM;
    }
    c->e = e;
    snprintf(c->job, sizeof c->job, "%s", job);
    c->g = g;
    c->slots = slots;
    c->lease = lease;
    c->ttl_s = ttl_s > 0 ? ttl_s : 5;
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (c->efd < 0 || pthread_create(&c->th, NULL, agent_main, c) != 0) {
        ps_repl_coord_stop(c);
        return PS_EIO;
    }
    c->started = 1;
    *out = c;
    return 0;
}

void ps_repl_coord_stop(ps_repl_coord *c)
{
    if (!c)
        return;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    if (c->e && c->lease) {
        char why[256];
        if (ps_etcd_lease_revoke(c->e, c->lease, why, sizeof why) != 0)
            ps_debug("replicas: revoking this server's lease: %s", why);
    }
    ps_etcd_close(c->e);
    if (c->efd >= 0)
        close(c->efd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int ps_repl_coord_fd(const ps_repl_coord *c) { return c->efd; }

static void ask(ps_repl_coord *c, const req *q)
{
    pthread_mutex_lock(&c->mu);
    if (c->qlen < QCAP) {
        c->q[(c->qhead + c->qlen) % QCAP] = *q;
        c->qlen++;
        c->busy++;
        pthread_cond_signal(&c->cv);
    } else {
        ps_error("replicas: too many requests for etcd waiting; one was dropped");
    }
    pthread_mutex_unlock(&c->mu);
}

void ps_repl_coord_load(ps_repl_coord *c, uint64_t tag)
{
    req q = {.kind = PS_RC_LOAD, .tag = tag};
    ask(c, &q);
}

void ps_repl_coord_cas(ps_repl_coord *c, int64_t expect_rev, const ps_group_cfg *next,
                       uint64_t tag)
{
    req q = {.kind = PS_RC_CAS, .tag = tag, .expect_rev = expect_rev, .next = *next};
    ask(c, &q);
}

int ps_repl_coord_take(ps_repl_coord *c, ps_repl_coord_result *out)
{
    uint64_t v;
    ssize_t rd = read(c->efd, &v, sizeof v);
    (void)rd;
    pthread_mutex_lock(&c->mu);
    int got = c->rlen > 0;
    if (got) {
        *out = c->res[c->rhead];
        c->rhead = (c->rhead + 1) % QCAP;
        c->rlen--;
    }
    int more = c->rlen > 0;
    pthread_mutex_unlock(&c->mu);
    if (more) { /* the eventfd was drained: keep it readable for the rest */
        uint64_t one = 1;
        ssize_t w = write(c->efd, &one, sizeof one);
        (void)w;
    }
    return got;
}

int ps_repl_coord_busy(const ps_repl_coord *c)
{
    ps_repl_coord *m = (ps_repl_coord *)c;
    pthread_mutex_lock(&m->mu);
    int b = m->busy;
    pthread_mutex_unlock(&m->mu);
    return b;
}
