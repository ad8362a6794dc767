/* common/ps_hash.h: FNV-1a 64 against the published test vectors, and the
 * pieces of a chained hash giving the hash of the whole. */
#include <string.h>

#include "ps_hash.h"
#include "ps_test.h"

PS_TEST(fnv1a_matches_the_published_test_vectors)
{
    /* the FNV-1a 64 vectors of the reference (isthe.com/chongo/tech/comp/fnv) */
    struct { const char *s; uint64_t want; } v[] = {
        {"", 0xcbf29ce484222325ull},
        {"a", 0xaf63dc4c8601ec8cull},
        {"b", 0xaf63df4c8601f1a5ull},
        {"foobar", 0x85944171f73967e8ull},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECK_MSG(ps_fnv1a(PS_FNV1A_BASIS, v[i].s, strlen(v[i].s)) == v[i].want,
                  "\"%s\": %016llx, want %016llx", v[i].s,
                  (unsigned long long)ps_fnv1a(PS_FNV1A_BASIS, v[i].s, strlen(v[i].s)),
                  (unsigned long long)v[i].want);
}

PS_TEST(fnv1a_chained_over_pieces_equals_the_hash_of_the_whole)
{
    const char *s = "foobar";
    for (size_t cut = 0; cut <= 6; cut++)
        CHECK_EQ_INT(ps_fnv1a(ps_fnv1a(PS_FNV1A_BASIS, s, cut), s + cut, 6 - cut),
                     0x85944171f73967e8ull);
}

PS_TEST(fnv1a_u64le_hashes_the_little_endian_bytes)
{
    const unsigned char le[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    uint64_t h = ps_fnv1a_u64le(PS_FNV1A_BASIS, 0x0102030405060708ull);
    CHECK_EQ_INT(h, ps_fnv1a(PS_FNV1A_BASIS, le, sizeof le));
    CHECK(h != ps_fnv1a_u64le(PS_FNV1A_BASIS, 0x0807060504030201ull));
}
