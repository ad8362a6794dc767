/* The agent between a replicated server's I/O thread and etcd: a thread of
 * its own, so that the I/O thread never waits on HTTP.  It keeps this
 * process's lease alive and runs what the I/O thread asks of the group's
 * configuration (a read, a compare-and-swap), one at a time, in order;
 * each answer is a result the I/O thread takes when the agent's eventfd is
 * readable.  A lease that expires (etcd unreachable for its TTL) is a
 * result too: the server then stops (server/repl.c).
 *
 * Ownership: the agent owns the ps_etcd it is given, and revokes the lease
 * when stopped. */
#ifndef PS_REPL_COORD_H
#define PS_REPL_COORD_H

#include <stdint.h>

#include "ps_etcd.h"
#include "ps_group.h"

typedef struct ps_repl_coord ps_repl_coord;

enum { PS_RC_LOAD = 1, PS_RC_CAS = 2, PS_RC_LEASE_LOST = 3 };

typedef struct ps_repl_coord_result {
    int kind;         /* PS_RC_* */
    uint64_t tag;     /* the request's */
    int rc;           /* 0; CAS: PS_ESTALE (cfg is what etcd holds now); PS_EIO ... */
    ps_group_cfg cfg; /* LOAD: read; CAS: written (rc 0) or what is there (PS_ESTALE) */
    int64_t took_ns;  /* how long etcd took */
    char why[256];
} ps_repl_coord_result;

/* Start the agent on e (taken) for group g of job (slots members), lease
 * `lease` of ttl_s seconds kept alive every ttl_s / 3.  PS_ENOMEM, PS_EIO. */
int ps_repl_coord_start(ps_etcd *e, const char *job, int g, int slots, int64_t lease, int ttl_s,
                        ps_repl_coord **out);
/* Stop the thread, revoke the lease (what is attached to it goes), close.
 * NULL is fine. */
void ps_repl_coord_stop(ps_repl_coord *c);
/* Readable when a result waits. */
int ps_repl_coord_fd(const ps_repl_coord *c);
/* Ask: read the configuration / write next if it is still at expect_rev. */
void ps_repl_coord_load(ps_repl_coord *c, uint64_t tag);
void ps_repl_coord_cas(ps_repl_coord *c, int64_t expect_rev, const ps_group_cfg *next,
                       uint64_t tag);
/* Take the oldest result: 1, or 0 when none waits. */
int ps_repl_coord_take(ps_repl_coord *c, ps_repl_coord_result *out);
/* Requests not answered yet. */
int ps_repl_coord_busy(const ps_repl_coord *c);

#endif
