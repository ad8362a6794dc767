#include "ps_curve.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_fs.h"
#include "ps_log.h"
#include "ps_time.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_POLL_MS 100           /* how long ps_curve_auth_stop may wait */
#define RESCAN_NS 1000000000LL    /* re-read authorized/ at least this often */
#define QUIET_NS 10000000000LL    /* repeated refusals of one peer: log once per 10 s */
#define QUIET_SLOTS 32
#define KEY_FILE_MAX 128          /* a key file is 40 characters and a newline */

static void wipe(void *p, size_t n) { explicit_bzero(p, n); }

int ps_curve_available(char *why, size_t why_len)
{
    if (!zmq_has("curve")) {
        int maj, min, pat;
        zmq_version(&maj, &min, &pat);
        ps_errorf(why, why_len,
            "this libzmq (%d.%d.%d) was built without CURVE support (needs libsodium); "
            "--curve-keys cannot be used with it",
            maj, min, pat);
        return PS_EAUTH;
    }
    return 0;
}

/* ---- key files ---------------------------------------------------------- */

static int is_z85(char c)
{
    return c && strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       ".-:+=^!/*?&<>()[]{}@%$#",
                       c) != NULL;
}

int ps_curve_read_key(const char *path, char key[PS_CURVE_KEY_LEN + 1], char *why,
                      size_t why_len)
{
    key[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        ps_errorf(why, why_len, "%s: cannot open key file: %s%s", path, strerror(e),
            e == ENOENT ? " (make keys with ps_keygen --dir DIR --servers S --workers W)" : "");
        return e == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    char buf[KEY_FILE_MAX + 1];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            ps_errorf(why, why_len, "%s: cannot read key file: %s", path, strerror(e));
            return PS_EIO;
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf)
            break;
    }
    close(fd);
    size_t len = n;
    while (len > 0 && strchr(" \t\r\n", buf[len - 1]))
        len--;
    size_t bad = 0;
    while (bad < len && is_z85(buf[bad]))
        bad++;
    uint8_t bin[32];
    if (n > KEY_FILE_MAX || len != PS_CURVE_KEY_LEN || bad != len) {
        if (n > KEY_FILE_MAX)
            ps_errorf(why, why_len, "%s: not a CURVE key file: more than %d bytes (expected %d Z85 "
                "characters and a newline)", path, KEY_FILE_MAX, PS_CURVE_KEY_LEN);
        else if (bad != len)
            ps_errorf(why, why_len, "%s: not a CURVE key file: byte %zu (0x%02x) is not a Z85 "
                "character (expected %d Z85 characters)", path, bad + 1,
                (unsigned char)buf[bad], PS_CURVE_KEY_LEN);
        else
            ps_errorf(why, why_len, "%s: not a CURVE key file: %zu characters, expected %d Z85 "
                "characters", path, len, PS_CURVE_KEY_LEN);
        wipe(buf, sizeof buf);
        return PS_EINVAL;
    }
    memcpy(key, buf, PS_CURVE_KEY_LEN);
    key[PS_CURVE_KEY_LEN] = 0;
    wipe(buf, sizeof buf);
    if (!zmq_z85_decode(bin, key)) {
        ps_errorf(why, why_len, "%s: not a CURVE key file: not valid Z85", path);
        wipe(key, PS_CURVE_KEY_LEN + 1);
        return PS_EINVAL;
    }
    wipe(bin, sizeof bin);
    return 0;
}

/* CURVE can be used with the key directory dir: libzmq has it and dir is a
 * directory.  0, or a PS_E* code with why saying what is wrong. */
