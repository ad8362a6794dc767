/* The tokens a request carries (client_token.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_token.h"

struct psc_tokens {
    char *admin;      /* copy of opt.admin_token, or NULL */
    int n;
    uint64_t hello[]; /* per server slot: the token its hello reply gave (0: none yet) */
};

int psc_tokens_new(ps_client *c, const char *admin_token)
{
    struct psc_tokens *t = calloc(1, sizeof *t + (size_t)c->nservers * sizeof t->hello[0]);
    if (!t || (admin_token && !(t->admin = strdup(admin_token)))) {
        free(t);
        return PS_ENOMEM;
    }
    t->n = c->nservers;
    c->tokens = t;
    return 0;
}

int psc_tokens_grow(ps_client *c, int nslots)
{
    struct psc_tokens *t = c->tokens;
    if (nslots <= t->n)
        return 0;
    t = realloc(t, sizeof *t + (size_t)nslots * sizeof t->hello[0]);
    if (!t)
        return PS_ENOMEM;
    memset(t->hello + t->n, 0, (size_t)(nslots - t->n) * sizeof t->hello[0]);
    t->n = nslots;
    c->tokens = t;
    return 0;
}

void psc_tokens_free(ps_client *c)
{
    if (!c->tokens)
        return;
    free(c->tokens->admin);
    free(c->tokens);
    c->tokens = NULL;
}

void psc_tokens_fill(const ps_client *c, int server, ps_header *h)
{
    if (h->type == PS_MSG_HELLO)
        h->hello.token = c->tokens->hello[server];
    else if (h->type == PS_MSG_SHUTDOWN && c->tokens->admin)
        snprintf(h->admin, sizeof h->admin, "%s", c->tokens->admin);
}

void psc_tokens_keep(ps_client *c, int server, const ps_hello *reply)
{
    if (reply->token)
        c->tokens->hello[server] = reply->token;
}
