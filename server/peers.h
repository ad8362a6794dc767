/* The peers of the ROUTER, told apart by their routing id, and what each
 * one's unread replies hold (docs/OPERATIONS.md "Memory").
 *
 * A reply's payload (pull, pushpull) is memory the server keeps until
 * ZeroMQ has written it to the peer's connection: a weight buffer pinned by
 * a zero-copy reply, or a copy.  A peer that sends requests and never reads
 * the replies would make the server hold one payload per request (up to the
 * ROUTER's high-water mark).  So each payload reply the I/O thread forwards
 * is counted against its peer, and uncounted by ZeroMQ's free callback when
 * the bytes are gone (written, or dropped with a connection that closed);
 * a peer at its limit gets an error instead of more payloads.
 *
 * Threads: everything runs on the I/O thread except the free callback of a
 * counted payload, which runs on whichever thread ZeroMQ closes it (its I/O
 * thread, or ours): the counters it drops are atomic, and a peer is freed
 * only once nothing counts against it.  No lock. */
#ifndef PS_PEERS_H
#define PS_PEERS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

typedef struct ps_peers ps_peers;
typedef struct ps_peer ps_peer;

/* max_replies: payload replies one peer may have unread; max_bytes: their
 * bytes, or 0 for "auto": the larger of PS_PEERS_MIN_BYTES and twice the
 * server's chunk memory, *mem_used - *copies (what --max-memory counts,
 * less the reply copies in it), read when needed, so a worker that pulls
 * every chunk of the server twice over stays within it.  PS_ENOMEM. */
#define PS_PEERS_MIN_BYTES (64ull << 20)
int ps_peers_create(uint64_t max_replies, uint64_t max_bytes, _Atomic uint64_t *mem_used,
                    _Atomic uint64_t *copies, ps_peers **out);

/* Free every peer.  Only once nothing can call a payload's free callback any
 * more (after zmq_ctx_term).  NULL is fine. */
void ps_peers_destroy(ps_peers *p);

/* May the peer with identity id (frame: the request's header frame, for its
 * connection) get one more payload reply?  0 yes.  PS_ETOOBIG no: why says
 * what it holds and what to do (for the requester); the refusal is counted
 * and logged (at most once per peer per 10 s) naming the peer as rank.
 * PS_ENOMEM: too many peers to count. */
int ps_peers_admit(ps_peers *p, const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *why,
                   size_t why_len);

/* The bytes of unread replies one connection may have now (--max-peer-bytes,
 * or its automatic value): a single reply larger than this is refused
 * before it is built. */
uint64_t ps_peers_byte_limit(const ps_peers *p);

/* A payload reply to the peer with identity id is about to go on the ROUTER:
 * count it, and make *payload a frame whose free callback uncounts it (the
 * original frame is kept inside until then).  When it cannot be counted (out
 * of memory) *payload is left as it is. */
void ps_peers_count(ps_peers *p, const zmq_msg_t *id, zmq_msg_t *payload);

/* The connection on socket fd closed (the ROUTER's monitor): its peer goes
 * once ZeroMQ has dropped its unread replies. */
void ps_peers_gone(ps_peers *p, int fd);

/* Forget peers that are gone (or idle for a minute) and hold nothing. */
void ps_peers_sweep(ps_peers *p, int64_t now);

/* Payload requests refused so far; replies and bytes unread now, over every
 * peer. */
uint64_t ps_peers_refused(const ps_peers *p);
void ps_peers_unread(const ps_peers *p, uint64_t *replies, uint64_t *bytes);

/* "rank R, routing id 0a1b2c3d4e, from 10.0.0.7, CURVE key worker-3" for
 * the peer that sent a message: id is its identity frame, frame any frame
 * it sent (ZeroMQ attaches the peer's address and CURVE user id to those). */
void ps_peer_name(const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *out, size_t len);

#endif
