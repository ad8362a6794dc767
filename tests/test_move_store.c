/* Objects moved between servers, the store half (server/move_records.h,
 * ps_shard_remove_chunk, ps_shard_move_in, ps_tparts_remove): no sockets,
 * no threads.  A moved object goes on exactly as if it had stayed: each
 * case runs the moved one and an unmoved copy through the same requests and
 * compares them bit for bit; and what waited on a moved object is handed to
 * the hooks, its memory is given back, and a load never overwrites. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "ckpt_coord.h"
#include "move_records.h"
#include "optimizer.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "server.h"
#include "shard.h"
#include "table_part.h"

enum { W = 2, N = 5 };

static ps_opt_config adam(void)
{
    ps_opt_config o;
    ps_opt_default(&o);
    o.kind = PS_OPT_ADAM;
    o.lr = 0.01f;
    o.given = PS_OPT_GIVEN_ALL;
    return o;
}

static ps_shard_config shard_cfg(int mode, int staleness, _Atomic uint64_t *mem)
{
    ps_shard_config sc = {mode, staleness, W, adam(), 1 << 24, mem, 1};
    return sc;
}

/* A push of rank r at step to (key, 0) of s, gradient g: applied or kept
 * (released through the hooks), never refused. */
static int push(ps_shard *s, uint64_t key, int r, int64_t step, const float *g)
{
    int kept, dup;
    int64_t v;
    char why[256];
    int rc = ps_shard_push(s, key, 0, r, step, g, N, (void *)1, &kept, &dup, &v, why,
                           sizeof why);
    return rc ? rc : dup ? -1 : 0;
}

/* One sync round `step` on s: rank 1 first (kept until rank 0's), values
 * depending on the step. */
static int round_of(ps_shard *s, uint64_t key, int64_t step, int ranks)
{
    float g[2][N];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++)
            g[r][i] = 0.37f * (float)(i + 1) - 0.11f * (float)step + 0.5f * (float)r;
    for (int r = ranks - 1; r >= 0; r--) {
        int rc = push(s, key, r, step, g[r]);
        if (rc)
            return rc;
    }
    return 0;
}

static ps_tparts *no_place(void *user, int home, uint32_t part, int nparts, int create, int *rc,
                           char *why, size_t why_len)
{
    (void)user, (void)home, (void)part, (void)nparts, (void)create, (void)why, (void)why_len;
    *rc = 0;
    return NULL;
}

/* The same weights, version and optimizer step count. */
static int same_chunk(ps_shard *a, ps_shard *b, uint64_t key)
{
    ps_shard_chunk_view va, vb;
    int64_t sa, sb;
    if (ps_shard_view(a, key, 0, &va, &sa) || ps_shard_view(b, key, 0, &vb, &sb))
        return 0;
    return va.n == vb.n && va.version == vb.version && sa == sb &&
           memcmp(va.w, vb.w, va.n * sizeof(float)) == 0 &&
           memcmp(va.state[0], vb.state[0], va.n * sizeof(float)) == 0 &&
           memcmp(va.state[1], vb.state[1], va.n * sizeof(float)) == 0 &&
           memcmp(va.clock, vb.clock, W * sizeof(int64_t)) == 0;
}

