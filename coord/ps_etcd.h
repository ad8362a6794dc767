/* A client of etcd's v3 API through its JSON gateway (POST /v3/kv/range,
 * /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange, /v3/lease/grant,
 * /v3/lease/keepalive, /v3/lease/revoke), over libcurl, with the bodies
 * built and read by json-c.  Keys and values are bytes (base64 on the wire).
 *
 * What it is for: the shard groups' configuration (coord/ps_group.h) and
 * the members' leases.  etcd decides, by a transaction that compares a
 * key's mod revision, which of two servers that both want to change a
 * group's configuration does: the other is told the compare failed and
 * what the key holds now.
 *
 * Threads: a ps_etcd is one libcurl handle, used by one thread at a time.
 * Every call blocks for at most the timeout given at open per endpoint
 * tried.  curl_global_init must have run before the first open (the
 * programs' main does it; ps_etcd_global_init is that call, once).
 *
 * Errors: 0, or PS_EIO (no endpoint answered, or etcd answered with an
 * error: why says which and what it said), PS_ENOTFOUND (no such key;
 * a lease that expired), PS_ESTALE (a compare-and-swap found another
 * revision), PS_ENOMEM, PS_EINVAL (a bad endpoint list). */
#ifndef PS_ETCD_H
#define PS_ETCD_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_etcd ps_etcd;

/* One key as etcd holds it.  value is NUL-terminated (len excludes it);
 * mod_rev 0: the key does not exist.  Owned by the caller after a call
 * filled it: ps_etcd_kv_free. */
typedef struct ps_etcd_kv {
    char *key;
    char *value;
    size_t len;
    int64_t create_rev, mod_rev, version, lease;
} ps_etcd_kv;

void ps_etcd_kv_free(ps_etcd_kv *kv);

/* curl_global_init, once per process (thread-safe). */
void ps_etcd_global_init(void);

/* urls: "http://host:port[,http://host:port...]", tried in turn (the last
 * one that answered first).  timeout_ms: per request and endpoint. */
int ps_etcd_open(const char *urls, long timeout_ms, ps_etcd **out, char *why, size_t why_len);
void ps_etcd_close(ps_etcd *e);
/* The endpoint that answered last ("" before any). */
const char *ps_etcd_endpoint(const ps_etcd *e);

/* The key, into *kv.  PS_ENOTFOUND when it does not exist. */
int ps_etcd_get(ps_etcd *e, const char *key, ps_etcd_kv *kv, char *why, size_t why_len);

/* Every key that starts with prefix, in key order: *kvs (free each with
 * ps_etcd_kv_free, then the array), *n of them. */
int ps_etcd_list(ps_etcd *e, const char *prefix, ps_etcd_kv **kvs, size_t *n, char *why,
                 size_t why_len);

/* Put key = value (len bytes), attached to lease (0: none). *rev (may be
 * NULL): the revision of the write. */
int ps_etcd_put(ps_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
                int64_t *rev, char *why, size_t why_len);

/* Compare and swap: put key = value only if its mod revision is still
 * expect_rev (0: only if the key does not exist).  0: written, *rev (may be
 * NULL) its revision.  PS_ESTALE: not written; *cur (may be NULL) is what
 * the key holds now (mod_rev 0: it does not exist). */
int ps_etcd_cas(ps_etcd *e, const char *key, int64_t expect_rev, const void *value, size_t len,
                int64_t lease, int64_t *rev, ps_etcd_kv *cur, char *why, size_t why_len);

/* Delete key, or with prefix != 0 every key that starts with it. */
int ps_etcd_delete(ps_etcd *e, const char *key, int prefix, char *why, size_t why_len);

/* A lease of ttl_s seconds: *id, and *ttl (may be NULL) what etcd granted
 * (it has a floor of about 2 s). */
int ps_etcd_lease_grant(ps_etcd *e, int ttl_s, int64_t *id, int *ttl, char *why,
                        size_t why_len);
/* Renew lease id: *ttl (may be NULL) its seconds left.  PS_ENOTFOUND: it
 * expired or was revoked (everything attached to it is gone). */
int ps_etcd_lease_keepalive(ps_etcd *e, int64_t id, int *ttl, char *why, size_t why_len);
int ps_etcd_lease_revoke(ps_etcd *e, int64_t id, char *why, size_t why_len);

#endif
