/* An elastic job's membership on the I/O thread (server.h "Elastic jobs"):
 * --num-workers MIN:MAX makes ranks 0..MAX-1 possible and none a member
 * until its hello; a JOIN names the step from which a new member's
 * gradients count, the same on every chunk and partition; barriers
 * complete only with MIN members.  The workers' table (workers.c) counts
 * the members and logs each change; the owners' live sets follow through
 * PS_CMD_LIVE (hello, loss, leave) and PS_CMD_JOIN. */
#include "server_internal.h"

#include "ps_log.h"

int srv_elastic(const ps_server_config *c)
{
    return c->num_workers_min > 0 && c->num_workers_min < c->num_workers;
}

void srv_membership_open(ps_server *s)
{
    if (!srv_elastic(&s->cfg))
        return;
    int W = s->cfg.num_workers, min = s->cfg.num_workers_min;
    ps_workers_set_elastic(s->workers, min);
    for (int r = 0; r < W; r++) { /* the owners start so (ps_shard_config.elastic) */
        ps_barriers_set_live(s->barriers, r, 0);
        ps_colls_set_live(s->colls, r, 0);
    }
    ps_barriers_set_min(s->barriers, min);
    ps_info("elastic job: workers %d..%d (ranks 0..%d); barriers wait for %d members, and "
            "workers join and leave while training goes on", min, W, W - 1, min);
}

void srv_stream_join(ps_server *s, int rank, int64_t step)
{
    ps_cmd_frame cmd = {.cmd = PS_CMD_JOIN, .rank = rank};
    cmd.h.push_step = step;
    for (int i = 0; i < s->cfg.threads; i++)
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    ps_repl_forward_join(s->repl, rank, step);
    ps_info("worker %d is a member from step %lld on (%d members)", rank, (long long)step,
            ps_workers_members(s->workers));
}
