/* Ranges that more than one program or layer checks: one place, so a value
 * ps_launch accepts is one ps_server and ps_worker accept too. */
#ifndef PS_LIMITS_H
#define PS_LIMITS_H

/* ranks: workers and servers are numbered 0..PS_MAX_RANK */
#define PS_MAX_RANK 65535
#define PS_MAX_WORKERS (PS_MAX_RANK + 1)
#define PS_MAX_SERVERS (PS_MAX_RANK + 1)
/* --max-staleness: -1 (unbounded) or 0..PS_MAX_STALENESS */
#define PS_MAX_STALENESS 1000000
/* How many processes one ps_launch supervises (each has two pipes in one
 * poll loop): its own limits, within what the programs accept. */
#define PS_LAUNCH_MAX_SERVERS 256
/* Longest endpoint we keep (bytes, with the terminator): common/ps_endpoint.h
 * checks them, a PS_EMOVED reply names one. */
#define PS_ENDPOINT_MAX 256
#define PS_LAUNCH_MAX_WORKERS 1024
/* ps_server --threads: update threads per server */
#define PS_SERVER_MAX_THREADS 64
/* Largest payload one message may carry: 1 GiB. */
#define PS_MAX_PAYLOAD_BYTES (1ull << 30)
/* Chunks per tensor at most, and the --chunk-size range in bytes. */
#define PS_MAX_CHUNK (1u << 24)
#define PS_MIN_CHUNK_BYTES 1024ull
#define PS_MAX_CHUNK_BYTES PS_MAX_PAYLOAD_BYTES
/* Tables: floats per row at most, and ids one sparse message may carry (its
 * rows must fit in PS_MAX_PAYLOAD_BYTES too). */
#define PS_MAX_TABLE_DIM 65536
#define PS_MAX_SPARSE_IDS (1u << 20)

/* A lookup (a reader's rows of several tables in one partition): tables one
 * message names at most, and the bytes of each one's entry (u64 key, u32
 * ids, u32 dim). */
#define PS_MAX_LOOKUP_TABLES 4096
#define PS_LOOKUP_ENTRY_BYTES 16
/* An export reads a server's snapshot in pages of this many bytes. */
#define PS_SNAP_PAGE_BYTES (16u << 20)

#endif
