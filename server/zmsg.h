/* Multipart ZeroMQ messages as arrays of frames, the way the server's threads
 * pass them on: received into zmq_msg_t slots, moved on without a copy.
 * Every function leaves each slot it names initialized (closed or not). */
#ifndef PS_ZMSG_H
#define PS_ZMSG_H

#include <zmq.h>

/* Receive the next frame from sock into m (initialized here).  0, or -1 with
 * m closed again and errno as zmq_msg_recv left it. */
int ps_zmsg_recv(void *sock, zmq_msg_t *m, int flags);

/* Receive the frames left of a message on sock (more: zmq_msg_more of the
 * last one received).  The first ones go to f[*nf], f[*nf + 1], ... while
 * *nf < max; the others are dropped (f and nf may be NULL: all dropped).
 * Returns how many frames came. */
int ps_zmsg_recv_rest(void *sock, int more, zmq_msg_t *f, int *nf, int max);

/* Send f[0..nf-1] as one message (ZMQ_SNDMORE on all but the last, `flags`
 * on each); the frames are left initialized, empty when sent. */
void ps_zmsg_send_all(void *sock, zmq_msg_t *f, int nf, int flags);

void ps_zmsg_close_all(zmq_msg_t *f, int nf);

#endif
