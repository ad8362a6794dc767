/* CURVE keys and the ZAP handler (common/ps_curve.c) and ps_keygen.
 * The echo server here is a ROUTER set up by ps_curve_server_setup and a
 * thread of this test that sends every message back; the server/client
 * integration tests live with the server and the client. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

/* A fresh key directory under the test's scratch directory. */
static const char *make_keys(const char *name, int servers, int workers, char *dir, size_t len)
{
    char why[512];
    snprintf(dir, len, "%s/%s", ps_test_tmpdir(), name);
    if (ps_curve_keygen(dir, servers, workers, 0, why, sizeof why) != 0) {
        fprintf(stderr, "make_keys: %s\n", why);
        return NULL;
    }
    return dir;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

static int read_text(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
    return (int)n;
}

static int file_mode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* ---- ps_keygen ---------------------------------------------------------- */

static int run_keygen(const char *const args[], const char *log)
{
    char bin[512];
    if (access(ps_test_bin("ps_keygen", bin, sizeof bin), X_OK) != 0)
        return -2;
    int pid = ps_test_spawn_args("ps_keygen", args, log);
    return pid < 0 ? -1 : ps_test_wait(pid, 20000);
}

/* A key file is 40 Z85 characters and a newline; returns the key or "". */
static int check_key_file(const char *path, char key[41])
{
    char text[128];
    key[0] = 0;
    if (read_text(path, text, sizeof text) != 41 || text[40] != '\n')
        return -1;
    uint8_t bin[32];
    memcpy(key, text, 40);
    key[40] = 0;
    return zmq_z85_decode(bin, key) ? 0 : -1;
}

PS_TEST(keygen_writes_key_pairs_with_private_modes)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], log[600], path[700], pub[41], sec[41], derived[41], copy[41];
    snprintf(dir, sizeof dir, "%s/kg/keys", ps_test_tmpdir());
    snprintf(log, sizeof log, "%s/kg.log", ps_test_tmpdir());
    const char *args[] = {"--dir", dir, "--servers", "2", "--workers", "3", NULL};
    int rc = run_keygen(args, log);
    CHECK_MSG(rc != -2, "bin/ps_keygen is missing: run `make bin/ps_keygen` first");
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(file_mode(dir), 0700);
    snprintf(path, sizeof path, "%s/authorized", dir);
    CHECK_EQ_INT(file_mode(path), 0700);
    for (int role = 0; role < 2; role++) {
        const char *name = role ? "worker" : "server";
        for (int i = 0; i < (role ? 3 : 2); i++) {
            snprintf(path, sizeof path, "%s/%s-%d.key", dir, name, i);
            CHECK_EQ_INT(file_mode(path), 0600);
            CHECK_MSG(check_key_file(path, sec) == 0, "%s is not 40 Z85 chars + newline", path);
            snprintf(path, sizeof path, "%s/%s-%d.pub", dir, name, i);
            CHECK_EQ_INT(file_mode(path), 0644);
            CHECK_MSG(check_key_file(path, pub) == 0, "%s is not 40 Z85 chars + newline", path);
            CHECK_OK(zmq_curve_public(derived, sec));
            CHECK_MSG(strcmp(derived, pub) == 0, "%s-%d: .pub is not the public key of .key",
                      name, i);
            snprintf(path, sizeof path, "%s/authorized/%s-%d.pub", dir, name, i);
            if (role) {
                CHECK_MSG(check_key_file(path, copy) == 0 && strcmp(copy, pub) == 0,
                          "%s is not a copy of worker-%d.pub", path, i);
            } else {
                CHECK_MSG(access(path, F_OK) != 0, "server key %s must not be authorized", path);
            }
        }
    }
    snprintf(path, sizeof path, "%s/server-2.key", dir);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/worker-3.key", dir);
    CHECK(access(path, F_OK) != 0);
    /* every key is different */
    char k0[41], k1[41];
    snprintf(path, sizeof path, "%s/worker-0.pub", dir);
    CHECK_OK(check_key_file(path, k0));
    snprintf(path, sizeof path, "%s/worker-1.pub", dir);
    CHECK_OK(check_key_file(path, k1));
    CHECK(strcmp(k0, k1) != 0);
}

