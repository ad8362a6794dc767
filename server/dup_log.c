/* The duplicate pushes' log (server/dup_log.h). */
#include "dup_log.h"

#include <string.h>

#include "ps_log.h"
#include "ps_time.h"

/* Say what the duplicate window holds, and close it. */
void ps_dup_log_flush(ps_dup_log *d, int64_t now)
{
    if (!d->n)
        return;
    double secs = (double)(now - d->win_ns) * 1e-9;
    for (int i = 0; i < d->nranks; i++) {
        const ps_dup_rank *x = &d->r[i];
        if (x->n >= DUP_WARN)
            ps_warn("worker %d: %llu duplicate pushes dropped in the last %.1f s (the last on "
                    "key %llu chunk %u, step %lld, below its clock there): resends, or pushes "
                    "another connection made in its name", x->rank, (unsigned long long)x->n,
                    secs, (unsigned long long)x->key, x->chunk, (long long)x->step);
        else
            ps_info("worker %d: %llu duplicate pushes dropped in the last %.1f s (the last on "
                    "key %llu chunk %u, step %lld)", x->rank, (unsigned long long)x->n, secs,
                    (unsigned long long)x->key, x->chunk, (long long)x->step);
    }
    if (d->others)
        ps_info("%llu more duplicate pushes of other workers dropped in the last %.1f s",
                (unsigned long long)d->others, secs);
    int64_t quiet = d->quiet_ns;
    memset(d, 0, sizeof *d);
    d->quiet_ns = quiet;
}

void ps_dup_log_tick(ps_dup_log *d)
{
    if (!d->n)
        return;
    int64_t now = ps_now_ns();
    if (now - d->win_ns >= DUP_WINDOW_NS)
        ps_dup_log_flush(d, now);
}

void ps_dup_log_note(ps_dup_log *d, const ps_header *h)
{
    int64_t now = ps_now_ns();
    if (!d->n) {
        d->win_ns = now;
        if (now - d->quiet_ns >= DUP_WINDOW_NS) {
            ps_info("worker %d: push of step %lld to key %llu chunk %u is a duplicate (below its "
                    "clock there): dropped; more are summed up every %d s", h->rank,
                    (long long)h->push_step, (unsigned long long)h->key, h->chunk,
                    (int)(DUP_WINDOW_NS / 1000000000LL));
            d->quiet_ns = now;
        }
    }
    d->n++;
    int i = 0;
    while (i < d->nranks && d->r[i].rank != h->rank)
        i++;
    if (i == d->nranks && i < DUP_RANKS)
        d->r[d->nranks++].rank = h->rank;
    if (i < d->nranks)
        d->r[i] = (ps_dup_rank){h->rank, d->r[i].n + 1, h->key, h->chunk, h->push_step};
    else
        d->others++;
}
