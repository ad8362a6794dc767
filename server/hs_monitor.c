#include "hs_monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_log.h"
#include "ps_time.h"
#include "zmsg.h"

struct ps_hs_monitor {
    void *router, *sock;
    int curve;
    uint64_t failed, unlogged;
    int64_t log_ns;
};

ps_hs_monitor *ps_hs_monitor_open(void *ctx, void *router, int curve)
{
    ps_hs_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ps-monitor-%p", (void *)m);
    int events = ZMQ_EVENT_DISCONNECTED;
    if (curve)
        events |= ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    if (zmq_socket_monitor(router, ep, events) != 0) {
        free(m);
        return NULL;
    }
    m->router = router;
    m->curve = curve;
    m->sock = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0;
    if (!m->sock || zmq_setsockopt(m->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(m->sock, ep) != 0) {
        ps_hs_monitor_close(m);
        return NULL;
    }
    return m;
}

void *ps_hs_monitor_socket(const ps_hs_monitor *m) { return m->sock; }

uint64_t ps_hs_monitor_failed(const ps_hs_monitor *m) { return m ? m->failed : 0; }

void ps_hs_monitor_read(ps_hs_monitor *m, void (*gone)(void *user, int fd), void *user)
{
    while (m) {
        zmq_msg_t ev, addr;
        if (ps_zmsg_recv(m->sock, &ev, ZMQ_DONTWAIT) < 0)
            return;
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev))
            zmq_msg_recv(&addr, m->sock, 0);
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
        }
        if (event == ZMQ_EVENT_DISCONNECTED && gone)
            gone(user, (int)value);
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            m->failed++;
            int64_t now = ps_now_ns();
            if (now - m->log_ns >= 5000000000LL || !m->log_ns) {
                char more[96] = "";
                if (m->unlogged)
                    snprintf(more, sizeof more, " (%llu more since the last such line)",
                             (unsigned long long)m->unlogged);
                const char *what =
                    event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                        ? "the peer hung up (a worker without --curve-keys, or one that does "
                          "not have this server's public key?)"
                    : value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                        ? "the peer does not use CURVE (a worker without --curve-keys?)"
                        : "protocol error (not a ps worker, or a damaged connection)";
                ps_warn("refused a connection on %.*s: CURVE handshake failed: %s%s",
                        (int)zmq_msg_size(&addr), (const char *)zmq_msg_data(&addr), what,
                        more);
                m->log_ns = now;
                m->unlogged = 0;
            } else {
                m->unlogged++;
            }
        }
        zmq_msg_close(&ev);
        zmq_msg_close(&addr);
    }
}

void ps_hs_monitor_close(ps_hs_monitor *m)
{
    if (!m)
        return;
    zmq_socket_monitor(m->router, NULL, 0);
    if (m->sock)
        zmq_close(m->sock);
    free(m);
}