static int check_dir(const char *dir, char *why, size_t why_len)
{
    int rc = ps_curve_available(why, why_len);
    if (rc)
        return rc;
    struct stat st;
    if (!dir || !*dir) {
        ps_errorf(why, why_len, "no CURVE key directory given");
        return PS_EINVAL;
    }
    if (stat(dir, &st) != 0) {
        int e = errno;
        ps_errorf(why, why_len, "%s: cannot use as CURVE key directory: %s%s", dir, strerror(e),
            e == ENOENT ? " (make it with ps_keygen --dir DIR --servers S --workers W)" : "");
        return e == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        ps_errorf(why, why_len,
            "%s: not a directory (--curve-keys wants the directory ps_keygen made)", dir);
        return PS_EINVAL;
    }
    return 0;
}

/* Read DIR/<role>-<rank>.key and .pub and check that they are one pair. */
static int read_pair(const char *dir, const char *name, char pub[41], char sec[41], char *why,
                     size_t why_len)
{
    char path[4096], derived[41];
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    int rc = ps_curve_read_key(path, pub, why, why_len);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    if ((rc = ps_curve_read_key(path, sec, why, why_len)))
        return rc;
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        ps_warn("%s: secret key is readable by other users (mode %03o); chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
    if (zmq_curve_public(derived, sec) != 0 || memcmp(derived, pub, PS_CURVE_KEY_LEN) != 0) {
        ps_errorf(why, why_len, "%s/%s.pub is not the public key of %s (keys from two ps_keygen "
            "runs mixed?)", dir, name, path);
        wipe(sec, 41);
        return PS_EINVAL;
    }
    return 0;
}

/* ---- the list of authorized keys ---------------------------------------- */

typedef struct authorized_key {
    char key[PS_CURVE_KEY_LEN + 1];
    char *name; /* file name without ".pub": the ZAP user id */
} authorized_key;

typedef struct keylist {
    authorized_key *k;
    size_t n, cap;
} keylist;

static void keylist_free(keylist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->k[i].name);
    free(l->k);
    l->k = NULL;
    l->n = l->cap = 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && strcmp(s + a - b, suffix) == 0;
}

/* Read every ADIR/NAME.pub into l, each named prefix + NAME (the ZAP user
 * id).  strict (at setup): a malformed file or an empty list is an error.
 * Otherwise (re-reads while running) a bad file is skipped with a warning, so
 * one typo does not lock out everyone.  optional (admin/): a directory that
 * is missing or empty is an empty list. */
static int load_keys(const char *adir, const char *prefix, int strict, int optional, keylist *l,
                     char *why, size_t why_len)
{
    l->k = NULL;
    l->n = l->cap = 0;
    DIR *d = opendir(adir);
    if (!d) {
        int e = errno;
        if (optional && e == ENOENT)
            return 0;
        ps_errorf(why, why_len, "%s: cannot read the %s keys: %s", adir,
            optional ? prefix : "authorized worker", strerror(e));
        return e == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !ends_with(de->d_name, ".pub"))
            continue;
        char path[4096], msg[512];
        authorized_key ak;
        snprintf(path, sizeof path, "%s/%s", adir, de->d_name);
        int r = ps_curve_read_key(path, ak.key, msg, sizeof msg);
        if (r) {
            if (strict) {
                ps_errorf(why, why_len, "%s", msg);
                rc = r;
                break;
            }
            ps_warn("%s (skipped: that key is not authorized)", msg);
            continue;
        }
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 16;
            authorized_key *k = realloc(l->k, cap * sizeof *k);
            if (!k) {
                rc = PS_ENOMEM;
                break;
            }
            l->k = k;
            l->cap = cap;
        }
        size_t nl = strlen(de->d_name) - 4;
        if (!(ak.name = malloc(strlen(prefix) + nl + 1))) {
            rc = PS_ENOMEM;
            break;
        }
        snprintf(ak.name, strlen(prefix) + nl + 1, "%s%.*s", prefix, (int)nl, de->d_name);
        l->k[l->n++] = ak;
    }
    closedir(d);
    if (rc == PS_ENOMEM)
        ps_errorf(why, why_len, "out of memory reading %s", adir);
    if (!rc && strict && !optional && l->n == 0) {
        ps_errorf(why, why_len, "%s holds no *.pub key: every worker would be refused", adir);
        rc = PS_ENOTFOUND;
    }
    if (rc)
        keylist_free(l);
    return rc;
}

