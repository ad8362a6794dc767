/* CURVE security (CurveZMQ, RFC 26) for the server's ROUTER and the workers'
 * DEALERs, with our own ZAP handler (RFC 27) deciding which workers may
 * connect.
 *
 * Key directory (made by ps_keygen / ps_curve_keygen):
 *   DIR/server-R.key  server R's secret key   (mode 0600)
 *   DIR/server-R.pub  server R's public key
 *   DIR/worker-W.key  worker W's secret key   (mode 0600)
 *   DIR/worker-W.pub  worker W's public key
 *   DIR/authorized/NAME.pub  a public key the servers accept (ps_keygen puts
 *                     every worker-W.pub there); removing the file revokes
 *                     that key for every later handshake
 *   DIR/admin/NAME.pub  optional: a key the servers accept as an admin's,
 *                     which may stop a server with a SHUTDOWN message
 *                     (server/admin.h); ps_keygen makes none
 *   DIR/reader/NAME.pub optional: a key the servers accept as a reader's
 *                     (user id "reader/NAME"): it may send, as rank -1,
 *                     only what reads (lookups, pulls, snapshots, stats;
 *                     server/server_dispatch.c), never a push or a worker rank
 *   DIR/reader.key/.pub a reader's own key pair (a client of rank -1)
 * Each key file holds the 40-character Z85 text of a 32-byte key, optionally
 * followed by a newline.  A server host needs its server-R.key/.pub and
 * authorized/; a worker host needs its worker-W.key/.pub and every
 * server-*.pub.
 *
 * Order of calls, server side (one ROUTER per process):
 *   ctx = zmq_ctx_new(); router = zmq_socket(ctx, ZMQ_ROUTER);
 *   ps_curve_server_setup(ctx, router, dir, rank, &auth, why, len);  before bind
 *   zmq_bind(router, ...); ... serve ...
 *   zmq_close(router);
 *   ps_curve_auth_stop(auth);          after the ROUTER is closed
 *   zmq_ctx_term(ctx);                 after ps_curve_auth_stop
 * libzmq lets a CURVE client in WITHOUT any check when no ZAP handler is bound
 * in the context, so the handler must outlive the ROUTER; setup returns only
 * once the handler is bound.
 *
 * Client side (each DEALER, before zmq_connect):
 *   ps_curve_client_setup(dealer, dir, worker_rank, server_rank, why, len);
 *
 * Errors: 0 or a PS_E* code (common/ps_error.h) with a sentence in why:
 * PS_ENOTFOUND (no such directory or key file), PS_EINVAL (malformed key
 * file, public key not matching the secret key, bad rank), PS_EAUTH (libzmq
 * built without CURVE), PS_EIO (a zmq_setsockopt or the handler's bind
 * failed, e.g. a second handler in one context), PS_ENOMEM. */
#ifndef PS_CURVE_H
#define PS_CURVE_H

#include <stddef.h>
#include <stdint.h>

/* The ZAP user id of a reader key starts with this. */
#define PS_CURVE_READER_PREFIX "reader/"

/* Z85 text of a 32-byte CURVE key, without the terminating NUL. */
#define PS_CURVE_KEY_LEN 40
/* ZAP domain set on the server's ROUTER; the handler answers only for it. */
#define PS_CURVE_ZAP_DOMAIN "ps"

/* 0 when this libzmq supports CURVE, else PS_EAUTH with a sentence in why. */
int ps_curve_available(char *why, size_t why_len);

/* Read a key file: 40 Z85 characters, optionally followed by whitespace.
 * key receives the text and a NUL (PS_CURVE_KEY_LEN + 1 bytes). */
int ps_curve_read_key(const char *path, char key[PS_CURVE_KEY_LEN + 1], char *why,
                      size_t why_len);

/* ---- server ------------------------------------------------------------ */

/* The ZAP handler of one context: a thread owning a REP socket bound to
 * inproc://zeromq.zap.01.  Opaque; created by ps_curve_server_setup, freed by
 * ps_curve_auth_stop.  At most one per zmq context (a second setup in the same
 * context fails with PS_EIO). */
typedef struct ps_curve_auth ps_curve_auth;

