/* Local aggregation's shared segment (local_group.h). */
#include "local_group.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_hash.h"
#include "ps_log.h"
#include "ps_time.h"

#define MAGIC "PSLGRP02"
/* how often a wait looks at the abort flag and at its peers */
#define POLL_MS 50

typedef struct hdr {
    char magic[8];
    uint32_t size, n;
    uint64_t fp;        /* FNV-1a of n and the counts: the same model on every member */
    uint64_t total;     /* floats of all tensors */
    int32_t leader_pid;
    int32_t ready;      /* the leader initialised everything (atomic) */
    int32_t abort;      /* a member gave up: every wait fails (atomic) */
    int32_t final;      /* the final weights are published */
    int32_t attached;   /* members that attached (the leader counts too) */
    int32_t pids[PS_LGROUP_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the leader could not make the segment (it holds only this header):
     * why, for every member to say and stop with */
    char failed[320];
} hdr;

struct ps_lgroup {
    char name[256];
    int rank, size, n;
    hdr *h;
    size_t map_len;
    uint64_t *posted;   /* [size][n]: gradients a rank put in its slot */
    uint64_t *consumed; /* [size][n]: gradients the leader took from it */
    uint64_t *gen;      /* [n]: weight publications */
    float *w;           /* [total] */
    float *g;           /* [size][total] */
    size_t *off, *count;
    int timeout_ms;
    const int *interrupted;
    int unlinked;
    int owner_died;     /* this process found the mutex's holder dead */
    uint64_t take_seen; /* ps_lgroup_take: the generation to pass */
};

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

static uint64_t fingerprint(const size_t *counts, int n)
{
    uint64_t v = (uint64_t)n;
    uint64_t h = ps_fnv1a(PS_FNV1A_BASIS, &v, sizeof v);
    for (int k = 0; k < n; k++) {
        v = counts[k];
        h = ps_fnv1a(h, &v, sizeof v);
    }
    return h;
}

static size_t layout(ps_lgroup *g, uint64_t total, size_t *counters_at, size_t *floats_at)
{
    size_t at = up64(sizeof(hdr));
    *counters_at = at;
    at = up64(at + ((size_t)2 * g->size + 1) * g->n * sizeof(uint64_t));
    *floats_at = at;
    return at + (size_t)(g->size + 1) * total * sizeof(float);
}

static void bind_arrays(ps_lgroup *g, size_t counters_at, size_t floats_at, uint64_t total)
{
    char *base = (char *)g->h;
    g->posted = (uint64_t *)(base + counters_at);
    g->consumed = g->posted + (size_t)g->size * g->n;
    g->gen = g->consumed + (size_t)g->size * g->n;
    g->w = (float *)(base + floats_at);
    g->g = g->w + total;
}

/* A process that is there and not a zombie: a peer killed a moment ago
 * stays a zombie until its parent (a launcher, a shell) reaps it, and must
 * count as dead before that. */
static int alive(int pid)
{
    if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1; /* no /proc: kill's answer stands */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold ')' */
    return !(paren && paren[1] == ' ' && paren[2] == 'Z');
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 2 || n > 200 || s[0] != '/')
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* The mutex's holder died: the mutex is consistent again (every update
 * under it is a few stores) but the group is aborted, and this process, the
 * one that saw the death, names the dead peer when its wait ends. */
static void holder_died(ps_lgroup *g)
{
    pthread_mutex_consistent(&g->h->mu);
    __atomic_store_n(&g->h->abort, 1, __ATOMIC_RELEASE);
    g->owner_died = 1;
}

static void lock(ps_lgroup *g)
{
    if (pthread_mutex_lock(&g->h->mu) == EOWNERDEAD)
        holder_died(g);
}

/* The first rank other than this one whose process is gone, or -1. */
static int dead_peer(const ps_lgroup *g)
{
    for (int r = 0; r < g->size; r++)
        if (r != g->rank && g->h->pids[r] && !alive(g->h->pids[r]))
            return r;
    return -1;
}

static void unlock(ps_lgroup *g) { pthread_mutex_unlock(&g->h->mu); }

typedef int (*pred_fn)(ps_lgroup *g, int i);