PS_TEST(sync_chunk_moved_at_a_round_boundary_goes_on_bitwise_as_unmoved)
{
    _Atomic uint64_t mem_a = 0, mem_b = 0, mem_r = 0;
    ps_test_hook_log la, lb, lr;
    ps_shard_hooks ha = ps_test_hook_log_hooks(&la), hb = ps_test_hook_log_hooks(&lb),
                   hr = ps_test_hook_log_hooks(&lr);
    ps_shard_config ca = shard_cfg(PS_MODE_SYNC, 0, &mem_a), cb = shard_cfg(PS_MODE_SYNC, 0, &mem_b),
                    cr = shard_cfg(PS_MODE_SYNC, 0, &mem_r);
    ps_shard *a, *b, *r;
    CHECK_OK(ps_shard_create(&ca, &ha, &a));
    CHECK_OK(ps_shard_create(&cb, &hb, &b));
    CHECK_OK(ps_shard_create(&cr, &hr, &r));
    float w0[N] = {1, -2, 3, -4, 5};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(a, 8, 0, w0, N, N, &v, NULL, why, sizeof why)); /* stays */
    uint64_t before = atomic_load(&mem_a);
    CHECK_OK(ps_shard_init(a, 7, 0, w0, N, N, &v, NULL, why, sizeof why));
    CHECK_OK(ps_shard_init(r, 7, 0, w0, N, N, &v, NULL, why, sizeof why));
    /* a loaded optimizer state: the step count must travel (adam's t) */
    float planes[2 * N] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 1, 2, 3, 4, 5};
    CHECK_OK(ps_shard_set_state(a, 7, 0, planes, 2 * N, 100, &v, why, sizeof why));
    CHECK_OK(ps_shard_set_state(r, 7, 0, planes, 2 * N, 100, &v, why, sizeof why));
    for (int64_t t = 0; t < 3; t++) {
        CHECK_OK(round_of(a, 7, t, 2));
        CHECK_OK(round_of(r, 7, t, 2));
    }
    /* rank 1 joins again at step 5: rounds 3 and 4 are rank 0's alone, so its
     * clock is past the version at the move and must travel as it is */
    ps_shard_join(a, 1, 5);
    ps_shard_join(r, 1, 5);
    CHECK_EQ_INT(ps_shard_open_rounds(a), 0); /* the quiet point */
    ps_move_obj obj = {PS_MOVE_CHUNK, 0, 7, 0};
    void *block;
    size_t len;
    CHECK_OK(ps_move_serialize(a, NULL, 0, &obj, 1, PS_MODE_SYNC, W, &block, &len, why,
                               sizeof why));
    CHECK_OK(ps_shard_remove_chunk(a, 7, 0, why, sizeof why));
    CHECK(atomic_load(&mem_a) == before); /* its charge given back */
    CHECK(ps_shard_weights(a, 7, 0, NULL, NULL) == NULL);
    CHECK(ps_shard_weights(a, 8, 0, NULL, NULL) != NULL);
    uint64_t nc, np;
    CHECK_OK(ps_move_load(b, block, len, W, 2, no_place, NULL, &nc, &np, why, sizeof why));
    CHECK(nc == 1 && np == 0);
    CHECK(same_chunk(b, r, 7));
    for (int64_t t = 3; t < 7; t++) {
        int ranks = t < 5 ? 1 : 2;
        CHECK_OK(round_of(b, 7, t, ranks));
        CHECK_OK(round_of(r, 7, t, ranks));
    }
    CHECK(same_chunk(b, r, 7));
    ps_shard_chunk_view vb;
    int64_t sb;
    CHECK_OK(ps_shard_view(b, 7, 0, &vb, &sb));
    CHECK_EQ_INT(vb.version, 7);
    /* a push beyond the open round stays refused: no fast-forward leniency */
    float g[N] = {0};
    CHECK_EQ_INT(push(b, 7, 0, 9, g), PS_ESTATE);
    CHECK_EQ_INT(ps_shard_fast_forwards(b), 0);
    free(block);
    ps_shard_destroy(a);
    ps_shard_destroy(b);
    ps_shard_destroy(r);
}

PS_TEST(async_chunk_moved_with_a_queued_ssp_pull_hands_it_to_cancel)
{
    _Atomic uint64_t mem = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = shard_cfg(PS_MODE_ASYNC, 0, &mem);
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    float w0[N] = {1, 2, 3, 4, 5}, g[N] = {1, 1, 1, 1, 1};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 3, 0, w0, N, N, &v, NULL, why, sizeof why));
    uint64_t empty = 0;
    {
        ps_shard *e;
        _Atomic uint64_t m2 = 0;
        ps_shard_config c2 = shard_cfg(PS_MODE_ASYNC, 0, &m2);
        CHECK_OK(ps_shard_create(&c2, &hk, &e));
        empty = atomic_load(&m2);
        ps_shard_destroy(e);
    }
    CHECK_OK(push(s, 3, 0, 0, g));
    /* rank 0 wants version 2 with staleness 0: rank 1 is at 0, so it waits */
    int queued;
    const float *w;
    size_t n;
    CHECK_OK(ps_shard_pull(s, 3, 0, 0, 2, (void *)7, &queued, &w, &n, &v, why, sizeof why));
    CHECK_EQ_INT(queued, 1);
    ps_move_obj obj = {PS_MOVE_CHUNK, 0, 3, 0};
    void *block;
    size_t len;
    CHECK_OK(ps_move_serialize(s, NULL, 0, &obj, 1, PS_MODE_ASYNC, W, &block, &len, why,
                               sizeof why));
    CHECK_OK(ps_shard_remove_chunk(s, 3, 0, why, sizeof why));
    CHECK_EQ_INT(log.cancelled, 1); /* the updater answers it PS_EMOVED (its hooks) */
    CHECK_EQ_INT(log.ready, 0);
    CHECK(atomic_load(&mem) == empty);
    CHECK_EQ_INT(ps_shard_remove_chunk(s, 3, 0, why, sizeof why), PS_ENOTFOUND);
    free(block);
    ps_shard_destroy(s);
    CHECK_EQ_INT(log.cancelled, 1); /* not twice */
}