/* ---- the ZAP handler ------------------------------------------------------ */

typedef struct quiet_slot {
    char peer[128]; /* address + key (or mechanism) */
    int64_t logged_ns;
    uint64_t unlogged;
} quiet_slot;

struct ps_curve_auth {
    void *ctx;
    char dir[4096], adir[4200], mdir[4200], rdir[4200]; /* DIR, DIR/authorized, DIR/admin,
                                                           DIR/reader */
    size_t admins_at_setup;
    pthread_t thread;
    atomic_int stop;
    _Atomic uint64_t refused, accepted;
    /* start-up handshake with the thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, bind_errno;
    /* owned by the handler thread from here on */
    keylist keys, admins, readers;
    char self_pub[PS_CURVE_KEY_LEN + 1], self_name[32]; /* this server's own key: the other
                                                            members of its shard group */
    int64_t scanned_ns;
    struct timespec scanned_mtime, admin_mtime, reader_mtime;
    quiet_slot quiet[QUIET_SLOTS];
};

/* Read the keys of dir into *l again (a bad file skipped); when dir cannot
 * be read, *l is empty, and the warning says `then` until it can. */
static void reload(const char *dir, const char *prefix, int optional, keylist *l,
                   const char *then)
{
    keylist fresh;
    char msg[512];
    if (load_keys(dir, prefix, 0, optional, &fresh, msg, sizeof msg) != 0) {
        ps_warn("%s; %s until it is readable again", msg, then);
        fresh.k = NULL;
        fresh.n = fresh.cap = 0;
    }
    keylist_free(l);
    *l = fresh;
}

static int same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static void maybe_rescan(ps_curve_auth *a)
{
    struct stat st, ma, mr;
    int64_t now = ps_now_ns();
    int have = stat(a->adir, &st) == 0;
    if (stat(a->mdir, &ma) != 0)
        memset(&ma, 0, sizeof ma);
    if (stat(a->rdir, &mr) != 0)
        memset(&mr, 0, sizeof mr);
    if (have && now - a->scanned_ns < RESCAN_NS && same_time(&st.st_mtim, &a->scanned_mtime) &&
        same_time(&ma.st_mtim, &a->admin_mtime) && same_time(&mr.st_mtim, &a->reader_mtime))
        return;
    reload(a->mdir, "admin/", 1, &a->admins, "no admin key is accepted");
    a->admin_mtime = ma.st_mtim;
    reload(a->rdir, PS_CURVE_READER_PREFIX, 1, &a->readers, "no reader key is accepted");
    a->reader_mtime = mr.st_mtim;
    /* fail closed: without a readable list nobody gets in */
    reload(a->adir, "", 0, &a->keys, "refusing every CURVE client");
    a->scanned_ns = now;
    if (have)
        a->scanned_mtime = st.st_mtim;
}

/* Frame i as a printable C string (non-printable bytes become '?'). */
static void frame_str(zmq_msg_t *f, int nf, int i, char *out, size_t cap)
{
    size_t n = 0;
    if (i < nf) {
        const unsigned char *p = zmq_msg_data(&f[i]);
        size_t len = zmq_msg_size(&f[i]);
        for (; n < len && n + 1 < cap; n++)
            out[n] = p[n] >= 0x20 && p[n] < 0x7f ? (char)p[n] : '?';
    }
    out[n] = 0;
}

static int frame_is(zmq_msg_t *f, int nf, int i, const char *s)
{
    size_t n = strlen(s);
    return i < nf && zmq_msg_size(&f[i]) == n && memcmp(zmq_msg_data(&f[i]), s, n) == 0;
}

