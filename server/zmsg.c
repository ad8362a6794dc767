#include "zmsg.h"

#include <errno.h>

int ps_zmsg_recv(void *sock, zmq_msg_t *m, int flags)
{
    zmq_msg_init(m);
    if (zmq_msg_recv(m, sock, flags) >= 0)
        return 0;
    int e = errno;
    zmq_msg_close(m);
    errno = e;
    return -1;
}

int ps_zmsg_recv_rest(void *sock, int more, zmq_msg_t *f, int *nf, int max)
{
    int n = 0;
    while (more) {
        zmq_msg_t x;
        if (ps_zmsg_recv(sock, &x, 0) < 0)
            break;
        more = zmq_msg_more(&x);
        n++;
        if (nf && *nf < max) {
            zmq_msg_init(&f[*nf]);
            zmq_msg_move(&f[(*nf)++], &x);
        }
        zmq_msg_close(&x);
    }
    return n;
}

void ps_zmsg_send_all(void *sock, zmq_msg_t *f, int nf, int flags)
{
    for (int k = 0; k < nf; k++)
        zmq_msg_send(&f[k], sock, (k < nf - 1 ? ZMQ_SNDMORE : 0) | flags);
}

void ps_zmsg_close_all(zmq_msg_t *f, int nf)
{
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
}