PS_TEST(a_pinned_weight_buffer_outlives_its_chunks_removal)
{
    _Atomic uint64_t mem = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = shard_cfg(PS_MODE_ASYNC, -1, &mem);
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    float w0[N] = {1, 2, 3, 4, 5};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 3, 0, w0, N, N, &v, NULL, why, sizeof why));
    int queued;
    const float *w;
    size_t n;
    CHECK_OK(ps_shard_pull(s, 3, 0, 0, 0, (void *)7, &queued, &w, &n, &v, why, sizeof why));
    void *ref;
    const float *pinned = ps_shard_pin(s, 3, 0, w, &ref);
    CHECK(pinned != NULL);
    CHECK_OK(ps_shard_remove_chunk(s, 3, 0, why, sizeof why));
    CHECK(memcmp(pinned, w0, sizeof w0) == 0); /* a reply in flight still reads it (ASan) */
    ps_shard_unpin(ref);
    ps_shard_destroy(s);
}

PS_TEST(removing_chunks_keeps_every_other_chunk_found)
{
    _Atomic uint64_t mem = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = shard_cfg(PS_MODE_ASYNC, -1, &mem);
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    float w0[N] = {0};
    int64_t v;
    char why[256];
    for (uint32_t c = 0; c < 300; c++) {
        w0[0] = (float)c;
        CHECK_OK(ps_shard_init(s, 11, c, w0, N, 0, &v, NULL, why, sizeof why));
    }
    for (uint32_t c = 0; c < 300; c += 3)
        CHECK_OK(ps_shard_remove_chunk(s, 11, c, why, sizeof why));
    for (uint32_t c = 0; c < 300; c++) {
        const float *w = ps_shard_weights(s, 11, c, NULL, NULL);
        CHECK_MSG(c % 3 ? w && w[0] == (float)c : !w, "chunk %u", c);
    }
    ps_stats st;
    ps_shard_stats(s, &st);
    CHECK_EQ_INT(st.chunks, 200);
    ps_shard_destroy(s);
}

/* ---------------- table partitions ---------------- */

enum { S = 2, HOME = 1, P = 2, PART = 1, DIM = 4, KEY = 5 };

typedef struct tlog {
    int released, cancelled, ready, last_rc;
} tlog;

static void t_release(void *user, void *hold, int rc, const char *why)
{
    (void)hold, (void)why;
    tlog *l = user;
    l->released++;
    l->last_rc = rc;
}
static void t_ready(void *user, void *waiter, int64_t version)
{
    (void)waiter, (void)version;
    ((tlog *)user)->ready++;
}
static void t_cancel(void *user, void *waiter)
{
    (void)waiter;
    ((tlog *)user)->cancelled++;
}

static ps_tparts_config tcfg(int mode, _Atomic uint64_t *mem)
{
    ps_tparts_config c;
    memset(&c, 0, sizeof c);
    c.mode = mode;
    c.max_staleness = mode == PS_MODE_SYNC ? 0 : -1;
    c.num_workers = W;
    c.num_servers = S;
    c.nparts = P;
    c.part = PART;
    c.max_memory = 1 << 26;
    c.mem_used = mem;
    c.home = HOME;
    return c;
}

static ps_tparts *new_tparts(const ps_tparts_config *c, tlog *l)
{
    ps_tparts_hooks h = {l, t_release, t_ready, t_cancel, NULL, NULL};
    ps_tparts *t = NULL;
    ps_tparts_create(c, &h, &t);
    return t;
}

