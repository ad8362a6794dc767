/* The peers of the ROUTER, told apart by their routing id: how to name one
 * in a log line.  (Runs on the I/O thread; no sockets.) */
#ifndef PS_PEERS_H
#define PS_PEERS_H

#include <stddef.h>
#include <zmq.h>

/* "rank R, routing id 0a1b2c3d4e, from 10.0.0.7, CURVE key worker-3" for
 * the peer that sent a message: id is its identity frame, frame any frame
 * it sent (ZeroMQ attaches the peer's address and CURVE user id to those). */
void ps_peer_name(const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *out, size_t len);

#endif
