/* The server map (common/ps_smap.c): slots, overrides and their lookup, the
 * plans for a server added or removed (the bounds ps_smap.h promises, on
 * fixed cases and on many seeded random inventories), and the encoded map,
 * which is network input: every truncation and every malformed field is
 * refused. */
#include <stdint.h>
#include <string.h>

#include "ps_error.h"
#include "ps_smap.h"
#include "ps_test.h"

static uint64_t g_rng;

static uint64_t rnd(void)
{
    /* xorshift64*: seeded, so a failure is the same on every run */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}

static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

static const char *const g_eps[] = {"tcp://a:1", "tcp://b:2", "tcp://c:3", "tcp://d:4",
                                    "tcp://e:5", "tcp://f:6", "tcp://g:7", "tcp://h:8"};

static ps_smap_obj part(uint64_t table, int h, uint32_t p, uint64_t bytes)
{
    return (ps_smap_obj){{PS_SMAP_PART, table, (uint32_t)h, p}, bytes, h, h};
}

static ps_smap_obj chunk(uint64_t key, uint32_t c, int home, uint64_t bytes)
{
    return (ps_smap_obj){{PS_SMAP_CHUNK, key, c, 0}, bytes, home, home};
}

static int same_moves(const ps_smap_plan *x, const ps_smap_plan *y)
{
    if (x->n != y->n || x->bytes != y->bytes || x->op != y->op || x->slot != y->slot)
        return 0;
    for (size_t i = 0; i < x->n; i++) {
        const ps_smap_move *a = &x->moves[i], *b = &y->moves[i];
        if (ps_smap_id_cmp(&a->id, &b->id) || a->bytes != b->bytes || a->home != b->home ||
            a->from != b->from || a->to != b->to)
            return 0;
    }
    return 1;
}

/* The moves applied to the inventory's owners, as ps_smap_apply does to the map */
static void apply_inv(ps_smap_obj *inv, size_t n, const ps_smap_plan *p)
{
    for (size_t i = 0; i < p->n; i++)
        for (size_t k = 0; k < n; k++)
            if (!ps_smap_id_cmp(&inv[k].id, &p->moves[i].id))
                inv[k].owner = p->moves[i].to;
}

/* NULL when the map's lookup gives every object's owner and holds exactly
 * the objects away from home; else what differs (into msg) */
static const char *consistent(const ps_smap *m, const ps_smap_obj *inv, size_t n, char *msg,
                              size_t len)
{
    size_t away = 0;
    for (size_t k = 0; k < n; k++) {
        int o = ps_smap_owner(m, &inv[k].id, inv[k].home);
        if (o != inv[k].owner) {
            snprintf(msg, len, "object %zu: map says %d, the plan %d", k, o, inv[k].owner);
            return msg;
        }
        if (m->slots[o].state != PS_SMAP_LIVE) {
            snprintf(msg, len, "object %zu is on removed slot %d", k, o);
            return msg;
        }
        away += inv[k].owner != inv[k].home;
    }
    if (away != m->nover) {
        snprintf(msg, len, "%zu objects away from home, the map has %zu overrides", away,
                 m->nover);
        return msg;
    }
    return NULL;
}

PS_TEST(slots_are_added_removed_and_never_reused)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 3, why, sizeof why));
    CHECK_EQ_INT(m.epoch, 0);
    CHECK_EQ_INT(m.nlive, 3);
    int s = -1;
    int rc = ps_smap_add_slot(&m, "tcp://x:9", &s, why, sizeof why);
    int rm = ps_smap_remove_slot(&m, 1, why, sizeof why);
    int again = ps_smap_remove_slot(&m, 1, why, sizeof why);
    int out = ps_smap_remove_slot(&m, 4, why, sizeof why);
    /* a removed server's endpoint may come back, as a new slot */
    int s2 = -1;
    int back = ps_smap_add_slot(&m, g_eps[1], &s2, why, sizeof why);
    int dup = ps_smap_add_slot(&m, g_eps[0], &s2, why, sizeof why);
    char dupwhy[256];
    snprintf(dupwhy, sizeof dupwhy, "%s", why);
    int nslots = m.nslots, nlive = m.nlive;
    uint64_t epoch = m.epoch;
    ps_smap_free(&m);
    CHECK_OK(rc);
    CHECK_EQ_INT(s, 3);
    CHECK_OK(rm);
    CHECK_EQ_INT(again, PS_EINVAL);
    CHECK_EQ_INT(out, PS_EINVAL);
    CHECK_OK(back);
    CHECK_EQ_INT(s2, 4);
    CHECK_EQ_INT(dup, PS_EINVAL);
    CHECK_MSG(strstr(dupwhy, "slot 0"), "why: %s", dupwhy);
    CHECK_EQ_INT(nslots, 5);
    CHECK_EQ_INT(nlive, 4);
    CHECK_EQ_INT(epoch, 3);
}

