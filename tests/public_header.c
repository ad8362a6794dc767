/* libps's public headers stand alone: this file includes only them
 * and the Makefile compiles it with -Iinclude as the only include path
 * (C99, pedantic), so include/ never comes to need proto/, common/ or
 * worker/.  It touches what a caller touches: options, the optimizer it
 * expects, the public results of a request, server counters. */
#include "ps_client.h"
#include "ps_exchange.h"

int ps_public_header_check(const ps_request *r, ps_client_options *o, const ps_stats *st);
int ps_public_header_check(const ps_request *r, ps_client_options *o, const ps_stats *st)
{
    ps_client_options_default(o);
    o->mode = PS_MODE_ASYNC;
    o->expect.kind = PS_OPT_ADAM;
    o->expect.beta1 = 0.9f;
    o->expect.given = PS_OPT_GIVEN(beta1);
    return r->status == PS_OK && r->version >= 0 && r->done_ns > 0 &&
           r->err[PS_ERR_TEXT_MAX] == 0 && st->pushes > 0 && ps_strerror(r->status) != 0;
}

/* the exchange as a binding drives it: a host backend, one tensor */
int ps_public_exchange_check(ps_client_options *o, float *w, float *g);
int ps_public_exchange_check(ps_client_options *o, float *w, float *g)
{
    ps_backend *b;
    ps_exchange *x;
    int rc = ps_backend_host_create(&b);
    if (rc == 0 && (rc = ps_exchange_open(o, b, &x)) == 0) {
        ps_exchange_set_init(x, 1);
        rc = ps_exchange_add(x, 7, 16, w, g, -1);
        ps_exchange_close(x);
    }
    ps_backend_host_destroy(b);
    ps_log_set_level(PS_LOG_WARN);
    return rc;
}
