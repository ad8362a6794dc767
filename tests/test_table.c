/* The table store (server/table.h) on its own: the initializer against the
 * formula its header documents, every optimizer against the arithmetic
 * written out here (bit for bit: the same float operations in the same
 * order), sync rounds and async pushes, the row cap's exact LRU, the
 * frequency filter, the memory charge, growth to a million rows (the
 * per-row overhead printed as a '#' line), checkpoint views and restores,
 * and bad input. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "table.h"

#define MAXD 8

static ps_table_config config(uint32_t dim, int kind, int init)
{
    ps_table_config c;
    memset(&c, 0, sizeof c);
    c.table = 42;
    c.dim = dim;
    c.init = init;
    c.init_scale = 0.25f;
    c.seed = 7;
    ps_opt_default(&c.opt);
    c.opt.kind = kind;
    c.opt.lr = 0.125f;
    c.max_memory = UINT64_MAX;
    return c;
}

static ps_table *make(const ps_table_config *c)
{
    ps_table *t = NULL;
    char why[256] = "";
    int rc = ps_table_create(c, &t, why, sizeof why);
    if (rc)
        fprintf(stderr, "ps_table_create: %s\n", why);
    return t;
}

/* ---- the initializer as table.h writes it down ---- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}
#define G 0x9e3779b97f4a7c15ull
static uint64_t sm(uint64_t x) { return mix(x + G); }

static float documented(const ps_table_config *c, uint64_t id, size_t i)
{
    uint64_t k = sm(sm(sm(c->seed) ^ c->table) ^ id);
    if (c->init == PS_TABLE_INIT_ZEROS)
        return 0.0f;
    if (c->init == PS_TABLE_INIT_UNIFORM) {
        float f = (float)((int64_t)(sm(k + i * G) >> 40) - 8388608) * 0x1p-23f;
        return c->init_scale * f;
    }
    double u1 = (double)((sm(k + 2 * i * G) >> 11) + 1) * 0x1p-53;
    double u2 = (double)(sm(k + (2 * i + 1) * G) >> 11) * 0x1p-53;
    return (float)((double)c->init_scale * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
}

static int is_documented_row(const ps_table_config *c, uint64_t id, const float *w)
{
    for (size_t i = 0; i < c->dim; i++) {
        float want = documented(c, id, i);
        if (memcmp(&want, &w[i], 4) != 0)
            return 0;
    }
    return 1;
}

PS_TEST(first_touch_rows_are_the_documented_initializer)
{
    const uint64_t ids[5] = {0, 1, 42, 0xdeadbeefcafef00dull, UINT64_MAX};
    for (int init = PS_TABLE_INIT_ZEROS; init <= PS_TABLE_INIT_NORMAL; init++) {
        ps_table_config c = config(7, PS_OPT_SGD, init);
        ps_table *t = make(&c);
        CHECK(t);
        float out[5 * 7];
        CHECK_OK(ps_table_pull(t, ids, 5, out, 5 * 7, NULL, 0));
        for (int r = 0; r < 5; r++)
            CHECK_MSG(is_documented_row(&c, ids[r], out + r * 7), "init %d id %llu", init,
                      (unsigned long long)ids[r]);
        ps_table_destroy(t);
    }
    /* the distributions are what they say: uniform in [-a, a), normal(0, s) */
    ps_table_config c = config(4096, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    static float w[4096];
    ps_table_initial_row(&c, 3, w);
    double lo = 1, hi = -1;
    for (int i = 0; i < 4096; i++) {
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
    }
    CHECK(lo >= -0.25 && hi < 0.25 && lo < -0.24 && hi > 0.24);
    c.init = PS_TABLE_INIT_NORMAL;
    ps_table_initial_row(&c, 3, w);
    double sum = 0, sq = 0;
    for (int i = 0; i < 4096; i++) {
        sum += w[i];
        sq += (double)w[i] * w[i];
    }
    double mean = sum / 4096, sd = sqrt(sq / 4096 - mean * mean);
    CHECK_MSG(fabs(mean) < 0.02 && fabs(sd - 0.25) < 0.02, "mean %g sd %g", mean, sd);
}

/* The header says numpy reproduces the initializer: python/ps/table_init.py,
 * the package's mirror of common/ps_table_row.h, gives the same bits, and
 * the same place hash (Debian's python3-numpy; skipped without it).  The
 * file is loaded alone, so libps is not needed. */
static const char numpy_init[] =
    "import sys, importlib.util\n"
    "try:\n"
    "    import numpy as np\n"
    "except ImportError:\n"
    "    sys.exit(3)\n"
    "spec = importlib.util.spec_from_file_location('table_init', 'python/ps/table_init.py')\n"
    "ti = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(ti)\n"
    "seed, table, dim = (int(a) for a in sys.argv[1:4])\n"
    "for line in sys.stdin:\n"
    "    init, scale, id_ = line.split()\n"
    "    w = ti.initial_rows(seed, table, [int(id_)], dim, init, float(scale))[0]\n"
    "    h = int(ti.row_hash(table, [int(id_)])[0])\n"
    "    print(' '.join('%08x' % v for v in w.view(np.uint32)), '%016x' % h)\n";

PS_TEST(initializer_is_reproduced_bit_for_bit_by_numpy)
{
    char script[512], input[512], cmd[2048];
    if (access("/usr/bin/python3", X_OK) != 0)
        SKIP("no /usr/bin/python3");
    snprintf(script, sizeof script, "%s/init.py", ps_test_tmpdir());
    snprintf(input, sizeof input, "%s/init.in", ps_test_tmpdir());
    FILE *f = fopen(script, "w");
    CHECK(f && fputs(numpy_init, f) >= 0 && fclose(f) == 0);
    ps_table_config c = config(9, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    c.seed = 0xfeedfacecafebeefull;
    c.table = 123456789012345ull;
    const uint64_t ids[4] = {0, 77, 1ull << 63, UINT64_MAX};
    f = fopen(input, "w");
    CHECK(f);
    for (int init = PS_TABLE_INIT_UNIFORM; init <= PS_TABLE_INIT_NORMAL; init++)
        for (int k = 0; k < 4; k++)
            fprintf(f, "%s %.9g %llu\n", init == PS_TABLE_INIT_UNIFORM ? "uniform" : "normal",
                    init == PS_TABLE_INIT_UNIFORM ? 0.05 : 0.3, (unsigned long long)ids[k]);
    CHECK(fclose(f) == 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %llu %llu %u <%s 2>&1", script,
             (unsigned long long)c.seed, (unsigned long long)c.table, c.dim, input);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    char line[256];
    int rows = 0, same = 0;
    for (int init = PS_TABLE_INIT_UNIFORM; init <= PS_TABLE_INIT_NORMAL; init++) {
        c.init = init;
        c.init_scale = init == PS_TABLE_INIT_UNIFORM ? 0.05f : 0.3f;
        for (int k = 0; k < 4 && fgets(line, sizeof line, p); k++) {
            float w[9];
            char want[256], *o = want;
            ps_table_initial_row(&c, ids[k], w);
            for (int i = 0; i < 9; i++) {
                uint32_t u;
                memcpy(&u, &w[i], 4);
                o += sprintf(o, i ? " %08x" : "%08x", u);
            }
            sprintf(o, " %016llx", (unsigned long long)ps_table_row_hash(c.table, ids[k]));
            rows++;
            line[strcspn(line, "\n")] = 0;
            same += strcmp(line, want) == 0;
            if (strcmp(line, want) != 0)
                fprintf(stderr, "numpy: %s\nours:  %s\n", line, want);
        }
    }
    int st = pclose(p);
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 3)
        SKIP("no numpy for /usr/bin/python3");
    CHECK_MSG(st == 0 && rows == 8, "python3 exit status %d, %d rows (%s)", st, rows, line);
    CHECK_EQ_INT(same, 8);
}

/* What a server checks of a table request's ids: each a row of the
 * partition, and of the server, it was sent to (the placement of
 * ps_table_row.h). */
