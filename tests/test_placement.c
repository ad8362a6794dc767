/* Placement: every element of every tensor lands in exactly one chunk, the
 * chunks spread over the servers within one largest chunk of balance, and the
 * map and the fingerprint are pure functions of their inputs. */
#include <string.h>

#include "ps_error.h"
#include "ps_placement.h"
#include "ps_test.h"

static const ps_tensor_spec g_model[] = {
    {101, 1}, {102, 7}, {103, 1000003}, {104, 4097}, {105, 13}, {106, 999}, {107, 250000},
    {108, 3},
};
#define NMODEL (sizeof g_model / sizeof g_model[0])

/* Structural checks shared by the cases; returns 0 or fails the test. */
static int check_map(const ps_tensor_spec *t, size_t n, size_t chunk_elems, int ns,
                     const ps_placement *p)
{
    if (p->num_tensors != n || p->num_servers != ns) {
        ps_test_fail(__FILE__, __LINE__, "num_tensors %zu num_servers %d", p->num_tensors,
                     p->num_servers);
        return -1;
    }
    size_t expect_chunks = 0, largest = 0;
    uint64_t *load = calloc((size_t)ns, sizeof *load);
    for (size_t i = 0; i < n; i++) {
        expect_chunks += (t[i].count + chunk_elems - 1) / chunk_elems;
        size_t first = p->first_chunk[i], k = p->tensor_chunks[i];
        size_t next = 0;
        for (size_t j = 0; j < k; j++) {
            const ps_chunk_place *c = &p->chunks[first + j];
            /* contiguous, in order, no gap and no overlap: each element once */
            if (c->key != t[i].key || c->chunk != j || c->offset != next || c->count == 0 ||
                c->count > chunk_elems || c->server < 0 || c->server >= ns) {
                ps_test_fail(__FILE__, __LINE__,
                             "tensor %zu chunk %zu: key %llu chunk %u offset %zu count %zu "
                             "server %d (expected offset %zu)",
                             i, j, (unsigned long long)c->key, c->chunk, c->offset, c->count,
                             c->server, next);
                free(load);
                return -1;
            }
            next += c->count;
            load[c->server] += c->count;
            if (c->count > largest)
                largest = c->count;
        }
        if (next != t[i].count) {
            ps_test_fail(__FILE__, __LINE__, "tensor %zu covers %zu of %zu elements", i, next,
                         t[i].count);
            free(load);
            return -1;
        }
    }
    if (p->num_chunks != expect_chunks) {
        ps_test_fail(__FILE__, __LINE__, "num_chunks %zu, expected %zu", p->num_chunks,
                     expect_chunks);
        free(load);
        return -1;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int s = 0; s < ns; s++) {
        if (load[s] != p->server_elems[s]) {
            ps_test_fail(__FILE__, __LINE__, "server %d: server_elems %llu, counted %llu", s,
                         (unsigned long long)p->server_elems[s], (unsigned long long)load[s]);
            free(load);
            return -1;
        }
        lo = load[s] < lo ? load[s] : lo;
        hi = load[s] > hi ? load[s] : hi;
    }
    free(load);
    if (hi - lo > largest) {
        ps_test_fail(__FILE__, __LINE__, "%d servers: load spread %llu > largest chunk %zu", ns,
                     (unsigned long long)(hi - lo), largest);
        return -1;
    }
    return 0;
}

PS_TEST(placement_covers_every_element_once_and_balances_1_2_3_7_servers)
{
    const int servers[] = {1, 2, 3, 7};
    const size_t chunk_sizes[] = {1, 5, 1000, 4096, 1 << 20};
    for (size_t a = 0; a < sizeof servers / sizeof servers[0]; a++)
        for (size_t b = 0; b < sizeof chunk_sizes / sizeof chunk_sizes[0]; b++) {
            ps_placement p;
            /* chunk size 1 over a million elements is slow; skip that pairing */
            if (chunk_sizes[b] == 1) {
                static const ps_tensor_spec small[] = {{1, 1}, {2, 7}, {3, 13}, {4, 2}};
                CHECK_OK(ps_placement_build(small, 4, 1, servers[a], &p));
                int bad = check_map(small, 4, 1, servers[a], &p);
                ps_placement_free(&p);
                if (bad)
                    return;
                continue;
            }
            CHECK_OK(ps_placement_build(g_model, NMODEL, chunk_sizes[b], servers[a], &p));
            int bad = check_map(g_model, NMODEL, chunk_sizes[b], servers[a], &p);
            ps_placement_free(&p);
            if (bad)
                return;
        }
}

PS_TEST(placement_one_big_tensor_spreads_over_every_server)
{
    ps_tensor_spec t = {42, 7 * 1000 + 3};
    ps_placement p;
    CHECK_OK(ps_placement_build(&t, 1, 1000, 7, &p));
    int bad = check_map(&t, 1, 1000, 7, &p);
    for (int s = 0; !bad && s < 7; s++)
        if (p.server_elems[s] < 1000)
            bad = 1;
    ps_placement_free(&p);
    CHECK(!bad);
}