PS_TEST(slots_refuse_bad_endpoints_the_last_live_and_the_257th)
{
    ps_smap m;
    char why[256], long_ep[PS_ENDPOINT_MAX + 8];
    memset(long_ep, 'a', sizeof long_ep - 1);
    long_ep[sizeof long_ep - 1] = '\0';
    const char *bad[] = {"", long_ep, "tcp://a\n:1", "tcp://\x7f:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *eps[] = {"tcp://ok:1", bad[i]};
        CHECK_EQ_INT(ps_smap_init(&m, eps, 2, why, sizeof why), PS_EINVAL);
        CHECK(m.slots == NULL);
    }
    const char *twice[] = {"tcp://ok:1", "tcp://ok:1"};
    CHECK_EQ_INT(ps_smap_init(&m, twice, 2, why, sizeof why), PS_EINVAL);
    CHECK_EQ_INT(ps_smap_init(&m, g_eps, 0, why, sizeof why), PS_EINVAL);
    CHECK_EQ_INT(ps_smap_init(&m, g_eps, PS_SMAP_MAX_SLOTS + 1, why, sizeof why), PS_EINVAL);

    CHECK_OK(ps_smap_init(&m, g_eps, 1, why, sizeof why));
    int last = ps_smap_remove_slot(&m, 0, why, sizeof why);
    char lastwhy[256];
    snprintf(lastwhy, sizeof lastwhy, "%s", why);
    int s = 0, rc = 0;
    char ep[32];
    for (int i = 1; i < PS_SMAP_MAX_SLOTS && !rc; i++) {
        snprintf(ep, sizeof ep, "tcp://n:%d", i);
        rc = ps_smap_add_slot(&m, ep, &s, why, sizeof why);
    }
    int full = ps_smap_add_slot(&m, "tcp://one-more:1", &s, why, sizeof why);
    int nslots = m.nslots;
    ps_smap_free(&m);
    CHECK_EQ_INT(last, PS_EINVAL);
    CHECK_MSG(strstr(lastwhy, "last live"), "why: %s", lastwhy);
    CHECK_OK(rc);
    CHECK_EQ_INT(s, PS_SMAP_MAX_SLOTS - 1);
    CHECK_EQ_INT(full, PS_ETOOBIG);
    CHECK_MSG(strstr(why, "256"), "why: %s", why);
    CHECK_EQ_INT(nslots, PS_SMAP_MAX_SLOTS);
}

PS_TEST(apply_adds_changes_and_drops_overrides)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 3, why, sizeof why));
    ps_smap_id c = {PS_SMAP_CHUNK, 7, 2, 0}, p = {PS_SMAP_PART, 9, 1, 3};
    CHECK_EQ_INT(ps_smap_owner(&m, &c, 0), 0); /* no overrides: the home */
    CHECK_EQ_INT(ps_smap_part_owner(&m, 9, 1, 3), 1);
    ps_smap_move first[] = {{c, 10, 0, 0, 2}, {p, 20, 1, 1, 0}};
    CHECK_OK(ps_smap_apply(&m, first, 2, why, sizeof why));
    CHECK_EQ_INT(m.epoch, 1);
    CHECK_EQ_INT(m.nover, 2);
    CHECK_EQ_INT(ps_smap_chunk_owner(&m, 7, 2, 0), 2);
    CHECK_EQ_INT(ps_smap_part_owner(&m, 9, 1, 3), 0);
    CHECK_EQ_INT(ps_smap_part_owner(&m, 9, 1, 2), 1); /* its neighbour stays */
    CHECK_EQ_INT(ps_smap_chunk_owner(&m, 7, 3, 1), 1);
    ps_smap_override held[4];
    CHECK_EQ_INT(ps_smap_held(&m, 2, held, 4), 1);
    CHECK(!ps_smap_id_cmp(&held[0].id, &c));
    CHECK_EQ_INT(ps_smap_held(&m, 1, held, 4), 0);
    /* the chunk moves on (changed), the partition goes home (dropped) */
    ps_smap_move second[] = {{c, 10, 0, 2, 1}, {p, 20, 1, 0, 1}};
    CHECK_OK(ps_smap_apply(&m, second, 2, why, sizeof why));
    CHECK_EQ_INT(m.nover, 1);
    CHECK_EQ_INT(ps_smap_chunk_owner(&m, 7, 2, 0), 1);
    CHECK_EQ_INT(ps_smap_part_owner(&m, 9, 1, 3), 1);
    /* slot 1 holds the chunk: it cannot be removed until the chunk leaves */
    CHECK_EQ_INT(ps_smap_remove_slot(&m, 1, why, sizeof why), PS_ESTATE);
    ps_smap_move third[] = {{c, 10, 0, 1, 0}};
    CHECK_OK(ps_smap_apply(&m, third, 1, why, sizeof why));
    CHECK_EQ_INT(m.nover, 0);
    CHECK_OK(ps_smap_remove_slot(&m, 1, why, sizeof why));
    CHECK_EQ_INT(m.epoch, 4);
    ps_smap_free(&m);
}

