/* Checkpoint coordination (server/ckpt_coord.h): taking a checkpoint,
 * the writer thread, the replies held until they are durable, and the
 * coordinator's life.  Reading checkpoints back (--restore) is
 * ckpt_restore.c's. */
#include "ckpt_coord_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ps_error.h"
#include "ps_fs.h"
#include "ps_log.h"
#include "ps_time.h"
#include "zmsg.h"

/* Trace lanes: update thread i is 1 + i; the checkpoint writer has its own. */
#define TID_CKPT 999
/* After a failed checkpoint write, wait this long before the next try. */
#define CKPT_RETRY_NS 1000000000LL
/* While writes keep failing: one error line per this long, the tries in
 * between counted in it. */
#define FAIL_LOG_NS 30000000000LL

enum { CK_IDLE = 0, CK_SNAP = 1, CK_WRITE = 2 };

static void free_parts(ps_ckpt_part *parts, int n)
{
    for (int i = 0; parts && i < n; i++) {
        free(parts[i].buf);
        free(parts[i].tbuf);
    }
    free(parts);
}

/* Take a snapshot: every owner serializes its chunks when PS_CMD_CKPT(token)
 * reaches it.  0 when out of memory (tried again in a second). */
static int start(ps_ckpt_coord *c, int64_t now, uint64_t mut, uint64_t *token)
{
    c->parts = calloc((size_t)c->threads, sizeof *c->parts);
    if (!c->parts) {
        ps_error("out of memory starting checkpoint %llu", (unsigned long long)c->seq);
        c->retry_ns = now + CKPT_RETRY_NS;
        return 0;
    }
    c->state = CK_SNAP;
    c->token = c->seq++;
    c->snap_full = c->need_full || !c->written_seq || c->chain_len >= PS_CKPT_FULL_EVERY;
    c->got = 0;
    c->failed = 0;
    c->last_mut = mut;
    c->snap_mut = mut;
    c->last_ns = now;
    *token = c->token;
    return 1;
}

/* The writer's work: runs on the writer thread, or on the I/O thread for the
 * last checkpoint at stop. */
static void write_job(ps_ckpt_coord *c)
{
    ckpt_writer *w = &c->wr;
    w->t0 = ps_now_ns();
    w->why[0] = 0;
    /* a directory removed under the server is made again */
    w->recreated = 0;
    if (ps_mkdir_p(c->dir, 0755, &w->recreated) != 0) {
        snprintf(w->why, sizeof w->why, "cannot create the directory %s: %s", c->dir,
                 strerror(errno));
        w->rc = PS_EIO;
        w->t1 = ps_now_ns();
        return;
    }
    w->rc = ps_ckpt_write(c->dir, &w->meta, w->parts, w->nparts, PS_CKPT_KEEP, w->path,
                          sizeof w->path, &w->bytes, w->why, sizeof w->why);
    w->t1 = ps_now_ns();
}

/* Is a reply of this kind and version durable by now? */
static int durable(const ps_ckpt_coord *c, int kind, int64_t version)
{
    if (kind == PS_OUT_INIT)
        return version > 0 && (uint64_t)version <= c->written_seq;
    if (kind == PS_OUT_ACK)
        return (uint64_t)version <= c->written_mut + (uint64_t)c->every;
    return version <= c->durable_round;
}

/* Take out, in arrival order, every held reply that is now on disk (all:
 * every one). */
static ps_held_reply *release_held(ps_ckpt_coord *c, int all)
{
    ps_held_reply **pp = &c->held_head, *last = NULL, *out = NULL, **tail = &out;
    while (*pp) {
        ps_held_reply *m = *pp;
        if (all || durable(c, m->kind, m->version)) {
            *pp = m->next;
            c->nheld_init -= (size_t)(m->kind == PS_OUT_INIT);
            m->next = NULL;
            *tail = m;
            tail = &m->next;
        } else {
            last = m;
            pp = &m->next;
        }
    }
    c->held_tail = last;
    return out;
}

