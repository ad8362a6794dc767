/* Keys, chunks and placement.  A tensor (key, count) is cut into chunks of at
 * most chunk_elems elements; chunks are spread over the servers so that each
 * holds about the same number of bytes.  The map is a pure function of the
 * registered tensor list (in order), chunk_elems and num_servers, so every
 * worker computes the same one without asking. */
#ifndef PS_PLACEMENT_H
#define PS_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_tensor_spec {
    uint64_t key;
    size_t count; /* elements */
} ps_tensor_spec;

typedef struct ps_chunk_place {
    uint64_t key;
    uint32_t chunk;  /* index within the tensor */
    size_t offset;   /* first element */
    size_t count;    /* elements */
    int server;      /* 0..num_servers-1 */
} ps_chunk_place;

typedef struct ps_placement {
    ps_chunk_place *chunks; /* grouped by tensor in registration order, chunk order within */
    size_t num_chunks;
    size_t *first_chunk;    /* per tensor: index of its first chunk in chunks[] */
    size_t *tensor_chunks;  /* per tensor: number of chunks */
    size_t num_tensors;
    int num_servers;
    uint64_t *server_elems; /* per server: elements placed there */
} ps_placement;

/* Build the map.  Fails with PS_EINVAL for num_servers < 1, chunk_elems < 1,
 * a zero-length tensor, or a duplicate key; PS_ENOMEM.  The caller frees with
 * ps_placement_free. */
int ps_placement_build(const ps_tensor_spec *tensors, size_t n, size_t chunk_elems,
                       int num_servers, ps_placement *out);
void ps_placement_free(ps_placement *p);

/* Index of `key` in the tensor list, or -1. */
long ps_placement_find(const ps_placement *p, uint64_t key);

/* Fingerprint of the tensor list and chunk size (FNV-1a), sent at hello so
 * servers refuse workers built with a different model. */
uint64_t ps_placement_fingerprint(const ps_tensor_spec *tensors, size_t n, size_t chunk_elems);

#endif