static int declare(ps_tparts *t, uint64_t key)
{
    ps_table_options o;
    ps_table_options_default(&o);
    o.dim = DIM;
    o.init = PS_TABLE_INIT_UNIFORM;
    o.init_scale = 0.1f;
    o.opt = adam();
    ps_table *store;
    char why[256];
    int rc = ps_tparts_make_store(ps_tparts_cfg(t), key, &o, &store, why, sizeof why);
    return rc ? rc : ps_tparts_adopt(t, key, &o, store, why, sizeof why);
}

/* ids of partition PART of server HOME */
static void ids_here(uint64_t *ids, size_t n)
{
    size_t k = 0;
    for (uint64_t id = 1; k < n; id++)
        if (ps_table_row_misplaced(KEY, &id, 1, HOME, S, PART, P) == 1)
            ids[k++] = id;
}

static int tround(ps_tparts *t, int64_t step, const uint64_t *ids, size_t n)
{
    float g[2][8 * DIM];
    char why[256];
    for (int r = 1; r >= 0; r--) {
        for (size_t i = 0; i < n * DIM; i++)
            g[r][i] = 0.03f * (float)i - 0.2f * (float)r + 0.01f * (float)step;
        int kept, dup;
        int64_t v;
        int rc = ps_tparts_push(t, KEY, r, step, 1, ids + r, n - 1, g[r], (void *)1, &kept, &dup,
                                &v, why, sizeof why);
        if (rc || dup)
            return rc ? rc : -1;
    }
    return 0;
}

static int same_rows(ps_tparts *a, ps_tparts *b, const uint64_t *ids, size_t n)
{
    float ra[8 * DIM], rb[8 * DIM];
    char why[256];
    if (ps_tparts_rows(a, KEY, 0, ids, n, ra, n * DIM, why, sizeof why) ||
        ps_tparts_rows(b, KEY, 0, ids, n, rb, n * DIM, why, sizeof why))
        return 0;
    int64_t ca, cb;
    ps_table_counts xa, xb;
    ps_tparts_table_counts(a, KEY, &xa);
    ps_tparts_table_counts(b, KEY, &xb);
    for (int r = 0; r < W; r++) {
        ps_tparts_clock(a, KEY, r, &ca, why, sizeof why);
        ps_tparts_clock(b, KEY, r, &cb, why, sizeof why);
        if (ca != cb)
            return 0;
    }
    int have;
    return memcmp(ra, rb, n * DIM * sizeof(float)) == 0 && xa.rows == xb.rows &&
           ps_tparts_min_version(a, &have) == ps_tparts_min_version(b, &have);
}

typedef struct dest {
    ps_tparts_config cfg;
    tlog *log;
    ps_tparts *made;
} dest;

static ps_tparts *make_place(void *user, int home, uint32_t part, int nparts, int create,
                             int *rc, char *why, size_t why_len)
{
    dest *d = user;
    (void)why, (void)why_len;
    *rc = 0;
    if (d->made || !create)
        return d->made;
    ps_tparts_config c = d->cfg;
    c.home = home;
    c.part = (int)part;
    c.nparts = nparts;
    d->made = new_tparts(&c, d->log);
    if (!d->made)
        *rc = PS_ENOMEM;
    return d->made;
}