PS_TEST(apply_refuses_bad_moves_and_leaves_the_map_as_it_was)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 4, why, sizeof why));
    ps_smap_id c = {PS_SMAP_CHUNK, 7, 2, 0};
    ps_smap_move ok = {c, 10, 0, 0, 2};
    CHECK_OK(ps_smap_apply(&m, &ok, 1, why, sizeof why));
    CHECK_OK(ps_smap_remove_slot(&m, 3, why, sizeof why));
    struct {
        ps_smap_move mv[2];
        size_t n;
        const char *why;
    } bad[] = {
        {{{c, 10, 0, 0, 1}}, 1, "source is not its owner"},
        {{{c, 10, 0, 2, 3}}, 1, "not a live slot"},
        {{{c, 10, 0, 2, 9}}, 1, "not a live slot"},
        {{{c, 10, 0, 2, 2}}, 1, "destination is its source"},
        {{{{PS_SMAP_CHUNK, 8, 0, 1}, 1, 0, 0, 1}}, 1, "b is not 0"},
        {{{{3, 8, 0, 0}, 1, 0, 0, 1}}, 1, "kind"},
        {{{{PS_SMAP_PART, 8, 1, 0}, 1, 0, 0, 1}}, 1, "home is not its a"},
        {{{{PS_SMAP_PART, 8, 7, 0}, 1, 7, 7, 1}}, 1, "not a slot"},
        {{{{PS_SMAP_CHUNK, 8, 0, 0}, 1, 5, 5, 1}}, 1, "home is not a slot"},
        {{{c, 10, 0, 2, 1}, {c, 10, 0, 2, 0}}, 2, "twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        int rc = ps_smap_apply(&m, bad[i].mv, bad[i].n, why, sizeof why);
        CHECK_MSG(rc == PS_EINVAL && strstr(why, bad[i].why),
                  "case %zu: rc %d, why '%s', expected '%s'", i, rc, why, bad[i].why);
        CHECK_EQ_INT(m.epoch, 2);
        CHECK_EQ_INT(m.nover, 1);
        CHECK_EQ_INT(ps_smap_chunk_owner(&m, 7, 2, 0), 2);
    }
    ps_smap_free(&m);
}

/* 8 table partitions of 1 MB on 4 servers, a 5th added: the target is 1.6
 * MB, so 1 or 2 partitions move, from the most loaded (all equal: slot 0). */
PS_TEST(plan_add_equal_partitions_moves_one_or_two)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 4, why, sizeof why));
    ps_smap_obj inv[8];
    for (int h = 0; h < 4; h++)
        for (uint32_t p = 0; p < 2; p++)
            inv[h * 2 + (int)p] = part(55, h, p, 1000000);
    int s;
    CHECK_OK(ps_smap_add_slot(&m, "tcp://new:5", &s, why, sizeof why));
    ps_smap_plan plan;
    CHECK_OK(ps_smap_plan_add(&m, inv, 8, s, &plan, why, sizeof why));
    size_t n = plan.n;
    int from0 = plan.n ? plan.moves[0].from : -1, to0 = plan.n ? plan.moves[0].to : -1;
    char line[256];
    ps_smap_plan_describe(&m, &plan, line, sizeof line);
    ps_smap_plan_free(&plan);
    ps_smap_free(&m);
    CHECK_MSG(n == 1 || n == 2, "%zu moves", n);
    CHECK_EQ_INT(from0, 0);
    CHECK_EQ_INT(to0, 4);
    CHECK_STR(line, "add slot 4 (tcp://new:5): 1 object, 1.0 MB from slots 0 (1)");
}

PS_TEST(plan_add_takes_from_the_most_loaded_first)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 2, why, sizeof why));
    ps_smap_obj inv[12];
    for (uint32_t i = 0; i < 12; i++)
        inv[i] = chunk(3, i, i < 10 ? 0 : 1, 1000);
    int s;
    CHECK_OK(ps_smap_add_slot(&m, "tcp://new:5", &s, why, sizeof why));
    ps_smap_plan plan;
    CHECK_OK(ps_smap_plan_add(&m, inv, 12, s, &plan, why, sizeof why));
    size_t n = plan.n, from1 = 0;
    for (size_t i = 0; i < plan.n; i++)
        from1 += plan.moves[i].from == 1;
    uint64_t bytes = plan.bytes;
    ps_smap_plan_free(&plan);
    ps_smap_free(&m);
    /* target 4000: all four from slot 0 (10 -> 6), none from slot 1 (2) */
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(from1, 0);
    CHECK_EQ_INT(bytes, 4000);
}