PS_TEST(keygen_refuses_to_overwrite_keys_without_force)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], log[600], path[700], before[41], after[41];
    snprintf(dir, sizeof dir, "%s/kg2", ps_test_tmpdir());
    snprintf(log, sizeof log, "%s/kg2.log", ps_test_tmpdir());
    const char *args[] = {"--dir", dir, "--servers", "1", "--workers", "3", NULL};
    int rc = run_keygen(args, log);
    CHECK_MSG(rc != -2, "bin/ps_keygen is missing: run `make bin/ps_keygen` first");
    CHECK_EQ_INT(rc, 0);
    snprintf(path, sizeof path, "%s/server-0.key", dir);
    CHECK_OK(check_key_file(path, before));

    CHECK_EQ_INT(run_keygen(args, log), 1);
    CHECK_OK(check_key_file(path, after));
    CHECK_MSG(strcmp(before, after) == 0, "a refused run changed %s", path);
    char text[4096];
    CHECK(read_text(log, text, sizeof text) > 0);
    CHECK_MSG(strstr(text, "already exists") && strstr(text, "--force"),
              "no clear refusal in the output: %s", text);

    /* --force replaces the whole set: fewer workers leave no stale key */
    const char *force[] = {"--dir", dir, "--servers", "1", "--workers", "1", "--force", NULL};
    CHECK_EQ_INT(run_keygen(force, log), 0);
    CHECK_OK(check_key_file(path, after));
    CHECK(strcmp(before, after) != 0);
    snprintf(path, sizeof path, "%s/worker-2.key", dir);
    CHECK_MSG(access(path, F_OK) != 0, "stale %s left behind by --force", path);
    snprintf(path, sizeof path, "%s/authorized/worker-2.pub", dir);
    CHECK_MSG(access(path, F_OK) != 0, "stale %s still authorized after --force", path);
    snprintf(path, sizeof path, "%s/authorized/worker-0.pub", dir);
    CHECK(access(path, F_OK) == 0);
}

PS_TEST(keygen_bad_flags_exit_2)
{
    char dir[512], log[600];
    snprintf(dir, sizeof dir, "%s/kg3", ps_test_tmpdir());
    snprintf(log, sizeof log, "%s/kg3.log", ps_test_tmpdir());
    const char *zero[] = {"--dir", dir, "--servers", "0", "--workers", "1", NULL};
    const char *junk[] = {"--dir", dir, "--servers", "1x", "--workers", "1", NULL};
    const char *unknown[] = {"--dir", dir, "--servers", "1", "--workers", "1", "--bogus", NULL};
    const char *nodir[] = {"--servers", "1", "--workers", "1", NULL};
    const char *noval[] = {"--servers", "1", "--workers", "1", "--dir", NULL};
    const char *help[] = {"--help", NULL};
    const char *version[] = {"--version", NULL};
    int rc = run_keygen(zero, log);
    CHECK_MSG(rc != -2, "bin/ps_keygen is missing: run `make bin/ps_keygen` first");
    CHECK_EQ_INT(rc, 2);
    CHECK_EQ_INT(run_keygen(junk, log), 2);
    CHECK_EQ_INT(run_keygen(unknown, log), 2);
    CHECK_EQ_INT(run_keygen(nodir, log), 2);
    CHECK_EQ_INT(run_keygen(noval, log), 2);
    CHECK_MSG(access(dir, F_OK) != 0, "a refused run created %s", dir);
    CHECK_EQ_INT(run_keygen(help, log), 0);
    CHECK_EQ_INT(run_keygen(version, log), 0);
    char text[8192];
    CHECK(read_text(log, text, sizeof text) > 0);
    CHECK_MSG(strstr(text, "--servers must be an integer in [1, 65536], got '0'"), "%s", text);
    CHECK_MSG(strstr(text, "unknown flag '--bogus'"), "%s", text);
    CHECK_MSG(strstr(text, "--dir is required"), "%s", text);
    CHECK_MSG(strstr(text, "ps_keygen " PS_VERSION), "%s", text);
}

