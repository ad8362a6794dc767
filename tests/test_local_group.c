/* Local aggregation's shared segment (client/local_group.h) driven through
 * its API alone: no servers, no exchange.  The host's workers are threads of
 * this process, each with its own ps_lgroup on the one segment; where a peer
 * must die (a process that is gone, not one that stopped cleanly) it is a
 * forked child that opens the group and _exits without closing it.
 *
 * Checked: the leader's gradient is the local-rank-order mean bitwise and the
 * members take exactly what it publishes; a member posts its next gradient
 * only once the leader took the last; a blocking take waits for weights newer
 * than the last taken; a dead member, an abort or the interrupt flag stops
 * every wait of the group with a message naming why; waits give up after the
 * timeout (the final one excepted); bad values are refused; a dead leader's
 * segment is replaced and the name is removed once everyone attached.  Every
 * wait is bounded by the group's timeout. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "local_group.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_time.h"

#define WAIT_MS 5000 /* the groups' timeout: bounds every wait that must end */
#define MAXN 8       /* floats per tensor in these cases */

/* A group name of this test program: "/ps_test_lg_PID_TAG". */
static const char *group_name(const char *tag)
{
    static char name[8][64];
    static int k;
    char *s = name[k++ % 8];
    snprintf(s, 64, "/ps_test_lg_%d_%s", (int)getpid(), tag);
    return s;
}

static int64_t ms_since(int64_t t0_ns) { return (ps_now_ns() - t0_ns) / 1000000; }

/* 1 when the group's segment still has its name. */
static int name_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* ---------------------------------------------------------------- members
 * A member thread: opens the group as `rank`, then does `script` steps, each
 * a post of its gradient of tensor 0 or a take of its weights, recording
 * every return code, message and what it took. */

enum { OP_POST, OP_TAKE, OP_LOOK, OP_FINAL, OP_ABORT };

typedef struct member {
    const char *name;
    int rank, size, n, timeout_ms;
    const size_t *counts;
    const int *interrupted;
    int ops[8], nops;
    float grad[2][MAXN];     /* what OP_POST posts: [0] first, then [1] */
    /* results */
    int open_rc;
    int rc[8];
    int64_t done_ms[8];      /* when each op returned, ms after t0 */
    int took[8];
    uint64_t seen;
    float got[8][MAXN];      /* what each take copied */
    char why[8][400];
    int64_t t0;
    pthread_t th;
} member;

static void *member_main(void *arg)
{
    member *m = arg;
    ps_lgroup *g = NULL;
    char why[400];
    m->open_rc = ps_lgroup_open(m->name, m->rank, m->size, m->counts, m->n, m->timeout_ms,
                                m->interrupted, &g, why, sizeof why);
    if (m->open_rc) {
        snprintf(m->why[0], sizeof m->why[0], "%s", why);
        return NULL;
    }
    int posts = 0;
    for (int k = 0; k < m->nops; k++) {
        switch (m->ops[k]) {
        case OP_POST:
            m->rc[k] = ps_lgroup_post_grad(g, 0, m->grad[posts++ % 2], m->why[k], sizeof m->why[k]);
            break;
        case OP_TAKE:
        case OP_LOOK:
            m->rc[k] = ps_lgroup_take(g, 0, m->got[k], &m->seen, m->ops[k] == OP_TAKE,
                                      &m->took[k], m->why[k], sizeof m->why[k]);
            break;
        case OP_FINAL:
            m->rc[k] = ps_lgroup_wait_final(g, m->why[k], sizeof m->why[k]);
            break;
        case OP_ABORT:
            ps_lgroup_abort(g);
            m->rc[k] = 0;
            break;
        }
        m->done_ms[k] = ms_since(m->t0);
        if (m->rc[k])
            break;
    }
    ps_lgroup_close(g);
    return NULL;
}

