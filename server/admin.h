/* Who may stop a server with a SHUTDOWN message (docs/SECURITY.md "Who may
 * stop a server").
 *
 * By default nobody: SIGTERM and SIGINT stop a server (ps_launch sends
 * SIGTERM), and a SHUTDOWN message is refused with PS_EAUTH, whoever sends
 * it.  A remote shutdown is allowed only when the operator started the server
 * to allow it, each way sufficient on its own:
 *  - --admin-token-file FILE: a shared secret, read at start from a file only
 *    its owner may read (never a command-line argument, which `ps` shows),
 *    that the SHUTDOWN request carries in `adm`; compared in constant time;
 *  - with --curve-keys DIR: a peer that connected with a key of DIR/admin
 *    (the ZAP handler gives it the user id "admin/NAME", common/ps_curve.h).
 * No sockets here: the I/O thread asks, answers and logs. */
#ifndef PS_ADMIN_H
#define PS_ADMIN_H

#include <stddef.h>

#include "ps_proto.h"

typedef struct ps_admin ps_admin;

/* token_file: NULL, or the file holding the token: a regular file that
 * neither group nor others may read or write, whose first line (trailing
 * whitespace cut) is 16..PS_ADMIN_TOKEN_MAX printable characters without
 * spaces.  curve: the server uses --curve-keys (admin keys count).
 * Errors: PS_EINVAL (why names the file and what is wrong with it),
 * PS_ENOMEM. */
int ps_admin_open(const char *token_file, int curve, ps_admin **out, char *why, size_t why_len);

/* Wipe the token, free.  NULL is fine. */
void ps_admin_close(ps_admin *a);

/* May this SHUTDOWN request stop the server?  user_id: the CURVE user id of
 * the peer (zmq_msg_gets "User-Id" of a frame it sent), or NULL.  0: yes.
 * PS_EAUTH: no, and why says why and what would be allowed, in words for
 * the requester (it never reveals anything of the token). */
int ps_admin_check(const ps_admin *a, const ps_header *h, const char *user_id, char *why,
                   size_t why_len);

/* "signals only", "signals, or a shutdown message with the token of FILE",
 * ...: for the start-up log line. */
const char *ps_admin_describe(const ps_admin *a);

#endif