/* With the lock held: wait until pred(g, i), or fail (see local_group.h). */
static int wait_for(ps_lgroup *g, pred_fn pred, int i, const char *what, char *why,
                    size_t why_len)
{
    int64_t deadline = ps_now_ns() + (int64_t)g->timeout_ms * 1000000;
    for (;;) {
        if (pred(g, i))
            return 0;
        /* a peer this process saw die (its own scan, or the mutex it
         * held) is named; an abort another worker raised is not ours to
         * explain: that worker says why */
        int dead = !__atomic_load_n(&g->h->abort, __ATOMIC_ACQUIRE) || g->owner_died
                       ? dead_peer(g) : -1;
        if (dead >= 0) {
            __atomic_store_n(&g->h->abort, 1, __ATOMIC_RELEASE);
            ps_errorf(why, why_len, "local aggregation: local worker %d (pid %d) of this "
                      "host died (while waiting for %s)", dead, g->h->pids[dead], what);
            return PS_ECLOSED;
        }
        if (__atomic_load_n(&g->h->abort, __ATOMIC_ACQUIRE)) {
            ps_errorf(why, why_len, "local aggregation: another worker of this host stopped "
                      "(while waiting for %s)", what);
            return PS_ECLOSED;
        }
        if (g->interrupted && __atomic_load_n(g->interrupted, __ATOMIC_ACQUIRE)) {
            ps_errorf(why, why_len, "interrupted");
            return PS_ECLOSED;
        }
        if (g->timeout_ms > 0 && ps_now_ns() > deadline) {
            ps_errorf(why, why_len, "local aggregation: waited %d ms for %s; giving up",
                      g->timeout_ms, what);
            return PS_ETIMEDOUT;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&g->h->cv, &g->h->mu, &ts) == EOWNERDEAD)
            holder_died(g);
    }
}

/* The owner and mode of `what` (a segment another user may hold) for a
 * message: "uid 1001 (mallory), mode 0666". */
static void owner_text(const struct stat *st, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(st->st_uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, len, "uid %u (%s), mode 0%o", (unsigned)st->st_uid, res->pw_name,
                 (unsigned)(st->st_mode & 07777));
    else
        snprintf(buf, len, "uid %u, mode 0%o", (unsigned)st->st_uid,
                 (unsigned)(st->st_mode & 07777));
}

/* Another user holds the group's name: nothing may be taken from, or given
 * to, a segment we did not make.  PS_EAUTH with why. */
static int squatted(const ps_lgroup *g, const struct stat *st, char *why, size_t why_len)
{
    char who[128];
    owner_text(st, who, sizeof who);
    ps_errorf(why, why_len, "local aggregation: /dev/shm%s belongs to %s, not to this user "
              "(uid %u): another user holds this host's group name; stopping (remove it as "
              "root, or run without --local-aggregate)", g->name, who, (unsigned)geteuid());
    return PS_EAUTH;
}

static void init_sync(hdr *h)
{
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
}

static int all_attached(ps_lgroup *g, int i);

/* The leader could not allocate the segment (why says so): leave the
 * members a segment of the header alone that says it, wait (as long as the
 * group waits) until every one of them has read it, and remove it.
 * Returns rc. */
static int tell_members(ps_lgroup *g, int fd, int rc, const char *why)
{
    size_t len = up64(sizeof(hdr));
    len = (len + 4095) & ~(size_t)4095;
    hdr *h = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0 && posix_fallocate(fd, 0, (off_t)len) == 0)
        h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) { /* not even a page: the members time out */
        shm_unlink(g->name);
        return rc;
    }
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, 8);
    h->size = (uint32_t)g->size;
    h->leader_pid = (int32_t)getpid();
    h->pids[0] = (int32_t)getpid();
    h->attached = 1;
    snprintf(h->failed, sizeof h->failed, "%s", why);
    init_sync(h);
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
    g->h = h;
    g->map_len = len;
    char ignored[200];
    lock(g);
    wait_for(g, all_attached, 0, "every local worker to hear why", ignored, sizeof ignored);
    unlock(g);
    munmap(h, len);
    g->h = NULL;
    shm_unlink(g->name);
    return rc;
}

