/* Messages for a PAIR whose peer is behind.  The I/O thread never blocks on
 * an update thread: what its PAIR does not take now waits here, in order,
 * and the I/O thread stops reading the ROUTER until the box is empty again
 * (server.h "Back-pressure").
 *
 * Ownership: frames handed to ps_outbox_put are the box's from then on
 * (sent, queued or dropped); a queued message is freed once sent. */
#ifndef PS_OUTBOX_H
#define PS_OUTBOX_H

#include <stddef.h>
#include <zmq.h>

typedef struct ps_outmsg ps_outmsg;

typedef struct ps_outbox { /* zeroed is empty */
    ps_outmsg *head, *tail;
    size_t n;              /* messages waiting */
} ps_outbox;

/* Send f[0..nf-1] (nf <= 5) on sock without blocking when nothing waits and
 * sock takes it, else queue it behind the others.  0 (sent or queued: n
 * says), PS_EIO (sending failed, errno says) or PS_ENOMEM (could not queue);
 * then the message is dropped. */
int ps_outbox_put(ps_outbox *ob, void *sock, zmq_msg_t *f, int nf);

/* Send waiting messages, oldest first, while sock takes them.  0 when the
 * box is empty or sock is full again; PS_EIO (errno says) when one failed:
 * it was dropped, call again for the rest. */
int ps_outbox_flush(ps_outbox *ob, void *sock);

/* Drop everything waiting. */
void ps_outbox_clear(ps_outbox *ob);

#endif