/* ---- key files ---------------------------------------------------------- */

PS_TEST(read_key_refuses_malformed_files)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], path[700], key[41], why[512];
    CHECK(make_keys("rk", 1, 1, dir, sizeof dir));
    snprintf(path, sizeof path, "%s/worker-0.pub", dir);
    CHECK_OK(ps_curve_read_key(path, key, why, sizeof why));
    CHECK_EQ_INT(strlen(key), 40);

    snprintf(path, sizeof path, "%s/short.pub", dir);
    CHECK_OK(write_file(path, "abc\n"));
    CHECK_EQ_INT(ps_curve_read_key(path, key, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, path) && strstr(why, "3 characters, expected 40"), "%s", why);

    /* 40 characters, one of them (space) not Z85 */
    CHECK_OK(write_file(path, "0123456789 123456789012345678901234567890\n"));
    CHECK_EQ_INT(ps_curve_read_key(path, key, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "byte 11 (0x20) is not a Z85 character"), "%s", why);

    CHECK_OK(write_file(path, "01234567890123456789012345678901234567890\n")); /* 41 */
    CHECK_EQ_INT(ps_curve_read_key(path, key, why, sizeof why), PS_EINVAL);

    snprintf(path, sizeof path, "%s/nothere.pub", dir);
    CHECK_EQ_INT(ps_curve_read_key(path, key, why, sizeof why), PS_ENOTFOUND);
    CHECK_MSG(strstr(why, path) && strstr(why, "ps_keygen"), "%s", why);
}

/* ---- the echo server ---------------------------------------------------- */

typedef struct echo_server {
    void *ctx, *router;
    ps_curve_auth *auth;
    pthread_t thread;
    atomic_int stop;
    int port;
    pthread_mutex_t mu;
    char user_id[64]; /* ZAP user id of the last message echoed */
    int echoed;
} echo_server;

static void *echo_main(void *arg)
{
    echo_server *s = arg;
    int tmo = 50;
    zmq_setsockopt(s->router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    while (!atomic_load(&s->stop)) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, s->router, 0) >= 0 && zmq_msg_more(&id) &&
            zmq_msg_recv(&body, s->router, 0) >= 0) {
            const char *user = zmq_msg_gets(&body, "User-Id");
            pthread_mutex_lock(&s->mu);
            snprintf(s->user_id, sizeof s->user_id, "%s", user ? user : "");
            s->echoed++;
            pthread_mutex_unlock(&s->mu);
            zmq_msg_send(&id, s->router, ZMQ_SNDMORE);
            zmq_msg_send(&body, s->router, 0);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    return NULL;
}

static int echo_start(echo_server *s, const char *dir, int rank, char *why, size_t len)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->ctx = zmq_ctx_new();
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
    int rc = ps_curve_server_setup(s->ctx, s->router, dir, rank, &s->auth, why, len);
    if (rc)
        return rc;
    char ep[64];
    for (int tries = 0; tries < 20; tries++) {
        s->port = ps_test_free_port();
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", s->port);
        if (zmq_bind(s->router, ep) == 0) {
            pthread_create(&s->thread, NULL, echo_main, s);
            return 0;
        }
    }
    snprintf(why, len, "cannot bind a free port");
    return PS_EIO;
}