PS_TEST(misplaced_finds_the_first_id_of_another_server_or_partition)
{
    enum { S = 3, P = 4, N = 64 };
    uint64_t ids[N];
    size_t n = 0;
    /* ids of server 1, partition 2 */
    for (uint64_t id = 0; n < N; id++) {
        uint64_t h = ps_table_row_hash(9, id);
        if (ps_table_row_server(h, S) == 1 && ps_table_row_part(h, S, P) == 2)
            ids[n++] = id;
    }
    CHECK_EQ_INT(ps_table_row_misplaced(9, ids, N, 1, S, 2, P), N);
    CHECK_EQ_INT(ps_table_row_misplaced(9, ids, N, 0, S, 2, P), 0); /* another server */
    CHECK_EQ_INT(ps_table_row_misplaced(9, ids, N, 1, S, 3, P), 0); /* another partition */
    CHECK_EQ_INT(ps_table_row_misplaced(8, ids, N, 1, S, 2, P) < N, 1); /* another table */
    CHECK_EQ_INT(ps_table_row_misplaced(9, ids, 0, 0, S, 0, P), 0);
    /* one id of another server among them: found where it is */
    uint64_t other = 0;
    while (ps_table_row_server(ps_table_row_hash(9, other), S) == 1)
        other++;
    ids[37] = other;
    CHECK_EQ_INT(ps_table_row_misplaced(9, ids, N, 1, S, 2, P), 37);
}

PS_TEST(rows_are_equal_across_stores_and_insertion_orders)
{
    ps_table_config c = config(5, PS_OPT_ADAGRAD, PS_TABLE_INIT_NORMAL);
    ps_table *a = make(&c), *b = make(&c);
    CHECK(a && b);
    enum { N = 300 };
    uint64_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = sm((uint64_t)i);
    float out[N * 5];
    /* a: one id at a time, forwards; b: backwards in one pull */
    for (int i = 0; i < N; i++)
        CHECK_OK(ps_table_pull(a, &ids[i], 1, out, 5, NULL, 0));
    uint64_t rev[N];
    for (int i = 0; i < N; i++)
        rev[i] = ids[N - 1 - i];
    CHECK_OK(ps_table_pull(b, rev, N, out, N * 5, NULL, 0));
    for (int i = 0; i < N; i++) {
        ps_table_row_view va, vb;
        CHECK(ps_table_get_row(a, ids[i], &va) && ps_table_get_row(b, ids[i], &vb));
        CHECK(memcmp(va.w, vb.w, 5 * sizeof(float)) == 0);
        CHECK(is_documented_row(&c, ids[i], va.w));
    }
    /* another seed or another table gives other rows */
    float w0[5], w1[5];
    ps_table_initial_row(&c, ids[0], w0);
    c.seed++;
    ps_table_initial_row(&c, ids[0], w1);
    CHECK(memcmp(w0, w1, sizeof w0) != 0);
    c.seed--;
    c.table++;
    ps_table_initial_row(&c, ids[0], w1);
    CHECK(memcmp(w0, w1, sizeof w0) != 0);
    ps_table_destroy(a);
    ps_table_destroy(b);
}

/* ---- optimizers: each row against the arithmetic written out ---- */

typedef struct refrow {
    float w[MAXD], s0[MAXD], s1[MAXD];
    int64_t t; /* the row's updates */
} refrow;

/* One update of r with gradient g, as server/optimizer.c and
 * server/table_opt.c compute it (torch's steps: float, same operations, same
 * order, fmaf where torch fuses). */
static void ref_update(const ps_table_config *c, refrow *r, const float *g, float lr)
{
    const ps_opt_config *o = &c->opt;
    float wd = o->weight_decay, mu = o->momentum;
    r->t++;
    double b1 = ps_opt_decimal(o->beta1), b2 = ps_opt_decimal(o->beta2);
    float step = (float)-(ps_opt_decimal(lr) / (1.0 - pow(b1, (double)r->t)));
    float bc2s = (float)sqrt(1.0 - pow(b2, (double)r->t));
    if (o->kind == PS_TABLE_OPT_ROWWISE_ADAGRAD) {
        /* FBGEMM's EXACT_ROWWISE_ADAGRAD (weight_decay_mode 1): the mean of
         * the squared (decayed) gradient, summed in order, into one float */
        float sq = 0.0f;
        for (uint32_t i = 0; i < c->dim; i++) {
            float gp = g[i] + wd * r->w[i];
            sq += gp * gp;
        }
        r->s0[0] = r->s0[0] + sq / (float)c->dim;
        float mult = lr / (sqrtf(r->s0[0]) + o->eps), corr = 1.0f - mult * wd;
        for (uint32_t i = 0; i < c->dim; i++)
            r->w[i] = corr * r->w[i] - g[i] * mult;
        return;
    }
    for (uint32_t i = 0; i < c->dim; i++) {
        float w = r->w[i], gp = wd != 0 ? fmaf(w, wd, g[i]) : g[i];
        switch (o->kind) {
        case PS_OPT_SGD: r->w[i] = fmaf(gp, -lr, w); break;
        case PS_OPT_MOMENTUM:
            r->s0[i] = r->s0[i] * mu + gp;
            r->w[i] = fmaf(r->s0[i], -lr, w);
            break;
        case PS_OPT_NESTEROV:
            r->s0[i] = r->s0[i] * mu + gp;
            r->w[i] = fmaf(fmaf(r->s0[i], mu, gp), -lr, w);
            break;
        case PS_OPT_ADAGRAD:
            r->s0[i] = fmaf(gp, gp, r->s0[i]);
            r->w[i] = w + (-lr * gp) / (sqrtf(r->s0[i]) + o->eps);
            break;
        case PS_OPT_ADAM:
            r->s0[i] = fmaf(gp, (float)(1.0 - b1), r->s0[i] * o->beta1);
            r->s1[i] = fmaf((float)(1.0 - b2) * gp, gp, r->s1[i] * o->beta2);
            r->w[i] = w + (step * r->s0[i]) / (sqrtf(r->s1[i]) / bc2s + o->eps);
            break;
        case PS_TABLE_OPT_FTRL: { /* no torch optimizer: table_opt.c's own sums */
            gp = g[i] + wd * w;
            float n1 = r->s1[i] + gp * gp;
            float sigma = (sqrtf(n1) - sqrtf(r->s1[i])) / lr;
            r->s0[i] = r->s0[i] + gp - sigma * w;
            r->s1[i] = n1;
            float z = r->s0[i];
            r->w[i] = fabsf(z) <= c->ftrl_l1
                          ? 0.0f
                          : -(z - copysignf(c->ftrl_l1, z)) / ((c->ftrl_beta + sqrtf(n1)) / lr +
                                                                c->ftrl_l2);
            break;
        }
        }
    }
}

static int row_is(const ps_table *t, uint64_t id, const refrow *r, int nstate)
{
    ps_table_row_view v;
    size_t b = ps_table_get_config(t)->dim * sizeof(float);
    if (!ps_table_get_row(t, id, &v) || memcmp(v.w, r->w, b) != 0)
        return 0;
    size_t sb = v.state_len * sizeof(float); /* row-wise adagrad: one float */
    if ((nstate >= 1 && memcmp(v.state[0], r->s0, sb) != 0) ||
        (nstate >= 2 && memcmp(v.state[1], r->s1, sb) != 0))
        return 0;
    return ps_table_get_config(t)->opt.kind != PS_OPT_ADAM || v.count == (uint32_t)r->t;
}

static float grad(int step, int row, int i) { return 0.37f * (float)(step + 1) - 0.11f * (float)(row * 5 + i); }

/* Three ids; async pushes {0, 1}, {0}, {0, 2}: row 0 has 3 updates, rows 1
 * and 2 one each, at table versions 1 and 3 (lazy adam: t is the row's). */