static int create(ps_lgroup *g, uint64_t fp, uint64_t total, char *why, size_t why_len)
{
    size_t ca, fa, len = layout(g, total, &ca, &fa);
    shm_unlink(g->name); /* a stale group of a dead leader, or none (another user's: root only) */
    int fd = shm_open(g->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        int e = errno;
        char path[300];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm%s", g->name);
        if (e == EEXIST && stat(path, &st) == 0 && st.st_uid != geteuid())
            return squatted(g, &st, why, why_len);
        ps_errorf(why, why_len, "local aggregation: cannot create shared memory %s: %s",
                  g->name, strerror(e));
        return PS_EIO;
    }
    /* exact mode whatever the umask, and every page now: a /dev/shm too
     * small is an error here, for the whole group, not a SIGBUS later */
    int rc = 0;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)len) != 0) {
        ps_errorf(why, why_len, "local aggregation: cannot size %s to %zu bytes: %s", g->name,
                  len, strerror(errno));
        rc = PS_EIO;
    } else if ((rc = posix_fallocate(fd, 0, (off_t)len)) != 0) {
        struct statvfs vs;
        double free_mib = -1, all_mib = -1;
        if (ftruncate(fd, 0) == 0 && statvfs("/dev/shm", &vs) == 0) { /* what it gave back */
            free_mib = (double)vs.f_bavail * (double)vs.f_frsize / 1048576.0;
            all_mib = (double)vs.f_blocks * (double)vs.f_frsize / 1048576.0;
        }
        ps_errorf(why, why_len, "local aggregation: the %d workers of this host need %.1f MiB "
                  "of shared memory for their gradients and weights; /dev/shm has %.1f MiB "
                  "free of %.1f MiB (%s): give it more (docker run --shm-size, mount -o "
                  "remount,size=...) or run without --local-aggregate", g->size,
                  (double)len / 1048576.0, free_mib, all_mib, strerror(rc));
        return tell_members(g, fd, PS_ENOMEM, why);
    }
    void *p = rc ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!rc && p == MAP_FAILED) {
        ps_errorf(why, why_len, "local aggregation: cannot map %s: %s", g->name,
                  strerror(errno));
        rc = PS_ENOMEM;
    }
    close(fd);
    if (rc) {
        shm_unlink(g->name);
        return rc;
    }
    g->h = p;
    g->map_len = len;
    hdr *h = g->h; /* ftruncate gave zeros */
    memcpy(h->magic, MAGIC, 8);
    h->size = (uint32_t)g->size;
    h->n = (uint32_t)g->n;
    h->fp = fp;
    h->total = total;
    h->leader_pid = (int32_t)getpid();
    h->pids[0] = (int32_t)getpid();
    h->attached = 1;
    init_sync(h);
    bind_arrays(g, ca, fa, total);
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
    return 0;
}

/* One try to attach as a member: 0 attached, 1 not (yet) there, or an error. */
static int attach_once(ps_lgroup *g, uint64_t fp, uint64_t total, char *why, size_t why_len)
{
    int fd = shm_open(g->name, O_RDWR, 0);
    if (fd < 0) {
        char path[300];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm%s", g->name);
        if (errno != ENOENT && stat(path, &st) == 0 && st.st_uid != geteuid() && geteuid() != 0)
            return squatted(g, &st, why, why_len);
        return 1;
    }
    struct stat st;
    size_t ca, fa, len = layout(g, total, &ca, &fa);
    if (fstat(fd, &st) != 0) {
        close(fd);
        return 1;
    }
    /* only a segment of this user, mode 0600, made by the leader: another
     * user's file under the group's name gets nothing of ours (a leader
     * still setting its mode: wait; as root, the leader removes another
     * user's file: wait for it) */
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        close(fd);
        return geteuid() == 0 ? 1 : squatted(g, &st, why, why_len);
    }
    if ((st.st_mode & 07777) != 0600 || (size_t)st.st_size < sizeof(hdr)) {
        close(fd);
        return 1; /* the leader is still making it */
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return 1;
    hdr *h = p;
    if (memcmp(h->magic, MAGIC, 8) != 0 || !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) ||
        !alive(h->leader_pid)) {
        munmap(p, (size_t)st.st_size);
        return 1; /* not ready, or a dead leader's: wait for the new one */
    }
    if (h->failed[0]) {
        /* the leader could not make it: say why, and let it know we heard */
        ps_errorf(why, why_len, "%s", h->failed);
        g->h = h;
        g->map_len = (size_t)st.st_size;
        lock(g);
        h->attached++;
        pthread_cond_broadcast(&h->cv);
        unlock(g);
        munmap(p, (size_t)st.st_size);
        g->h = NULL;
        return PS_ENOMEM;
    }
    if (h->size != (uint32_t)g->size || h->fp != fp || (size_t)st.st_size != len) {
        ps_errorf(why, why_len, "local aggregation: the leader of group %s (pid %d) has %u "
                  "local workers and model fingerprint %016llx, this worker %d and %016llx "
                  "(give every worker of the host the same --local-size and model)",
                  g->name, h->leader_pid, h->size, (unsigned long long)h->fp, g->size,
                  (unsigned long long)fp);
        munmap(p, (size_t)st.st_size);
        return PS_EMISMATCH;
    }
    g->h = h;
    g->map_len = len;
    lock(g);
    int holder = h->pids[g->rank];
    if (holder && holder != (int)getpid() && alive(holder)) {
        unlock(g);
        ps_errorf(why, why_len, "local aggregation: local rank %d of group %s is taken by pid "
                  "%d (two workers with the same rank?)", g->rank, g->name, holder);
        munmap(p, len);
        g->h = NULL;
        return PS_ESTATE;
    }
    h->pids[g->rank] = (int32_t)getpid();
    h->attached++;
    pthread_cond_broadcast(&h->cv);
    unlock(g);
    bind_arrays(g, ca, fa, total);
    return 0;
}