/* Say that write `seq` failed: the first failure at once, then one line per
 * FAIL_LOG_NS with the tries in between. */
static void failure_said(ps_ckpt_coord *c, int64_t now, uint64_t seq)
{
    if (c->fail_log_ns && now - c->fail_log_ns < FAIL_LOG_NS) {
        c->fail_unlogged++;
        return;
    }
    const char *then =
        c->on_failure == PS_CKPT_FAIL_CONTINUE
            ? "replies that waited for a checkpoint go without one (--on-checkpoint-failure "
              "continue): a crash now loses more than --checkpoint-every says"
        : c->on_failure == PS_CKPT_FAIL_EXIT
            ? "the server exits if writes still fail a while after the first failure "
              "(--on-checkpoint-failure exit)"
            : "replies that wait for a checkpoint are held until one is written, so training "
              "may stall, and their workers are told so after a while (--on-checkpoint-failure "
              "stall); free space or fix the directory";
    ps_error("checkpoint %llu failed: %s (%llu failed tries in %.0f s); %s; the next try is in "
             "1 s", (unsigned long long)seq, c->fail_why, (unsigned long long)c->fail_streak,
             (double)(now - c->fail_since) * 1e-9, then);
    c->fail_log_ns = now;
    c->fail_unlogged = 0;
}

/* A write finished: log it, and with durable rounds let the replies go. */
static ps_held_reply *done(ps_ckpt_coord *c)
{
    ckpt_writer *w = &c->wr;
    ps_held_reply *released = NULL;
    if (w->started) { /* the writer's results happen-before this read */
        pthread_mutex_lock(&w->mu);
        pthread_mutex_unlock(&w->mu);
    }
    int64_t now = ps_now_ns();
    if (w->recreated)
        ps_warn("--checkpoint-dir %s was gone: made it again", c->dir);
    if (w->rc) {
        c->nfail++;
        c->fail_streak++;
        snprintf(c->fail_why, sizeof c->fail_why, "%s", w->why);
        if (!c->fail_since)
            c->fail_since = now;
        c->retry_ns = now + CKPT_RETRY_NS;
        c->last_mut = 0; /* still to do */
        c->last_round = c->prev_round;
        c->need_full = 1; /* the changes it held are marked clean: only a full one has them */
        failure_said(c, now, w->meta.seq);
        /* continue: what waits for a checkpoint goes without one */
        if (c->on_failure == PS_CKPT_FAIL_CONTINUE)
            released = release_held(c, 1);
    } else {
        if (c->fail_since)
            ps_warn("checkpoint %llu written to %s after %llu failed tries over %.1f s: "
                    "checkpoints work again", (unsigned long long)w->meta.seq, c->dir,
                    (unsigned long long)c->fail_streak, (double)(now - c->fail_since) * 1e-9);
        c->fail_since = 0;
        c->fail_unlogged = 0;
        c->fail_streak = 0;
        c->fail_log_ns = 0;
        c->count++;
        c->last_done_ns = now;
        c->last_took_ns = w->t1 - w->t0;
        double ms = (double)(w->t1 - w->t0) * 1e-6;
        /* each says what it holds, so the loss of a crash can be counted: the
         * updates in it, and the inits and pushes of this process it holds
         * (of how many received); one info line per second at most, as a
         * checkpoint per round is common */
        if (now - c->info_ns >= 1000000000LL || c->stopping) {
            char kind[64] = "";
            if (w->meta.nparts)
                snprintf(kind, sizeof kind, ", %llu table partitions (%s)",
                         (unsigned long long)w->meta.nparts, w->meta.prev ? "changes" : "whole");
            ps_info("checkpoint %llu written: %s, %llu chunks%s, versions %lld..%lld, %llu "
                    "updates, %llu inits and pushes of this process, %.1f MiB in %.1f ms (%llu "
                    "written so far)", (unsigned long long)w->meta.seq, w->path,
                    (unsigned long long)w->meta.nchunks, kind, (long long)w->meta.min_version,
                    (long long)w->meta.max_version,
                    (unsigned long long)w->meta.counters.updates, (unsigned long long)w->mut,
                    (double)w->bytes / 1048576.0, ms, (unsigned long long)c->count);
            c->info_ns = now;
        } else {
            ps_debug("checkpoint %llu written: %s, %llu updates, %llu inits and pushes of this "
                     "process (%.1f ms)", (unsigned long long)w->meta.seq, w->path,
                     (unsigned long long)w->meta.counters.updates, (unsigned long long)w->mut,
                     ms);
        }
        if (c->trace)
            ps_trace_event(c->trace, "write", "checkpoint", TID_CKPT, w->t0, w->t1,
                           (int64_t)w->meta.seq, -1);
        if (w->meta.nchunks + w->meta.nparts && w->meta.min_version > c->durable_round)
            c->durable_round = w->meta.min_version;
        c->written_seq = w->meta.seq;
        c->chain_len = w->meta.prev ? c->chain_len + 1 : 0;
        c->need_full = 0;
        c->written_mut = w->mut;
        released = release_held(c, 0);
    }
    free_parts(w->parts, w->nparts);
    free(w->hello);
    w->parts = NULL;
    w->hello = NULL;
    c->state = CK_IDLE;
    return released;
}

