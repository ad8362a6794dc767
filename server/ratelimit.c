#include "ratelimit.h"

#include "ps_log.h"
#include "ps_time.h"

void ps_rlimit_flush(ps_rlimit *r, int64_t now, int force)
{
    if (!force && now - r->win < 1000000000LL)
        return;
    if (r->suppressed)
        ps_warn("%llu more refused or dropped messages not logged", r->suppressed);
    r->win = now;
    r->n = 0;
    r->suppressed = 0;
}

int ps_rlimit_allow(ps_rlimit *r)
{
    ps_rlimit_flush(r, ps_now_ns(), 0);
    if (r->n < PS_RLIMIT_LINES) {
        r->n++;
        return 1;
    }
    r->suppressed++;
    return 0;
}