static int check_kind(int kind, float wd, char *what, size_t len)
{
    ps_table_config c = config(5, kind, PS_TABLE_INIT_UNIFORM);
    c.opt.weight_decay = wd;
    c.opt.lr_decay = 0.5f; /* the rate of update t: lr * 0.5^floor((t-1)/2) */
    c.opt.lr_decay_every = 2;
    c.ftrl_beta = 1.0f;
    c.ftrl_l1 = 0.3f;
    c.ftrl_l2 = 0.01f;
    ps_table *t = make(&c);
    if (!t)
        return snprintf(what, len, "create"), 0;
    int nstate = ps_table_state_arrays(kind);
    const uint64_t ids[3] = {1001, 7, 99999};
    refrow r[3];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 3; k++)
        ps_table_initial_row(&c, ids[k], r[k].w);
    const int push[3][2] = {{0, 1}, {0, -1}, {0, 2}};
    for (int step = 0; step < 3; step++) {
        uint64_t pid[2];
        float g[2 * 5];
        size_t n = 0;
        for (int j = 0; j < 2; j++) {
            int k = push[step][j];
            if (k < 0)
                continue;
            pid[n] = ids[k];
            for (int i = 0; i < 5; i++)
                g[n * 5 + i] = grad(step, k, i);
            ref_update(&c, &r[k], g + n * 5, ps_opt_lr_at(&c.opt, step + 1));
            n++;
        }
        if (ps_table_push(t, pid, n, g, n * 5, 1, NULL, 0) != 0)
            return snprintf(what, len, "push %d", step), 0;
        for (int k = 0; k < 3; k++)
            if (r[k].t && !row_is(t, ids[k], &r[k], nstate))
                return snprintf(what, len, "%s wd %g: row %d after step %d",
                                ps_table_opt_name(kind), (double)wd, k, step), 0;
    }
    if (ps_table_version(t) != 3)
        return snprintf(what, len, "version %lld", (long long)ps_table_version(t)), 0;
    ps_table_destroy(t);
    return 1;
}

PS_TEST(every_optimizer_matches_its_arithmetic_per_row_with_lazy_adam_t)
{
    const int kinds[7] = {PS_OPT_SGD,  PS_OPT_MOMENTUM,   PS_OPT_NESTEROV,
                          PS_OPT_ADAGRAD, PS_OPT_ADAM, PS_TABLE_OPT_FTRL,
                          PS_TABLE_OPT_ROWWISE_ADAGRAD};
    char what[128] = "";
    for (int k = 0; k < 7; k++) {
        CHECK_MSG(check_kind(kinds[k], 0.0f, what, sizeof what), "%s", what);
        CHECK_MSG(check_kind(kinds[k], 0.01f, what, sizeof what), "%s", what);
    }
}

PS_TEST(ftrl_l1_makes_exact_zeros)
{
    ps_table_config c = config(4, PS_TABLE_OPT_FTRL, PS_TABLE_INIT_UNIFORM);
    c.ftrl_beta = 1.0f;
    c.ftrl_l1 = 0.5f;
    uint64_t id = 5;
    float g[4] = {0.1f, -0.2f, 3.0f, -4.0f}, out[4];
    ps_table *t = make(&c);
    CHECK(t);
    CHECK_OK(ps_table_push(t, &id, 1, g, 4, 1, NULL, 0));
    CHECK_OK(ps_table_pull(t, &id, 1, out, 4, NULL, 0));
    /* |z| = |g - sqrt(g^2)/lr * w0| <= 0.5 for the small gradients */
    CHECK(out[0] == 0.0f && out[1] == 0.0f && out[2] < 0.0f && out[3] > 0.0f);
    ps_table_destroy(t);
}

/* ---- sync rounds ---- */

PS_TEST(sync_round_sums_in_rank_order_and_divides_by_contributors)
{
    ps_table_config c = config(2, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    c.opt.lr = 0.5f;
    ps_table *t = make(&c), *t2 = make(&c);
    CHECK(t && t2);
    /* rows 1..4 pulled; row 5 only pushed (created by the round) */
    const uint64_t pulled[4] = {1, 2, 3, 4};
    float out[8], w0[6][2];
    CHECK_OK(ps_table_pull(t, pulled, 4, out, 8, NULL, 0));
    CHECK_OK(ps_table_pull(t2, pulled, 4, out, 8, NULL, 0));
    for (int k = 1; k <= 5; k++)
        ps_table_initial_row(&c, (uint64_t)k, w0[k]);
    /* row 2 gets 2^24, 1, 1 from ranks 0, 1, 2: in rank order the ones are
     * lost ((2^24 + 1) + 1 = 2^24), in another order they are not */
    const float a = 16777216.0f, b = 1.0f;
    CHECK(a + b + b != a + (b + b));
    const uint64_t id0[3] = {1, 2, 3}, id1[1] = {2}, id2[3] = {3, 2, 5};
    const float g0[6] = {5.0f, -1.5f, a, 3.0f, 0.25f, 0.75f};
    const float g1[2] = {b, -2.0f};
    const float g2[6] = {1.25f, -0.5f, b, 7.0f, 7.0f, -3.0f};
    /* a division, as shard.c: multiplying by 1/3 would give other bits */
    CHECK(g0[0] / 3.0f != g0[0] * (1.0f / 3.0f));
    char why[256] = "";
    for (int k = 0; k < 2; k++) {
        ps_table *x = k ? t2 : t;
        CHECK_OK(ps_table_round_add(x, 0, id0, 3, g0, 6, why, sizeof why));
        CHECK_OK(ps_table_round_add(x, 1, id1, 1, g1, 2, why, sizeof why));
        /* out of rank order: refused, nothing added */
        CHECK_EQ_INT(ps_table_round_add(x, 1, id1, 1, g1, 2, why, sizeof why), PS_ESTATE);
        CHECK_MSG(strstr(why, "rank order"), "message: %s", why);
        CHECK_OK(ps_table_round_add(x, 2, id2, 3, g2, 6, why, sizeof why));
        CHECK_EQ_INT(ps_table_round_contributors(x, NULL), 3);
        ps_table_round_finish(x);
    }
    /* the same arithmetic written out: sums in rank order, / 3 contributors */
    float want[6][2];
    memcpy(want, w0, sizeof want);
    float s1[2] = {g0[0] / 3.0f, g0[1] / 3.0f};
    float s2[2] = {((g0[2] + g1[0]) + g2[2]) / 3.0f, ((g0[3] + g1[1]) + g2[3]) / 3.0f};
    float s3[2] = {(g0[4] + g2[0]) / 3.0f, (g0[5] + g2[1]) / 3.0f};
    float s5[2] = {g2[4] / 3.0f, g2[5] / 3.0f};
    float *sums[6] = {NULL, s1, s2, s3, NULL, s5};
    for (int k = 1; k <= 5; k++)
        for (int i = 0; sums[k] && i < 2; i++)
            want[k][i] = w0[k][i] - 0.5f * (sums[k][i] + 0.0f * w0[k][i]);
    for (int k = 1; k <= 5; k++) {
        ps_table_row_view v, v2;
        CHECK_MSG(ps_table_get_row(t, (uint64_t)k, &v) && ps_table_get_row(t2, (uint64_t)k, &v2),
                  "row %d", k);
        CHECK_MSG(memcmp(v.w, want[k], sizeof want[k]) == 0, "row %d: %.9g %.9g, want %.9g %.9g",
                  k, (double)v.w[0], (double)v.w[1], (double)want[k][0], (double)want[k][1]);
        CHECK(memcmp(v.w, v2.w, sizeof want[k]) == 0); /* bitwise repeatable */
    }
    CHECK(memcmp(want[4], w0[4], sizeof w0[4]) == 0); /* untouched row 4 unchanged */
    CHECK_EQ_INT(ps_table_version(t), 1);
    /* a round where ranks 0 and 2 touch nothing still divides by 3; one
     * where rank 1 is gone divides by 2 */
    ps_table_row_view v;
    CHECK(ps_table_get_row(t, 4, &v));
    float before = v.w[0];
    const uint64_t four = 4;
    const float g4[2] = {0.75f, 0.0f};
    CHECK_OK(ps_table_round_add(t, 0, NULL, 0, NULL, 0, NULL, 0));
    CHECK_OK(ps_table_round_add(t, 1, &four, 1, g4, 2, NULL, 0));
    CHECK_OK(ps_table_round_add(t, 2, NULL, 0, NULL, 0, NULL, 0));
    ps_table_round_finish(t);
    CHECK(ps_table_get_row(t, 4, &v));
    float after = before - 0.5f * (g4[0] / 3.0f + 0.0f * before);
    CHECK(memcmp(&v.w[0], &after, 4) == 0);
    before = after;
    CHECK_OK(ps_table_round_add(t, 0, &four, 1, g4, 2, NULL, 0));
    CHECK_OK(ps_table_round_add(t, 2, NULL, 0, NULL, 0, NULL, 0));
    ps_table_round_finish(t);
    CHECK(ps_table_get_row(t, 4, &v));
    after = before - 0.5f * (g4[0] / 2.0f + 0.0f * before);
    CHECK(memcmp(&v.w[0], &after, 4) == 0);
    /* a round nobody pushed to changes nothing */
    ps_table_round_finish(t);
    CHECK_EQ_INT(ps_table_version(t), 3);
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rounds, 3);
    CHECK_EQ_INT(st.rows, 5);
    ps_table_destroy(t);
    ps_table_destroy(t2);
}

