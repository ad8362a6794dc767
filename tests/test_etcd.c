/* coord/: the etcd client over the v3 JSON gateway and the shard groups'
 * configuration in it, against a real etcd started here. */
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>

#include "ps_error.h"
#include "ps_etcd.h"
#include "ps_group.h"
#include "ps_test.h"

static ps_test_etcd g_etcd;

/* An etcd for the test, started on first use (the framework stops every
 * child at the end of each test). */
static const char *etcd_url(void)
{
    if (g_etcd.pid <= 0 || kill(g_etcd.pid, 0) != 0) {
        char log[512];
        snprintf(log, sizeof log, "%s/etcd.log", ps_test_tmpdir());
        if (ps_test_etcd_start(&g_etcd, log) != 0)
            return NULL;
    }
    return g_etcd.url;
}

#define OPEN(e)                                                                  \
    do {                                                                         \
        const char *u_ = etcd_url();                                             \
        if (!u_)                                                                 \
            SKIP("no etcd (install etcd-server: make deps)");                    \
        char w_[256];                                                            \
        CHECK_OK(ps_etcd_open(u_, 2000, &(e), w_, sizeof w_));                   \
    } while (0)

PS_TEST(etcd_put_get_list_delete)
{
    ps_etcd *e;
    OPEN(e);
    char why[256];
    int64_t rev = 0;
    /* bytes, not text: a NUL and a high byte survive base64 */
    const char v[] = {'a', 0, (char)0xff, 'z'};
    CHECK_OK(ps_etcd_put(e, "/t/kv/a", v, sizeof v, 0, &rev, why, sizeof why));
    CHECK(rev > 0);
    CHECK_OK(ps_etcd_put(e, "/t/kv/b", "2", 1, 0, NULL, why, sizeof why));
    CHECK_OK(ps_etcd_put(e, "/t/kw", "x", 1, 0, NULL, why, sizeof why));
    ps_etcd_kv kv;
    CHECK_OK(ps_etcd_get(e, "/t/kv/a", &kv, why, sizeof why));
    CHECK_EQ_INT(kv.len, sizeof v);
    CHECK(memcmp(kv.value, v, sizeof v) == 0);
    CHECK_STR(kv.key, "/t/kv/a");
    CHECK_EQ_INT(kv.mod_rev, rev);
    ps_etcd_kv_free(&kv);
    ps_etcd_kv *kvs;
    size_t n;
    CHECK_OK(ps_etcd_list(e, "/t/kv/", &kvs, &n, why, sizeof why));
    CHECK_EQ_INT(n, 2); /* not /t/kw */
    CHECK_STR(kvs[0].key, "/t/kv/a");
    CHECK_STR(kvs[1].value, "2");
    for (size_t i = 0; i < n; i++)
        ps_etcd_kv_free(&kvs[i]);
    free(kvs);
    CHECK_OK(ps_etcd_delete(e, "/t/kv/", 1, why, sizeof why));
    CHECK_EQ_INT(ps_etcd_get(e, "/t/kv/a", &kv, why, sizeof why), PS_ENOTFOUND);
    CHECK_OK(ps_etcd_get(e, "/t/kw", &kv, why, sizeof why));
    ps_etcd_kv_free(&kv);
    ps_etcd_close(e);
}

PS_TEST(etcd_cas_compares_the_revision)
{
    ps_etcd *e;
    OPEN(e);
    char why[256];
    int64_t r1, r2;
    ps_etcd_kv cur;
    /* create only if absent */
    CHECK_OK(ps_etcd_cas(e, "/t/cas", 0, "one", 3, 0, &r1, &cur, why, sizeof why));
    CHECK_EQ_INT(ps_etcd_cas(e, "/t/cas", 0, "two", 3, 0, &r2, &cur, why, sizeof why),
                 PS_ESTALE);
    CHECK_STR(cur.value, "one");
    CHECK_EQ_INT(cur.mod_rev, r1);
    ps_etcd_kv_free(&cur);
    /* swap at the revision read; the old revision then fails */
    CHECK_OK(ps_etcd_cas(e, "/t/cas", r1, "two", 3, 0, &r2, &cur, why, sizeof why));
    CHECK(r2 > r1);
    CHECK_EQ_INT(ps_etcd_cas(e, "/t/cas", r1, "three", 5, 0, NULL, &cur, why, sizeof why),
                 PS_ESTALE);
    CHECK_STR(cur.value, "two");
    CHECK(strstr(why, "no longer at revision") != NULL);
    ps_etcd_kv_free(&cur);
    ps_etcd_close(e);
}

PS_TEST(etcd_lease_expires_with_its_keys)
{
    ps_etcd *e;
    OPEN(e);
    char why[256];
    int64_t id;
    int ttl = 0;
    CHECK_OK(ps_etcd_lease_grant(e, 2, &id, &ttl, why, sizeof why));
    CHECK(ttl >= 2);
    CHECK_OK(ps_etcd_put(e, "/t/leased", "x", 1, id, NULL, why, sizeof why));
    ps_etcd_kv kv;
    CHECK_OK(ps_etcd_get(e, "/t/leased", &kv, why, sizeof why));
    CHECK_EQ_INT(kv.lease, id);
    ps_etcd_kv_free(&kv);
    CHECK_OK(ps_etcd_lease_keepalive(e, id, &ttl, why, sizeof why));
    CHECK(ttl > 0);
    CHECK_OK(ps_etcd_lease_revoke(e, id, why, sizeof why));
    CHECK_EQ_INT(ps_etcd_lease_keepalive(e, id, &ttl, why, sizeof why), PS_ENOTFOUND);
    CHECK_EQ_INT(ps_etcd_get(e, "/t/leased", &kv, why, sizeof why), PS_ENOTFOUND);
    ps_etcd_close(e);
}

