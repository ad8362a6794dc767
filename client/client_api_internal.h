/* What the public API's files share (the contract is include/ps_client.h):
 *   client.c        options, open, posting requests, the blocking helpers,
 *                   close
 *   client_start.c  registering tensors and starting (placement, hellos,
 *                   tables declared)
 * Only these two include it; all of it runs on the training thread. */
#ifndef PS_CLIENT_API_INTERNAL_H
#define PS_CLIENT_API_INTERNAL_H

#include <stdint.h>

#include "client_internal.h"

/* client.c */
/* c->last_error, formatted. */
void psc_set_last_error(ps_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The index of table `key` in c->tables, or -1. */
long psc_find_table(const ps_client *c, uint64_t key);
/* Post a control message of `type` to one server. */
int psc_post_ctl(ps_client *c, uint32_t type, int server, int64_t step, void *out,
                 ps_request *req);
/* Give up on req with `code` and wait until the comm thread let go of it. */
void psc_cancel(ps_client *c, ps_request *req, int code);

#endif
