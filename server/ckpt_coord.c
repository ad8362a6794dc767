#include "ckpt_coord.h"

#include <errno.h>
#include <pthread.h>
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

enum { CK_IDLE = 0, CK_SNAP = 1, CK_WRITE = 2 };

/* The checkpoint writer thread and the one job it may have. */
typedef struct ckpt_writer {
    pthread_t tid;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, have_job, efd;
    /* the job (owned by the writer while have_job) and its result */
    ps_ckpt_meta meta;
    uint8_t *hello;
    ps_ckpt_part *parts;
    int nparts;
    int rc;
    uint64_t bytes;
    int64_t t0, t1;
    char path[1024], why[512];
} ckpt_writer;

struct ps_ckpt_coord {
    /* the server's configuration, as far as checkpoints go */
    char *dir;
    int rank, num_servers, num_workers, mode, max_staleness, threads;
    ps_opt_config opt;
    int64_t every;
    int every_ms;
    ps_ckpt_policy pol;
    ps_trace *trace;
    int stopping;
    int state;
    uint64_t seq;             /* sequence number of the next checkpoint */
    uint64_t token;           /* the snapshot being collected */
    ps_ckpt_part *parts;
    int got, failed;
    int64_t *min_version;     /* per owner, as last reported (sync, by rounds) */
    uint8_t *have_min;
    int64_t last_round;       /* sync: lowest version when the last one was taken */
    int64_t prev_round;       /* last_round before that, to try again after a failure */
    uint64_t last_mut;        /* the I/O thread's mutation count at the last one */
    uint64_t count;
    int64_t last_ns, retry_ns, info_ns;
    int64_t durable_round;    /* durable rounds: versions up to it are on disk */
    uint64_t written_seq;     /* the last checkpoint written */
    ps_held_reply *held_head, *held_tail;
    size_t nheld_init;
    ckpt_writer wr;
};

static void free_parts(ps_ckpt_part *parts, int n)
{
    for (int i = 0; parts && i < n; i++)
        free(parts[i].buf);
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
    c->got = 0;
    c->failed = 0;
    c->last_mut = mut;
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
    w->rc = ps_ckpt_write(c->dir, &w->meta, w->parts, w->nparts, PS_CKPT_KEEP, w->path,
                          sizeof w->path, &w->bytes, w->why, sizeof w->why);
    w->t1 = ps_now_ns();
}