PS_TEST(async_push_applies_on_arrival_and_takes_the_mean_of_summed_pushes)
{
    ps_table_config c = config(3, PS_OPT_ADAM, PS_TABLE_INIT_ZEROS);
    ps_table *t = make(&c);
    CHECK(t);
    const uint64_t id = 77; /* never pulled: the push creates it */
    const float g[3] = {0.3f, -0.6f, 0.9f};
    refrow r;
    memset(&r, 0, sizeof r);
    CHECK_OK(ps_table_push(t, &id, 1, g, 3, 1, NULL, 0));
    ref_update(&c, &r, g, c.opt.lr);
    CHECK(row_is(t, id, &r, 2));
    /* a push that sums 4 gradients: their mean, 4 updates of the row */
    CHECK_OK(ps_table_push(t, &id, 1, g, 3, 4, NULL, 0));
    float mean[3];
    for (int i = 0; i < 3; i++)
        mean[i] = g[i] * (1.0f / 4.0f);
    r.t += 3; /* ref_update adds the fourth */
    ref_update(&c, &r, mean, c.opt.lr);
    CHECK(row_is(t, id, &r, 2));
    CHECK_EQ_INT(r.t, 5);
    CHECK_EQ_INT(ps_table_version(t), 5);
    char why[256] = "";
    CHECK_EQ_INT(ps_table_push(t, &id, 1, g, 3, 0, why, sizeof why), PS_EPROTO);
    ps_table_destroy(t);
}

/* ---- the row cap ---- */

static void collect_ids(void *arg, const ps_table_row_view *v)
{
    uint64_t **p = arg;
    *(*p)++ = v->id;
}

PS_TEST(row_cap_evicts_the_least_recently_touched_row_exactly)
{
    ps_table_config c = config(2, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    c.max_rows = 3;
    ps_table *t = make(&c);
    CHECK(t);
    float out[6], g[2] = {1.0f, 1.0f};
    const uint64_t abc[3] = {1, 2, 3}, one = 1, two = 2, four = 4, five = 5;
    CHECK_OK(ps_table_pull(t, abc, 3, out, 6, NULL, 0)); /* order 1 2 3 */
    CHECK_OK(ps_table_pull(t, &one, 1, out, 2, NULL, 0)); /* 2 3 1 */
    CHECK_OK(ps_table_push(t, &two, 1, g, 2, 1, NULL, 0)); /* 3 1 2 */
    CHECK_OK(ps_table_pull(t, &four, 1, out, 2, NULL, 0)); /* evicts 3: 1 2 4 */
    ps_table_row_view v;
    CHECK(!ps_table_get_row(t, 3, &v));
    CHECK(ps_table_get_row(t, 1, &v) && ps_table_get_row(t, 2, &v) && ps_table_get_row(t, 4, &v));
    CHECK_OK(ps_table_pull(t, &five, 1, out, 2, NULL, 0)); /* evicts 1: 2 4 5 */
    CHECK(!ps_table_get_row(t, 1, &v));
    uint64_t order[3], *p = order;
    ps_table_foreach(t, PS_TABLE_ROWS_ALL, collect_ids, &p);
    CHECK(p == order + 3 && order[0] == 2 && order[1] == 4 && order[2] == 5);
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.evicted, 2);
    CHECK_EQ_INT(st.rows, 3);
    /* an evicted row comes back as new: the initializer's values */
    CHECK_OK(ps_table_pull(t, &one, 1, out, 2, NULL, 0));
    CHECK(is_documented_row(&c, 1, out));
    ps_table_destroy(t);
}

/* Many rows through a small cap against an LRU list kept here: the rows
 * that exist, and their order, are exactly the reference's. */
PS_TEST(row_cap_keeps_exact_lru_under_churn)
{
    enum { CAP = 500, IDS = 3000, BATCH = 64, ROUNDS = 200 };
    ps_table_config c = config(3, PS_OPT_ADAGRAD, PS_TABLE_INIT_UNIFORM);
    c.max_rows = CAP;
    ps_table *t = make(&c);
    CHECK(t);
    static uint64_t lru[CAP + 1]; /* least recent first */
    int nl = 0;
    uint64_t x = 1, evictions = 0;
    uint64_t ids[BATCH];
    float buf[BATCH * 3];
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < BATCH; i++) {
            x = sm(x);
            ids[i] = (x % IDS) * 0x10001ull; /* repeats, across and within batches */
            buf[i * 3] = buf[i * 3 + 1] = buf[i * 3 + 2] = 0.01f;
        }
        if (r % 3 == 2)
            CHECK_OK(ps_table_push(t, ids, BATCH, buf, BATCH * 3, 1, NULL, 0));
        else
            CHECK_OK(ps_table_pull(t, ids, BATCH, buf, BATCH * 3, NULL, 0));
        for (int i = 0; i < BATCH; i++) {
            int k = 0;
            while (k < nl && lru[k] != ids[i])
                k++;
            if (k == nl && nl == CAP) { /* evict the least recent */
                memmove(lru, lru + 1, (CAP - 1) * sizeof *lru);
                nl--;
                k = nl;
                evictions++;
            } else if (k < nl) {
                memmove(lru + k, lru + k + 1, (size_t)(nl - k - 1) * sizeof *lru);
                nl--;
            }
            lru[nl++] = ids[i];
        }
    }
    static uint64_t got[CAP];
    uint64_t *p = got;
    ps_table_foreach(t, PS_TABLE_ROWS_ALL, collect_ids, &p);
    CHECK_EQ_INT(p - got, nl);
    for (int k = 0; k < nl; k++)
        CHECK_MSG(got[k] == lru[k], "position %d: %llu, want %llu", k,
                  (unsigned long long)got[k], (unsigned long long)lru[k]);
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.evicted, evictions);
    CHECK(evictions > 1000);
    /* every row is found through the hash after all those deletions */
    ps_table_row_view v;
    for (int k = 0; k < nl; k++)
        CHECK(ps_table_get_row(t, lru[k], &v) && v.id == lru[k]);
    ps_table_destroy(t);
}

/* ---- the frequency filter ---- */

PS_TEST(frequency_filter_creates_a_row_at_the_nth_sighting)
{
    ps_table_config c = config(4, PS_OPT_SGD, PS_TABLE_INIT_NORMAL);
    c.min_count = 3;
    c.filter_cells = 1024;
    ps_table *t = make(&c);
    CHECK(t);
    const uint64_t id = 12345;
    const float g[4] = {1, 2, 3, 4};
    float out[4];
    ps_table_row_view v;
    for (int seen = 1; seen <= 2; seen++) {
        CHECK_OK(ps_table_pull(t, &id, 1, out, 4, NULL, 0));
        CHECK(is_documented_row(&c, id, out));
        CHECK(!ps_table_get_row(t, id, &v));
        CHECK_OK(ps_table_push(t, &id, 1, g, 4, 1, NULL, 0)); /* dropped */
        CHECK(!ps_table_get_row(t, id, &v));
    }
    /* a sync round drops it too */
    CHECK_OK(ps_table_round_add(t, 0, &id, 1, g, 4, NULL, 0));
    ps_table_round_finish(t);
    CHECK(!ps_table_get_row(t, id, &v));
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.filtered_pulls, 2);
    CHECK_EQ_INT(st.filtered_pushes, 3);
    CHECK_EQ_INT(st.rows, 0);
    /* the third sighting creates it, with the initializer's values */
    CHECK_OK(ps_table_pull(t, &id, 1, out, 4, NULL, 0));
    CHECK(is_documented_row(&c, id, out));
    CHECK(ps_table_get_row(t, id, &v) && is_documented_row(&c, id, v.w));
    CHECK_OK(ps_table_push(t, &id, 1, g, 4, 1, NULL, 0));
    CHECK(ps_table_get_row(t, id, &v) && v.w[0] == out[0] - c.opt.lr * g[0]);
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rows, 1);
    CHECK_EQ_INT(st.filtered_pulls, 2);
    CHECK_EQ_INT(st.filtered_pushes, 3);
    /* the cells are what a checkpoint keeps; another table takes them back */
    size_t n;
    const uint8_t *cells = ps_table_filter_cells(t, &n);
    CHECK(cells && n == 1024);
    ps_table *u = make(&c);
    CHECK(u);
    CHECK_OK(ps_table_restore_filter(u, cells, n, NULL, 0));
    CHECK_OK(ps_table_pull(u, &id, 1, out, 4, NULL, 0)); /* its 4th sighting */
    CHECK(ps_table_get_row(u, id, &v));
    char why[256] = "";
    CHECK_EQ_INT(ps_table_restore_filter(u, cells, 1000, why, sizeof why), PS_EMISMATCH);
    CHECK_MSG(strstr(why, "1024"), "message: %s", why);
    ps_table_destroy(u);
    ps_table_destroy(t);
}