/* Every owner's part is in: describe the server and hand it all to the writer
 * (at stop, write it here and now). */
static ps_held_reply *submit(ps_ckpt_coord *c, uint64_t model_fp, const uint8_t *hello)
{
    int T = c->threads, W = c->num_workers;
    ckpt_writer *w = &c->wr;
    if (c->failed) {
        ps_error("checkpoint %llu: out of memory serializing the chunks; the next try is in 1 s",
                 (unsigned long long)c->token);
        c->need_full = 1; /* some tables' changes were not taken: a delta would lose them */
        free_parts(c->parts, T);
        c->parts = NULL;
        c->state = CK_IDLE;
        c->retry_ns = ps_now_ns() + CKPT_RETRY_NS;
        c->last_mut = 0;
        c->last_round = c->prev_round;
        return NULL;
    }
    ps_ckpt_meta *m = &w->meta;
    memset(m, 0, sizeof *m);
    m->seq = c->token;
    m->rank = c->rank;
    m->num_servers = c->num_servers;
    m->num_workers = W;
    m->mode = c->mode;
    m->max_staleness = c->max_staleness;
    m->opt = c->opt;
    m->config_fp = ps_ckpt_config_fp(m->rank, m->num_servers, W, m->mode, m->max_staleness,
                                     &m->opt);
    m->model_fp = model_fp;
    w->hello = calloc((size_t)W, 1);
    if (w->hello)
        memcpy(w->hello, hello, (size_t)W);
    m->hello = w->hello;
    m->threads = T;
    int have_versions = 0;
    for (int i = 0; i < T; i++) {
        const ps_ckpt_part *p = &c->parts[i];
        if (p->nchunks + p->nparts) {
            if (!(m->nchunks + m->nparts) || p->min_version < m->min_version)
                m->min_version = p->min_version;
            if (!(m->nchunks + m->nparts) || p->max_version > m->max_version)
                m->max_version = p->max_version;
        }
        m->nchunks += p->nchunks;
        m->nparts += p->nparts;
        ps_stats_add(&m->counters, &have_versions, &p->counters);
    }
    /* a delta names the checkpoint it builds on; without tables every
     * checkpoint is whole */
    m->prev = c->snap_full || !m->nparts ? 0 : c->written_seq;
    w->parts = c->parts;
    w->nparts = T;
    w->mut = c->snap_mut;
    c->parts = NULL;
    c->state = CK_WRITE;
    if (c->stopping || !w->started) {
        write_job(c);
        return done(c);
    }
    pthread_mutex_lock(&w->mu);
    w->have_job = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

ps_held_reply *ps_ckpt_coord_part(ps_ckpt_coord *c, int i, ps_ckpt_frame *cf, uint64_t model_fp,
                                  const uint8_t *hello)
{
    if (c->state != CK_SNAP || cf->token != c->token || c->parts[i].buf) {
        free(cf->part.buf); /* not the snapshot being collected */
        free(cf->part.tbuf);
        return NULL;
    }
    if (cf->rc)
        c->failed = 1;
    c->parts[i] = cf->part;
    if (++c->got == c->threads)
        return submit(c, model_fp, hello);
    return NULL;
}

static void *writer_main(void *arg)
{
    ps_ckpt_coord *c = arg;
    ckpt_writer *w = &c->wr;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->have_job && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->mu);
        write_job(c);
        pthread_mutex_lock(&w->mu);
        w->have_job = 0;
        uint64_t one = 1;
        ssize_t r = write(w->efd, &one, sizeof one); /* wakes the I/O thread */
        (void)r;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int ps_ckpt_coord_due(ps_ckpt_coord *c, int64_t now, uint64_t mut, uint64_t *token)
{
    if (!c->pol.on || c->state != CK_IDLE || c->stopping || now < c->retry_ns)
        return 0;
    int due = c->nheld_init > 0; /* new chunks: their init acknowledgements wait */
    if (c->every > 0 && c->mode == PS_MODE_SYNC) {
        int have = 0;
        int64_t gmin = 0;
        for (int i = 0; i < c->threads; i++)
            if (c->have_min[i] && (!have || c->min_version[i] < gmin)) {
                gmin = c->min_version[i];
                have = 1;
            }
        if (have && gmin >= c->last_round + c->every) {
            c->prev_round = c->last_round;
            c->last_round = gmin;
            due = 1;
        }
    } else if (c->every > 0 && mut - c->last_mut >= (uint64_t)c->every) {
        due = 1;
    }
    if (!due && c->every_ms > 0 && mut != c->last_mut &&
        now - c->last_ns >= (int64_t)c->every_ms * 1000000LL)
        due = 1;
    return due && start(c, now, mut, token);
}

int ps_ckpt_coord_final(ps_ckpt_coord *c, int64_t now, uint64_t mut, uint64_t *token)
{
    if (!c->pol.on || c->state != CK_IDLE || mut == c->last_mut)
        return 0;
    return start(c, now, mut, token);
}

int ps_ckpt_coord_full(const ps_ckpt_coord *c) { return c->snap_full; }

void ps_ckpt_coord_progress(ps_ckpt_coord *c, int i, int64_t min_version, int have)
{
    c->min_version[i] = min_version;
    c->have_min[i] = (uint8_t)have;
}

ps_held_reply *ps_ckpt_coord_written(ps_ckpt_coord *c)
{
    uint64_t v;
    ssize_t r = read(c->wr.efd, &v, sizeof v);
    (void)r;
    return c->state == CK_WRITE ? done(c) : NULL;
}

int ps_ckpt_coord_idle(const ps_ckpt_coord *c) { return c->state == CK_IDLE; }

int ps_ckpt_coord_collecting(const ps_ckpt_coord *c) { return c->state == CK_SNAP; }

uint64_t ps_ckpt_coord_abandon(ps_ckpt_coord *c)
{
    free_parts(c->parts, c->threads);
    c->parts = NULL;
    c->state = CK_IDLE;
    c->need_full = 1;
    return c->token;
}

int ps_ckpt_coord_hold(ps_ckpt_coord *c, int tag, int64_t version, int64_t now,
                       ps_held_reply **slot)
{
    *slot = NULL;
    if (tag != PS_OUT_INIT && tag != PS_OUT_HELD && tag != PS_OUT_ACK)
        return 0;
    /* a chunk in a snapshot already waits for that one only; a new one for
     * the next */
    if (tag == PS_OUT_INIT && version <= 0)
        version = (int64_t)c->seq;
    if (durable(c, tag, version))
        return 0;
    if (c->fail_since && c->on_failure == PS_CKPT_FAIL_CONTINUE)
        return 0; /* writes fail and the operator chose to go on without them */
    ps_held_reply *m = calloc(1, sizeof *m);
    if (!m)
        return 1;
    m->version = version;
    m->kind = tag;
    m->held_ns = now;
    c->nheld_init += (size_t)(tag == PS_OUT_INIT);
    if (c->held_tail)
        c->held_tail->next = m;
    else
        c->held_head = m;
    c->held_tail = m;
    *slot = m;
    return 1;
}

void ps_held_reply_free(ps_held_reply *m)
{
    ps_zmsg_close_all(m->f, m->nf);
    free(m);
}

uint64_t ps_ckpt_coord_count(const ps_ckpt_coord *c) { return c->count; }

void ps_ckpt_coord_last(const ps_ckpt_coord *c, int64_t *done_ns, int64_t *took_ns)
{
    *done_ns = c->last_done_ns;
    *took_ns = c->last_took_ns;
}

uint64_t ps_ckpt_coord_failures(const ps_ckpt_coord *c) { return c->nfail; }

int ps_ckpt_coord_failing(const ps_ckpt_coord *c, char *why, size_t why_len, int64_t *since_ns)
{
    if (!c->fail_since)
        return 0;
    ps_errorf(why, why_len, "%s", c->fail_why);
    *since_ns = c->fail_since;
    return 1;
}

void ps_ckpt_coord_overdue(ps_ckpt_coord *c, int64_t now,
                           void (*fn)(void *user, const ps_held_reply *m), void *user)
{
    if (!c->fail_since || c->on_failure != PS_CKPT_FAIL_STALL)
        return;
    for (ps_held_reply *m = c->held_head; m; m = m->next)
        if (!m->noticed && now - m->held_ns >= c->failure_ns &&
            now - c->fail_since >= c->failure_ns) {
            m->noticed = 1;
            fn(user, m);
        }
}

int ps_ckpt_coord_give_up(const ps_ckpt_coord *c, int64_t now)
{
    return c->on_failure == PS_CKPT_FAIL_EXIT && c->fail_since &&
           now - c->fail_since >= c->failure_ns;
}

ps_held_reply *ps_ckpt_coord_take_held(ps_ckpt_coord *c) { return release_held(c, 1); }

const ps_ckpt_policy *ps_ckpt_coord_policy(const ps_ckpt_coord *c) { return &c->pol; }

int ps_ckpt_coord_fd(const ps_ckpt_coord *c) { return c->wr.efd; }

void ps_ckpt_coord_stopping(ps_ckpt_coord *c) { c->stopping = 1; }

void ps_ckpt_coord_set_trace(ps_ckpt_coord *c, ps_trace *t)
{
    c->trace = t;
    if (t && c->pol.on)
        ps_trace_thread_name(t, TID_CKPT, "checkpoint-writer");
}

/* A checkpoint directory that cannot be made, or written (read-only, full,
 * no permission: even root's writes fail on a read-only mount), is refused
 * before the server runs: a file is written, synced and removed. */
static int try_write(const char *dir, int rank, char *why, size_t why_len)
{
    if (ps_mkdir_p(dir, 0755, NULL) != 0) {
        ps_errorf(why, why_len, "--checkpoint-dir %s: cannot create it: %s", dir,
            strerror(errno));
        return PS_EINVAL;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/.write-test-%d", dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const char *step = "create a file in";
    int ok = fd >= 0 && (step = "write a file in", write(fd, "ps\n", 3) == 3) &&
             (step = "sync a file in", fsync(fd) == 0);
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlink(path);
    if (!ok) {
        ps_errorf(why, why_len, "--checkpoint-dir %s: cannot %s it: %s", dir, step,
            strerror(e));
        return PS_EINVAL;
    }
    return 0;
}

int ps_ckpt_coord_create(const ps_server_config *cfg, ps_ckpt_coord **out, char *why,
                         size_t why_len)
{
    *out = NULL;
    ps_ckpt_coord *c = calloc(1, sizeof *c);
    if (!c) {
        ps_errorf(why, why_len, "out of memory starting the server");
        return PS_ENOMEM;
    }
    c->wr.efd = -1;
    c->rank = cfg->rank;
    c->num_servers = cfg->num_servers;
    c->num_workers = cfg->num_workers;
    c->mode = cfg->mode;
    c->max_staleness = cfg->max_staleness;
    c->threads = cfg->threads;
    c->opt = cfg->opt;
    c->every = cfg->checkpoint_every;
    c->every_ms = cfg->checkpoint_every_ms;
    c->on_failure = cfg->on_checkpoint_failure;
    c->failure_ns = (int64_t)(cfg->checkpoint_failure_ms ? cfg->checkpoint_failure_ms
                              : c->on_failure == PS_CKPT_FAIL_EXIT ? PS_CKPT_EXIT_AFTER_MS
                                                                   : PS_CKPT_STALL_NOTICE_MS) *
                    1000000LL;
    c->seq = 1;
    c->dir = cfg->checkpoint_dir ? strdup(cfg->checkpoint_dir) : NULL;
    c->min_version = calloc((size_t)c->threads, sizeof *c->min_version);
    c->have_min = calloc((size_t)c->threads, sizeof *c->have_min);
    if ((cfg->checkpoint_dir && !c->dir) || !c->min_version || !c->have_min) {
        ps_errorf(why, why_len, "out of memory starting the server");
        ps_ckpt_coord_destroy(c);
        return PS_ENOMEM;
    }
    /* with any checkpoints in sync mode, pushes are acknowledged when their
     * round is complete; with one every round, rounds are durable */
    int sync = cfg->mode == PS_MODE_SYNC;
    c->pol.on = c->dir && (c->every > 0 || c->every_ms > 0);
    c->pol.defer_acks = c->pol.on && sync;
    c->pol.durable = c->pol.on && sync && c->every == 1 && c->every_ms == 0;
    c->pol.report_progress = c->pol.on && sync && c->every > 0;
    c->pol.ack_bound = c->pol.on && !sync && c->every > 0;
    if (c->dir) {
        /* a directory only read (--restore without checkpoints, an offline
         * export) need not be writable */
        int rc = c->pol.on ? try_write(c->dir, c->rank, why, why_len) : 0;
        if (rc) {
            ps_ckpt_coord_destroy(c);
            return rc;
        }
        uint64_t *seqs = NULL;
        char msg[512];
        int n = ps_ckpt_list(c->dir, c->rank, &seqs, msg, sizeof msg);
        if (n < 0) {
            ps_errorf(why, why_len, "--checkpoint-dir: %s", msg);
            ps_ckpt_coord_destroy(c);
            return PS_EIO;
        }
        if (n > 0)
            c->seq = seqs[0] + 1; /* never reuse a name, even without --restore */
        free(seqs);
    }
    if (c->pol.on) {
        c->wr.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (c->wr.efd < 0) {
            ps_errorf(why, why_len, "cannot create an eventfd: %s", strerror(errno));
            ps_ckpt_coord_destroy(c);
            return PS_EIO;
        }
    }
    *out = c;
    return 0;
}

int ps_ckpt_coord_run_writer(ps_ckpt_coord *c)
{
    if (!c->pol.on)
        return 0;
    c->last_ns = ps_now_ns();
    ckpt_writer *w = &c->wr;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->tid, NULL, writer_main, c) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        return PS_ENOMEM;
    }
    w->started = 1;
    return 0;
}

void ps_ckpt_coord_destroy(ps_ckpt_coord *c)
{
    if (!c)
        return;
    while (c->held_head) {
        ps_held_reply *m = c->held_head;
        c->held_head = m->next;
        ps_held_reply_free(m);
    }
    ckpt_writer *w = &c->wr;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->tid, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    free_parts(w->parts, w->nparts);
    free(w->hello);
    free_parts(c->parts, c->threads);
    if (w->efd >= 0)
        close(w->efd);
    free(c->min_version);
    free(c->have_min);
    free(c->dir);
    free(c);
}
