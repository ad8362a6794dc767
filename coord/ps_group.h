/* A shard group's configuration, as etcd keeps it (docs/DESIGN.md
 * "Replicas and failover").
 *
 * Shard group g is what server rank g holds: its chunks and table
 * partitions.  With --replicas R it has R + 1 member slots, each a
 * ps_server process of rank g at its own endpoint; slot 0 starts as the
 * primary.  The configuration says which members hold the group's state now
 * (each by slot and incarnation: the etcd lease of the process that claimed
 * the slot, so a restarted process is never mistaken for the one it
 * replaces), which of them is the primary, and an epoch that every change
 * of primary or members raises.
 *
 * Key:   /ps/<job>/group/<g>
 * Value: {"epoch":E,"primary":P,"members":[{"slot":S,"inc":"I"},...]}
 * (inc "0": the slot was given at start and its process has not claimed it
 * yet).  Members' presence: /ps/<job>/member/<g>/<slot>, attached to the
 * process's lease, {"endpoint":..., "inc":..., "pid":...}.
 *
 * Every change is a compare-and-swap on the key's mod revision
 * (ps_group_cas), so of two servers that decide at once (a primary that
 * drops a silent replica, the replica that promotes itself) exactly one
 * succeeds and the other reads what the winner wrote. */
#ifndef PS_GROUP_H
#define PS_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "ps_etcd.h"

#define PS_GROUP_MAX_MEMBERS 3 /* --replicas 2 */

typedef struct ps_group_member {
    int slot;
    uint64_t inc; /* 0: not claimed yet */
} ps_group_member;

typedef struct ps_group_cfg {
    uint64_t epoch;
    int primary; /* a slot of members[] */
    int n;
    ps_group_member m[PS_GROUP_MAX_MEMBERS];
    int64_t rev; /* the etcd mod revision it was read or written at (0: none) */
} ps_group_cfg;

/* "/ps/<job>/group/<g>" and "/ps/<job>/member/<g>/<slot>" into out. */
void ps_group_key(const char *job, int g, char *out, size_t cap);
void ps_group_member_key(const char *job, int g, int slot, char *out, size_t cap);

/* The JSON above (caller frees), or NULL when out of memory. */
char *ps_group_encode(const ps_group_cfg *c);
/* Parse and check (epoch >= 1, 1..PS_GROUP_MAX_MEMBERS distinct slots in
 * [0, slots), the primary among them).  PS_EDATA naming what is wrong. */
int ps_group_decode(const char *json, int slots, ps_group_cfg *c, char *why, size_t why_len);

/* members[] index of slot, or -1. */
int ps_group_find(const ps_group_cfg *c, int slot);
/* Remove slot from members (the primary cannot be removed this way). */
void ps_group_remove(ps_group_cfg *c, int slot);

/* The group's configuration from etcd into *c (c->rev its revision).
 * PS_ENOTFOUND: none yet. */
int ps_group_load(ps_etcd *e, const char *job, int g, int slots, ps_group_cfg *c, char *why,
                  size_t why_len);

/* Write *next if the key is still at revision expect_rev (0: absent).  0:
 * written, next->rev its revision.  PS_ESTALE: another change came first;
 * *now (may be NULL) is the configuration as it is (now->rev 0 and n 0
 * when there is none). */
int ps_group_cas(ps_etcd *e, const char *job, int g, int slots, int64_t expect_rev,
                 ps_group_cfg *next, ps_group_cfg *now, char *why, size_t why_len);

/* "epoch 4, primary 1, members 1 (inc 7f..), 2 (unclaimed)" into out. */
void ps_group_describe(const ps_group_cfg *c, char *out, size_t cap);

#endif