static int echo_count(echo_server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->echoed;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void echo_stop(echo_server *s)
{
    if (s->thread) {
        atomic_store(&s->stop, 1);
        pthread_join(s->thread, NULL);
    }
    if (s->router)
        zmq_close(s->router);
    ps_curve_auth_stop(s->auth); /* after the ROUTER, before the context */
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    pthread_mutex_destroy(&s->mu);
    memset(s, 0, sizeof *s);
}

enum { CLIENT_PLAIN, CLIENT_WORKER, CLIENT_FRESH_KEY };

/* Connect a DEALER (own context, like another process) as worker `worker`
 * of key dir `dir` talking to server `server_rank`, or plaintext, or with a
 * key made on the spot; send "ping" and wait up to timeout_ms for the echo.
 * Returns 1 echoed, 0 nothing, -1 setup failed. */
static int try_echo(int port, int kind, const char *dir, int worker, int server_rank,
                    int timeout_ms)
{
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, rc = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    char why[512];
    if (kind == CLIENT_WORKER) {
        if (ps_curve_client_setup(d, dir, worker, server_rank, why, sizeof why) != 0) {
            fprintf(stderr, "try_echo: %s\n", why);
            rc = -1;
        }
    } else if (kind == CLIENT_FRESH_KEY) {
        char pub[41], sec[41], spub[41], path[700];
        snprintf(path, sizeof path, "%s/server-%d.pub", dir, server_rank);
        if (zmq_curve_keypair(pub, sec) || ps_curve_read_key(path, spub, why, sizeof why) ||
            zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, spub, 41) ||
            zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, 41) ||
            zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, 41))
            rc = -1;
    }
    char ep[64], buf[16];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    if (rc == 0 && zmq_connect(d, ep) == 0 && zmq_send(d, "ping", 4, 0) == 4) {
        int n = zmq_recv(d, buf, sizeof buf, 0);
        rc = n == 4 && memcmp(buf, "ping", 4) == 0;
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc;
}

static int wait_refused(ps_curve_auth *a, uint64_t want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        if (ps_curve_auth_refused(a) >= want)
            return 1;
        ps_test_sleep_ms(10);
    }
    return ps_curve_auth_refused(a) >= want;
}

/* Send fd 2 to a file while the ZAP handler logs; restore with the result. */
static int stderr_to(const char *path)
{
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    return saved;
}
static void stderr_restore(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

PS_TEST(curve_listed_worker_gets_its_echo)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512];
    CHECK(make_keys("echo", 2, 2, dir, sizeof dir));
    echo_server s;
    int rc = echo_start(&s, dir, 1, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int got = try_echo(s.port, CLIENT_WORKER, dir, 1, 1, 3000);
    pthread_mutex_lock(&s.mu);
    char user[64];
    snprintf(user, sizeof user, "%s", s.user_id);
    pthread_mutex_unlock(&s.mu);
    uint64_t acc = ps_curve_auth_accepted(s.auth), ref = ps_curve_auth_refused(s.auth);
    echo_stop(&s);
    CHECK_EQ_INT(got, 1);
    CHECK_MSG(strcmp(user, "worker-1") == 0, "User-Id '%s', expected 'worker-1'", user);
    CHECK_EQ_INT(acc, 1);
    CHECK_EQ_INT(ref, 0);
}

PS_TEST(curve_unlisted_key_gets_nothing_and_is_counted)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512], log[600], text[8192];
    CHECK(make_keys("unlisted", 1, 1, dir, sizeof dir));
    snprintf(log, sizeof log, "%s/unlisted.log", ps_test_tmpdir());
    echo_server s;
    int rc = echo_start(&s, dir, 0, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int saved = stderr_to(log);
    int got = try_echo(s.port, CLIENT_FRESH_KEY, dir, 0, 0, 700);
    int refused = wait_refused(s.auth, 1, 3000);
    stderr_restore(saved);
    int echoed = echo_count(&s);
    uint64_t acc = ps_curve_auth_accepted(s.auth);
    echo_stop(&s);
    CHECK_EQ_INT(got, 0);
    CHECK_MSG(refused, "the refusal was not counted");
    CHECK_EQ_INT(echoed, 0);
    CHECK_EQ_INT(acc, 0);
    CHECK(read_text(log, text, sizeof text) > 0);
    char want[700];
    snprintf(want, sizeof want, "is not in %s/authorized", dir);
    CHECK_MSG(strstr(text, "warn") && strstr(text, "refused CURVE client from 127.0.0.1: key ") &&
                  strstr(text, want),
              "no refusal line in the log: %s", text);
}

