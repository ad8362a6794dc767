/* What the I/O loop (server.c) and the message handlers (server_msg.c) both
 * do: put a reply on the ROUTER, hand a command to an update thread, and
 * mark the server as stopping.  Here, so that neither of the two calls the
 * other back. */
#include "server_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_log.h"

void srv_send(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    srv_send_payload(s, id, h, NULL);
}

void srv_send_payload(ps_server *s, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("cannot encode a %s reply", ps_msg_type_name(h->type));
        return;
    }
    if (zmq_msg_send(id, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(s->router, buf, len, ZMQ_DONTWAIT | (payload ? ZMQ_SNDMORE : 0));
    if (payload)
        zmq_msg_send(payload, s->router, ZMQ_DONTWAIT);
}

/* ps_reply_to for the barriers and stats requests */
void srv_reply_hook(void *user, zmq_msg_t *id, const ps_header *h) { srv_send(user, id, h); }

/* Hand a message to an owner, or queue it while its PAIR is full (reads from
 * the ROUTER pause meanwhile: out_total). */
static void srv_to_owner(ps_server *s, int i, zmq_msg_t *f, int nf)
{
    owner *o = &s->own[i];
    size_t before = o->out.n;
    int rc = ps_outbox_put(&o->out, o->pair, f, nf);
    if (rc == PS_EIO)
        ps_error("handing a message to update thread %d failed: %s", i, zmq_strerror(errno));
    else if (rc)
        ps_error("out of memory queueing a message for update thread %d; dropped", i);
    else if (!before && o->out.n)
        ps_debug("update thread %d is behind: reads from the ROUTER pause until it catches up",
                 i);
    s->out_total += o->out.n - before;
}

void srv_flush_outbox(ps_server *s, int i)
{
    owner *o = &s->own[i];
    size_t before = o->out.n;
    while (ps_outbox_flush(&o->out, o->pair) != 0)
        ps_error("handing a message to update thread %d failed: %s", i, zmq_strerror(errno));
    s->out_total -= before - o->out.n;
}

void srv_send_cmd_frames(ps_server *s, int owner, const ps_cmd_frame *cmd, zmq_msg_t *id,
                         zmq_msg_t *frames, int nframes)
{
    zmq_msg_t f[PS_CMD_MAX_FRAMES];
    int nf = 1;
    zmq_msg_init_size(&f[0], sizeof *cmd);
    memcpy(zmq_msg_data(&f[0]), cmd, sizeof *cmd);
    if (id) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], id);
    }
    for (int i = 0; i < nframes && nf < PS_CMD_MAX_FRAMES; i++) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], &frames[i]);
    }
    srv_to_owner(s, owner, f, nf);
}

void srv_send_cmd(ps_server *s, int owner, const ps_cmd_frame *cmd, zmq_msg_t *id,
                  zmq_msg_t *payload)
{
    srv_send_cmd_frames(s, owner, cmd, id, payload, payload ? 1 : 0);
}

srv_table *srv_find_table(ps_server *s, uint64_t key)
{
    for (size_t i = 0; i < s->ntables; i++)
        if (s->tables[i].key == key)
            return &s->tables[i];
    return NULL;
}

srv_table *srv_add_table(ps_server *s, uint64_t key, const ps_table_options *decl,
                         int restored)
{
    if (s->ntables == s->cap_tables) {
        size_t ncap = s->cap_tables ? 2 * s->cap_tables : 8;
        srv_table *t = realloc(s->tables, ncap * sizeof *t);
        if (!t)
            return NULL;
        s->tables = t;
        s->cap_tables = ncap;
    }
    srv_table *t = &s->tables[s->ntables++];
    memset(t, 0, sizeof *t);
    t->key = key;
    t->decl = *decl;
    ps_table_decl_normalize(&t->decl);
    t->restored = restored;
    t->opt_now = t->decl.opt;
    ps_srv_metrics_add_table(s->met, key); /* before any update thread hears of it */
    return t;
}

const char *srv_table_label(const srv_table *t, char *buf, size_t len)
{
    if (t->name[0])
        snprintf(buf, len, "table '%s' (key %llu)", t->name, (unsigned long long)t->key);
    else
        snprintf(buf, len, "table %llu", (unsigned long long)t->key);
    return buf;
}

uint64_t srv_tables_fp(const ps_server *s)
{
    return ps_table_decl_fingerprint(s->tables, s->ntables, sizeof *s->tables,
                                     offsetof(srv_table, key), offsetof(srv_table, decl));
}

ps_tparts_config srv_tparts_config(ps_server *s)
{
    const ps_server_config *c = &s->cfg;
    return (ps_tparts_config){c->mode,
                              c->max_staleness,
                              c->num_workers,
                              c->num_servers,
                              c->threads,
                              0,
                              c->max_memory,
                              &s->mem_used,
                              c->on_nonfinite != PS_NONFINITE_APPLY,
                              s->worker_mem,
                              ps_server_worker_share(c),
                              c->rank};
}

/* From here on no checkpoint is started by schedule, and one that completes
 * is written at once (the last one at stop). */
void srv_set_stopping(ps_server *s)
{
    s->stopping = 1;
    if (s->ck)
        ps_ckpt_coord_stopping(s->ck);
}
