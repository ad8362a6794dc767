/* push_pull: the smallest program on libps (include/ps_client.h alone).
 *
 * Connects to the servers given as the argument or in PS_SERVERS, registers
 * one tensor of 4 floats, sets its first values w0, pushes one gradient g and
 * pulls the weights w1 back.  With plain SGD the servers apply
 * w1 = w0 - lr * g:
 *
 *   bin/ps_server --bind tcp://127.0.0.1:5555 --mode sync --num-workers 1 --lr 0.5 &
 *   build/examples/push_pull tcp://127.0.0.1:5555
 *   w0: 1 2 3 4
 *   g: 0.5 0.25 -1 2
 *   w1: 0.75 1.875 3.5 3
 *
 * Every call is checked: on an error it prints the library's message and
 * exits 1 (2 for bad usage). */
#include <stdio.h>
#include <stdlib.h>

#include "ps_client.h"

#define KEY 0
#define N 4

static int fail(const char *call, int rc, const char *text)
{
    fprintf(stderr, "push_pull: %s failed (error %d): %s\n", call, rc,
            text && *text ? text : "see the message above");
    return 1;
}

/* rc is what posting the request returned; then wait for it. */
static int finish(const char *call, const ps_client *c, int rc, ps_request *r)
{
    if (rc)
        return fail(call, rc, ps_client_last_error(c));
    rc = ps_request_wait(r);
    return rc ? fail(call, rc, r->err) : 0;
}

static void print(const char *name, const float *v)
{
    printf("%s:", name);
    for (int i = 0; i < N; i++)
        printf(" %g", (double)v[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *servers = argc == 2 ? argv[1] : getenv("PS_SERVERS");
    if (argc > 2 || !servers || !*servers) {
        fprintf(stderr, "usage: push_pull tcp://HOST:PORT[,...]  (or set PS_SERVERS)\n");
        return 2;
    }
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = servers;
    o.mode = PS_MODE_SYNC;     /* the servers must run --mode sync --num-workers 1 */
    o.hello_timeout_ms = 3000; /* give up on a server that does not answer */

    ps_client *c;
    int rc = ps_client_open(&o, &c);
    if (rc)
        return fail("ps_client_open", rc, NULL);
    float w[N] = {1, 2, 3, 4}, g[N] = {0.5f, 0.25f, -1, 2}, w1[N] = {0};
    ps_request r;
    if ((rc = ps_client_register(c, KEY, N)))
        rc = fail("ps_client_register", rc, ps_client_last_error(c));
    else if ((rc = ps_client_start(c)))
        rc = fail("ps_client_start", rc, ps_client_last_error(c));
    else if (!(rc = finish("ps_client_init", c, ps_client_init(c, KEY, w, &r), &r)) &&
             !(rc = finish("ps_client_push", c, ps_client_push(c, KEY, g, 0, &r), &r)) &&
             !(rc = finish("ps_client_pull", c, ps_client_pull(c, KEY, w1, 1, &r), &r))) {
        print("w0", w);
        print("g", g);
        print("w1", w1);
    }
    ps_client_close(c);
    return rc;
}
