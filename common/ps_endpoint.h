/* ZeroMQ endpoints as users type them: checked before ZeroMQ sees them, so a
 * mistake gets a message that shows the expected form instead of ZeroMQ's
 * "Invalid argument" or "No such device". */
#ifndef PS_ENDPOINT_H
#define PS_ENDPOINT_H

#include <stddef.h>

#include "ps_limits.h" /* PS_ENDPOINT_MAX */

/* Check `ep` and write the form to hand to ZeroMQ into out (cap bytes).
 * Accepted: tcp://HOST:PORT (HOST a name, an IPv4 address or [IPv6]; for a
 * bind also * or an interface address), ipc://PATH, inproc://NAME.
 * bind = 1: a tcp HOST that is a name is resolved to its address (ZeroMQ
 * binds only to addresses and interface names; a port of 0 or * picks a
 * free one); bind = 0: names are left for ZeroMQ to resolve at connect.
 * PS_EINVAL with the reason and the expected form in why ("'127.0.0.1:5555'
 * is not an endpoint: write tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555"). */
int ps_endpoint_check(const char *ep, int bind, char *out, size_t cap, char *why,
                      size_t why_len);

#endif
