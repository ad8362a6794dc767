/* The tokens a request carries (client_internal.h "client_token.c"). */
#include <stdio.h>

#include "client_internal.h"

void psc_tokens_fill(const ps_client *c, int server, ps_header *h)
{
    if (h->type == PS_MSG_HELLO)
        h->hello.token = c->hello_tokens[server];
    else if (h->type == PS_MSG_SHUTDOWN && c->admin_token)
        snprintf(h->admin, sizeof h->admin, "%s", c->admin_token);
}

void psc_tokens_keep(ps_client *c, int server, const ps_hello *reply)
{
    if (reply->token)
        c->hello_tokens[server] = reply->token;
}