static void member_start(member *m, const char *name, int rank, int size, const size_t *counts,
                         int n, const int *ops, int nops)
{
    memset(m, 0, sizeof *m);
    m->name = name;
    m->rank = rank;
    m->size = size;
    m->counts = counts;
    m->n = n;
    m->timeout_ms = WAIT_MS;
    memcpy(m->ops, ops, (size_t)nops * sizeof *ops);
    m->nops = nops;
    for (int i = 0; i < MAXN; i++) {
        m->grad[0][i] = (float)(rank * 10 + i);
        m->grad[1][i] = (float)(rank * 100 + i);
    }
    m->t0 = ps_now_ns();
}

static int member_run(member *m)
{
    return pthread_create(&m->th, NULL, member_main, m);
}

/* ---------------------------------------------------------------- cases */

PS_TEST(the_leader_gets_the_local_rank_order_mean_bitwise_and_members_take_what_it_publishes)
{
    enum { L = 3 };
    const size_t counts[2] = {4, 3};
    const char *name = group_name("mean");
    /* values whose float sum depends on the order it is taken in */
    static const float g[L][4] = {{1e8f, 1.0f, 3.0f, 0.1f},
                                  {-1e8f, 1e8f, 1e-8f, 0.2f},
                                  {1.0f, -1e8f, -3.0f, 0.3f}};
    float want[4], other[4];
    int order_matters = 0;
    for (int i = 0; i < 4; i++) {
        want[i] = ((g[0][i] + g[1][i]) + g[2][i]) / (float)L;
        other[i] = ((g[2][i] + g[1][i]) + g[0][i]) / (float)L;
        order_matters |= memcmp(&want[i], &other[i], sizeof(float)) != 0;
    }
    CHECK_MSG(order_matters, "the test's gradients do not depend on the summation order");
    char why[400];
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, L, counts, 2, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    CHECK_EQ_INT(ps_lgroup_rank(lead), 0);
    CHECK_EQ_INT(ps_lgroup_size(lead), L);
    member m[L];
    static const int ops[] = {OP_POST, OP_TAKE, OP_LOOK};
    int started = 0;
    for (int r = 1; r < L; r++) {
        member_start(&m[r], name, r, L, counts, 2, ops, 3);
        memcpy(m[r].grad[0], g[r], sizeof g[r]);
        started += member_run(&m[r]) == 0;
    }
    int rc_wait = ps_lgroup_wait_members(lead, why, sizeof why);
    int named = name_exists(name);
    float mean[4];
    memcpy(mean, g[0], sizeof mean);
    int rc_sum = ps_lgroup_sum_grads(lead, 0, mean, why, sizeof why);
    const float w[4] = {0.5f, -2.0f, 1e30f, 7.0f};
    int rc_pub = ps_lgroup_publish(lead, 0, w);
    for (int r = 1; r <= started; r++)
        pthread_join(m[r].th, NULL);
    ps_lgroup_close(lead);
    CHECK_EQ_INT(started, L - 1);
    CHECK_MSG(rc_wait == 0, "wait_members: %s", why);
    CHECK_MSG(!named, "the name %s is still there once every member attached", name);
    CHECK_MSG(rc_sum == 0, "sum: %s", why);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(memcmp(&mean[i], &want[i], sizeof(float)) == 0,
                  "element %d: %.9g, the rank-order mean is %.9g", i, (double)mean[i],
                  (double)want[i]);
    CHECK_OK(rc_pub);
    for (int r = 1; r < L; r++) {
        CHECK_MSG(m[r].open_rc == 0, "member %d: %s", r, m[r].why[0]);
        CHECK_MSG(m[r].rc[0] == 0 && m[r].rc[1] == 0 && m[r].rc[2] == 0, "member %d: %s%s%s", r,
                  m[r].why[0], m[r].why[1], m[r].why[2]);
        CHECK_EQ_INT(m[r].took[1], 1);
        CHECK(memcmp(m[r].got[1], w, sizeof w) == 0);
        CHECK_EQ_INT(m[r].seen, 1);
        /* nothing newer was published: a look takes nothing */
        CHECK_EQ_INT(m[r].took[2], 0);
    }
}