PS_TEST(curve_plaintext_client_gets_nothing)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512];
    CHECK(make_keys("plain", 1, 1, dir, sizeof dir));
    echo_server s;
    int rc = echo_start(&s, dir, 0, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int got = try_echo(s.port, CLIENT_PLAIN, dir, 0, 0, 700);
    int echoed = echo_count(&s);
    uint64_t acc = ps_curve_auth_accepted(s.auth);
    /* a listed worker still gets in afterwards */
    int worker = try_echo(s.port, CLIENT_WORKER, dir, 0, 0, 3000);
    echo_stop(&s);
    CHECK_EQ_INT(got, 0);
    CHECK_EQ_INT(echoed, 0);
    CHECK_EQ_INT(acc, 0);
    CHECK_EQ_INT(worker, 1);
}

PS_TEST(curve_client_with_another_servers_key_gets_nothing)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512];
    CHECK(make_keys("wrongserver", 2, 1, dir, sizeof dir));
    echo_server s;
    int rc = echo_start(&s, dir, 0, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int got = try_echo(s.port, CLIENT_WORKER, dir, 0, 1, 700); /* believes it is server 1 */
    int echoed = echo_count(&s);
    echo_stop(&s);
    CHECK_EQ_INT(got, 0);
    CHECK_EQ_INT(echoed, 0);
}

PS_TEST(curve_removed_authorized_key_is_refused_from_next_handshake)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512], path[700], log[600];
    CHECK(make_keys("revoke", 1, 2, dir, sizeof dir));
    snprintf(log, sizeof log, "%s/revoke.log", ps_test_tmpdir());
    echo_server s;
    int rc = echo_start(&s, dir, 0, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int before = try_echo(s.port, CLIENT_WORKER, dir, 1, 0, 3000);
    snprintf(path, sizeof path, "%s/authorized/worker-1.pub", dir);
    int removed = unlink(path);
    int saved = stderr_to(log);
    int after = try_echo(s.port, CLIENT_WORKER, dir, 1, 0, 700);
    int refused = wait_refused(s.auth, 1, 3000);
    stderr_restore(saved);
    int other = try_echo(s.port, CLIENT_WORKER, dir, 0, 0, 3000);
    echo_stop(&s);
    CHECK_EQ_INT(before, 1);
    CHECK_EQ_INT(removed, 0);
    CHECK_EQ_INT(after, 0);
    CHECK(refused);
    CHECK_EQ_INT(other, 1);
}

/* Every refused handshake is counted, but a peer (address and key) that
 * keeps trying is logged once per 10 s, so it cannot flood the log. */
PS_TEST(repeated_refusals_of_one_peer_are_logged_once)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], other[512], why[512], log[600], text[16384], path[700], spub[41], line[64];
    CHECK(make_keys("flood", 1, 1, dir, sizeof dir));
    /* a worker key of another set, which trusts this set's server */
    CHECK(make_keys("flood-other", 1, 1, other, sizeof other));
    snprintf(path, sizeof path, "%s/server-0.pub", dir);
    CHECK_OK(ps_curve_read_key(path, spub, why, sizeof why));
    snprintf(path, sizeof path, "%s/server-0.pub", other);
    snprintf(line, sizeof line, "%s\n", spub);
    CHECK_OK(write_file(path, line));
    snprintf(log, sizeof log, "%s/flood.log", ps_test_tmpdir());
    echo_server s;
    int rc = echo_start(&s, dir, 0, why, sizeof why);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    int saved = stderr_to(log);
    int got = 0;
    for (int i = 0; i < 3; i++) {
        got += try_echo(s.port, CLIENT_WORKER, other, 0, 0, 300) == 1;
        wait_refused(s.auth, (uint64_t)i + 1, 3000);
    }
    stderr_restore(saved);
    uint64_t refused = ps_curve_auth_refused(s.auth);
    echo_stop(&s);
    CHECK_EQ_INT(got, 0);
    CHECK_EQ_INT(refused, 3);
    CHECK(read_text(log, text, sizeof text) > 0);
    int lines = 0;
    for (const char *p = text; (p = strstr(p, "refused CURVE client")); p++)
        lines++;
    CHECK_MSG(lines == 1, "%d refusal lines for one peer: %s", lines, text);
}