/* ---- memory ---- */

PS_TEST(memory_charge_refused_past_the_limit_changes_nothing)
{
    _Atomic uint64_t used;
    atomic_init(&used, 1000); /* someone else's charge */
    ps_table_config c = config(8, PS_OPT_ADAGRAD, PS_TABLE_INIT_UNIFORM);
    c.mem_used = &used;
    c.max_memory = 200000;
    c.min_count = 2;
    c.filter_cells = 4096;
    ps_table *t = make(&c);
    CHECK(t);
    enum { N = 4000 };
    static uint64_t ids[N];
    static float out[N * 8];
    for (int i = 0; i < N; i++)
        ids[i] = (uint64_t)i * 7919;
    for (int k = 0; k < 2; k++) /* 100 rows (admitted at the second pull) */
        CHECK_OK(ps_table_pull(t, ids, 100, out, 100 * 8, NULL, 0));
    ps_table_counts a, b;
    ps_table_stats(t, &a);
    CHECK_EQ_INT(a.rows, 100);
    CHECK_EQ_INT(atomic_load(&used), 1000 + a.bytes);
    size_t n;
    static uint8_t cells[4096];
    memcpy(cells, ps_table_filter_cells(t, &n), sizeof cells);
    /* 4000 rows of 64 bytes do not fit in 200000 */
    char why[256] = "";
    CHECK_EQ_INT(ps_table_pull(t, ids, N, out, N * 8, why, sizeof why), PS_ETOOBIG);
    CHECK_MSG(strstr(why, "--max-memory"), "message: %s", why);
    /* the same through an async push and a round */
    static float g[N * 8];
    CHECK_EQ_INT(ps_table_push(t, ids, N, g, N * 8, 1, NULL, 0), PS_ETOOBIG);
    CHECK_EQ_INT(ps_table_round_add(t, 0, ids, N, g, N * 8, NULL, 0), PS_ETOOBIG);
    CHECK_EQ_INT(ps_table_round_contributors(t, NULL), 0);
    ps_table_stats(t, &b);
    a.lookups = b.lookups; /* the lookups that found the request too large */
    a.probes = b.probes;
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(memcmp(cells, ps_table_filter_cells(t, &n), sizeof cells) == 0);
    CHECK_EQ_INT(atomic_load(&used), 1000 + b.bytes);
    CHECK_EQ_INT(ps_table_version(t), 0);
    /* what fits still goes */
    CHECK_OK(ps_table_pull(t, ids + 100, 50, out, 50 * 8, NULL, 0));
    ps_table_destroy(t);
    CHECK_EQ_INT(atomic_load(&used), 1000);
}

PS_TEST(growth_to_a_million_rows_and_the_overhead_per_row)
{
    enum { ROWS = 1000000, BATCH = 4096 };
    ps_table_config c = config(16, PS_OPT_ADAGRAD, PS_TABLE_INIT_UNIFORM);
    ps_table *t = make(&c);
    CHECK(t);
    static uint64_t ids[BATCH];
    static float out[BATCH * 16];
    uint64_t x = 99;
    for (int done = 0; done < ROWS; done += BATCH) {
        int n = ROWS - done < BATCH ? ROWS - done : BATCH;
        for (int i = 0; i < n; i++)
            ids[i] = sm(x++); /* distinct: sm is a bijection */
        CHECK_OK(ps_table_pull(t, ids, (size_t)n, out, (size_t)n * 16, NULL, 0));
    }
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rows, ROWS);
    CHECK_EQ_INT(st.created, ROWS);
    ps_table_row_view v;
    for (uint64_t y = 99; y < 99 + ROWS; y += 9973)
        CHECK(ps_table_get_row(t, sm(y), &v) && is_documented_row(&c, sm(y), v.w));
    /* the goal: at most 16 bytes a row beyond its values and state, by
     * design the id (8) and the hash (4 bytes per entry, 1/2 to 3/4 full);
     * besides, the last slab's free rows and the table's fixed part */
    double rows = (double)st.rows, row = (double)ps_table_row_bytes(t);
    double per = ((double)st.bytes - rows * row) / rows;
    double hash = 4.0 * (double)st.hash_entries / rows;
    double slack = (double)(st.slots - st.rows) * (8 + row) / rows;
    printf("# table of %llu rows, dim 16, adagrad: %.2f bytes per row beyond its %.0f bytes of "
           "values and state: id 8, hash %.2f, free rows of the last slab %.2f, the rest %.2f; "
           "%.2f probes per lookup (most of them inserting)\n", (unsigned long long)st.rows, per,
           row, hash, slack, per - 8 - hash - slack, (double)st.probes / (double)st.lookups);
    CHECK_MSG(8 + hash <= 16.0, "id and hash: %.2f bytes per row", 8 + hash);
    CHECK_MSG(per <= 8 + hash + slack + 0.1, "%.2f bytes per row", per);
    ps_table_destroy(t);
}

PS_TEST(rowwise_adagrad_keeps_one_state_float_a_row)
{
    /* the goal: (dim + 1) floats and at most 16 bytes a row (id and hash),
     * besides the last slab's free rows */
    enum { ROWS = 200000, BATCH = 4096, D = 16 };
    ps_table_config c = config(D, PS_TABLE_OPT_ROWWISE_ADAGRAD, PS_TABLE_INIT_UNIFORM);
    ps_table *t = make(&c);
    CHECK(t);
    CHECK_EQ_INT(ps_table_row_bytes(t), 4 * (D + 1));
    static uint64_t ids[BATCH];
    static float out[BATCH * D];
    uint64_t x = 7;
    for (int done = 0; done < ROWS; done += BATCH) {
        int n = ROWS - done < BATCH ? ROWS - done : BATCH;
        for (int i = 0; i < n; i++)
            ids[i] = sm(x++);
        CHECK_OK(ps_table_pull(t, ids, (size_t)n, out, (size_t)n * D, NULL, 0));
    }
    ps_table_counts st;
    ps_table_stats(t, &st);
    double rows = (double)st.rows;
    double slack = (double)(st.slots - st.rows) * (8 + 4 * (D + 1)) / rows;
    double per = (double)st.bytes / rows - slack;
    printf("# row-wise adagrad, dim %d: %.2f bytes a row (values and state %d, the last slab's "
           "free rows %.2f more)\n", D, per, 4 * (D + 1), slack);
    CHECK_MSG(per <= 4.0 * (D + 1) + 16 + 0.1, "%.2f bytes a row", per);
    /* a view's state is the one float, zero until the row's first update */
    ps_table_row_view v;
    CHECK(ps_table_get_row(t, ids[0], &v));
    CHECK_EQ_INT(v.nstate, 1);
    CHECK_EQ_INT(v.state_len, 1);
    CHECK(v.state[0][0] == 0.0f);
    ps_table_destroy(t);
}

/* Row-wise adagrad's results are checked as every table optimizer's
 * (cfg.guard): a gradient whose squares overflow would make the row's one
 * state float Inf (and freeze the row: r = lr / Inf); the row and its state
 * keep their old values instead, counted as dim values kept.  Without the
 * guard the state becomes Inf, as computed.  A finite update after it is
 * exactly the kernel's. */
