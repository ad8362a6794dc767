#include "ps_group.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

void ps_group_key(const char *job, int g, char *out, size_t cap)
{
    snprintf(out, cap, "/ps/%s/group/%d", job, g);
}

void ps_group_member_key(const char *job, int g, int slot, char *out, size_t cap)
{
    snprintf(out, cap, "/ps/%s/member/%d/%d", job, g, slot);
}

char *ps_group_encode(const ps_group_cfg *c)
{
    json_object *o = json_object_new_object(), *arr = json_object_new_array();
    if (!o || !arr) {
        json_object_put(o);
        json_object_put(arr);
        return NULL;
    }
    json_object_object_add(o, "epoch", json_object_new_int64((int64_t)c->epoch));
    json_object_object_add(o, "primary", json_object_new_int(c->primary));
    for (int i = 0; i < c->n; i++) {
        json_object *m = json_object_new_object();
        char inc[24];
        snprintf(inc, sizeof inc, "%" PRIu64, c->m[i].inc);
        json_object_object_add(m, "slot", json_object_new_int(c->m[i].slot));
        /* a string: JSON numbers lose bits past 2^53 in some readers */
        json_object_object_add(m, "inc", json_object_new_string(inc));
        json_object_array_add(arr, m);
    }
    json_object_object_add(o, "members", arr);
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return s;
}

int ps_group_decode(const char *json, int slots, ps_group_cfg *c, char *why, size_t why_len)
{
    memset(c, 0, sizeof *c);
    json_object *o = json_tokener_parse(json), *v, *arr;
    int rc = PS_EDATA;
    if (!o || !json_object_is_type(o, json_type_object)) {
        ps_errorf(why, why_len, "a group configuration is not a JSON object: %.80s", json);
        goto out;
    }
    if (!json_object_object_get_ex(o, "epoch", &v) || json_object_get_int64(v) < 1 ||
        !json_object_object_get_ex(o, "primary", &v) ||
        !json_object_object_get_ex(o, "members", &arr) ||
        !json_object_is_type(arr, json_type_array)) {
        ps_errorf(why, why_len, "a group configuration needs epoch >= 1, primary and members: "
                  "%.80s", json);
        goto out;
    }
    json_object_object_get_ex(o, "epoch", &v);
    c->epoch = (uint64_t)json_object_get_int64(v);
    json_object_object_get_ex(o, "primary", &v);
    c->primary = json_object_get_int(v);
    size_t n = json_object_array_length(arr);
    if (n < 1 || n > PS_GROUP_MAX_MEMBERS) {
        ps_errorf(why, why_len, "a group configuration has %zu members (1..%d)", n,
                  PS_GROUP_MAX_MEMBERS);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(arr, i), *s, *inc;
        if (!json_object_object_get_ex(m, "slot", &s) || !json_object_object_get_ex(m, "inc", &inc)) {
            ps_errorf(why, why_len, "member %zu of a group configuration lacks slot or inc", i);
            goto out;
        }
        int slot = json_object_get_int(s);
        if (slot < 0 || slot >= slots || ps_group_find(c, slot) >= 0) {
            ps_errorf(why, why_len, "member slot %d of a group configuration is out of range "
                      "[0, %d) or given twice", slot, slots);
            goto out;
        }
        c->m[c->n].slot = slot;
        c->m[c->n].inc = strtoull(json_object_get_string(inc), NULL, 10);
        c->n++;
    }
    if (ps_group_find(c, c->primary) < 0) {
        ps_errorf(why, why_len, "the primary %d of a group configuration is not a member",
                  c->primary);
        goto out;
    }
    rc = 0;
out:
    json_object_put(o);
    return rc;
}

int ps_group_find(const ps_group_cfg *c, int slot)
{
    for (int i = 0; i < c->n; i++)
        if (c->m[i].slot == slot)
            return i;
    return -1;
}

void ps_group_remove(ps_group_cfg *c, int slot)
{
    int i = ps_group_find(c, slot);
    if (i < 0 || slot == c->primary)
        return;
    memmove(&c->m[i], &c->m[i + 1], (size_t)(c->n - i - 1) * sizeof c->m[0]);
    c->n--;
}

int ps_group_load(ps_etcd *e, const char *job, int g, int slots, ps_group_cfg *c, char *why,
                  size_t why_len)
{
    char key[256];
    ps_group_key(job, g, key, sizeof key);
    ps_etcd_kv kv;
    memset(c, 0, sizeof *c);
    int rc = ps_etcd_get(e, key, &kv, why, why_len);
    if (rc)
        return rc;
    rc = ps_group_decode(kv.value, slots, c, why, why_len);
    c->rev = kv.mod_rev;
    ps_etcd_kv_free(&kv);
    return rc;
}

int ps_group_cas(ps_etcd *e, const char *job, int g, int slots, int64_t expect_rev,
                 ps_group_cfg *next, ps_group_cfg *now, char *why, size_t why_len)
{
    char key[256];
    ps_group_key(job, g, key, sizeof key);
    char *val = ps_group_encode(next);
    if (!val)
        return PS_ENOMEM;
    ps_etcd_kv cur;
    int64_t rev = 0;
    int rc = ps_etcd_cas(e, key, expect_rev, val, strlen(val), 0, &rev, &cur, why, why_len);
    free(val);
    if (!rc) {
        next->rev = rev;
        return 0;
    }
    if (rc == PS_ESTALE && now) {
        memset(now, 0, sizeof *now);
        if (cur.mod_rev) {
            int drc = ps_group_decode(cur.value, slots, now, why, why_len);
            now->rev = cur.mod_rev;
            if (drc)
                rc = drc;
        }
    }
    ps_etcd_kv_free(&cur);
    return rc;
}

void ps_group_describe(const ps_group_cfg *c, char *out, size_t cap)
{
    size_t w = 0;
    int n = snprintf(out, cap, "epoch %" PRIu64 ", primary %d, members", c->epoch, c->primary);
    w = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < c->n && w < cap; i++) {
        if (c->m[i].inc)
            n = snprintf(out + w, cap - w, "%s %d (inc %" PRIx64 ")", i ? "," : "",
                         c->m[i].slot, c->m[i].inc);
        else
            n = snprintf(out + w, cap - w, "%s %d (unclaimed)", i ? "," : "", c->m[i].slot);
        w += n > 0 ? (size_t)n : 0;
    }
}