PS_TEST(partition_moved_keeps_its_rows_state_version_and_clocks_and_goes_on_bitwise)
{
    _Atomic uint64_t mem_a = 0, mem_b = 0, mem_r = 0;
    tlog la = {0}, lb = {0}, lr = {0};
    ps_tparts_config ca = tcfg(PS_MODE_SYNC, &mem_a), cr = tcfg(PS_MODE_SYNC, &mem_r);
    ps_tparts *a = new_tparts(&ca, &la), *r = new_tparts(&cr, &lr);
    CHECK(a && r);
    CHECK_OK(declare(a, KEY + 1)); /* stays */
    uint64_t before = atomic_load(&mem_a);
    CHECK_OK(declare(a, KEY));
    CHECK_OK(declare(r, KEY));
    uint64_t ids[6];
    ids_here(ids, 6);
    /* a HYPER of the table before the move: its rate goes with the partition */
    ps_opt_config faster = adam();
    faster.lr = 0.2f;
    CHECK_OK(ps_tparts_set_opt(a, KEY, 1, &faster));
    CHECK_OK(ps_tparts_set_opt(r, KEY, 1, &faster));
    for (int64_t t = 0; t < 3; t++) {
        CHECK_OK(tround(a, t, ids, 5));
        CHECK_OK(tround(r, t, ids, 5));
    }
    CHECK(la.released == 3 && lr.released == 3); /* rank 1's were kept for rank 0's */
    ps_move_obj obj = {PS_MOVE_PART, PART, KEY, HOME};
    void *block;
    size_t len;
    char why[256];
    _Atomic uint64_t mem_s = 0;
    ps_test_hook_log sl;
    ps_shard_hooks sh = ps_test_hook_log_hooks(&sl);
    ps_shard_config sc = shard_cfg(PS_MODE_SYNC, 0, &mem_s);
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &sh, &s));
    CHECK_OK(ps_move_serialize(s, &a, 1, &obj, 1, PS_MODE_SYNC, W, &block, &len, why,
                               sizeof why));
    CHECK_OK(ps_tparts_remove(a, KEY, PS_EMOVED, "moved", why, sizeof why));
    CHECK(atomic_load(&mem_a) == before); /* its store's charge given back */
    CHECK(ps_tparts_decl(a, KEY) == NULL && ps_tparts_decl(a, KEY + 1) != NULL);
    dest d = {tcfg(PS_MODE_SYNC, &mem_b), &lb, NULL};
    d.cfg.home = 0; /* the destination's own identity: another server */
    d.cfg.part = 0;
    uint64_t nc, np;
    CHECK_OK(ps_move_load(s, block, len, W, 2, make_place, &d, &nc, &np, why, sizeof why));
    CHECK(nc == 0 && np == 1 && d.made);
    ps_tparts *b = d.made;
    CHECK_EQ_INT(ps_tparts_cfg(b)->home, HOME);
    CHECK_EQ_INT(ps_tparts_cfg(b)->part, PART);
    CHECK_EQ_INT(ps_tparts_cfg(b)->nparts, P);
    CHECK(same_rows(b, r, ids, 6));
    for (int64_t t = 3; t < 6; t++) {
        CHECK_OK(tround(b, t, ids, 6));
        CHECK_OK(tround(r, t, ids, 6));
    }
    CHECK(same_rows(b, r, ids, 6));
    int have;
    CHECK(ps_tparts_min_version(b, &have) == 6);
    /* no restore leniency: a push beyond the open round is refused */
    int kept, dup;
    int64_t v;
    float g[DIM] = {0};
    CHECK_EQ_INT(ps_tparts_push(b, KEY, 0, 9, 1, ids, 1, g, (void *)1, &kept, &dup, &v, why,
                                sizeof why), PS_ESTATE);
    /* loading it again is refused, and changes nothing */
    CHECK_EQ_INT(ps_move_load(s, block, len, W, 2, make_place, &d, &nc, &np, why, sizeof why),
                 PS_EMISMATCH);
    CHECK(strstr(why, "here already") != NULL);
    CHECK(same_rows(b, r, ids, 6));
    free(block);
    ps_tparts_destroy(a);
    ps_tparts_destroy(b);
    ps_tparts_destroy(r);
    ps_shard_destroy(s);
    CHECK(atomic_load(&mem_b) == 0);
}

PS_TEST(partition_removed_hands_its_waiters_and_kept_pushes_to_the_hooks_with_the_code)
{
    _Atomic uint64_t mem = 0;
    tlog l = {0};
    ps_tparts_config c = tcfg(PS_MODE_SYNC, &mem);
    ps_tparts *t = new_tparts(&c, &l);
    CHECK(t);
    CHECK_OK(declare(t, KEY));
    uint64_t ids[2];
    ids_here(ids, 2);
    float g[2 * DIM] = {0};
    char why[256];
    int kept, dup, queued;
    int64_t v;
    /* rank 1's push waits, kept, for rank 0's; a pull of version 1 waits */
    CHECK_OK(ps_tparts_push(t, KEY, 1, 0, 1, ids, 2, g, (void *)1, &kept, &dup, &v, why,
                            sizeof why));
    CHECK_EQ_INT(kept, 1);
    CHECK_OK(ps_tparts_pull(t, KEY, 1, (void *)2, &queued, &v, why, sizeof why));
    CHECK_EQ_INT(queued, 1);
    CHECK_OK(ps_tparts_remove(t, KEY, PS_EMOVED, "moved to slot 3", why, sizeof why));
    CHECK_EQ_INT(l.cancelled, 1);
    CHECK_EQ_INT(l.released, 1);
    CHECK_EQ_INT(l.last_rc, PS_EMOVED);
    CHECK(atomic_load(&mem) == 0);
    CHECK_EQ_INT(ps_tparts_remove(t, KEY, PS_EMOVED, "", why, sizeof why), PS_ENOTFOUND);
    ps_tparts_destroy(t);
    CHECK_EQ_INT(l.cancelled, 1);
}