PS_TEST(placement_is_deterministic)
{
    ps_placement a, b;
    CHECK_OK(ps_placement_build(g_model, NMODEL, 1000, 3, &a));
    CHECK_OK(ps_placement_build(g_model, NMODEL, 1000, 3, &b));
    int same = a.num_chunks == b.num_chunks &&
               memcmp(a.chunks, b.chunks, a.num_chunks * sizeof *a.chunks) == 0 &&
               memcmp(a.server_elems, b.server_elems, 3 * sizeof *a.server_elems) == 0;
    ps_placement_free(&a);
    ps_placement_free(&b);
    CHECK(same);
}

PS_TEST(placement_find_returns_tensor_index)
{
    ps_placement p;
    CHECK_OK(ps_placement_build(g_model, NMODEL, 4096, 2, &p));
    long idx[NMODEL];
    for (size_t i = 0; i < NMODEL; i++)
        idx[i] = ps_placement_find(&p, g_model[i].key);
    long missing = ps_placement_find(&p, 999999);
    ps_placement_free(&p);
    for (size_t i = 0; i < NMODEL; i++)
        CHECK_EQ_INT(idx[i], (long)i);
    CHECK_EQ_INT(missing, -1);
}

PS_TEST(placement_empty_model_is_allowed)
{
    ps_placement p;
    CHECK_OK(ps_placement_build(NULL, 0, 1024, 2, &p));
    size_t n = p.num_chunks;
    uint64_t l0 = p.server_elems[0], l1 = p.server_elems[1];
    ps_placement_free(&p);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(l0 + l1, 0);
}

PS_TEST(placement_refuses_bad_inputs)
{
    ps_placement p;
    ps_tensor_spec zero[] = {{1, 10}, {2, 0}};
    ps_tensor_spec dup[] = {{1, 10}, {2, 5}, {1, 3}};
    CHECK_EQ_INT(ps_placement_build(g_model, NMODEL, 1024, 0, &p), PS_EINVAL);
    CHECK_EQ_INT(ps_placement_build(g_model, NMODEL, 1024, -1, &p), PS_EINVAL);
    CHECK_EQ_INT(ps_placement_build(g_model, NMODEL, 0, 2, &p), PS_EINVAL);
    CHECK_EQ_INT(ps_placement_build(zero, 2, 1024, 2, &p), PS_EINVAL);
    CHECK_EQ_INT(ps_placement_build(dup, 3, 1024, 2, &p), PS_EINVAL);
}

PS_TEST(fingerprint_changes_with_chunk_size_order_length_and_key)
{
    ps_tensor_spec a[] = {{1, 100}, {2, 200}, {3, 300}};
    ps_tensor_spec swapped[] = {{2, 200}, {1, 100}, {3, 300}};
    ps_tensor_spec longer[] = {{1, 100}, {2, 201}, {3, 300}};
    ps_tensor_spec rekeyed[] = {{1, 100}, {4, 200}, {3, 300}};
    uint64_t base = ps_placement_fingerprint(a, 3, 1024);
    CHECK(base != 0);
    CHECK_EQ_INT(ps_placement_fingerprint(a, 3, 1024), base);
    CHECK(ps_placement_fingerprint(a, 3, 2048) != base);
    CHECK(ps_placement_fingerprint(swapped, 3, 1024) != base);
    CHECK(ps_placement_fingerprint(longer, 3, 1024) != base);
    CHECK(ps_placement_fingerprint(rekeyed, 3, 1024) != base);
    CHECK(ps_placement_fingerprint(a, 2, 1024) != base);
    CHECK(ps_placement_fingerprint(NULL, 0, 1024) != 0);
}

/* docs/PROTOCOL.md "Chunks, placement and the model fingerprint" spells the
 * fingerprint out byte for byte, for clients written from the document: the
 * same computation, from that text, must give what libps sends. */
static uint64_t doc_fnv(uint64_t h, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
    return 8;
}

PS_TEST(model_fingerprint_is_the_documented_fnv_of_the_documented_bytes)
{
    ps_tensor_spec t[3] = {{1, 10}, {7, 1 << 20}, {0xfedcba9876543210ull, 3}};
    unsigned char b[8 * 8];
    size_t n = 0;
    n += le64(b + n, 1048576);
    n += le64(b + n, 3);
    for (int i = 0; i < 3; i++) {
        n += le64(b + n, t[i].key);
        n += le64(b + n, t[i].count);
    }
    uint64_t want = doc_fnv(0x14650fb0739d0383ull, b, n);
    CHECK_EQ_INT(ps_placement_fingerprint(t, 3, 1048576), want ? want : 1);
    /* the example of the document: one tensor, key 1, count 10 */
    n = 0;
    n += le64(b + n, 1048576);
    n += le64(b + n, 1);
    n += le64(b + n, 1);
    n += le64(b + n, 10);
    CHECK_EQ_INT(n, 32);
    CHECK_EQ_INT(ps_placement_fingerprint(t, 1, 1048576), doc_fnv(0x14650fb0739d0383ull, b, n));
}