/* Make router_socket (a ROUTER of zmq_ctx, not yet bound) a CURVE server with
 * the secret key of DIR/server-<server_rank>.key (checked against its .pub),
 * ZAP domain "ps", and start the handler thread in zmq_ctx.  The handler
 * accepts exactly the CURVE clients whose public key is in a .pub file of
 * DIR/authorized; it re-reads that directory on every handshake, so a removed file
 * refuses that worker from its next connection on (sessions already open
 * stay open until they reconnect).  Setup fails when authorized/ is missing,
 * holds no key or holds a malformed .pub; a file that turns bad later is
 * skipped with a warning.  Every other request (another key, NULL or PLAIN
 * mechanism, another domain) is refused with ZAP status 400, counted, and
 * logged with ps_warn:
 *   refused CURVE client from 127.0.0.1: key <z85> is not in DIR/authorized
 * (a client refused again with the same key from the same address within 10 s
 * is counted but not logged again until the 10 s have passed; the next line
 * says how many were not logged, so a peer that keeps reconnecting cannot
 * flood the log).
 * An accepted connection's messages carry the key's file name without ".pub"
 * ("worker-3") as ZAP user id: zmq_msg_gets(&msg, "User-Id") on a received
 * frame tells the server which key the peer proved it holds.  Keys in
 * DIR/admin (optional, re-read like authorized/) are accepted too, and
 * looked up first: their user id is "admin/" and the file name ("admin/ops"),
 * which no file in authorized/ can give (a name has no '/').  A client
 * that holds this server's own key pair (server-<server_rank>) is accepted
 * too, with that user id: the other members of its shard group
 * (server/repl.h), which share the key, stream to each other with it.
 * The caller keeps owning router_socket and zmq_ctx; on success *out is the
 * handler, which the caller must stop with ps_curve_auth_stop.  On failure
 * *out is NULL and nothing is left running. */
int ps_curve_server_setup(void *zmq_ctx, void *router_socket, const char *dir, int server_rank,
                          ps_curve_auth **out, char *why, size_t why_len);

/* Stop the handler thread (within about 100 ms), close its socket and free a.
 * Call after closing the ROUTER and before zmq_ctx_term.  NULL is a no-op.
 * (If the context is terminated first, the thread notices and exits on its
 * own; stop then only joins and frees.) */
void ps_curve_auth_stop(ps_curve_auth *a);

/* Admin keys in DIR/admin at setup (the handler re-reads it later). */
size_t ps_curve_auth_admin_keys(const ps_curve_auth *a);

/* Handshakes refused / accepted so far.  Any thread may call these. */
uint64_t ps_curve_auth_refused(const ps_curve_auth *a);
uint64_t ps_curve_auth_accepted(const ps_curve_auth *a);

/* ---- client ------------------------------------------------------------ */

/* Make dealer_socket (not yet connected) a CURVE client of server
 * <server_rank>: ZMQ_CURVE_SERVERKEY from DIR/server-<server_rank>.pub,
 * ZMQ_CURVE_PUBLICKEY / ZMQ_CURVE_SECRETKEY from DIR/worker-<worker_rank>.pub
 * / .key (checked to be a pair; worker_rank -1, a reader: DIR/reader.pub and
 * reader.key).  Sets socket options only: no thread, nothing
 * to free; call it from the thread that owns the socket.  A server that
 * refuses the key never answers (libzmq 4.3 gives up on that connection
 * without telling the socket's user), so the caller's request timeout is what
 * reports it; say "check --curve-keys" in that message. */
int ps_curve_client_setup(void *dealer_socket, const char *dir, int worker_rank, int server_rank,
                          char *why, size_t why_len);
/* The same with the client's pair DIR/<key_name>.pub / .key (ps_top --key;
 * a name without '/'). */
int ps_curve_client_setup_key(void *dealer_socket, const char *dir, const char *key_name,
                              int server_rank, char *why, size_t why_len);

/* ---- key generation ---------------------------------------------------- */

/* What ps_keygen does: create dir (mode 0700, parents as needed) and write
 * server-0..S-1 and worker-0..W-1 key pairs (secret files 0600, public 0644)
 * plus authorized/ (0700) holding a copy of every worker-*.pub.  Without
 * force, PS_ESTATE when any key file (server-*.key/.pub, worker-*.key/.pub,
 * authorized/NAME.pub) is already there; with force, those files are removed
 * first, so no key of an earlier set stays authorized.  Files are created with
 * O_EXCL and O_NOFOLLOW.  servers and workers in [1, PS_CURVE_MAX_KEYS]. */
#define PS_CURVE_MAX_KEYS 65536
int ps_curve_keygen(const char *dir, int servers, int workers, int force, char *why,
                    size_t why_len);

#endif
