#include "outbox.h"

#include <errno.h>
#include <stdlib.h>

#include "ps_error.h"
#include "zmsg.h"

struct ps_outmsg {
    struct ps_outmsg *next;
    int nf;
    zmq_msg_t f[5]; /* a command, an identity and a sparse request's three frames */
};

/* Try to hand frames to sock without blocking: 0 sent, 1 full (frames
 * untouched), -1 failed. */
static int try_send(void *sock, zmq_msg_t *f, int nf)
{
    if (zmq_msg_send(&f[0], sock, ZMQ_DONTWAIT | (nf > 1 ? ZMQ_SNDMORE : 0)) < 0)
        return errno == EAGAIN ? 1 : -1;
    /* the rest of a multipart message is never refused once its first frame went */
    for (int i = 1; i < nf; i++)
        zmq_msg_send(&f[i], sock, i < nf - 1 ? ZMQ_SNDMORE : 0);
    return 0;
}

int ps_outbox_put(ps_outbox *ob, void *sock, zmq_msg_t *f, int nf)
{
    if (!ob->head) {
        int rc = try_send(sock, f, nf);
        if (rc <= 0) {
            int e = errno;
            ps_zmsg_close_all(f, nf);
            errno = e;
            return rc ? PS_EIO : 0;
        }
    }
    ps_outmsg *m = calloc(1, sizeof *m);
    if (!m) {
        ps_zmsg_close_all(f, nf);
        return PS_ENOMEM;
    }
    m->nf = nf;
    for (int i = 0; i < nf; i++) {
        zmq_msg_init(&m->f[i]);
        zmq_msg_move(&m->f[i], &f[i]);
    }
    if (ob->tail)
        ob->tail->next = m;
    else
        ob->head = m;
    ob->tail = m;
    ob->n++;
    return 0;
}

static void pop(ps_outbox *ob)
{
    ps_outmsg *m = ob->head;
    ps_zmsg_close_all(m->f, m->nf);
    ob->head = m->next;
    if (!ob->head)
        ob->tail = NULL;
    ob->n--;
    free(m);
}

int ps_outbox_flush(ps_outbox *ob, void *sock)
{
    while (ob->head) {
        int rc = try_send(sock, ob->head->f, ob->head->nf);
        if (rc == 1)
            return 0;
        int e = errno;
        pop(ob);
        if (rc < 0) {
            errno = e;
            return PS_EIO;
        }
    }
    return 0;
}

void ps_outbox_clear(ps_outbox *ob)
{
    while (ob->head)
        pop(ob);
}