PS_TEST(a_member_posts_its_next_gradient_only_once_the_leader_took_the_last)
{
    const size_t counts[1] = {2};
    const char *name = group_name("slot");
    char why[400];
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, 2, counts, 1, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    member m;
    static const int ops[] = {OP_POST, OP_POST};
    member_start(&m, name, 1, 2, counts, 1, ops, 2);
    int started = member_run(&m) == 0;
    int rc_wait = ps_lgroup_wait_members(lead, why, sizeof why);
    /* the member's second post must wait for this first sum */
    ps_test_sleep_ms(300);
    int64_t sum_ms = ms_since(m.t0);
    float s0[2] = {1.0f, 2.0f}, s1[2] = {1.0f, 2.0f};
    int rc0 = ps_lgroup_sum_grads(lead, 0, s0, why, sizeof why);
    int rc1 = rc0 ? rc0 : ps_lgroup_sum_grads(lead, 0, s1, why, sizeof why);
    if (started)
        pthread_join(m.th, NULL);
    ps_lgroup_close(lead);
    CHECK(started);
    CHECK_MSG(rc_wait == 0 && rc0 == 0 && rc1 == 0, "leader: %s", why);
    CHECK_MSG(m.open_rc == 0 && m.rc[0] == 0 && m.rc[1] == 0, "member: %s%s", m.why[0],
              m.why[1]);
    CHECK_MSG(m.done_ms[1] >= sum_ms, "the second post returned after %lld ms, before the "
              "leader took the first gradient (%lld ms)", (long long)m.done_ms[1],
              (long long)sum_ms);
    /* each sum saw its own step's gradient: the slot was not overwritten */
    CHECK(s0[0] == (1.0f + m.grad[0][0]) / 2.0f && s0[1] == (2.0f + m.grad[0][1]) / 2.0f);
    CHECK(s1[0] == (1.0f + m.grad[1][0]) / 2.0f && s1[1] == (2.0f + m.grad[1][1]) / 2.0f);
}

PS_TEST(a_blocking_take_waits_for_weights_newer_than_the_last_taken)
{
    const size_t counts[1] = {3};
    const char *name = group_name("take");
    char why[400];
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, 2, counts, 1, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    const float w1[3] = {1, 2, 3}, w2[3] = {4, 5, 6}, w3[3] = {7, 8, 9};
    ps_lgroup_publish(lead, 0, w1);
    member m;
    static const int ops[] = {OP_TAKE, OP_TAKE, OP_LOOK};
    member_start(&m, name, 1, 2, counts, 1, ops, 3);
    int started = member_run(&m) == 0;
    int rc_wait = ps_lgroup_wait_members(lead, why, sizeof why);
    ps_test_sleep_ms(300);
    int64_t pub_ms = ms_since(m.t0);
    ps_lgroup_publish(lead, 0, w2);
    ps_lgroup_publish(lead, 0, w3); /* the member may take either: both are newer */
    if (started)
        pthread_join(m.th, NULL);
    ps_lgroup_close(lead);
    CHECK(started);
    CHECK_MSG(rc_wait == 0, "leader: %s", why);
    CHECK_MSG(m.open_rc == 0 && !m.rc[0] && !m.rc[1] && !m.rc[2], "member: %s%s%s", m.why[0],
              m.why[1], m.why[2]);
    /* the first take finds generation 1 at once */
    CHECK(m.took[0] == 1 && memcmp(m.got[0], w1, sizeof w1) == 0);
    /* the second waits for the leader's next publication */
    CHECK_MSG(m.done_ms[1] >= pub_ms, "the second take returned after %lld ms, before the "
              "leader published again (%lld ms)", (long long)m.done_ms[1], (long long)pub_ms);
    CHECK(m.took[1] == 1);
    CHECK(memcmp(m.got[1], w2, sizeof w2) == 0 || memcmp(m.got[1], w3, sizeof w3) == 0);
    /* the look never takes a generation twice or an older one: nothing when
     * the wait already had generation 3; generation 3 or nothing otherwise
     * (the look may come between the leader's two publications) */
    int had_3 = memcmp(m.got[1], w3, sizeof w3) == 0;
    CHECK_MSG(!(had_3 && m.took[2]), "the look took again after the wait had generation 3");
    if (m.took[2])
        CHECK(memcmp(m.got[2], w3, sizeof w3) == 0);
    CHECK_EQ_INT(m.seen, had_3 || m.took[2] ? 3 : 2);
}