PS_TEST(ids_of_a_moved_partition_are_checked_against_its_home)
{
    /* a moved-in partition's rows are those of (home, part): ids placed
     * there pass, ids of the destination's own partition do not */
    _Atomic uint64_t mem = 0;
    tlog l = {0};
    ps_tparts_config c = tcfg(PS_MODE_SYNC, &mem);
    ps_tparts *t = new_tparts(&c, &l);
    CHECK(t);
    const ps_tparts_config *k = ps_tparts_cfg(t);
    uint64_t ids[4];
    ids_here(ids, 4);
    CHECK(ps_table_row_misplaced(KEY, ids, 4, k->home, k->num_servers, (uint32_t)k->part,
                                 (uint32_t)k->nparts) == 4);
    uint64_t other = ids[0];
    while (ps_table_row_misplaced(KEY, &other, 1, 0, S, 0, P) == 0) /* one of (0, 0)'s */
        other++;
    CHECK(ps_table_row_misplaced(KEY, &other, 1, k->home, k->num_servers, (uint32_t)k->part,
                                 (uint32_t)k->nparts) == 0);
    ps_tparts_destroy(t);
}

PS_TEST(a_move_block_splits_to_the_threads_that_own_its_objects)
{
    _Atomic uint64_t mem = 0;
    ps_test_hook_log sl;
    ps_shard_hooks sh = ps_test_hook_log_hooks(&sl);
    ps_shard_config sc = shard_cfg(PS_MODE_ASYNC, -1, &mem);
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &sh, &s));
    tlog l = {0};
    ps_tparts_config c = tcfg(PS_MODE_ASYNC, &mem);
    ps_tparts *t = new_tparts(&c, &l);
    CHECK(t);
    CHECK_OK(declare(t, KEY));
    CHECK_OK(declare(t, KEY + 1));
    float w0[N] = {1, 2, 3, 4, 5};
    int64_t v;
    char why[256];
    ps_move_obj objs[10];
    for (uint32_t ch = 0; ch < 8; ch++) {
        CHECK_OK(ps_shard_init(s, 21, ch, w0, N, 0, &v, NULL, why, sizeof why));
        objs[ch] = (ps_move_obj){PS_MOVE_CHUNK, 0, 21, ch};
    }
    objs[8] = (ps_move_obj){PS_MOVE_PART, PART, KEY, HOME};
    objs[9] = (ps_move_obj){PS_MOVE_PART, PART, KEY + 1, HOME};
    void *block;
    size_t len;
    /* an object named twice, or one not here, is refused before anything */
    ps_move_obj twice[2] = {objs[0], objs[0]};
    CHECK_EQ_INT(ps_move_serialize(s, &t, 1, twice, 2, PS_MODE_ASYNC, W, &block, &len, why,
                                   sizeof why), PS_EINVAL);
    ps_move_obj absent = {PS_MOVE_PART, 0, KEY, HOME};
    CHECK_EQ_INT(ps_move_serialize(s, &t, 1, &absent, 1, PS_MODE_ASYNC, W, &block, &len, why,
                                   sizeof why), PS_ENOTFOUND);
    CHECK_OK(ps_move_serialize(s, &t, 1, objs, 10, PS_MODE_ASYNC, W, &block, &len, why,
                               sizeof why));
    enum { T = 3 };
    void *out[T];
    size_t out_len[T];
    CHECK_OK(ps_move_split(block, len, W, 2, 0, T, out, out_len, why, sizeof why));
    uint64_t chunks = 0, parts = 0;
    for (int k = 0; k < T; k++) {
        if (!out[k])
            continue;
        ps_move_view mv;
        CHECK_OK(ps_move_view_block(out[k], out_len[k], W, 2, &mv, why, sizeof why));
        size_t off = 0;
        ps_shard_chunk_view cv;
        while (ps_ckpt_next_chunk(&mv.chunks, &off, &cv))
            CHECK_EQ_INT(ps_server_owner(cv.key, cv.chunk, T), k);
        off = 0;
        ps_ckpt_part_view pv;
        while (ps_ckpt_next_part(&mv.parts, &off, &pv))
            CHECK_EQ_INT(ps_server_away_owner(HOME, pv.part, T), k);
        chunks += mv.nchunks;
        parts += mv.nparts;
        free(out[k]);
    }
    CHECK(chunks == 8 && parts == 2);
    /* the home server takes its partition back on thread PART */
    CHECK_OK(ps_move_split(block, len, W, 2, HOME, T, out, out_len, why, sizeof why));
    for (int k = 0; k < T; k++) {
        ps_move_view mv;
        if (out[k] && ps_move_view_block(out[k], out_len[k], W, 2, &mv, why, sizeof why) == 0)
            CHECK(mv.nparts == (k == PART ? 2u : 0u));
        free(out[k]);
    }
    /* a damaged block is refused */
    ((unsigned char *)block)[0] ^= 1;
    ps_move_view mv;
    CHECK_EQ_INT(ps_move_view_block(block, len, W, 2, &mv, why, sizeof why), PS_EDATA);
    CHECK_EQ_INT(ps_move_view_block(block, len - 8, W, 2, &mv, why, sizeof why), PS_EDATA);
    free(block);
    ps_tparts_destroy(t);
    ps_shard_destroy(s);
}

