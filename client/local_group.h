/* Local aggregation (ps_worker --local-aggregate): the workers of one host
 * share their gradients and weights through one shared-memory segment, and
 * only the host's leader (local rank 0) talks to the servers.
 *
 * The segment (POSIX shared memory, mode 0600, named by the group, every
 * page allocated by the leader at creation: a /dev/shm too small stops every
 * worker of the group with the leader's reason, the size needed and the
 * space free) holds, for every tensor i of the model: one gradient slot per
 * local rank and one weight slot, with counters under one process-shared
 * mutex.  The name is predictable, so a worker maps only a segment of its
 * own user with mode 0600: another user's file under the name (a squatter)
 * gets nothing of the group, and stops the leader and every member at once,
 * naming its owner (a root group waits for its leader, which removes it):
 *
 *   member l > 0, step t:  ps_lgroup_post_grad   waits until the leader took
 *                          its gradient of step t-1, copies step t's into its
 *                          slot (posted[l][i] = t + 1)
 *   leader:                ps_lgroup_sum_grads   waits for every member's
 *                          step-t gradient and replaces its own g with
 *                          (((g + g_1) + g_2) + ... + g_{L-1}) / L, summed in
 *                          local-rank order (consumed[l][i] = t + 1); it
 *                          pushes that mean as the host's gradient
 *   leader:                ps_lgroup_publish     once the servers' weights
 *                          are in: copies them into the weight slot (gen[i]++)
 *   member:                ps_lgroup_take        copies the weight slot when
 *                          its gen is newer than the last one taken (waiting
 *                          for it, or not)
 *
 * So each host moves one copy of each gradient and of each weight tensor
 * over the network, and a sync round on the servers (whose --num-workers is
 * the number of hosts) sums the hosts' means in host order: the result is
 * the global rank-order mean up to the association of the float sum
 * (bitwise the same with one host; docs/PROTOCOL.md "Local aggregation").
 *
 * Liveness: every wait is a timed wait on the segment's condition variable
 * that gives up when a peer process of the group died (PS_ECLOSED, naming
 * it), when ps_lgroup_abort was called by any member (a member that fails or
 * is stopped aborts the group, so nobody waits for it), or after timeout_ms
 * without progress (PS_ETIMEDOUT).  The leader removes the segment's name as
 * soon as every member attached (and at close), so a killed group leaves no
 * name behind once it started; a stale segment of a dead leader is replaced.
 *
 * All buffers here are host memory (float32); the exchange stages device
 * memory.  One thread per process uses a group (the training thread), except
 * ps_lgroup_abort, which any thread may call (not async-signal-safe: from a
 * signal handler set a flag instead). */
#ifndef PS_LOCAL_GROUP_H
#define PS_LOCAL_GROUP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_lgroup ps_lgroup;

#define PS_LGROUP_MAX 64 /* workers per host */

/* Open group `name` (a shared-memory name: "/" and up to 200 characters of
 * [A-Za-z0-9._-]) as local rank `rank` of `size` (2..PS_LGROUP_MAX) with the
 * n tensors of counts[] (the same on every member: checked).  Rank 0 creates
 * the segment (replacing a stale one of its user); the others wait for it,
 * up to timeout_ms.  *interrupted (may be NULL) is polled by every wait:
 * non-zero makes it return PS_ECLOSED.  0 or a PS_E* code with why filled:
 * PS_EAUTH when another user holds the name, PS_ENOMEM (every rank, with the
 * leader's reason) when /dev/shm cannot hold the segment. */
int ps_lgroup_open(const char *name, int rank, int size, const size_t *counts, int n,
                   int timeout_ms, const int *interrupted, ps_lgroup **out, char *why,
                   size_t why_len);

/* Leader: wait until every member attached, then remove the name. */
int ps_lgroup_wait_members(ps_lgroup *g, char *why, size_t why_len);

int ps_lgroup_rank(const ps_lgroup *g);
int ps_lgroup_size(const ps_lgroup *g);

/* Member: put gradient src (counts[i] floats) of tensor i in its slot. */
int ps_lgroup_post_grad(ps_lgroup *g, int i, const float *src, char *why, size_t why_len);

/* Leader: wait for every member's next gradient of tensor i and make g the
 * local-rank-order sum divided by the group's size. */
int ps_lgroup_sum_grads(ps_lgroup *g, int i, float *grad, char *why, size_t why_len);

/* Leader: the weights of tensor i are now src. */
int ps_lgroup_publish(ps_lgroup *g, int i, const float *src);

/* Member: copy tensor i's weights into dst if the leader published them
 * since *seen (then *seen is their generation and *took 1); block: wait for
 * that.  0 or a PS_E* code. */
int ps_lgroup_take(ps_lgroup *g, int i, float *dst, uint64_t *seen, int block, int *took,
                   char *why, size_t why_len);

/* Leader: the final weights are published (after the final barrier).
 * Member: wait for that. */
int ps_lgroup_set_final(ps_lgroup *g);
int ps_lgroup_wait_final(ps_lgroup *g, char *why, size_t why_len);

/* Make every wait of every member of the group fail (a member stops). */
void ps_lgroup_abort(ps_lgroup *g);

/* Unmap; the leader also removes the name.  NULL is fine. */
void ps_lgroup_close(ps_lgroup *g);

#endif