PS_TEST(rowwise_adagrad_results_that_are_not_finite_keep_the_row_and_its_state)
{
    enum { D = 8 };
    for (int guard = 0; guard < 2; guard++) {
        ps_table_config c = config(D, PS_TABLE_OPT_ROWWISE_ADAGRAD, PS_TABLE_INIT_UNIFORM);
        c.guard = guard;
        ps_table *t = make(&c);
        CHECK(t);
        uint64_t id = 77;
        float w0[D], g[D], w[D];
        CHECK_OK(ps_table_pull(t, &id, 1, w0, D, NULL, 0));
        for (int k = 0; k < D; k++)
            g[k] = 1e20f; /* finite; its square is not */
        CHECK_OK(ps_table_push(t, &id, 1, g, D, 1, NULL, 0));
        ps_table_row_view v;
        CHECK(ps_table_get_row(t, id, &v));
        ps_table_nonfinite nf;
        ps_table_take_nonfinite(t, &nf);
        if (guard) {
            CHECK(memcmp(v.w, w0, sizeof w0) == 0);
            CHECK(v.state[0][0] == 0.0f);
            CHECK_EQ_INT(nf.rows, 1);
            CHECK_EQ_INT(nf.values, D);
            CHECK_EQ_INT(nf.id, id);
        } else {
            CHECK(isinf(v.state[0][0]));
            CHECK_EQ_INT(nf.rows, 0);
        }
        if (guard) {
            /* a finite gradient then: the kernel's update from the old row */
            float m = 0.0f;
            memcpy(w, w0, sizeof w);
            for (int k = 0; k < D; k++)
                g[k] = 0.5f - 0.125f * (float)k;
            ps_table_rowwise_adagrad(w, &m, g, D, c.opt.lr, c.opt.eps, c.opt.weight_decay);
            CHECK_OK(ps_table_push(t, &id, 1, g, D, 1, NULL, 0));
            CHECK(ps_table_get_row(t, id, &v));
            CHECK(memcmp(v.w, w, sizeof w) == 0);
            CHECK(v.state[0][0] == m);
            ps_table_take_nonfinite(t, &nf);
            CHECK_EQ_INT(nf.rows, 0);
        }
        ps_table_destroy(t);
    }
}

/* A row-wise adagrad row is charged to its worker at its real size: one
 * state float, not dim of them (adagrad's). */
PS_TEST(rowwise_adagrad_rows_are_charged_at_their_size)
{
    enum { D = 16 };
    uint64_t cost[2];
    int kinds[2] = {PS_OPT_ADAGRAD, PS_TABLE_OPT_ROWWISE_ADAGRAD};
    for (int k = 0; k < 2; k++) {
        static _Atomic uint64_t wm[1];
        atomic_init(&wm[0], 0);
        ps_table_config c = config(D, kinds[k], PS_TABLE_INIT_UNIFORM);
        c.worker_mem = wm;
        c.num_workers = 1;
        c.worker_share = UINT64_MAX;
        ps_table *t = make(&c);
        CHECK(t);
        uint64_t id = 5;
        float out[D];
        ps_table_set_maker(t, 0);
        CHECK_OK(ps_table_pull(t, &id, 1, out, D, NULL, 0));
        cost[k] = atomic_load(&wm[0]);
        ps_table_destroy(t);
    }
    CHECK_MSG(cost[1] >= 8 + 4 * (D + 1), "%llu", (unsigned long long)cost[1]);
    CHECK_MSG(cost[0] - cost[1] == 4 * (D - 1), "adagrad %llu, row-wise %llu bytes a row",
              (unsigned long long)cost[0], (unsigned long long)cost[1]);
}

/* Rows a SASSIGN makes are charged to the worker that sent it, as a pull's;
 * past its share it is refused and changes nothing. */
PS_TEST(assigned_rows_are_charged_to_their_worker_within_its_share)
{
    enum { D = 4 };
    static _Atomic uint64_t wm[2];
    atomic_init(&wm[0], 0);
    atomic_init(&wm[1], 0);
    ps_table_config c = config(D, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    c.worker_mem = wm;
    c.num_workers = 2;
    c.worker_share = UINT64_MAX;
    ps_table *t = make(&c);
    CHECK(t);
    uint64_t ids[4] = {10, 11, 12, 13};
    float rows[4 * D], out[4 * D];
    for (int i = 0; i < 4 * D; i++)
        rows[i] = (float)i;
    ps_table_set_maker(t, 1);
    CHECK_OK(ps_table_assign(t, ids, 1, rows, D, NULL, 0));
    uint64_t cost = atomic_load(&wm[1]);
    CHECK(cost >= 8 + 4 * D);
    CHECK_EQ_INT(atomic_load(&wm[0]), 0);
    ps_table_destroy(t);
    atomic_store(&wm[1], 0);

    c.worker_share = 2 * cost;
    t = make(&c);
    ps_table_set_maker(t, 1);
    CHECK_OK(ps_table_assign(t, ids, 2, rows, 2 * D, NULL, 0));
    CHECK_EQ_INT(atomic_load(&wm[1]), 2 * cost);
    char why[256] = "";
    CHECK_EQ_INT(ps_table_assign(t, ids + 2, 2, rows + 2 * D, 2 * D, why, sizeof why),
                 PS_ETOOBIG);
    CHECK_MSG(strstr(why, "worker 1's rows here take"), "%s", why);
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rows, 2);
    /* setting rows that exist makes none: no charge */
    CHECK_OK(ps_table_assign(t, ids, 2, rows + 2 * D, 2 * D, NULL, 0));
    CHECK_EQ_INT(atomic_load(&wm[1]), 2 * cost);
    ps_table_set_maker(t, -1);
    CHECK_OK(ps_table_pull(t, ids, 2, out, 2 * D, NULL, 0));
    CHECK(memcmp(out, rows + 2 * D, sizeof(float) * 2 * D) == 0);
    ps_table_destroy(t);
}

/* ---- checkpoints ---- */

typedef struct saved {
    uint64_t id;
    float w[MAXD], s0[MAXD], s1[MAXD];
    uint32_t count;
} saved;

typedef struct saver {
    saved *rows;
    size_t n;
} saver;

static void save_row(void *arg, const ps_table_row_view *v)
{
    saver *s = arg;
    saved *r = &s->rows[s->n++];
    memset(r, 0, sizeof *r);
    r->id = v->id;
    memcpy(r->w, v->w, v->dim * sizeof(float));
    if (v->nstate >= 1)
        memcpy(r->s0, v->state[0], v->dim * sizeof(float));
    if (v->nstate >= 2)
        memcpy(r->s1, v->state[1], v->dim * sizeof(float));
    r->count = v->count;
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = ((const saved *)a)->id, y = ((const saved *)b)->id;
    return x < y ? -1 : x > y;
}

static int restore_all(ps_table *t, const saver *s)
{
    for (size_t i = 0; i < s->n; i++) {
        const saved *r = &s->rows[i];
        ps_table_row_view v = {r->id, ps_table_get_config(t)->dim, 2, r->w, {r->s0, r->s1},
                               r->count, ps_table_get_config(t)->dim};
        if (ps_table_restore_row(t, &v, NULL, 0) != 0)
            return 0;
    }
    return 1;
}

