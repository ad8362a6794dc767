/* FNV-1a, 64 bits: the one hash behind every fingerprint and name we derive
 * (the model fingerprint of hello, the checkpoint's configuration
 * fingerprint, the local-aggregation segment's name, the peers table).
 * Fingerprints are compared across processes and stored in checkpoints, so
 * this function and its constants never change; a new use that wants other
 * numbers starts from another h. */
#ifndef PS_HASH_H
#define PS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The usual FNV-1a 64 offset basis (14695981039346656037) and prime. */
#define PS_FNV1A_BASIS 0xcbf29ce484222325ull
#define PS_FNV1A_PRIME 0x100000001b3ull

/* h continued over the n bytes at p: for each byte b, h = (h ^ b) * prime.
 * Start from PS_FNV1A_BASIS; chain calls to hash several pieces as one. */
static inline uint64_t ps_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * PS_FNV1A_PRIME;
    return h;
}

/* h continued over the 8 bytes of v, least significant first, whatever the
 * host's byte order (what goes on the wire or into a file). */
static inline uint64_t ps_fnv1a_u64le(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        h = (h ^ ((v >> (8 * i)) & 0xff)) * PS_FNV1A_PRIME;
    return h;
}

#endif
