#include "peers.h"

#include <stdio.h>

void ps_peer_name(const zmq_msg_t *id, const zmq_msg_t *frame, int rank, char *out, size_t len)
{
    char hex[2 * 16 + 3] = "";
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)id);
    size_t n = zmq_msg_size((zmq_msg_t *)id), o = 0;
    for (size_t i = 0; i < n && i < 16; i++)
        o += (size_t)snprintf(hex + o, sizeof hex - o, "%02x", p[i]);
    if (n > 16)
        snprintf(hex + o, sizeof hex - o, "..");
    const char *addr = frame ? zmq_msg_gets((zmq_msg_t *)frame, "Peer-Address") : NULL;
    const char *user = frame ? zmq_msg_gets((zmq_msg_t *)frame, "User-Id") : NULL;
    snprintf(out, len, "rank %d, routing id %s%s%s%s%s", rank, hex[0] ? hex : "(empty)",
             addr ? ", from " : "", addr ? addr : "", user && *user ? ", CURVE key " : "",
             user && *user ? user : "");
}