PS_TEST(checkpoint_full_and_incremental_restore_bitwise)
{
    enum { CAP = 40, D = 6 };
    ps_table_config c = config(D, PS_OPT_ADAM, PS_TABLE_INIT_NORMAL);
    c.max_rows = CAP;
    ps_table *t = make(&c);
    CHECK(t);
    static saved full[CAP], delta[4 * CAP], now[CAP], back[CAP];
    uint64_t ids[60];
    static float g[60 * D];
    for (int i = 0; i < 60; i++)
        ids[i] = sm((uint64_t)i + 1000);
    for (int i = 0; i < 60 * D; i++)
        g[i] = 0.01f * (float)(i % 17) - 0.05f;
    CHECK_OK(ps_table_push(t, ids, 50, g, 50 * D, 1, NULL, 0)); /* 10 evicted */
    CHECK_OK(ps_table_push(t, ids + 20, 20, g, 20 * D, 1, NULL, 0));
    size_t nd;
    ps_table_deleted(t, &nd);
    CHECK_EQ_INT(nd, 0); /* nothing recorded before the first checkpoint */
    saver sf = {full, 0};
    ps_table_foreach(t, PS_TABLE_ROWS_ALL, save_row, &sf);
    CHECK_EQ_INT(sf.n, CAP);
    int64_t version = ps_table_version(t);
    ps_table_mark_clean(t);
    /* after the snapshot: updates, new rows (evicting), a row evicted and
     * created again */
    CHECK_OK(ps_table_push(t, ids + 30, 5, g + 7, 5 * D, 1, NULL, 0));
    CHECK_OK(ps_table_push(t, ids + 50, 10, g + 3, 10 * D, 2, NULL, 0));
    float out[D];
    CHECK_OK(ps_table_pull(t, &ids[5], 1, out, D, NULL, 0)); /* evicted before: comes back */
    saver sd = {delta, 0};
    ps_table_foreach(t, PS_TABLE_ROWS_DIRTY, save_row, &sd);
    CHECK_EQ_INT(sd.n, 16);
    const uint64_t *del = ps_table_deleted(t, &nd);
    CHECK_EQ_INT(nd, 11);
    /* a fresh table: the full checkpoint, then the delta (deletions first) */
    ps_table *r = make(&c);
    CHECK(r);
    CHECK(restore_all(r, &sf));
    ps_table_set_version(r, version);
    static saved order[CAP];
    saver so = {order, 0};
    ps_table_foreach(r, PS_TABLE_ROWS_ALL, save_row, &so);
    CHECK(so.n == CAP && memcmp(order, full, sizeof full) == 0); /* rows and LRU order */
    for (size_t i = 0; i < nd; i++)
        ps_table_remove(r, del[i]);
    CHECK(restore_all(r, &sd));
    ps_table_set_version(r, ps_table_version(t));
    saver sn = {now, 0}, sb = {back, 0};
    ps_table_foreach(t, PS_TABLE_ROWS_ALL, save_row, &sn);
    ps_table_foreach(r, PS_TABLE_ROWS_ALL, save_row, &sb);
    CHECK_EQ_INT(sn.n, CAP);
    CHECK_EQ_INT(sb.n, CAP);
    qsort(now, CAP, sizeof *now, by_id);
    qsort(back, CAP, sizeof *back, by_id);
    CHECK(memcmp(now, back, sizeof now) == 0);
    /* both go on the same way, and a new row is the initializer's */
    CHECK_OK(ps_table_push(t, ids, 3, g, 3 * D, 1, NULL, 0));
    CHECK_OK(ps_table_push(r, ids, 3, g, 3 * D, 1, NULL, 0));
    ps_table_row_view va, vb;
    for (int i = 0; i < 3; i++)
        CHECK(ps_table_get_row(t, ids[i], &va) && ps_table_get_row(r, ids[i], &vb) &&
              memcmp(va.w, vb.w, D * 4) == 0 && memcmp(va.state[1], vb.state[1], D * 4) == 0 &&
              va.count == vb.count);
    const uint64_t fresh = 31337;
    CHECK_OK(ps_table_pull(r, &fresh, 1, out, D, NULL, 0));
    CHECK(is_documented_row(&c, fresh, out));
    /* after mark_clean nothing is dirty */
    ps_table_mark_clean(r);
    sd.n = 0;
    ps_table_foreach(r, PS_TABLE_ROWS_DIRTY, save_row, &sd);
    CHECK_EQ_INT(sd.n, 0);
    ps_table_destroy(t);
    ps_table_destroy(r);
}

/* A checkpoint's rows come in the hash order of the table that wrote them
 * (PS_TABLE_ROWS_DIRTY); into a hash of the same function that grows as
 * they come they would pile into one run, each insertion probing all of it
 * (quadratic: 13 s to restore 200000 rows).  Reserved first, the probes
 * stay as short as in any order. */
static void collect_id(void *arg, const ps_table_row_view *v)
{
    saver *s = arg;
    s->rows[s->n++].id = v->id;
}

PS_TEST(restoring_rows_in_the_writers_hash_order_probes_little_once_reserved)
{
    enum { N = 100000, D = 2 };
    ps_table_config c = config(D, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    ps_table *t = make(&c), *r = make(&c);
    CHECK(t && r);
    static uint64_t ids[N];
    static float g[N * D];
    for (int i = 0; i < N; i++)
        ids[i] = sm((uint64_t)i + 77);
    CHECK_OK(ps_table_push(t, ids, N, g, N * D, 1, NULL, 0));
    static saved order[N];
    saver so = {order, 0};
    ps_table_foreach(t, PS_TABLE_ROWS_DIRTY, collect_id, &so);
    CHECK_EQ_INT(so.n, N);
    CHECK_OK(ps_table_reserve(r, N, NULL, 0));
    for (int i = 0; i < N; i++) {
        ps_table_row_view v;
        CHECK(ps_table_get_row(t, order[i].id, &v));
        CHECK_OK(ps_table_restore_row(r, &v, NULL, 0));
    }
    ps_table_counts st;
    ps_table_stats(r, &st);
    CHECK_EQ_INT(st.rows, N);
    CHECK_MSG(st.probes <= 3 * st.lookups, "%llu probes for %llu lookups",
              (unsigned long long)st.probes, (unsigned long long)st.lookups);
    ps_table_destroy(t);
    ps_table_destroy(r);
}

PS_TEST(remove_keeps_every_other_row_found)
{
    ps_table_config c = config(3, PS_OPT_MOMENTUM, PS_TABLE_INIT_UNIFORM);
    ps_table *t = make(&c);
    CHECK(t);
    enum { N = 2000 };
    static uint64_t ids[N];
    static float out[N * 3];
    for (int i = 0; i < N; i++)
        ids[i] = sm((uint64_t)i) >> (i % 40); /* small and large ids */
    CHECK_OK(ps_table_pull(t, ids, N, out, N * 3, NULL, 0));
    ps_table_mark_clean(t);
    int removed = 0;
    for (int i = 0; i < N; i += 3)
        removed += ps_table_remove(t, ids[i]);
    CHECK_EQ_INT(removed, (N + 2) / 3);
    CHECK_EQ_INT(ps_table_remove(t, ids[0]), 0);
    size_t nd;
    ps_table_deleted(t, &nd);
    CHECK_EQ_INT(nd, removed);
    ps_table_row_view v;
    for (int i = 0; i < N; i++) {
        int there = ps_table_get_row(t, ids[i], &v);
        CHECK_EQ_INT(there, i % 3 != 0);
        CHECK(!there || memcmp(v.w, out + i * 3, 12) == 0);
    }
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rows, N - removed);
    ps_table_destroy(t);
}

/* ---- bad input ---- */