/* Log a refusal unless this peer was logged less than QUIET_NS ago. */
static void log_refusal(ps_curve_auth *a, const char *peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_refusal(ps_curve_auth *a, const char *peer, const char *fmt, ...)
{
    int64_t now = ps_now_ns();
    quiet_slot *s = NULL, *oldest = &a->quiet[0];
    for (int i = 0; i < QUIET_SLOTS && !s; i++) {
        if (strcmp(a->quiet[i].peer, peer) == 0)
            s = &a->quiet[i];
        else if (a->quiet[i].logged_ns < oldest->logged_ns)
            oldest = &a->quiet[i];
    }
    if (s && s->logged_ns && now - s->logged_ns < QUIET_NS) {
        s->unlogged++;
        return;
    }
    if (!s) {
        s = oldest;
        snprintf(s->peer, sizeof s->peer, "%s", peer);
        s->unlogged = 0;
    }
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (s->unlogged)
        ps_warn("%s (and %llu more refusals of this peer not logged)", line,
                (unsigned long long)s->unlogged);
    else
        ps_warn("%s", line);
    s->logged_ns = now;
    s->unlogged = 0;
}

/* Decide one ZAP request (RFC 27): frames version, request id, domain,
 * address, routing id, mechanism, credentials...  Returns 1 to accept; *user
 * is then the key's name. */
static int zap_decide(ps_curve_auth *a, zmq_msg_t *f, int nf, const char **user)
{
    char addr[64], mech[32], peer[128];
    frame_str(f, nf, 3, addr, sizeof addr);
    frame_str(f, nf, 5, mech, sizeof mech);
    if (nf < 6 || !frame_is(f, nf, 0, "1.0")) {
        snprintf(peer, sizeof peer, "%s malformed", addr);
        log_refusal(a, peer, "refused a malformed ZAP request (%d frames) for a client from %s",
                    nf, addr[0] ? addr : "?");
        return 0;
    }
    if (!frame_is(f, nf, 5, "CURVE")) {
        snprintf(peer, sizeof peer, "%s %s", addr, mech);
        log_refusal(a, peer, "refused %s client from %s: only CURVE clients with a key in "
                    "%s/authorized may connect", mech[0] ? mech : "NULL", addr, a->dir);
        return 0;
    }
    char domain[32];
    frame_str(f, nf, 2, domain, sizeof domain);
    if (!frame_is(f, nf, 2, PS_CURVE_ZAP_DOMAIN)) {
        snprintf(peer, sizeof peer, "%s domain %s", addr, domain);
        log_refusal(a, peer, "refused CURVE client from %s: ZAP domain '%s' is not '%s'", addr,
                    domain, PS_CURVE_ZAP_DOMAIN);
        return 0;
    }
    if (nf != 7 || zmq_msg_size(&f[6]) != 32) {
        snprintf(peer, sizeof peer, "%s bad credentials", addr);
        log_refusal(a, peer, "refused CURVE client from %s: ZAP request without a 32-byte key",
                    addr);
        return 0;
    }
    char key[PS_CURVE_KEY_LEN + 1];
    zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
    maybe_rescan(a);
    /* admin keys first: their user id "admin/NAME" is what lets a peer stop
     * the server with a shutdown message (server/admin.h) */
    for (size_t i = 0; i < a->admins.n; i++)
        if (memcmp(a->admins.k[i].key, key, PS_CURVE_KEY_LEN) == 0) {
            *user = a->admins.k[i].name;
            ps_debug("accepted CURVE client from %s: admin key %s (%s)", addr, key, *user);
            return 1;
        }
    /* then reader keys, before workers': a key in both stays a reader */
    for (size_t i = 0; i < a->readers.n; i++)
        if (memcmp(a->readers.k[i].key, key, PS_CURVE_KEY_LEN) == 0) {
            *user = a->readers.k[i].name;
            ps_debug("accepted CURVE client from %s: reader key %s (%s)", addr, key, *user);
            return 1;
        }
    for (size_t i = 0; i < a->keys.n; i++)
        if (memcmp(a->keys.k[i].key, key, PS_CURVE_KEY_LEN) == 0) {
            *user = a->keys.k[i].name;
            ps_debug("accepted CURVE client from %s: key %s (%s)", addr, key, *user);
            return 1;
        }
    /* a peer that holds this server's own secret key: another member of its
     * shard group (server/repl.h), user id "server-RANK" */
    if (memcmp(a->self_pub, key, PS_CURVE_KEY_LEN) == 0) {
        *user = a->self_name;
        ps_debug("accepted CURVE client from %s: this server's own key (%s)", addr, *user);
        return 1;
    }
    snprintf(peer, sizeof peer, "%s %s", addr, key);
    log_refusal(a, peer, "refused CURVE client from %s: key %s is not in %s", addr, key, a->adir);
    return 0;
}

static int send_str(void *s, const void *p, size_t n, int more)
{
    return zmq_send(s, p, n, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

#define ZAP_MAX_FRAMES 8

static void *zap_main(void *arg)
{
    ps_curve_auth *a = arg;
    void *rep = zmq_socket(a->ctx, ZMQ_REP);
    int linger = 0, tmo = ZAP_POLL_MS, rc = -1;
    if (rep) {
        zmq_setsockopt(rep, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(rep, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
        rc = zmq_bind(rep, ZAP_ENDPOINT);
    }
    pthread_mutex_lock(&a->mu);
    a->bind_errno = rc == 0 ? 0 : (zmq_errno() ? zmq_errno() : EIO);
    a->ready = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (rc != 0) {
        if (rep)
            zmq_close(rep);
        return NULL;
    }
    while (!atomic_load(&a->stop)) {
        zmq_msg_t f[ZAP_MAX_FRAMES];
        int nf = 0, more = 1, err = 0;
        /* read the whole request; frames past the 8th are read and dropped */
        while (more) {
            zmq_msg_t spare, *m = nf < ZAP_MAX_FRAMES ? &f[nf] : &spare;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, rep, 0) < 0) {
                err = zmq_errno();
                zmq_msg_close(m);
                break;
            }
            more = zmq_msg_more(m);
            if (m == &spare)
                zmq_msg_close(m);
            else
                nf++;
        }
        if (err) {
            for (int i = 0; i < nf; i++)
                zmq_msg_close(&f[i]);
            if (err == EAGAIN || err == EINTR)
                continue;
            break; /* ETERM: the context is going away */
        }
        const char *user = "";
        int ok = zap_decide(a, f, nf, &user);
        if (ok)
            atomic_fetch_add(&a->accepted, 1);
        else
            atomic_fetch_add(&a->refused, 1);
        /* reply: version, request id, status code, status text, user id, metadata */
        const void *id = nf > 1 ? zmq_msg_data(&f[1]) : "";
        size_t id_len = nf > 1 ? zmq_msg_size(&f[1]) : 0;
        const char *text = ok ? "OK" : "key not authorized";
        if (send_str(rep, "1.0", 3, 1) || send_str(rep, id, id_len, 1) ||
            send_str(rep, ok ? "200" : "400", 3, 1) || send_str(rep, text, strlen(text), 1) ||
            send_str(rep, user, strlen(user), 1) || send_str(rep, "", 0, 0))
            ps_warn("ZAP handler: cannot send a reply: %s", zmq_strerror(zmq_errno()));
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
    zmq_close(rep);
    return NULL;
}

int ps_curve_server_setup(void *zmq_ctx, void *router_socket, const char *dir, int server_rank,
                          ps_curve_auth **out, char *why, size_t why_len)
{
    *out = NULL;
    if (!zmq_ctx || !router_socket || server_rank < 0 || server_rank >= PS_CURVE_MAX_KEYS) {
        ps_errorf(why, why_len, "ps_curve_server_setup: bad argument (server rank %d)",
            server_rank);
        return PS_EINVAL;
    }
    int rc = check_dir(dir, why, why_len);
    if (rc)
        return rc;
    if (strlen(dir) >= 4000) {
        ps_errorf(why, why_len, "CURVE key directory path is too long");
        return PS_EINVAL;
    }
    char pub[41], sec[41], name[32];
    snprintf(name, sizeof name, "server-%d", server_rank);
    if ((rc = read_pair(dir, name, pub, sec, why, why_len)))
        return rc;
    ps_curve_auth *a = calloc(1, sizeof *a);
    if (!a) {
        wipe(sec, sizeof sec);
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    a->ctx = zmq_ctx;
    memcpy(a->self_pub, pub, sizeof a->self_pub);
    snprintf(a->self_name, sizeof a->self_name, "%s", name);
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    snprintf(a->adir, sizeof a->adir, "%s/authorized", dir);
    snprintf(a->mdir, sizeof a->mdir, "%s/admin", dir);
    snprintf(a->rdir, sizeof a->rdir, "%s/reader", dir);
    struct stat st;
    if (stat(a->adir, &st) == 0)
        a->scanned_mtime = st.st_mtim;
    if (stat(a->mdir, &st) == 0)
        a->admin_mtime = st.st_mtim;
    if (stat(a->rdir, &st) == 0)
        a->reader_mtime = st.st_mtim;
    if ((rc = load_keys(a->adir, "", 1, 0, &a->keys, why, why_len))) {
        wipe(sec, sizeof sec);
        free(a);
        return rc;
    }
    if ((rc = load_keys(a->mdir, "admin/", 1, 1, &a->admins, why, why_len))) {
        wipe(sec, sizeof sec);
        keylist_free(&a->keys);
        free(a);
        return rc;
    }
    if ((rc = load_keys(a->rdir, PS_CURVE_READER_PREFIX, 1, 1, &a->readers, why, why_len))) {
        wipe(sec, sizeof sec);
        keylist_free(&a->keys);
        keylist_free(&a->admins);
        free(a);
        return rc;
    }
    a->admins_at_setup = a->admins.n;
    a->scanned_ns = ps_now_ns();
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, zap_main, a) != 0) {
        ps_errorf(why, why_len, "cannot start the ZAP handler thread");
        rc = PS_ENOMEM;
        goto fail_nothread;
    }
    pthread_mutex_lock(&a->mu);
    while (!a->ready)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    if (a->bind_errno) {
        ps_errorf(why, why_len, "cannot bind the ZAP handler to %s: %s%s", ZAP_ENDPOINT,
            zmq_strerror(a->bind_errno),
            a->bind_errno == EADDRINUSE ? " (one CURVE server per zmq context)" : "");
        pthread_join(a->thread, NULL);
        rc = PS_EIO;
        goto fail_nothread;
    }
    int one = 1;
    if (zmq_setsockopt(router_socket, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(router_socket, ZMQ_CURVE_SECRETKEY, sec, PS_CURVE_KEY_LEN + 1) ||
        zmq_setsockopt(router_socket, ZMQ_ZAP_DOMAIN, PS_CURVE_ZAP_DOMAIN,
                       strlen(PS_CURVE_ZAP_DOMAIN))) {
        ps_errorf(why, why_len, "cannot make the socket a CURVE server: %s",
            zmq_strerror(zmq_errno()));
        wipe(sec, sizeof sec);
        ps_curve_auth_stop(a);
        return PS_EIO;
    }
    wipe(sec, sizeof sec);
    ps_info("CURVE: server %d key %s, %zu authorized worker key(s) in %s, %zu admin key(s) in "
            "%s, %zu reader key(s) in %s", server_rank, pub, a->keys.n, a->adir, a->admins.n,
            a->mdir, a->readers.n, a->rdir);
    *out = a;
    return 0;
fail_nothread:
    wipe(sec, sizeof sec);
    keylist_free(&a->keys);
    keylist_free(&a->admins);
    keylist_free(&a->readers);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    return rc;
}

void ps_curve_auth_stop(ps_curve_auth *a)
{
    if (!a)
        return;
    atomic_store(&a->stop, 1);
    pthread_join(a->thread, NULL);
    keylist_free(&a->keys);
    keylist_free(&a->admins);
    keylist_free(&a->readers);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

uint64_t ps_curve_auth_refused(const ps_curve_auth *a)
{
    return a ? atomic_load(&((ps_curve_auth *)a)->refused) : 0;
}

size_t ps_curve_auth_admin_keys(const ps_curve_auth *a) { return a ? a->admins_at_setup : 0; }

uint64_t ps_curve_auth_accepted(const ps_curve_auth *a)
{
    return a ? atomic_load(&((ps_curve_auth *)a)->accepted) : 0;
}

/* ---- client ------------------------------------------------------------ */

int ps_curve_client_setup(void *dealer_socket, const char *dir, int worker_rank, int server_rank,
                          char *why, size_t why_len)
{
    if (worker_rank < -1 || worker_rank >= PS_CURVE_MAX_KEYS) {
        ps_errorf(why, why_len, "ps_curve_client_setup: bad argument (worker %d)", worker_rank);
        return PS_EINVAL;
    }
    /* rank -1, a reader: its one pair, reader.key */
    char name[32];
    if (worker_rank < 0)
        snprintf(name, sizeof name, "reader");
    else
        snprintf(name, sizeof name, "worker-%d", worker_rank);
    return ps_curve_client_setup_key(dealer_socket, dir, name, server_rank, why, why_len);
}

int ps_curve_client_setup_key(void *dealer_socket, const char *dir, const char *key_name,
                              int server_rank, char *why, size_t why_len)
{
    if (!dealer_socket || !key_name || !*key_name || strchr(key_name, '/') || server_rank < 0 ||
        server_rank >= PS_CURVE_MAX_KEYS) {
        ps_errorf(why, why_len, "ps_curve_client_setup: bad argument (key '%s', server %d)",
            key_name ? key_name : "", server_rank);
        return PS_EINVAL;
    }
    int rc = check_dir(dir, why, why_len);
    if (rc)
        return rc;
    char server_pub[41], pub[41], sec[41], path[4096];
    snprintf(path, sizeof path, "%s/server-%d.pub", dir, server_rank);
    if ((rc = ps_curve_read_key(path, server_pub, why, why_len)))
        return rc;
    if ((rc = read_pair(dir, key_name, pub, sec, why, why_len)))
        return rc;
    if (zmq_setsockopt(dealer_socket, ZMQ_CURVE_SERVERKEY, server_pub, PS_CURVE_KEY_LEN + 1) ||
        zmq_setsockopt(dealer_socket, ZMQ_CURVE_PUBLICKEY, pub, PS_CURVE_KEY_LEN + 1) ||
        zmq_setsockopt(dealer_socket, ZMQ_CURVE_SECRETKEY, sec, PS_CURVE_KEY_LEN + 1)) {
        ps_errorf(why, why_len, "cannot make the socket a CURVE client: %s",
            zmq_strerror(zmq_errno()));
        rc = PS_EIO;
    }
    wipe(sec, sizeof sec);
    return rc;
}

/* ---- key generation ---------------------------------------------------- */

/* server-N.key, server-N.pub, worker-N.key, worker-N.pub */
static int is_key_name(const char *s)
{
    if (strncmp(s, "server-", 7) && strncmp(s, "worker-", 7))
        return 0;
    s += 7;
    if (*s < '0' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9')
        s++;
    return !strcmp(s, ".key") || !strcmp(s, ".pub");
}

/* Find (and with force, remove) the key files of an earlier set. */
static int clear_old_keys(const char *dir, int authorized, int force, char *why, size_t why_len)
{
    DIR *d = opendir(dir);
    if (!d) {
        ps_errorf(why, why_len, "%s: cannot read: %s", dir, strerror(errno));
        return PS_EIO;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (authorized ? (n[0] == '.' || !ends_with(n, ".pub")) : !is_key_name(n))
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, n);
        if (!force) {
            ps_errorf(why, why_len, "%s already exists; not overwriting keys (--force replaces the "
                "whole key set)", path);
            rc = PS_ESTATE;
            break;
        }
        if (unlink(path) != 0) {
            ps_errorf(why, why_len, "%s: cannot remove: %s", path, strerror(errno));
            rc = PS_EIO;
            break;
        }
    }
    closedir(d);
    return rc;
}

static int write_key(const char *path, const char *key, mode_t mode, char *why, size_t why_len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    char line[PS_CURVE_KEY_LEN + 1];
    memcpy(line, key, PS_CURVE_KEY_LEN);
    line[PS_CURVE_KEY_LEN] = '\n';
    int ok = fd >= 0 && fchmod(fd, mode) == 0 &&
             write(fd, line, sizeof line) == (ssize_t)sizeof line;
    int e = errno;
    wipe(line, sizeof line);
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        ps_errorf(why, why_len, "%s: cannot write key file: %s", path, strerror(e));
        return PS_EIO;
    }
    return 0;
}

int ps_curve_keygen(const char *dir, int servers, int workers, int force, char *why,
                    size_t why_len)
{
    if (!dir || !*dir || servers < 1 || servers > PS_CURVE_MAX_KEYS || workers < 1 ||
        workers > PS_CURVE_MAX_KEYS) {
        ps_errorf(why, why_len, "ps_curve_keygen: need a directory and 1..%d servers and workers",
            PS_CURVE_MAX_KEYS);
        return PS_EINVAL;
    }
    if (strlen(dir) >= 4000) {
        ps_errorf(why, why_len, "%s: path too long", dir);
        return PS_EINVAL;
    }
    int rc = ps_curve_available(why, why_len);
    if (rc)
        return rc;
    char adir[4096], path[4200];
    snprintf(adir, sizeof adir, "%s/authorized", dir);
    int created;
    const char *failed = ps_mkdir_p(dir, 0700, &created) != 0     ? dir
                         : ps_mkdir_p(adir, 0700, &created) != 0 ? adir
                                                               : NULL;
    if (failed) {
        ps_errorf(why, why_len, "%s: cannot create key directory: %s", failed, strerror(errno));
        return PS_EIO;
    }
    if ((rc = clear_old_keys(dir, 0, force, why, why_len)) ||
        (rc = clear_old_keys(adir, 1, force, why, why_len)))
        return rc;
    for (int role = 0; role < 2 && !rc; role++) {
        const char *name = role ? "worker" : "server";
        int count = role ? workers : servers;
        for (int i = 0; i < count && !rc; i++) {
            char pub[41], sec[41];
            if (zmq_curve_keypair(pub, sec) != 0) {
                ps_errorf(why, why_len, "zmq_curve_keypair failed: %s", zmq_strerror(zmq_errno()));
                return PS_EIO;
            }
            snprintf(path, sizeof path, "%s/%s-%d.key", dir, name, i);
            rc = write_key(path, sec, 0600, why, why_len);
            wipe(sec, sizeof sec);
            if (!rc) {
                snprintf(path, sizeof path, "%s/%s-%d.pub", dir, name, i);
                rc = write_key(path, pub, 0644, why, why_len);
            }
            if (!rc && role) {
                snprintf(path, sizeof path, "%s/%s-%d.pub", adir, name, i);
                rc = write_key(path, pub, 0644, why, why_len);
            }
        }
    }
    return rc;
}
