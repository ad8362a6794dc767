#include "ps_placement.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_hash.h"

/* Where the model fingerprint starts: not the usual FNV basis (docs/PROTOCOL.md
 * "Chunks, placement and the model fingerprint" says so), and kept, so a
 * fingerprint stays what every earlier worker and checkpoint computed. */
#define PLACEMENT_FNV_BASIS 1469598103934665603ull

void ps_placement_free(ps_placement *p)
{
    free(p->chunks);
    free(p->first_chunk);
    free(p->tensor_chunks);
    free(p->server_elems);
    memset(p, 0, sizeof *p);
}

long ps_placement_find(const ps_placement *p, uint64_t key)
{
    for (size_t i = 0; i < p->num_tensors; i++)
        if (p->chunks[p->first_chunk[i]].key == key)
            return (long)i;
    return -1;
}

/* (size, position) pairs sorted largest first, ties by position, for the
 * greedy pass; no globals, so concurrent builds are safe */
typedef struct order_item {
    size_t count, index;
} order_item;

static int by_size_desc(const void *a, const void *b)
{
    const order_item *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int ps_placement_build(const ps_tensor_spec *t, size_t n, size_t chunk_elems, int num_servers,
                       ps_placement *out)
{
    memset(out, 0, sizeof *out);
    if (num_servers < 1 || chunk_elems < 1)
        return PS_EINVAL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].count == 0)
            return PS_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (t[j].key == t[i].key)
                return PS_EINVAL;
        total += (t[i].count + chunk_elems - 1) / chunk_elems;
    }
    out->chunks = calloc(total ? total : 1, sizeof *out->chunks);
    out->first_chunk = calloc(n ? n : 1, sizeof *out->first_chunk);
    out->tensor_chunks = calloc(n ? n : 1, sizeof *out->tensor_chunks);
    out->server_elems = calloc((size_t)num_servers, sizeof *out->server_elems);
    order_item *order = calloc(total ? total : 1, sizeof *order);
    if (!out->chunks || !out->first_chunk || !out->tensor_chunks || !out->server_elems || !order) {
        free(order);
        ps_placement_free(out);
        return PS_ENOMEM;
    }
    out->num_servers = num_servers;
    out->num_tensors = n;
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        out->first_chunk[i] = c;
        for (size_t off = 0; off < t[i].count; off += chunk_elems) {
            ps_chunk_place *p = &out->chunks[c];
            p->key = t[i].key;
            p->chunk = (uint32_t)(off / chunk_elems);
            p->offset = off;
            p->count = t[i].count - off < chunk_elems ? t[i].count - off : chunk_elems;
            order[c].count = p->count;
            order[c].index = c;
            c++;
        }
        out->tensor_chunks[i] = c - out->first_chunk[i];
    }
    out->num_chunks = total;
    /* Longest-processing-time greedy: largest chunk first onto the server with
     * the fewest elements (lowest rank on ties).  Deterministic, and within
     * one largest chunk of perfect balance. */
    qsort(order, total, sizeof *order, by_size_desc);
    for (size_t k = 0; k < total; k++) {
        int best = 0;
        for (int s = 1; s < num_servers; s++)
            if (out->server_elems[s] < out->server_elems[best])
                best = s;
        out->chunks[order[k].index].server = best;
        out->server_elems[best] += order[k].count;
    }
    free(order);
    return 0;
}

uint64_t ps_placement_fingerprint(const ps_tensor_spec *t, size_t n, size_t chunk_elems)
{
    uint64_t h = ps_fnv1a_u64le(PLACEMENT_FNV_BASIS, chunk_elems);
    h = ps_fnv1a_u64le(h, n);
    for (size_t i = 0; i < n; i++) {
        h = ps_fnv1a_u64le(h, t[i].key);
        h = ps_fnv1a_u64le(h, t[i].count);
    }
    return h ? h : 1; /* 0 means "unset" on the wire */
}