/* Take out, in arrival order, every held reply that is now on disk. */
static ps_held_reply *release_held(ps_ckpt_coord *c)
{
    ps_held_reply **pp = &c->held_head, *last = NULL, *out = NULL, **tail = &out;
    while (*pp) {
        ps_held_reply *m = *pp;
        if (m->by_seq ? (uint64_t)m->version <= c->written_seq
                      : m->version <= c->durable_round) {
            *pp = m->next;
            c->nheld_init -= (size_t)m->by_seq;
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
    if (w->rc) {
        ps_error("checkpoint %llu failed: %s; training goes on, the next try is in 1 s",
                 (unsigned long long)w->meta.seq, w->why);
        c->retry_ns = now + CKPT_RETRY_NS;
        c->last_mut = 0; /* still to do */
        c->last_round = c->prev_round;
    } else {
        c->count++;
        double ms = (double)(w->t1 - w->t0) * 1e-6;
        /* one info line per 10 s at most: a checkpoint per round is common */
        if (now - c->info_ns >= 10000000000LL || c->stopping) {
            ps_info("checkpoint %llu written: %s, %llu chunks, versions %lld..%lld, %.1f MiB "
                    "in %.1f ms (%llu written so far)",
                    (unsigned long long)w->meta.seq, w->path,
                    (unsigned long long)w->meta.nchunks, (long long)w->meta.min_version,
                    (long long)w->meta.max_version, (double)w->bytes / 1048576.0, ms,
                    (unsigned long long)c->count);
            c->info_ns = now;
        } else {
            ps_debug("checkpoint %llu written: %s (%.1f ms)", (unsigned long long)w->meta.seq,
                     w->path, ms);
        }
        if (c->trace)
            ps_trace_event(c->trace, "write", "checkpoint", TID_CKPT, w->t0, w->t1,
                           (int64_t)w->meta.seq, -1);
        if (w->meta.nchunks && w->meta.min_version > c->durable_round)
            c->durable_round = w->meta.min_version;
        c->written_seq = w->meta.seq;
        released = release_held(c);
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
    for (int i = 0; i < T; i++) {
        const ps_ckpt_part *p = &c->parts[i];
        if (p->nchunks) {
            if (!m->nchunks || p->min_version < m->min_version)
                m->min_version = p->min_version;
            if (!m->nchunks || p->max_version > m->max_version)
                m->max_version = p->max_version;
        }
        m->nchunks += p->nchunks;
        m->counters.pushes += p->counters.pushes;
        m->counters.pulls += p->counters.pulls;
        m->counters.inits += p->counters.inits;
        m->counters.updates += p->counters.updates;
        m->counters.dup_dropped += p->counters.dup_dropped;
        m->counters.bytes_in += p->counters.bytes_in;
    }
    w->parts = c->parts;
    w->nparts = T;
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
    return c->token;
}

int ps_ckpt_coord_hold(ps_ckpt_coord *c, int tag, int64_t version, ps_held_reply **slot)
{
    *slot = NULL;
    int by_seq = tag == PS_OUT_INIT;
    if (by_seq)
        version = (int64_t)c->seq; /* the next snapshot holds the chunk */
    if (!by_seq && !(tag == PS_OUT_HELD && version > c->durable_round))
        return 0;
    ps_held_reply *m = calloc(1, sizeof *m);
    if (!m)
        return 1;
    m->version = version;
    m->by_seq = by_seq;
    c->nheld_init += (size_t)by_seq;
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

const ps_ckpt_policy *ps_ckpt_coord_policy(const ps_ckpt_coord *c) { return &c->pol; }

int ps_ckpt_coord_fd(const ps_ckpt_coord *c) { return c->wr.efd; }

void ps_ckpt_coord_stopping(ps_ckpt_coord *c) { c->stopping = 1; }

void ps_ckpt_coord_set_trace(ps_ckpt_coord *c, ps_trace *t)
{
    c->trace = t;
    if (t && c->pol.on)
        ps_trace_thread_name(t, TID_CKPT, "checkpoint-writer");
}

int ps_ckpt_coord_restore(ps_ckpt_coord *c, ps_shard *const *shards, int nshards,
                          uint8_t *hello, uint64_t *model_fp, char *why, size_t why_len)
{
    const char *dir = c->dir;
    int rank = c->rank;
    uint64_t *seqs = NULL;
    char msg[512], path[1024];
    int n = ps_ckpt_list(dir, rank, &seqs, msg, sizeof msg);
    if (n < 0) {
        ps_errorf(why, why_len, "--restore: %s", msg);
        return PS_EDATA;
    }
    if (n == 0) {
        ps_errorf(why, why_len,
            "--restore: no checkpoint of server %d in %s (start without --restore to begin afresh)",
            rank, dir);
        free(seqs);
        return PS_EDATA;
    }
    c->seq = seqs[0] + 1;
    for (int i = 0; i < n; i++) {
        ps_ckpt_file f;
        ps_ckpt_path(dir, rank, seqs[i], path, sizeof path);
        int rc = ps_ckpt_read(path, &f, msg, sizeof msg);
        if (rc) {
            ps_warn("checkpoint %s is corrupt or unreadable (%s): skipped%s", path, msg,
                    i + 1 < n ? "; trying the one before it" : "");
            continue;
        }
        const ps_ckpt_meta *m = &f.meta;
        rc = ps_ckpt_check_config(m, rank, c->num_servers, c->num_workers, c->mode,
                                  c->max_staleness, &c->opt, msg, sizeof msg);
        if (rc) {
            ps_errorf(why, why_len, "--restore: checkpoint %s does not fit this server: %s (start "
                "with the flags it was written with, or without --restore)", path, msg);
            ps_ckpt_file_free(&f);
            free(seqs);
            return PS_EMISMATCH;
        }
        size_t off = f.first;
        ps_shard_chunk_view v;
        while (ps_ckpt_next_chunk(&f, &off, &v)) {
            int owner = ps_server_owner(v.key, v.chunk, nshards);
            rc = ps_shard_restore_chunk(shards[owner], &v, msg, sizeof msg);
            if (rc) {
                ps_errorf(why, why_len, "--restore: %s: %s", path, msg);
                ps_ckpt_file_free(&f);
                free(seqs);
                return rc == PS_EMISMATCH ? PS_EDATA : rc;
            }
        }
        ps_shard_add_counters(shards[0], &m->counters);
        *model_fp = m->model_fp;
        /* a worker that said hello to the old process: its requests (resends
         * included) are served without a new hello */
        int known = 0;
        for (int r = 0; r < c->num_workers; r++) {
            hello[r] = m->hello[r] != 0;
            known += hello[r];
        }
        for (int t = 0; t < nshards; t++) {
            int have;
            c->min_version[t] = ps_shard_min_version(shards[t], &have);
            c->have_min[t] = (uint8_t)have;
        }
        c->last_round = c->prev_round = m->min_version;
        c->durable_round = m->min_version;
        c->written_seq = m->seq;
        ps_info("restored %s: checkpoint %llu, %llu chunks, versions %lld..%lld, %llu updates, "
                "%d of %d workers known, model fingerprint %016llx", path,
                (unsigned long long)m->seq, (unsigned long long)m->nchunks,
                (long long)m->min_version, (long long)m->max_version,
                (unsigned long long)m->counters.updates, known, c->num_workers,
                (unsigned long long)m->model_fp);
        ps_ckpt_file_free(&f);
        free(seqs);
        return 0;
    }
    ps_errorf(why, why_len,
        "--restore: none of the %d checkpoint(s) of server %d in %s is valid (see the lines above); "
        "refusing to start from an unknown state", n, rank, dir);
    free(seqs);
    return PS_EDATA;
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
    if (c->dir) {
        if (ps_mkdir_p(c->dir, 0755, NULL) != 0) {
            ps_errorf(why, why_len, "--checkpoint-dir %s: cannot create it: %s", c->dir,
                strerror(errno));
            ps_ckpt_coord_destroy(c);
            return PS_EIO;
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