int ps_lgroup_open(const char *name, int rank, int size, const size_t *counts, int n,
                   int timeout_ms, const int *interrupted, ps_lgroup **out, char *why,
                   size_t why_len)
{
    *out = NULL;
    if (!name || !name_ok(name)) {
        ps_errorf(why, why_len, "local aggregation: the group name must be / and 1..199 of "
                  "[A-Za-z0-9._-], got '%s'", name ? name : "(null)");
        return PS_EINVAL;
    }
    if (size < 2 || size > PS_LGROUP_MAX || rank < 0 || rank >= size || n < 1) {
        ps_errorf(why, why_len, "local aggregation: local rank %d of %d (2..%d workers per "
                  "host)", rank, size, PS_LGROUP_MAX);
        return PS_EINVAL;
    }
    ps_lgroup *g = calloc(1, sizeof *g);
    if (!g || !(g->off = calloc((size_t)n, sizeof *g->off)) ||
        !(g->count = calloc((size_t)n, sizeof *g->count))) {
        if (g) {
            free(g->off);
            free(g);
        }
        return PS_ENOMEM;
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    g->rank = rank;
    g->size = size;
    g->n = n;
    g->timeout_ms = timeout_ms;
    g->interrupted = interrupted;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        g->off[i] = (size_t)total;
        g->count[i] = counts[i];
        total += counts[i];
    }
    uint64_t fp = fingerprint(counts, n);
    int rc;
    if (rank == 0) {
        rc = create(g, fp, total, why, why_len);
    } else {
        int64_t deadline = ps_now_ns() + (int64_t)timeout_ms * 1000000;
        while ((rc = attach_once(g, fp, total, why, why_len)) == 1) {
            if (interrupted && __atomic_load_n(interrupted, __ATOMIC_ACQUIRE)) {
                ps_errorf(why, why_len, "interrupted");
                rc = PS_ECLOSED;
                break;
            }
            if (timeout_ms > 0 && ps_now_ns() > deadline) {
                ps_errorf(why, why_len, "local aggregation: no leader (local rank 0) made "
                          "group %s within %d ms", name, timeout_ms);
                rc = PS_ETIMEDOUT;
                break;
            }
            nanosleep(&(struct timespec){0, 20000000L}, NULL);
        }
    }
    if (rc) {
        free(g->off);
        free(g->count);
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

static int all_attached(ps_lgroup *g, int i)
{
    (void)i;
    return g->h->attached >= g->size;
}

int ps_lgroup_wait_members(ps_lgroup *g, char *why, size_t why_len)
{
    lock(g);
    int rc = wait_for(g, all_attached, 0, "every local worker to start", why, why_len);
    unlock(g);
    if (!rc && !g->unlinked) {
        shm_unlink(g->name); /* everyone has it mapped: nothing to leave behind */
        g->unlinked = 1;
    }
    return rc;
}

int ps_lgroup_rank(const ps_lgroup *g) { return g->rank; }
int ps_lgroup_size(const ps_lgroup *g) { return g->size; }

static int slot_free(ps_lgroup *g, int i)
{
    size_t k = (size_t)g->rank * g->n + i;
    return g->consumed[k] == g->posted[k];
}

int ps_lgroup_post_grad(ps_lgroup *g, int i, const float *src, char *why, size_t why_len)
{
    lock(g);
    int rc = wait_for(g, slot_free, i, "the leader to take the previous gradient", why,
                      why_len);
    unlock(g);
    if (rc)
        return rc;
    /* the slot is ours until posted moves: the leader reads it only after */
    memcpy(g->g + (size_t)g->rank * g->h->total + g->off[i], src, g->count[i] * sizeof(float));
    lock(g);
    g->posted[(size_t)g->rank * g->n + i]++;
    pthread_cond_broadcast(&g->h->cv);
    unlock(g);
    return 0;
}

static int all_posted(ps_lgroup *g, int i)
{
    for (int r = 1; r < g->size; r++) {
        size_t k = (size_t)r * g->n + i;
        if (g->posted[k] == g->consumed[k])
            return 0;
    }
    return 1;
}

int ps_lgroup_sum_grads(ps_lgroup *g, int i, float *grad, char *why, size_t why_len)
{
    lock(g);
    int rc = wait_for(g, all_posted, i, "the gradients of the other local workers", why,
                      why_len);
    unlock(g);
    if (rc)
        return rc;
    size_t n = g->count[i];
    /* local-rank order, like the servers' rank order; the mean as they take it */
    for (int r = 1; r < g->size; r++) {
        const float *s = g->g + (size_t)r * g->h->total + g->off[i];
        for (size_t k = 0; k < n; k++)
            grad[k] = grad[k] + s[k];
    }
    float L = (float)g->size;
    for (size_t k = 0; k < n; k++)
        grad[k] = grad[k] / L;
    lock(g);
    for (int r = 1; r < g->size; r++)
        g->consumed[(size_t)r * g->n + i]++;
    pthread_cond_broadcast(&g->h->cv);
    unlock(g);
    return 0;
}

int ps_lgroup_publish(ps_lgroup *g, int i, const float *src)
{
    lock(g);
    memcpy(g->w + g->off[i], src, g->count[i] * sizeof(float));
    g->gen[i]++;
    pthread_cond_broadcast(&g->h->cv);
    unlock(g);
    return 0;
}

static int newer(ps_lgroup *g, int i) { return g->gen[i] > g->take_seen; }

int ps_lgroup_take(ps_lgroup *g, int i, float *dst, uint64_t *seen, int block, int *took,
                   char *why, size_t why_len)
{
    *took = 0;
    lock(g);
    g->take_seen = *seen;
    int rc = 0;
    if (block)
        rc = wait_for(g, newer, i, "the weights from the leader", why, why_len);
    if (!rc && g->gen[i] > *seen) {
        /* under the lock: in async mode the leader may publish again meanwhile */
        memcpy(dst, g->w + g->off[i], g->count[i] * sizeof(float));
        *seen = g->gen[i];
        *took = 1;
    }
    unlock(g);
    return rc;
}

int ps_lgroup_set_final(ps_lgroup *g)
{
    lock(g);
    g->h->final = 1;
    pthread_cond_broadcast(&g->h->cv);
    unlock(g);
    return 0;
}

static int is_final(ps_lgroup *g, int i)
{
    (void)i;
    return g->h->final != 0;
}

int ps_lgroup_wait_final(ps_lgroup *g, char *why, size_t why_len)
{
    lock(g);
    /* the final barrier waits for every host: as long as the slowest */
    int keep = g->timeout_ms;
    g->timeout_ms = 0;
    int rc = wait_for(g, is_final, 0, "the final weights", why, why_len);
    g->timeout_ms = keep;
    unlock(g);
    return rc;
}

void ps_lgroup_abort(ps_lgroup *g)
{
    if (g && g->h)
        __atomic_store_n(&g->h->abort, 1, __ATOMIC_RELEASE);
}

void ps_lgroup_close(ps_lgroup *g)
{
    if (!g)
        return;
    if (g->h) {
        lock(g);
        if (g->h->pids[g->rank] == (int32_t)getpid())
            g->h->pids[g->rank] = 0; /* a clean exit is not a death */
        pthread_cond_broadcast(&g->h->cv);
        unlock(g);
        munmap(g->h, g->map_len);
    }
    if (g->rank == 0 && !g->unlinked)
        shm_unlink(g->name);
    free(g->off);
    free(g->count);
    free(g);
}