PS_TEST(plan_remove_moves_largest_first_onto_the_least_loaded)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 3, why, sizeof why));
    ps_smap_obj inv[] = {chunk(1, 0, 0, 500), chunk(1, 1, 1, 100), chunk(1, 2, 2, 700),
                         chunk(2, 0, 1, 300), chunk(2, 1, 1, 400), part(4, 1, 0, 300)};
    ps_smap_plan plan;
    CHECK_OK(ps_smap_plan_remove(&m, inv, 6, 1, &plan, why, sizeof why));
    /* slot 1's 400, 300 (chunk 2.0 before partition: kind order), 300, 100:
     * loads 0:500 2:700 -> 400 to 0 (900), 300 to 2 (1000), 300 to 0 (1200),
     * 100 to 2 (1100) */
    char line[256];
    ps_smap_plan_describe(&m, &plan, line, sizeof line);
    int want_to[] = {0, 2, 0, 2};
    uint64_t want_bytes[] = {400, 300, 300, 100};
    size_t n = plan.n;
    int ok = n == 4;
    for (size_t i = 0; ok && i < 4; i++)
        ok = plan.moves[i].to == want_to[i] && plan.moves[i].bytes == want_bytes[i] &&
             plan.moves[i].from == 1;
    int second_is_chunk = n > 1 && plan.moves[1].id.kind == PS_SMAP_CHUNK;
    ps_smap_plan_free(&plan);
    ps_smap_free(&m);
    CHECK_MSG(ok, "%zu moves, not 400->0, 300->2, 300->0, 100->2", n);
    CHECK(second_is_chunk);
    CHECK_STR(line, "remove slot 1 (tcp://b:2): 4 objects, 0.0 MB to slots 0 (2), 2 (2)");
}