/* The handler refuses any mechanism but CURVE, even for a socket of the
 * same context that asks it: here a ROUTER in ZAP domain "ps" that is a
 * PLAIN server (mechanism "PLAIN") or has no mechanism at all ("NULL", which
 * makes libzmq ask the handler too), and a DEALER of another context trying
 * it.  The handler must say no, count it and log it. */
static void check_zap_refuses(const char *mechanism)
{
    int plain = strcmp(mechanism, "PLAIN") == 0;
    char dir[512], why[512], log[600];
    CHECK(make_keys(plain ? "zapplain" : "zapnull", 1, 1, dir, sizeof dir));
    snprintf(log, sizeof log, "%s/%s.log", ps_test_tmpdir(), plain ? "zapplain" : "zapnull");
    void *ctx = zmq_ctx_new();
    void *curve = zmq_socket(ctx, ZMQ_ROUTER);
    ps_curve_auth *auth = NULL;
    int rc = ps_curve_server_setup(ctx, curve, dir, 0, &auth, why, sizeof why);
    void *other = zmq_socket(ctx, ZMQ_ROUTER);
    int one = 1, linger = 0, port = ps_test_free_port();
    zmq_setsockopt(other, ZMQ_LINGER, &linger, sizeof linger);
    if (plain)
        zmq_setsockopt(other, ZMQ_PLAIN_SERVER, &one, sizeof one);
    zmq_setsockopt(other, ZMQ_ZAP_DOMAIN, "ps", 2);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    int bound = rc == 0 ? zmq_bind(other, ep) : -1;

    int saved = stderr_to(log);
    void *cctx = zmq_ctx_new();
    void *d = zmq_socket(cctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (plain) {
        zmq_setsockopt(d, ZMQ_PLAIN_USERNAME, "admin", 5);
        zmq_setsockopt(d, ZMQ_PLAIN_PASSWORD, "secret", 6);
    }
    zmq_connect(d, ep);
    zmq_send(d, "x", 1, 0);
    int refused = auth && wait_refused(auth, 1, 3000);
    stderr_restore(saved);
    char buf[8];
    ps_test_sleep_ms(100);
    int n = zmq_recv(other, buf, sizeof buf, ZMQ_DONTWAIT);
    zmq_close(d);
    zmq_ctx_term(cctx);
    zmq_close(other);
    zmq_close(curve);
    uint64_t acc = ps_curve_auth_accepted(auth);
    ps_curve_auth_stop(auth);
    zmq_ctx_term(ctx);
    CHECK_MSG(rc == 0, "server setup: %s", why);
    CHECK_EQ_INT(bound, 0);
    CHECK_MSG(refused, "the %s attempt was not refused", mechanism);
    CHECK_EQ_INT(acc, 0);
    CHECK_EQ_INT(n, -1);
    char text[8192], want[64];
    CHECK(read_text(log, text, sizeof text) > 0);
    snprintf(want, sizeof want, "refused %s client from 127.0.0.1", mechanism);
    CHECK_MSG(strstr(text, want), "%s", text);
}

PS_TEST(zap_handler_refuses_plain_mechanism)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    check_zap_refuses("PLAIN");
}

PS_TEST(zap_handler_refuses_null_mechanism)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    check_zap_refuses("NULL");
}

PS_TEST(curve_setup_errors_return_their_code_naming_the_missing_key_or_directory)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512], path[700], missing[600];
    CHECK(make_keys("errs", 2, 2, dir, sizeof dir));
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER), *d = zmq_socket(ctx, ZMQ_DEALER);
    ps_curve_auth *auth = (ps_curve_auth *)1;
    int rc;
