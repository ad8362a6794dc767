/* CURVE handshake failures that the ZAP handler never sees: a peer without
 * CURVE (mechanism mismatch), or one that hangs up mid-handshake (it lacks
 * this server's public key).  ZAP refusals are logged by the handler
 * (common/ps_curve.h); these are logged here, one line per 5 s at most, the
 * rest counted.  Runs on the thread that owns the ROUTER. */
#ifndef PS_HS_MONITOR_H
#define PS_HS_MONITOR_H

#include <stdint.h>

typedef struct ps_hs_monitor ps_hs_monitor;

/* Watch router's handshakes (before it binds).  NULL when that cannot be set
 * up: not fatal, such refusals then go unlogged. */
ps_hs_monitor *ps_hs_monitor_open(void *ctx, void *router);

/* The socket to poll for ZMQ_POLLIN. */
void *ps_hs_monitor_socket(const ps_hs_monitor *m);

/* Take the events that came, log the failures. */
void ps_hs_monitor_read(ps_hs_monitor *m);

/* Handshakes that failed so far. */
uint64_t ps_hs_monitor_failed(const ps_hs_monitor *m);

/* Stop watching and close, before the ROUTER closes.  NULL is fine. */
void ps_hs_monitor_close(ps_hs_monitor *m);

#endif