PS_TEST(a_load_that_fails_part_way_leaves_nothing_behind)
{
    /* the second chunk is here already on the destination: refused before
     * anything is loaded; and a destination short of memory loads nothing */
    _Atomic uint64_t ma = 0, mb = 0;
    ps_test_hook_log la, lb;
    ps_shard_hooks ha = ps_test_hook_log_hooks(&la), hb = ps_test_hook_log_hooks(&lb);
    ps_shard_config ca = shard_cfg(PS_MODE_ASYNC, -1, &ma), cb = shard_cfg(PS_MODE_ASYNC, -1, &mb);
    ps_shard *a, *b;
    CHECK_OK(ps_shard_create(&ca, &ha, &a));
    float w0[N] = {1, 2, 3, 4, 5};
    int64_t v;
    char why[256];
    for (uint32_t ch = 0; ch < 4; ch++)
        CHECK_OK(ps_shard_init(a, 30, ch, w0, N, 0, &v, NULL, why, sizeof why));
    uint64_t one = atomic_load(&ma) / 4;
    ps_move_obj objs[4];
    for (uint32_t ch = 0; ch < 4; ch++)
        objs[ch] = (ps_move_obj){PS_MOVE_CHUNK, 0, 30, ch};
    void *block;
    size_t len;
    CHECK_OK(ps_move_serialize(a, NULL, 0, objs, 4, PS_MODE_ASYNC, W, &block, &len, why,
                               sizeof why));
    cb.max_memory = 2 * one + one / 2; /* room for two of the four */
    CHECK_OK(ps_shard_create(&cb, &hb, &b));
    uint64_t nc, np;
    CHECK_EQ_INT(ps_move_load(b, block, len, W, 2, no_place, NULL, &nc, &np, why, sizeof why),
                 PS_ETOOBIG);
    CHECK(atomic_load(&mb) == 0);
    for (uint32_t ch = 0; ch < 4; ch++)
        CHECK(ps_shard_weights(b, 30, ch, NULL, NULL) == NULL);
    ps_shard_destroy(b);
    cb.max_memory = 1 << 24;
    CHECK_OK(ps_shard_create(&cb, &hb, &b));
    CHECK_OK(ps_shard_init(b, 30, 1, w0, N, 0, &v, NULL, why, sizeof why));
    CHECK_EQ_INT(ps_move_load(b, block, len, W, 2, no_place, NULL, &nc, &np, why, sizeof why),
                 PS_EMISMATCH);
    CHECK(strstr(why, "chunk 1") != NULL);
    CHECK(ps_shard_weights(b, 30, 0, NULL, NULL) == NULL);
    free(block);
    ps_shard_destroy(a);
    ps_shard_destroy(b);
}
