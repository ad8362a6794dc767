/* libps: what a request proves (client_token.c).  The hello tokens are
 * the comm thread's; the admin token is set by open, read-only after. */
#ifndef PS_CLIENT_TOKEN_H
#define PS_CLIENT_TOKEN_H

#include "client_internal.h"

/* Open (c->nservers set): keep a copy of admin_token (NULL: none).  0 or
 * PS_ENOMEM. */
int psc_tokens_new(ps_client *c, const char *admin_token);
void psc_tokens_free(ps_client *c);
/* Room for nslots server slots (client_moved.h), comm thread: 0 or PS_ENOMEM. */
int psc_tokens_grow(ps_client *c, int nslots);
/* Put into h, a request to `server`, the token it needs: a hello the token
 * that server's last hello reply gave this worker (so it knows a hello again
 * comes from the same worker, not from another process taking its rank); a
 * shutdown the admin token of the options. */
void psc_tokens_fill(const ps_client *c, int server, ps_header *h);
/* A hello reply from `server`: keep the token it gives for later hellos. */
void psc_tokens_keep(ps_client *c, int server, const ps_hello *reply);

#endif