PS_TEST(etcd_unreachable_endpoint_named)
{
    ps_etcd *e;
    char why[256];
    int port = ps_test_free_port(); /* nothing listens there */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    CHECK_OK(ps_etcd_open(url, 500, &e, why, sizeof why));
    ps_etcd_kv kv;
    CHECK_EQ_INT(ps_etcd_get(e, "/x", &kv, why, sizeof why), PS_EIO);
    CHECK_MSG(strstr(why, url) != NULL, "why: %s", why);
    ps_etcd_close(e);
    CHECK_EQ_INT(ps_etcd_open("tcp://1.2.3.4:5", 500, &e, why, sizeof why), PS_EINVAL);
    /* a dead endpoint before a live one: the live one answers */
    const char *live = etcd_url();
    if (!live)
        SKIP("no etcd");
    char two[160];
    snprintf(two, sizeof two, "%s,%s/", url, live);
    CHECK_OK(ps_etcd_open(two, 2000, &e, why, sizeof why));
    int rc = ps_etcd_put(e, "/t/two", "y", 1, 0, NULL, why, sizeof why);
    CHECK_MSG(rc == 0, "%s", why);
    CHECK_STR(ps_etcd_endpoint(e), live);
    ps_etcd_close(e);
}

/* Two servers decide at once from the same configuration (a primary that
 * drops its silent replica, the replica that promotes itself): exactly one
 * change is written, and the other learns it. */
PS_TEST(group_cas_one_winner)
{
    ps_etcd *a, *b;
    OPEN(a);
    OPEN(b);
    char why[256];
    ps_group_cfg c0 = {.epoch = 1, .primary = 0, .n = 2, .m = {{0, 11}, {1, 22}}};
    CHECK_OK(ps_group_cas(a, "job1", 3, 2, 0, &c0, NULL, why, sizeof why));
    ps_group_cfg ra, rb;
    CHECK_OK(ps_group_load(a, "job1", 3, 2, &ra, why, sizeof why));
    CHECK_OK(ps_group_load(b, "job1", 3, 2, &rb, why, sizeof why));
    CHECK_EQ_INT(ra.rev, c0.rev);
    CHECK_EQ_INT(ra.n, 2);
    CHECK_EQ_INT(ra.m[1].inc, 22);
    ps_group_cfg drop = ra, promote = rb, now;
    drop.epoch++;
    ps_group_remove(&drop, 1);
    promote.epoch++;
    promote.primary = 1;
    promote.m[0] = promote.m[1];
    promote.n = 1;
    CHECK_OK(ps_group_cas(b, "job1", 3, 2, rb.rev, &promote, NULL, why, sizeof why));
    CHECK_EQ_INT(ps_group_cas(a, "job1", 3, 2, ra.rev, &drop, &now, why, sizeof why),
                 PS_ESTALE);
    CHECK_EQ_INT(now.primary, 1);
    CHECK_EQ_INT(now.epoch, 2);
    CHECK_EQ_INT(now.n, 1);
    CHECK_EQ_INT(now.rev, promote.rev);
    char d[200];
    ps_group_describe(&now, d, sizeof d);
    CHECK_MSG(strstr(d, "epoch 2, primary 1, members 1 (inc 16)") != NULL, "%s", d);
    ps_etcd_close(a);
    ps_etcd_close(b);
}

PS_TEST(group_decode_checks)
{
    ps_group_cfg c;
    char why[256];
    CHECK_OK(ps_group_decode("{\"epoch\":3,\"primary\":1,\"members\":[{\"slot\":1,\"inc\":\"0\"}]}",
                             2, &c, why, sizeof why));
    CHECK_EQ_INT(c.epoch, 3);
    CHECK_EQ_INT(ps_group_decode("{\"epoch\":0,\"primary\":0,\"members\":[]}", 2, &c, why,
                                 sizeof why), PS_EDATA);
    CHECK_EQ_INT(ps_group_decode("{\"epoch\":1,\"primary\":2,\"members\":[{\"slot\":2,\"inc\":"
                                 "\"1\"}]}", 2, &c, why, sizeof why), PS_EDATA);
    CHECK(strstr(why, "out of range") != NULL);
    CHECK_EQ_INT(ps_group_decode("{\"epoch\":1,\"primary\":1,\"members\":[{\"slot\":0,\"inc\":"
                                 "\"1\"}]}", 2, &c, why, sizeof why), PS_EDATA);
    CHECK(strstr(why, "not a member") != NULL);
    CHECK_EQ_INT(ps_group_decode("nonsense", 2, &c, why, sizeof why), PS_EDATA);
}
