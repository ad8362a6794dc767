/* The I/O thread's handlers of readers' and exports' messages: LOOKUP to
 * the update thread of its partition, SNAPSHOT and SNAPREAD through the
 * export session (export.h). */
#include <string.h>

#include "export.h"
#include "peers.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "server_internal.h"

void srv_on_lookup(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    char why[256];
    int rc;
    if ((rc = ps_peers_admit(s->peers, &f[0], &f[1], h->rank, why, sizeof why)) != 0) {
        srv_refuse_quiet(s, &f[0], h, rc, why);
        return;
    }
    if (h->chunk >= (uint32_t)s->cfg.threads) {
        ps_errorf(why, sizeof why, "lookup of partition %u: this server has %d (its --threads)",
            h->chunk, s->cfg.threads);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    ps_cmd_frame cmd = {.cmd = PS_CMD_REQ, .h = *h};
    srv_send_cmd_frames(s, (int)h->chunk, &cmd, &f[0], &f[2], nf - 2);
}

void srv_on_snapshot(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    char why[256];
    uint64_t token = 0;
    const ps_snap_target *t = NULL;
    size_t nt = 0;
    int send = 0;
    ps_header r;
    if (ps_move_happened(s->move)) {
        /* a snapshot here would miss what moved away or hold what moved in
         * under another home: not an export of the job */
        srv_refuse(s, &f[0], h, PS_ESTATE, "objects moved between this job's servers (servers "
                   "added or removed): an export does not follow them yet; export from "
                   "checkpoints, or before changing the servers");
        return;
    }
    int rc = ps_export_begin(s->exp, &f[0], h, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]),
                             ps_now_ns(), &token, &t, &nt, &send, &r, why, sizeof why);
    if (rc) {
        srv_refuse(s, &f[0], h, rc, why);
        return;
    }
    if (send == 2) {
        srv_send(s, &f[0], &r);
        return;
    }
    if (send != 1)
        return;
    char who[256];
    ps_peer_name(&f[0], &f[1], h->rank, who, sizeof who);
    ps_info("export: snapshot %llu asked by %s (version %lld, %zu keys of their own)",
            (unsigned long long)token, who, (long long)h->want_version, nt);
    ps_cmd_frame cmd = {.cmd = PS_CMD_SNAP, .snap_token = token, .snap_targets = t,
                        .snap_ntargets = nt};
    cmd.h.want_version = h->want_version;
    cmd.h.hello.opt = s->opt_now;
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
}

void srv_on_snapread(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    char why[256];
    zmq_msg_t page;
    ps_header r;
    int rc = ps_export_read(s->exp, &f[0], h, ps_now_ns(), &page, &r, why, sizeof why);
    if (rc) {
        srv_refuse(s, &f[0], h, rc, why);
        return;
    }
    srv_send_payload(s, &f[0], &r, &page);
    zmq_msg_close(&page); /* not sent: its item's reference goes */
}

void srv_export_part(ps_server *s, int i, ps_snap_frame *sf)
{
    zmq_msg_t id;
    ps_header r;
    if (ps_export_part(s->exp, i, sf, ps_now_ns(), &id, &r)) {
        if (r.type == PS_MSG_ERROR)
            ps_warn("export: snapshot refused: %s", r.err_text);
        srv_send(s, &id, &r);
        zmq_msg_close(&id);
    }
}

void srv_export_tick(ps_server *s, int64_t now)
{
    if (!ps_export_tick(s->exp, now))
        return;
    ps_cmd_frame cmd = {.cmd = PS_CMD_SNAP_FLUSH};
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
}