PS_TEST(plans_refuse_bad_slots_and_inventories)
{
    ps_smap m;
    char why[256];
    CHECK_OK(ps_smap_init(&m, g_eps, 3, why, sizeof why));
    ps_smap_move mv = {{PS_SMAP_CHUNK, 1, 0, 0}, 5, 0, 0, 2};
    CHECK_OK(ps_smap_apply(&m, &mv, 1, why, sizeof why));
    ps_smap_obj good[] = {chunk(1, 0, 0, 5), chunk(1, 1, 1, 5), part(2, 2, 0, 5)};
    good[0].owner = 2;
    ps_smap_plan plan;
    CHECK_OK(ps_smap_plan_remove(&m, good, 3, 2, &plan, why, sizeof why));
    CHECK_EQ_INT(plan.n, 2);
    ps_smap_plan_free(&plan);
    struct {
        int slot, remove;
        ps_smap_obj inv[3];
        const char *why;
    } bad[] = {
        {3, 0, {good[0], good[1], good[2]}, "not a slot"},
        {-1, 1, {good[0], good[1], good[2]}, "not a slot"},
        {1, 0, {good[0], chunk(1, 1, 1, 5), chunk(1, 1, 1, 5)}, "twice"},
        {1, 0, {chunk(1, 0, 0, 5), good[1], good[2]}, "not the map's"},
        {1, 0, {chunk(9, 0, 0, 5), good[1], good[2]}, "lacks it"},
        {1, 0, {good[0], chunk(1, 1, 4, 5), good[2]}, "home is not a slot"},
        {1, 0, {good[0], good[1], {{PS_SMAP_PART, 2, 1, 0}, 5, 2, 2}}, "home is not its a"},
        {1, 0, {good[0], good[1], {{PS_SMAP_CHUNK, 2, 1, 1}, 5, 2, 2}}, "b is not 0"},
        {1, 0, {good[0], good[1], chunk(3, 0, 0, UINT64_MAX)}, "2^64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        int rc = bad[i].remove
                     ? ps_smap_plan_remove(&m, bad[i].inv, 3, bad[i].slot, &plan, why, sizeof why)
                     : ps_smap_plan_add(&m, bad[i].inv, 3, bad[i].slot, &plan, why, sizeof why);
        CHECK_MSG(rc == PS_EINVAL && strstr(why, bad[i].why) && !plan.moves && !plan.n,
                  "case %zu: rc %d, why '%s', expected '%s'", i, rc, why, bad[i].why);
    }
    /* an owner that is not live: slot 1 removed under an object of it */
    CHECK_OK(ps_smap_remove_slot(&m, 1, why, sizeof why));
    int rc = ps_smap_plan_add(&m, good, 3, 0, &plan, why, sizeof why);
    CHECK_MSG(rc == PS_EINVAL && strstr(why, "owner is not a live slot"), "rc %d why %s", rc, why);
    rc = ps_smap_plan_add(&m, good + 2, 1, 1, &plan, why, sizeof why);
    CHECK_MSG(rc == PS_EINVAL && strstr(why, "removed"), "rc %d why %s", rc, why);
    ps_smap_free(&m);
    const char *one[] = {"tcp://only:1"};
    CHECK_OK(ps_smap_init(&m, one, 1, why, sizeof why));
    ps_smap_obj solo = chunk(1, 0, 0, 5);
    rc = ps_smap_plan_remove(&m, &solo, 1, 0, &plan, why, sizeof why);
    ps_smap_free(&m);
    CHECK_MSG(rc == PS_EINVAL && strstr(why, "last live"), "rc %d why %s", rc, why);
}

/* A random job: chunks with LPT-like or random homes and partitions of a
 * few tables, sizes equal, spread, or with a few giants. */
static size_t random_inventory(ps_smap_obj *inv, size_t cap, int nslots)
{
    size_t n = 0;
    int shape = (int)below(3);
    uint64_t unit = 1 + below(1u << 20);
    size_t nchunks = below(60), ntables = below(4);
    for (size_t c = 0; c < nchunks && n < cap; c++) {
        uint64_t b = shape == 0 ? unit : shape == 1 ? 1 + below(unit) : (below(10) ? 1 + below(1000) : unit * 50);
        inv[n++] = chunk(1000 + c / 7, (uint32_t)(c % 7), (int)below((uint64_t)nslots), b);
    }
    for (size_t t = 0; t < ntables; t++) {
        uint32_t parts = 1 + (uint32_t)below(4);
        for (int h = 0; h < nslots; h++)
            for (uint32_t p = 0; p < parts && n < cap; p++)
                inv[n++] = part(77 + t, h, p, shape == 0 ? unit : 1 + below(unit));
    }
    return n;
}

static void loads(const ps_smap_obj *inv, size_t n, uint64_t *load)
{
    memset(load, 0, PS_SMAP_MAX_SLOTS * sizeof *load);
    for (size_t k = 0; k < n; k++)
        load[inv[k].owner] += inv[k].bytes;
}

PS_TEST(plans_keep_their_bounds_on_random_jobs)
{
    static ps_smap_obj inv[600];
    static uint64_t before[PS_SMAP_MAX_SLOTS], after[PS_SMAP_MAX_SLOTS];
    char why[256], msg[256], ep[48];
    g_rng = 0x5eed5eed12345ull;
    size_t adds = 0, removes = 0, moved_objects = 0;
    for (int job = 0; job < 300; job++) {
        int s0 = 1 + (int)below(8);
        size_t n = random_inventory(inv, 600, s0);
        ps_smap m;
        CHECK_OK(ps_smap_init(&m, g_eps, s0, why, sizeof why));
        for (int op = 0; op < 6; op++) {
            ps_smap_plan plan, again;
            loads(inv, n, before);
            uint64_t total = 0, largest = 0;
            for (size_t k = 0; k < n; k++) {
                total += inv[k].bytes;
                largest = inv[k].bytes > largest ? inv[k].bytes : largest;
            }
            if (m.nlive == 1 || below(2)) {
                int s;
                snprintf(ep, sizeof ep, "tcp://job%d:%d", job, op);
                CHECK_OK(ps_smap_add_slot(&m, ep, &s, why, sizeof why));
                CHECK_MSG(!ps_smap_plan_add(&m, inv, n, s, &plan, why, sizeof why), "%s", why);
                CHECK_OK(ps_smap_plan_add(&m, inv, n, s, &again, why, sizeof why));
                int same = same_moves(&plan, &again);
                ps_smap_plan_free(&again);
                uint64_t L = (uint64_t)m.nlive;
                uint64_t sim[PS_SMAP_MAX_SLOTS];
                memcpy(sim, before, sizeof sim);
                for (size_t i = 0; i < plan.n; i++) {
                    const ps_smap_move *mv = &plan.moves[i];
                    CHECK_MSG(mv->to == s && mv->from != s && m.slots[mv->from].state == PS_SMAP_LIVE,
                              "job %d: move %zu %d -> %d onto slot %d", job, i, mv->from, mv->to, s);
                    /* no pointless move: the new slot stays lighter than the
                     * slot the object leaves was */
                    CHECK_MSG(sim[s] + mv->bytes < sim[mv->from],
                              "job %d: move %zu of %llu bytes from slot %d (%llu) to %d (%llu)", job,
                              i, (unsigned long long)mv->bytes, mv->from,
                              (unsigned long long)sim[mv->from], s, (unsigned long long)sim[s]);
                    sim[mv->from] -= mv->bytes;
                    sim[s] += mv->bytes;
                }
                apply_inv(inv, n, &plan);
                loads(inv, n, after);
                CHECK_MSG(same, "job %d: two plans of the same input differ", job);
                CHECK_MSG(plan.bytes <= total / L + largest,
                          "job %d: moved %llu > total/L %llu + largest %llu", job,
                          (unsigned long long)plan.bytes, (unsigned long long)(total / L),
                          (unsigned long long)largest);
                CHECK_MSG(after[s] + largest >= total / L,
                          "job %d: new slot %llu < total/L %llu - largest %llu", job,
                          (unsigned long long)after[s], (unsigned long long)(total / L),
                          (unsigned long long)largest);
                /* past the target only when that is nearer it: by under half an object */
                CHECK_MSG(after[s] <= total / L + largest / 2,
                          "job %d: new slot %llu > total/L %llu + largest/2 %llu", job,
                          (unsigned long long)after[s], (unsigned long long)(total / L),
                          (unsigned long long)largest / 2);
                for (int t = 0; t < m.nslots; t++)
                    CHECK_MSG(t == s || after[t] <= before[t], "job %d: slot %d grew", job, t);
                adds++;
            } else {
                int s;
                do
                    s = (int)below((uint64_t)m.nslots);
                while (m.slots[s].state != PS_SMAP_LIVE);
                CHECK_MSG(!ps_smap_plan_remove(&m, inv, n, s, &plan, why, sizeof why), "%s", why);
                CHECK_OK(ps_smap_plan_remove(&m, inv, n, s, &again, why, sizeof why));
                int same = same_moves(&plan, &again);
                ps_smap_plan_free(&again);
                CHECK_MSG(same, "job %d: two plans of the same input differ", job);
                /* exactly slot s's objects, largest first, each onto the least
                 * loaded live slot of that moment (the lowest on ties) */
                size_t held = 0;
                for (size_t k = 0; k < n; k++)
                    held += inv[k].owner == s;
                CHECK_EQ_INT(plan.n, held);
                uint64_t sim[PS_SMAP_MAX_SLOTS];
                memcpy(sim, before, sizeof sim);
                for (size_t i = 0; i < plan.n; i++) {
                    const ps_smap_move *mv = &plan.moves[i];
                    int least = -1;
                    for (int t = 0; t < m.nslots; t++)
                        if (t != s && m.slots[t].state == PS_SMAP_LIVE &&
                            (least < 0 || sim[t] < sim[least]))
                            least = t;
                    CHECK_MSG(mv->from == s && mv->to == least &&
                                  (i == 0 || mv->bytes <= plan.moves[i - 1].bytes),
                              "job %d: move %zu (%llu bytes) %d -> %d, least loaded %d", job, i,
                              (unsigned long long)mv->bytes, mv->from, mv->to, least);
                    sim[least] += mv->bytes;
                }
                apply_inv(inv, n, &plan);
                removes++;
            }
            moved_objects += plan.n;
            int rc = ps_smap_apply(&m, plan.moves, plan.n, why, sizeof why);
            int removed = plan.op == PS_SMAP_REMOVE ? plan.slot : -1;
            ps_smap_plan_free(&plan);
            CHECK_MSG(!rc, "job %d: apply: %s", job, why);
            if (removed >= 0)
                CHECK_MSG(!ps_smap_remove_slot(&m, removed, why, sizeof why), "%s", why);
            const char *bad = consistent(&m, inv, n, msg, sizeof msg);
            CHECK_MSG(!bad, "job %d op %d: %s", job, op, bad);
        }
        /* the map travels: what a client decodes answers every lookup alike */
        size_t len = ps_smap_encoded_bytes(&m);
        unsigned char *buf = malloc(len);
        ps_smap_encode(&m, buf);
        ps_smap d;
        int rc = ps_smap_decode(buf, len, &d, why, sizeof why);
        free(buf);
        ps_smap_free(&m);
        CHECK_MSG(!rc, "job %d: decode: %s", job, why);
        const char *bad = consistent(&d, inv, n, msg, sizeof msg);
        ps_smap_free(&d);
        CHECK_MSG(!bad, "job %d decoded: %s", job, bad);
    }
    CHECK(adds > 300 && removes > 300 && moved_objects > 1000);
}

/* A map with a removed slot and overrides of both kinds, its encoding */
static int sample_map(ps_smap *m, unsigned char **buf, size_t *len)
{
    char why[256];
    if (ps_smap_init(m, g_eps, 3, why, sizeof why))
        return -1;
    ps_smap_move mv[] = {{{PS_SMAP_PART, 5, 1, 0}, 1, 1, 1, 0},
                         {{PS_SMAP_CHUNK, 9, 4, 0}, 1, 1, 1, 2},
                         {{PS_SMAP_PART, 5, 1, 1}, 1, 1, 1, 2}};
    int s;
    if (ps_smap_add_slot(m, "ipc:///tmp/ps 3", &s, why, sizeof why) ||
        ps_smap_apply(m, mv, 3, why, sizeof why) || ps_smap_remove_slot(m, 1, why, sizeof why))
        return -1;
    *len = ps_smap_encoded_bytes(m);
    *buf = malloc(*len);
    ps_smap_encode(m, *buf);
    return 0;
}

PS_TEST(encoded_map_round_trips_in_the_documented_layout)
{
    ps_smap m, d;
    unsigned char *buf;
    size_t len;
    char why[256];
    CHECK_OK(sample_map(&m, &buf, &len));
    /* head 24; slots 3 x (8 + 16) + (8 + 16: "ipc:///tmp/ps 3" is 15); 3 x 24 */
    CHECK_EQ_INT(len, 24 + 4 * 24 + 3 * 24);
    CHECK(!memcmp(buf, "PSSMAP1\0", 8));
    CHECK_EQ_INT(buf[8], 3); /* epoch: add, apply, remove */
    CHECK_EQ_INT(buf[16], 4);
    CHECK_EQ_INT(buf[20], 3);
    CHECK_EQ_INT(buf[24 + 24], PS_SMAP_REMOVED); /* slot 1's state */
    CHECK_EQ_INT(buf[24 + 24 + 4], 9);           /* its endpoint's length */
    CHECK(!memcmp(buf + 24 + 24 + 8, "tcp://b:2\0\0\0\0\0\0\0", 16));
    /* the first override, by (kind, key, a, b): chunk 4 of key 9 on slot 2 */
    const unsigned char *o = buf + 24 + 4 * 24;
    CHECK(o[0] == 1 && o[4] == 4 && o[8] == 9 && o[16] == 0 && o[20] == 2);
    CHECK_OK(ps_smap_decode(buf, len, &d, why, sizeof why));
    size_t len2 = ps_smap_encoded_bytes(&d);
    unsigned char *buf2 = malloc(len2);
    ps_smap_encode(&d, buf2);
    int same = len2 == len && !memcmp(buf, buf2, len);
    int owners = ps_smap_part_owner(&d, 5, 1, 0) == 0 && ps_smap_part_owner(&d, 5, 1, 1) == 2 &&
                 ps_smap_chunk_owner(&d, 9, 4, 1) == 2 && ps_smap_chunk_owner(&d, 9, 5, 1) == 1;
    char line[512];
    ps_smap_describe(&d, line, sizeof line);
    int meta = d.epoch == 3 && d.nslots == 4 && d.nlive == 3 && d.nover == 3;
    free(buf2);
    free(buf);
    ps_smap_free(&m);
    ps_smap_free(&d);
    CHECK(same);
    CHECK(owners);
    CHECK(meta);
    CHECK_STR(line, "epoch 3: 4 slots, 3 live (0 tcp://a:1, 1 tcp://b:2 removed, 2 tcp://c:3, "
                    "3 ipc:///tmp/ps 3); 3 objects away from home");
}

PS_TEST(decode_refuses_every_truncation_and_trailing_bytes)
{
    ps_smap m, d;
    unsigned char *buf;
    size_t len;
    char why[256];
    CHECK_OK(sample_map(&m, &buf, &len));
    ps_smap_free(&m);
    unsigned char *big = calloc(len + 8, 1);
    memcpy(big, buf, len);
    free(buf);
    for (size_t cut = 0; cut < len; cut++) {
        /* a copy of exactly cut bytes, so the sanitizers see any read past it */
        unsigned char *part_buf = malloc(cut ? cut : 1);
        memcpy(part_buf, big, cut);
        int rc = ps_smap_decode(part_buf, cut, &d, why, sizeof why);
        free(part_buf);
        CHECK_MSG(rc == PS_EPROTO && d.slots == NULL && d.over == NULL,
                  "%zu of %zu bytes: rc %d (%s)", cut, len, rc, why);
    }
    for (size_t extra = 1; extra <= 8; extra++) {
        int rc = ps_smap_decode(big, len + extra, &d, why, sizeof why);
        CHECK_MSG(rc == PS_EPROTO, "%zu trailing bytes: rc %d", extra, rc);
    }
    free(big);
}

static void put32le(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

PS_TEST(decode_refuses_each_malformed_field_and_says_which)
{
    ps_smap m, d;
    unsigned char *buf;
    size_t len;
    char why[256];
    CHECK_OK(sample_map(&m, &buf, &len));
    ps_smap_free(&m);
    const size_t slot1 = 24 + 24, slot3 = 24 + 3 * 24, over = 24 + 4 * 24;
    /* over + 24 * i: override i (chunk 9.4 -> 2, part 5.1.0 -> 0, part 5.1.1 -> 2) */
    struct {
        size_t off;
        uint32_t value;
        const char *why;
    } bad[] = {
        {0, 0x4d53534f, "PSSMAP1"},
        {16, 0, "0 slots"},
        {16, PS_SMAP_MAX_SLOTS + 1, "257 slots"},
        {20, PS_SMAP_MAX_OVERRIDES + 1, "overrides, more than"},
        {20, 4, "for 4 overrides"},
        {20, 2, "follow the last override"},
        {slot1, 3, "state is 3"},
        {slot1 + 4, 0, "endpoint is 0 bytes"},
        {slot1 + 4, PS_ENDPOINT_MAX, "endpoint is 256 bytes"},
        {slot1 + 4, 200, "truncated"},
        {slot1 + 8, 0x3a700a74, "non-printable byte 0x0a"},
        {slot1 + 8 + 12, 1, "padding"},
        {slot3 + 8, 0x3a706374, "endpoint tcp://a:1 is slot 0's"}, /* "tcp:" -> ipc was 3 */
        {over, 3, "kind"},
        {over + 16, 1, "b is not 0"},
        {over + 20, 4, "owner is not a slot"},
        {over + 20, 0xffffffffu, "owner is not a slot"},
        {over + 20, 1, "owner is a removed slot"},
        {over + 24 + 20, 1, "owner is a removed slot"},
        {over + 48 + 20, 1, "removed"},
        {over + 48 + 4, 9, "home server is not a slot"},
        {over + 24 + 20, 2, "a partition's owner is its home"},
        {over + 48 + 16, 0, "does not follow"},                /* part 5.1.0 twice */
        {over + 24, PS_SMAP_CHUNK, "does not follow"},         /* chunk 5.1.0 after chunk 9.4 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char *b = malloc(len);
        memcpy(b, buf, len);
        if (bad[i].off == slot3 + 8) {
            /* slot 3 made a second "tcp://a:1": same length and padding */
            put32le(b + slot3 + 4, 9);
            memset(b + slot3 + 8, 0, 16);
            memcpy(b + slot3 + 8, "tcp://a:1", 9);
        } else if (bad[i].off == over + 24 + 20 && bad[i].value == 2) {
            /* partition 5.1.0 (home 1) owned by 1 would be its home: make its
             * home 2 and its owner 2 instead */
            put32le(b + over + 24 + 4, 2);
            put32le(b + over + 24 + 20, 2);
        } else {
            put32le(b + bad[i].off, bad[i].value);
        }
        why[0] = '\0';
        int rc = ps_smap_decode(b, len, &d, why, sizeof why);
        free(b);
        CHECK_MSG(rc == PS_EPROTO && strstr(why, bad[i].why) && d.slots == NULL,
                  "case %zu: rc %d, why '%s', expected '%s'", i, rc, why, bad[i].why);
    }
    free(buf);
}

/* Random bytes changed in a valid map: each result is refused, or decodes
 * to a map that encodes back to the same bytes (so nothing was misread). */
PS_TEST(decode_of_mutated_maps_refuses_or_round_trips)
{
    ps_smap m, d;
    unsigned char *buf;
    size_t len;
    char why[256];
    CHECK_OK(sample_map(&m, &buf, &len));
    ps_smap_free(&m);
    g_rng = 0xfeedbeefull;
    unsigned char *b = malloc(len), *again = malloc(len);
    size_t accepted = 0, refused = 0;
    for (int t = 0; t < 20000; t++) {
        memcpy(b, buf, len);
        int flips = 1 + (int)below(3);
        for (int f = 0; f < flips; f++) {
            size_t at = below(len);
            /* mostly a random byte, sometimes a byte copied from elsewhere */
            b[at] = (unsigned char)(below(4) ? rnd() : b[below(len)]);
        }
        int rc = ps_smap_decode(b, len, &d, why, sizeof why);
        if (rc) {
            CHECK_MSG(rc == PS_EPROTO && why[0], "try %d: rc %d", t, rc);
            refused++;
            continue;
        }
        int ok = ps_smap_encoded_bytes(&d) == len;
        if (ok) {
            ps_smap_encode(&d, again);
            ok = !memcmp(again, b, len);
        }
        ps_smap_free(&d);
        CHECK_MSG(ok, "try %d: decoded but does not encode back", t);
        accepted++;
    }
    free(b);
    free(again);
    free(buf);
    CHECK(accepted > 0 && refused > 0);
}