#define EXPECT(call, code, text)                                                       \
    do {                                                                               \
        why[0] = 0;                                                                    \
        rc = (call);                                                                   \
        if (rc != (code) || !strstr(why, text)) {                                      \
            zmq_close(r);                                                              \
            zmq_close(d);                                                              \
            zmq_ctx_term(ctx);                                                         \
            CHECK_MSG(0, "%s: rc %d (want %d), why '%s' (want '%s')", #call, rc, code,  \
                      why, text);                                                      \
        }                                                                              \
    } while (0)

    snprintf(missing, sizeof missing, "%s/nothere", ps_test_tmpdir());
    EXPECT(ps_curve_server_setup(ctx, r, missing, 0, &auth, why, sizeof why), PS_ENOTFOUND,
           "nothere: cannot use as CURVE key directory");
    CHECK(auth == NULL);
    EXPECT(ps_curve_client_setup(d, missing, 0, 0, why, sizeof why), PS_ENOTFOUND, "nothere");
    /* no key for this rank */
    EXPECT(ps_curve_server_setup(ctx, r, dir, 2, &auth, why, sizeof why), PS_ENOTFOUND,
           "server-2.pub");
    EXPECT(ps_curve_client_setup(d, dir, 2, 0, why, sizeof why), PS_ENOTFOUND, "worker-2.pub");
    EXPECT(ps_curve_client_setup(d, dir, 0, 5, why, sizeof why), PS_ENOTFOUND, "server-5.pub");
    /* a .pub that is not the secret key's */
    char other[41];
    snprintf(path, sizeof path, "%s/worker-1.pub", dir);
    CHECK_OK(ps_curve_read_key(path, other, why, sizeof why));
    snprintf(path, sizeof path, "%s/worker-0.pub", dir);
    char line[64];
    snprintf(line, sizeof line, "%s\n", other);
    CHECK_OK(write_file(path, line));
    EXPECT(ps_curve_client_setup(d, dir, 0, 0, why, sizeof why), PS_EINVAL,
           "is not the public key of");
    /* a malformed secret key */
    snprintf(path, sizeof path, "%s/server-1.key", dir);
    CHECK_OK(write_file(path, "not a key\n"));
    EXPECT(ps_curve_server_setup(ctx, r, dir, 1, &auth, why, sizeof why), PS_EINVAL,
           "server-1.key: not a CURVE key file");
    /* a malformed authorized key at start-up */
    snprintf(path, sizeof path, "%s/authorized/junk.pub", dir);
    CHECK_OK(write_file(path, "0123\n"));
    EXPECT(ps_curve_server_setup(ctx, r, dir, 0, &auth, why, sizeof why), PS_EINVAL,
           "junk.pub: not a CURVE key file");
    unlink(path);
    /* an empty authorized directory */
    snprintf(path, sizeof path, "%s/authorized/worker-0.pub", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/authorized/worker-1.pub", dir);
    unlink(path);
    EXPECT(ps_curve_server_setup(ctx, r, dir, 0, &auth, why, sizeof why), PS_ENOTFOUND,
           "holds no *.pub key");
    CHECK(auth == NULL);
    /* one handler per context */
    snprintf(path, sizeof path, "%s/authorized/w.pub", dir);
    CHECK_OK(write_file(path, line));
    ps_curve_auth *first = NULL;
    EXPECT(ps_curve_server_setup(ctx, r, dir, 0, &first, why, sizeof why), 0, "");
    void *r2 = zmq_socket(ctx, ZMQ_ROUTER);
    rc = ps_curve_server_setup(ctx, r2, dir, 0, &auth, why, sizeof why);
    zmq_close(r2);
    zmq_close(r);
    zmq_close(d);
    ps_curve_auth_stop(first);
    zmq_ctx_term(ctx);
    CHECK_EQ_INT(rc, PS_EIO);
    CHECK_MSG(strstr(why, "one CURVE server per zmq context"), "%s", why);
    CHECK(auth == NULL);
#undef EXPECT
}

/* Stopping the handler is prompt, and a context terminated under a running
 * handler does not hang (the thread sees ETERM). */
PS_TEST(zap_handler_stops_promptly)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], why[512];
    CHECK(make_keys("stop", 1, 1, dir, sizeof dir));
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    ps_curve_auth *auth = NULL;
    int rc = ps_curve_server_setup(ctx, r, dir, 0, &auth, why, sizeof why);
    zmq_close(r);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ps_curve_auth_stop(auth);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    zmq_ctx_term(ctx);
    CHECK_MSG(rc == 0, "setup: %s", why);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    CHECK_MSG(ms < 1000, "ps_curve_auth_stop took %.0f ms", ms);
    ps_curve_auth_stop(NULL);

    /* context first: zmq_ctx_term returns once the handler saw ETERM */
    ctx = zmq_ctx_new();
    r = zmq_socket(ctx, ZMQ_ROUTER);
    rc = ps_curve_server_setup(ctx, r, dir, 0, &auth, why, sizeof why);
    zmq_close(r);
    zmq_ctx_term(ctx);
    ps_curve_auth_stop(auth);
    CHECK_MSG(rc == 0, "setup: %s", why);
}