PS_TEST(bad_inputs_are_refused_with_a_message)
{
    char why[256];
    ps_table *t = NULL;
    struct {
        ps_table_config c;
        const char *says;
    } bad[10];
    for (int i = 0; i < 10; i++)
        bad[i].c = config(4, PS_OPT_ADAGRAD, PS_TABLE_INIT_UNIFORM);
    bad[0].c.dim = 0, bad[0].says = "dim must be in [1, 65536], got 0";
    bad[1].c.dim = 65537, bad[1].says = "got 65537";
    bad[2].c.opt.kind = 99, bad[2].says = "ftrl or rowwise_adagrad, got kind 99";
    bad[3].c.opt.kind = PS_OPT_NONE, bad[3].says = "got kind 0 (none)";
    bad[4].c.opt.lr = -1, bad[4].says = "lr must be in [0, 1e+06], got -1";
    bad[5].c.init = 3, bad[5].says = "got 3";
    bad[6].c.init_scale = -1, bad[6].says = "scale must be a finite number >= 0";
    bad[7].c.min_count = 300, bad[7].says = "[0, 255]";
    bad[8].c.opt.kind = PS_TABLE_OPT_FTRL, bad[8].c.ftrl_l1 = -0.5f, bad[8].says = "l1 must be";
    bad[9].c.max_rows = 1ull << 40, bad[9].says = "row cap";
    for (int i = 0; i < 10; i++) {
        why[0] = 0;
        CHECK_EQ_INT(ps_table_create(&bad[i].c, &t, why, sizeof why), PS_EINVAL);
        CHECK(t == NULL);
        CHECK_MSG(strstr(why, bad[i].says) && strstr(why, "table 42"), "case %d: %s", i, why);
    }
    /* an unused hyper-parameter out of range is no matter (sgd has no eps) */
    ps_table_config c = config(4, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
    c.opt.eps = 0;
    CHECK_OK(ps_table_check_config(&c, why, sizeof why));
    t = make(&c);
    CHECK(t);
    const uint64_t ids[2] = {1, 2};
    float buf[8];
    CHECK_EQ_INT(ps_table_pull(t, ids, 2, buf, 6, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "rows of 4 floats, so 8 were expected"), "%s", why);
    CHECK_EQ_INT(ps_table_push(t, ids, 2, buf, 7, 1, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_table_round_add(t, 0, ids, 2, buf, 9, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_table_round_add(t, -1, ids, 2, buf, 8, why, sizeof why), PS_ESTATE);
    ps_table_row_view v = {5, 3, 0, buf, {NULL, NULL}, 0, 3};
    CHECK_EQ_INT(ps_table_restore_row(t, &v, why, sizeof why), PS_EMISMATCH);
    CHECK_MSG(strstr(why, "3 values") && strstr(why, "rows of 4 values"), "%s", why);
    v.dim = 4, v.nstate = 1;
    CHECK_EQ_INT(ps_table_restore_row(t, &v, why, sizeof why), PS_EMISMATCH);
    ps_table_counts st;
    ps_table_stats(t, &st);
    CHECK_EQ_INT(st.rows, 0);
    CHECK_EQ_INT(ps_table_state_arrays(PS_OPT_NONE), -1);
    CHECK(strcmp(ps_table_opt_name(PS_TABLE_OPT_FTRL), "ftrl") == 0);
    CHECK(strcmp(ps_table_opt_name(PS_TABLE_OPT_ROWWISE_ADAGRAD), "rowwise_adagrad") == 0);
    ps_table_destroy(t);
}

/* A request's duplicate ids make one row and are charged as one: 20000
 * copies of a new id fit where 20000 rows would not (with the request's
 * scratch, 8 bytes an id), in a pull, an async push and a sync round. */
PS_TEST(duplicate_ids_of_a_request_are_charged_once)
{
    enum { N = 20000 };
    static uint64_t ids[N];
    static float out[N * 8], g[N * 8];
    for (int kind = 0; kind < 3; kind++) {
        _Atomic uint64_t used;
        atomic_init(&used, 0);
        ps_table_config c = config(8, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
        c.mem_used = &used;
        c.max_memory = 400000; /* 20000 rows of 40 bytes and their hash do not fit */
        ps_table *t = make(&c);
        CHECK(t);
        for (int i = 0; i < N; i++)
            ids[i] = 12345 + (uint64_t)kind;
        char why[256] = "";
        int rc = kind == 0   ? ps_table_pull(t, ids, N, out, N * 8, why, sizeof why)
                 : kind == 1 ? ps_table_push(t, ids, N, g, N * 8, 1, why, sizeof why)
                             : ps_table_round_add(t, 0, ids, N, g, N * 8, why, sizeof why);
        CHECK_MSG(rc == 0, "kind %d: %s", kind, why);
        if (kind == 2)
            ps_table_round_finish(t);
        ps_table_counts st;
        ps_table_stats(t, &st);
        CHECK_EQ_INT(st.rows, 1);
        ps_table_destroy(t);
        CHECK_EQ_INT(atomic_load(&used), 0);
    }
}

/* Each row is charged to the worker whose request made it: a pull, an
 * async push, a sync round (the rank whose push brought the id); past its
 * share a worker's request is refused, changing nothing, and another
 * worker's goes on; in a capped table an evicted row's charge goes back to
 * its maker; restored rows are nobody's; a cancelled round gives its
 * charges back; destroying the table gives back the capped rows'. */
PS_TEST(rows_are_charged_to_the_worker_that_made_them_within_its_share)
{
    enum { W = 3 };
    static _Atomic uint64_t wm[W];
    for (int capped = 0; capped < 2; capped++) {
        for (int k = 0; k < W; k++)
            atomic_init(&wm[k], 0);
        ps_table_config c = config(4, PS_OPT_SGD, PS_TABLE_INIT_UNIFORM);
        c.worker_mem = wm;
        c.num_workers = W;
        c.max_rows = capped ? 10 : 0;
        c.worker_share = UINT64_MAX;
        ps_table *t = make(&c);
        CHECK(t);
        /* the cost of a row, from a first one */
        uint64_t ids[16];
        float out[16 * 4], g[16 * 4] = {0};
        for (int i = 0; i < 16; i++)
            ids[i] = 1000 + (uint64_t)i;
        ps_table_set_maker(t, 0);
        CHECK_OK(ps_table_pull(t, ids, 1, out, 4, NULL, 0));
        uint64_t cost = atomic_load(&wm[0]);
        CHECK(cost >= 8 + 16 + 8);
        ps_table_destroy(t);
        CHECK_EQ_INT(atomic_load(&wm[0]), capped ? 0 : cost);
        atomic_store(&wm[0], 0);

        c.worker_share = 6 * cost; /* six rows each */
        t = make(&c);
        ps_table_set_maker(t, 0);
        CHECK_OK(ps_table_pull(t, ids, 4, out, 16, NULL, 0));  /* rows 0..3: worker 0 */
        ps_table_set_maker(t, 1);
        CHECK_OK(ps_table_push(t, ids + 2, 4, g, 16, 1, NULL, 0)); /* 4, 5: worker 1 */
        CHECK_EQ_INT(atomic_load(&wm[0]), 4 * cost);
        CHECK_EQ_INT(atomic_load(&wm[1]), 2 * cost);
        /* worker 0 past its share: refused, nothing made */
        char why[256] = "";
        ps_table_set_maker(t, 0);
        CHECK_EQ_INT(ps_table_pull(t, ids + 6, 3, out, 12, why, sizeof why), PS_ETOOBIG);
        CHECK_MSG(strstr(why, "worker 0's rows here take") && strstr(why, "max_rows"), "%s", why);
        ps_table_counts st;
        ps_table_stats(t, &st);
        CHECK_EQ_INT(st.rows, 6);
        CHECK_EQ_INT(atomic_load(&wm[0]), 4 * cost);
        /* a sync round: ids 6 (worker 2 brings it first), 7 (worker 1) */
        CHECK_OK(ps_table_round_add(t, 1, ids + 7, 1, g, 4, NULL, 0));
        CHECK_OK(ps_table_round_add(t, 2, ids + 6, 2, g, 8, NULL, 0));
        ps_table_round_finish(t);
        CHECK_EQ_INT(atomic_load(&wm[1]), 3 * cost);
        CHECK_EQ_INT(atomic_load(&wm[2]), 1 * cost);
        /* a round cancelled gives its charge back */
        CHECK_OK(ps_table_round_add(t, 2, ids + 8, 1, g, 4, NULL, 0));
        CHECK_EQ_INT(atomic_load(&wm[2]), 2 * cost);
        ps_table_round_cancel(t);
        CHECK_EQ_INT(atomic_load(&wm[2]), 1 * cost);
        ps_table_stats(t, &st);
        CHECK_EQ_INT(st.rows, 8);
        if (capped) {
            /* two more rows by worker 2 fill the cap; a third evicts the least
             * recently touched, worker 0's row 0 (pulled first) */
            ps_table_set_maker(t, 2);
            CHECK_OK(ps_table_pull(t, ids + 8, 3, out, 12, NULL, 0));
            ps_table_stats(t, &st);
            CHECK_EQ_INT(st.rows, 10);
            CHECK_EQ_INT(st.evicted, 1);
            CHECK_EQ_INT(atomic_load(&wm[0]), 3 * cost);
            CHECK_EQ_INT(atomic_load(&wm[2]), 4 * cost);
        }
        /* a restored row is nobody's */
        ps_table_set_maker(t, -1);
        float w[4] = {1, 2, 3, 4};
        ps_table_row_view v = {999, 4, 0, w, {NULL, NULL}, 0, 4};
        CHECK_OK(ps_table_restore_row(t, &v, NULL, 0));
        uint64_t sum = atomic_load(&wm[0]) + atomic_load(&wm[1]) + atomic_load(&wm[2]);
        ps_table_stats(t, &st);
        CHECK_EQ_INT(sum, (st.rows - 1) * cost);
        ps_table_destroy(t);
        sum = atomic_load(&wm[0]) + atomic_load(&wm[1]) + atomic_load(&wm[2]);
        CHECK_MSG(capped ? sum == 0 : sum == 8 * cost, "capped %d: %llu left", capped,
                  (unsigned long long)sum);
    }
}
