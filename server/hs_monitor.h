/* The ROUTER's connection events: peers that disconnect (so a worker rank's
 * hold and a peer's reply accounting end with its connection), and, with
 * CURVE, handshake failures that the ZAP handler never sees: a peer without
 * CURVE (mechanism mismatch), or one that hangs up mid-handshake (it lacks
 * this server's public key).  ZAP refusals are logged by the handler
 * (common/ps_curve.h); handshake failures are logged here, one line per 5 s
 * at most, the rest counted.  Runs on the thread that owns the ROUTER. */
#ifndef PS_HS_MONITOR_H
#define PS_HS_MONITOR_H

#include <stdint.h>

typedef struct ps_hs_monitor ps_hs_monitor;

/* Watch router's connections (before it binds); curve: it is a CURVE server.
 * NULL when that cannot be set up: not fatal, handshake failures then go
 * unlogged and disconnects unseen (a rank is then held until its connection
 * has been silent for the hold window, server/workers.h). */
ps_hs_monitor *ps_hs_monitor_open(void *ctx, void *router, int curve);

/* The socket to poll for ZMQ_POLLIN. */
void *ps_hs_monitor_socket(const ps_hs_monitor *m);

/* Take the events that came, log the handshake failures, and call
 * gone(user, fd) for each connection that closed (fd: the one ZeroMQ gave
 * its messages, zmq_msg_get ZMQ_SRCFD).  m NULL: nothing. */
void ps_hs_monitor_read(ps_hs_monitor *m, void (*gone)(void *user, int fd), void *user);

/* Handshakes that failed so far. */
uint64_t ps_hs_monitor_failed(const ps_hs_monitor *m);

/* Stop watching and close, before the ROUTER closes.  NULL is fine. */
void ps_hs_monitor_close(ps_hs_monitor *m);

#endif