/* ---- admin keys: who may stop a CURVE server with a message ---------------- */

/* A DEALER of its own context, a CURVE client of server 0 of dir with the
 * key pair pub/sec; sends a SHUTDOWN as rank -1 and returns the reply's
 * type and error code (-1: no reply). */
static int curve_shutdown(int port, const char *dir, const char *pub, const char *sec, int *ec)
{
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, tmo = 5000, rc = -1;
    char spub[41], path[700], why[256], buf[PS_HEADER_MAX], ep[64];
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    snprintf(path, sizeof path, "%s/server-0.pub", dir);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    ps_header h;
    ps_header_init(&h, PS_MSG_SHUTDOWN);
    h.seq = 5;
    size_t len = 0;
    if (ps_curve_read_key(path, spub, why, sizeof why) == 0 &&
        zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, spub, 41) == 0 &&
        zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, 41) == 0 &&
        zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, 41) == 0 && zmq_connect(d, ep) == 0 &&
        ps_proto_encode(&h, buf, sizeof buf, &len) == 0 && zmq_send(d, buf, len, 0) >= 0) {
        int n = zmq_recv(d, buf, sizeof buf, 0);
        ps_header r;
        if (n > 0 && ps_proto_decode(buf, (size_t)n, &r, why, sizeof why) == 0 && r.seq == 5) {
            rc = (int)r.type;
            *ec = r.err_code;
        }
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc;
}

PS_TEST(only_a_key_in_admin_may_stop_a_curve_server_with_a_message)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char dir[512], path[700], bin[512];
    if (access(ps_test_bin("ps_server", bin, sizeof bin), X_OK) != 0)
        SKIP("bin/ps_server is not built");
    CHECK(make_keys("admin", 1, 1, dir, sizeof dir));
    /* an admin key pair that is not a worker's: its .pub goes to admin/ only */
    char apub[41], asec[41], wpub[41], wsec[41], why[256];
    CHECK_OK(zmq_curve_keypair(apub, asec));
    snprintf(path, sizeof path, "%s/admin", dir);
    CHECK_OK(mkdir(path, 0700));
    snprintf(path, sizeof path, "%s/admin/ops.pub", dir);
    char line[64];
    snprintf(line, sizeof line, "%s\n", apub);
    CHECK_OK(write_file(path, line));
    snprintf(path, sizeof path, "%s/worker-0.pub", dir);
    CHECK_OK(ps_curve_read_key(path, wpub, why, sizeof why));
    snprintf(path, sizeof path, "%s/worker-0.key", dir);
    CHECK_OK(ps_curve_read_key(path, wsec, why, sizeof why));
    ps_test_server sv;
    char words[700];
    snprintf(words, sizeof words, "--curve-keys %s", dir);
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    int ec = 0;
    /* an authorized worker key is no admin key */
    CHECK_EQ_INT(curve_shutdown(sv.port, dir, wpub, wsec, &ec), PS_MSG_ERROR);
    CHECK_EQ_INT(ec, PS_EAUTH);
    CHECK_EQ_INT(curve_shutdown(sv.port, dir, apub, asec, &ec), PS_MSG_SHUTDOWN);
    CHECK_EQ_INT(ps_test_wait(sv.pid, 10000), 0);
    char *log = ps_test_read_file(sv.log, NULL);
    int ok = log && strstr(log, "1 admin key(s)") &&
             strstr(log, "refused a shutdown from rank -1, routing id ") &&
             strstr(log, "CURVE key worker-0") &&
             strstr(log, "shutdown requested by rank -1") && strstr(log, "CURVE key admin/ops");
    free(log);
    CHECK_MSG(ok, "see %s", sv.log);
}