/* A forked child that opens `name` as `rank` and _exits without closing
 * (status 0 when it had opened it): to the group, a process that died. */
static int open_and_die(const char *name, int rank, int size, const size_t *counts, int n)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        ps_lgroup *g = NULL;
        char why[400];
        int rc = ps_lgroup_open(name, rank, size, counts, n, WAIT_MS, NULL, &g, why, sizeof why);
        if (rc)
            fprintf(stderr, "child rank %d: %s\n", rank, why);
        _exit(rc ? 1 : 0);
    }
    if (pid < 0)
        return -1;
    /* reaped: kill(pid, 0) no longer finds it, as for any peer that died */
    int st = ps_test_wait((int)pid, WAIT_MS);
    return st == 0 ? (int)pid : -1;
}

PS_TEST(a_dead_member_stops_every_wait_of_the_group_naming_it)
{
    const size_t counts[1] = {2};
    const char *name = group_name("dead");
    char why[400], why_sum[400] = "", why_take[400] = "";
    ps_lgroup *lead = NULL, *live = NULL;
    int rc = ps_lgroup_open(name, 0, 3, counts, 1, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    int dead = open_and_die(name, 1, 3, counts, 1);
    /* rank 2 lives: it posts, and waits for weights once the leader gave up */
    rc = dead > 0 ? ps_lgroup_open(name, 2, 3, counts, 1, WAIT_MS, NULL, &live, why, sizeof why)
                  : -1;
    const float g2[2] = {5, 6};
    if (!rc)
        rc = ps_lgroup_post_grad(live, 0, g2, why, sizeof why);
    if (!rc)
        rc = ps_lgroup_wait_members(lead, why, sizeof why);
    int64_t t0 = ps_now_ns();
    float g[2] = {1, 2};
    int rc_sum = rc ? -1 : ps_lgroup_sum_grads(lead, 0, g, why_sum, sizeof why_sum);
    int64_t sum_ms = ms_since(t0);
    float w[2];
    uint64_t seen = 0;
    int took = 0;
    t0 = ps_now_ns();
    int rc_take = rc ? -1 : ps_lgroup_take(live, 0, w, &seen, 1, &took, why_take, sizeof why_take);
    int64_t take_ms = ms_since(t0);
    ps_lgroup_close(live);
    ps_lgroup_close(lead);
    CHECK_MSG(dead > 0, "the child could not open the group as rank 1");
    CHECK_MSG(rc == 0, "%s", why);
    /* the leader's wait for rank 1's gradient ends, naming it */
    CHECK_EQ_INT(rc_sum, PS_ECLOSED);
    char want[160];
    snprintf(want, sizeof want, "local worker 1 (pid %d) of this host died", dead);
    CHECK_MSG(strstr(why_sum, want), "leader said: %s", why_sum);
    CHECK_MSG(sum_ms < WAIT_MS / 2, "the leader noticed the death after %lld ms",
              (long long)sum_ms);
    CHECK(g[0] == 1 && g[1] == 2); /* nothing summed */
    /* and every later wait of the group ends at once */
    CHECK_EQ_INT(rc_take, PS_ECLOSED);
    CHECK_EQ_INT(took, 0);
    CHECK_MSG(strstr(why_take, "another worker of this host stopped (while waiting for the "
                               "weights from the leader)"),
              "member said: %s", why_take);
    CHECK_MSG(take_ms < WAIT_MS / 2, "the member's take ended after %lld ms", (long long)take_ms);
}

/* A member SIGKILLed while it holds the group's lock (a take copies the
 * weights under it): the leader's next lock finds the holder dead, and its
 * wait names the dead worker as a scan would, even before the member's
 * parent reaps it (a zombie counts as dead).  The member copies 4 MB per
 * take in a loop, so the kill lands under the lock nearly every time. */
PS_TEST(a_member_killed_holding_the_lock_is_named_by_the_leader)
{
    enum { BIG = 1 << 20 };
    const size_t counts[1] = {BIG};
    const char *name = group_name("held");
    char why[400], why_sum[400] = "";
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, 2, counts, 1, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    float *w = calloc(BIG, sizeof *w);
    CHECK(w != NULL);
    ps_lgroup_publish(lead, 0, w);
    int ready[2];
    CHECK(pipe(ready) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        ps_lgroup *g = NULL;
        char cwhy[400];
        if (ps_lgroup_open(name, 1, 2, counts, 1, WAIT_MS, NULL, &g, cwhy, sizeof cwhy))
            _exit(1);
        int took = 0;
        for (int k = 0;; k++) {
            uint64_t seen = 0;
            ps_lgroup_take(g, 0, w, &seen, 0, &took, cwhy, sizeof cwhy);
            if (k == 0 && write(ready[1], "r", 1) != 1)
                _exit(1);
        }
    }
    CHECK(pid > 0);
    char c = 0;
    int got = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    close(ready[1]);
    ps_test_sleep_ms(100);
    kill(pid, SIGKILL);
    ps_test_sleep_ms(50); /* dead, not reaped: a zombie */
    int64_t t0 = ps_now_ns();
    int rc_sum = got ? ps_lgroup_sum_grads(lead, 0, w, why_sum, sizeof why_sum) : -1;
    int64_t sum_ms = ms_since(t0);
    int st = ps_test_wait((int)pid, WAIT_MS);
    ps_lgroup_close(lead);
    free(w);
    CHECK_MSG(got, "the child did not open the group and take");
    CHECK_EQ_INT(st, 128 + SIGKILL);
    CHECK_EQ_INT(rc_sum, PS_ECLOSED);
    char want[160];
    snprintf(want, sizeof want, "local worker 1 (pid %d) of this host died", (int)pid);
    CHECK_MSG(strstr(why_sum, want), "leader said: %s", why_sum);
    CHECK_MSG(sum_ms < WAIT_MS / 2, "the leader noticed the death after %lld ms",
              (long long)sum_ms);
}

PS_TEST(an_abort_or_the_interrupt_flag_ends_a_wait_that_has_no_timeout)
{
    const size_t counts[1] = {2};
    const char *name = group_name("abort");
    char why[400];
    int interrupted = 0;
    ps_lgroup *lead = NULL;
    /* timeout 0: only an abort, a death or the flag end the waits */
    int rc = ps_lgroup_open(name, 0, 2, counts, 1, 0, &interrupted, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    member m;
    static const int ops[] = {OP_ABORT};
    member_start(&m, name, 1, 2, counts, 1, ops, 1);
    m.timeout_ms = 0;
    int started = member_run(&m) == 0;
    if (started)
        pthread_join(m.th, NULL);
    int64_t t0 = ps_now_ns();
    float g[2] = {1, 2};
    char why_sum[400] = "";
    int rc_sum = ps_lgroup_sum_grads(lead, 0, g, why_sum, sizeof why_sum);
    int64_t abort_ms = ms_since(t0);
    ps_lgroup_close(lead);
    CHECK(started && m.open_rc == 0);
    CHECK_EQ_INT(rc_sum, PS_ECLOSED);
    CHECK_MSG(strstr(why_sum, "another worker of this host stopped (while waiting for the "
                              "gradients of the other local workers)"),
              "leader said: %s", why_sum);
    CHECK_MSG(abort_ms < 1000, "the abort ended the wait after %lld ms", (long long)abort_ms);
    CHECK(g[0] == 1 && g[1] == 2); /* nothing summed */

    /* the interrupt flag: a member waiting for a leader that never comes */
    const char *name2 = group_name("intr");
    member m2;
    static const int ops2[] = {OP_TAKE};
    member_start(&m2, name2, 1, 2, counts, 1, ops2, 1);
    m2.timeout_ms = 0;
    m2.interrupted = &interrupted;
    int started2 = member_run(&m2) == 0;
    ps_test_sleep_ms(200);
    int64_t t1 = ps_now_ns();
    __atomic_store_n(&interrupted, 1, __ATOMIC_RELEASE);
    if (started2)
        pthread_join(m2.th, NULL);
    int64_t intr_ms = ms_since(t1);
    CHECK(started2);
    CHECK_EQ_INT(m2.open_rc, PS_ECLOSED);
    CHECK_MSG(strstr(m2.why[0], "interrupted"), "member said: %s", m2.why[0]);
    CHECK_MSG(intr_ms < 1000, "the flag ended the wait after %lld ms", (long long)intr_ms);
}

PS_TEST(waits_give_up_after_the_timeout_naming_what_they_waited_for_but_the_final_one_does_not)
{
    const size_t counts[1] = {2};
    char why[400];
    /* a member with no leader */
    ps_lgroup *g = NULL;
    const char *none = group_name("noleader");
    int64_t t0 = ps_now_ns();
    int rc = ps_lgroup_open(none, 1, 2, counts, 1, 300, NULL, &g, why, sizeof why);
    int64_t open_ms = ms_since(t0);
    CHECK_EQ_INT(rc, PS_ETIMEDOUT);
    CHECK(g == NULL);
    char want[300];
    snprintf(want, sizeof want, "no leader (local rank 0) made group %s within 300 ms", none);
    CHECK_MSG(strstr(why, want), "said: %s", why);
    CHECK_MSG(open_ms >= 300 && open_ms < 3000, "gave up after %lld ms", (long long)open_ms);

    /* a leader whose member never posts */
    const char *name = group_name("slow");
    ps_lgroup *lead = NULL;
    rc = ps_lgroup_open(name, 0, 2, counts, 1, 300, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    member m;
    static const int ops[] = {OP_FINAL};
    member_start(&m, name, 1, 2, counts, 1, ops, 1);
    m.timeout_ms = 300; /* the final wait ignores it */
    int started = member_run(&m) == 0;
    int rc_wait = ps_lgroup_wait_members(lead, why, sizeof why);
    float s[2] = {1, 2};
    char why_sum[400] = "";
    t0 = ps_now_ns();
    int rc_sum = rc_wait ? -1 : ps_lgroup_sum_grads(lead, 0, s, why_sum, sizeof why_sum);
    int64_t sum_ms = ms_since(t0);
    /* the member waits for the final weights longer than its timeout */
    ps_test_sleep_ms(400);
    int64_t final_ms = ms_since(m.t0);
    ps_lgroup_set_final(lead);
    if (started)
        pthread_join(m.th, NULL);
    ps_lgroup_close(lead);
    CHECK_MSG(rc_wait == 0, "leader: %s", why);
    CHECK_EQ_INT(rc_sum, PS_ETIMEDOUT);
    CHECK_MSG(strstr(why_sum, "waited 300 ms for the gradients of the other local workers"),
              "leader said: %s", why_sum);
    CHECK_MSG(sum_ms >= 300 && sum_ms < 3000, "gave up after %lld ms", (long long)sum_ms);
    CHECK(started);
    CHECK_MSG(m.open_rc == 0 && m.rc[0] == 0, "member: %s", m.why[0]);
    CHECK_MSG(m.done_ms[0] >= final_ms, "the final wait returned after %lld ms, before the "
              "leader set it (%lld ms)", (long long)m.done_ms[0], (long long)final_ms);
}

PS_TEST(bad_names_sizes_and_other_models_are_refused_with_a_message)
{
    const size_t counts[2] = {2, 3}, other[2] = {2, 4};
    char why[400];
    ps_lgroup *g = NULL;
    CHECK_EQ_INT(ps_lgroup_open("no-slash", 0, 2, counts, 2, 100, NULL, &g, why, sizeof why),
                 PS_EINVAL);
    CHECK(g == NULL);
    CHECK_MSG(strstr(why, "got 'no-slash'"), "said: %s", why);
    CHECK_EQ_INT(ps_lgroup_open("/a b", 0, 2, counts, 2, 100, NULL, &g, why, sizeof why),
                 PS_EINVAL);
    CHECK_EQ_INT(ps_lgroup_open(group_name("x"), 0, 1, counts, 2, 100, NULL, &g, why,
                                sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "local rank 0 of 1"), "said: %s", why);
    CHECK_EQ_INT(ps_lgroup_open(group_name("x"), 2, 2, counts, 2, 100, NULL, &g, why,
                                sizeof why), PS_EINVAL);
    CHECK_EQ_INT(ps_lgroup_open(group_name("x"), 0, PS_LGROUP_MAX + 1, counts, 2, 100, NULL, &g,
                                why, sizeof why), PS_EINVAL);
    CHECK_EQ_INT(ps_lgroup_open(group_name("x"), 0, 2, counts, 0, 100, NULL, &g, why,
                                sizeof why), PS_EINVAL);
    /* a member with another model */
    const char *name = group_name("model");
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, 2, counts, 2, WAIT_MS, NULL, &lead, why, sizeof why);
    CHECK_MSG(rc == 0, "leader: %s", why);
    char why_m[400] = "";
    int rc_m = ps_lgroup_open(name, 1, 2, other, 2, WAIT_MS, NULL, &g, why_m, sizeof why_m);
    ps_lgroup_close(lead);
    CHECK_EQ_INT(rc_m, PS_EMISMATCH);
    CHECK(g == NULL);
    CHECK_MSG(strstr(why_m, "has 2 local workers and model fingerprint") &&
                  strstr(why_m, "give every worker of the host the same --local-size and model"),
              "said: %s", why_m);
    CHECK_MSG(!name_exists(name), "the leader's close left %s behind", name);
}

PS_TEST(a_dead_leaders_segment_is_replaced_by_the_next_leader)
{
    const size_t counts[1] = {2};
    const char *name = group_name("stale");
    /* a leader that made the segment and died: its name stays */
    int dead = open_and_die(name, 0, 2, counts, 1);
    CHECK_MSG(dead > 0, "the child could not make the group");
    CHECK_MSG(name_exists(name), "no segment %s after the first leader", name);
    /* a member waits through the dead leader's segment for the new one */
    member m;
    static const int ops[] = {OP_POST};
    member_start(&m, name, 1, 2, counts, 1, ops, 1);
    int started = member_run(&m) == 0;
    ps_test_sleep_ms(200);
    char why[400];
    ps_lgroup *lead = NULL;
    int rc = ps_lgroup_open(name, 0, 2, counts, 1, WAIT_MS, NULL, &lead, why, sizeof why);
    int rc_wait = rc ? rc : ps_lgroup_wait_members(lead, why, sizeof why);
    float g[2] = {1, 2};
    int rc_sum = rc_wait ? rc_wait : ps_lgroup_sum_grads(lead, 0, g, why, sizeof why);
    if (started)
        pthread_join(m.th, NULL);
    int named = name_exists(name);
    ps_lgroup_close(lead);
    CHECK(started);
    CHECK_MSG(rc == 0 && rc_wait == 0 && rc_sum == 0, "new leader: %s", why);
    CHECK_MSG(m.open_rc == 0 && m.rc[0] == 0, "member: %s", m.why[0]);
    CHECK(g[0] == (1.0f + m.grad[0][0]) / 2.0f && g[1] == (2.0f + m.grad[0][1]) / 2.0f);
    CHECK_MSG(!named, "the name %s is still there once every member attached", name);
}
