/* The server map and its plans (ps_smap.h). */
#include "ps_smap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

static const char smap_magic[8] = {'P', 'S', 'S', 'M', 'A', 'P', '1', '\0'};

int ps_smap_id_cmp(const ps_smap_id *x, const ps_smap_id *y)
{
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->a != y->a)
        return x->a < y->a ? -1 : 1;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return 0;
}

static void id_text(const ps_smap_id *id, char *buf, size_t len)
{
    if (id->kind == PS_SMAP_CHUNK)
        snprintf(buf, len, "chunk %u of key %llu", id->a, (unsigned long long)id->key);
    else if (id->kind == PS_SMAP_PART)
        snprintf(buf, len, "partition %u of server %u of table %llu", id->b, id->a,
                 (unsigned long long)id->key);
    else
        snprintf(buf, len, "object of kind %u (key %llu)", id->kind, (unsigned long long)id->key);
}

/* NULL when id can be an object of a map of nslots slots, else what is wrong */
static const char *id_problem(const ps_smap_id *id, int nslots)
{
    if (id->kind == PS_SMAP_CHUNK)
        return id->b == 0 ? NULL : "a chunk's b is not 0";
    if (id->kind == PS_SMAP_PART)
        return id->a < (uint32_t)nslots ? NULL : "a partition's home server is not a slot";
    return "its kind is neither 1 (chunk) nor 2 (partition)";
}

static int slot_live(const ps_smap *m, int s)
{
    return s >= 0 && s < m->nslots && m->slots[s].state == PS_SMAP_LIVE;
}

/* An endpoint of n bytes: PS_EINVAL (why says) unless it is 1..PS_ENDPOINT_MAX-1
 * printable characters, so that it fits a slot, a log line and the wire. */
static int check_endpoint(const char *ep, size_t n, int slot, char *why, size_t why_len)
{
    if (n == 0) {
        ps_errorf(why, why_len, "slot %d: the endpoint is empty", slot);
        return PS_EINVAL;
    }
    if (n >= PS_ENDPOINT_MAX) {
        ps_errorf(why, why_len, "slot %d: the endpoint is %zu bytes, at most %d allowed", slot, n,
                  PS_ENDPOINT_MAX - 1);
        return PS_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)ep[i];
        if (c < 0x20 || c > 0x7e) {
            ps_errorf(why, why_len, "slot %d: the endpoint has a non-printable byte 0x%02x at %zu",
                      slot, c, i);
            return PS_EINVAL;
        }
    }
    return 0;
}

/* PS_EINVAL when a live slot other than `except` already has endpoint ep */
static int check_unique(const ps_smap *m, const char *ep, int except, char *why, size_t why_len)
{
    for (int s = 0; s < m->nslots; s++)
        if (s != except && m->slots[s].state == PS_SMAP_LIVE && !strcmp(m->slots[s].endpoint, ep)) {
            ps_errorf(why, why_len, "slot %d: endpoint %s is slot %d's already", except, ep, s);
            return PS_EINVAL;
        }
    return 0;
}

void ps_smap_free(ps_smap *m)
{
    free(m->slots);
    free(m->over);
    memset(m, 0, sizeof *m);
}

/* Slots are allocated at the most PS_SMAP_MAX_SLOTS up front (64 KiB) so
 * adding one never reallocates and can fail only for the limit. */
static int alloc_slots(ps_smap *m)
{
    m->slots = calloc(PS_SMAP_MAX_SLOTS, sizeof *m->slots);
    return m->slots ? 0 : PS_ENOMEM;
}

int ps_smap_init(ps_smap *m, const char *const *endpoints, int n, char *why, size_t why_len)
{
    memset(m, 0, sizeof *m);
    if (n < 1 || n > PS_SMAP_MAX_SLOTS) {
        ps_errorf(why, why_len, "a server map holds 1..%d servers, got %d", PS_SMAP_MAX_SLOTS, n);
        return PS_EINVAL;
    }
    if (alloc_slots(m)) {
        ps_errorf(why, why_len, "out of memory for the server map");
        return PS_ENOMEM;
    }
    for (int s = 0; s < n; s++) {
        const char *ep = endpoints[s] ? endpoints[s] : "";
        int rc = check_endpoint(ep, strnlen(ep, PS_ENDPOINT_MAX), s, why, why_len);
        if (!rc)
            rc = check_unique(m, ep, s, why, why_len);
        if (rc) {
            ps_smap_free(m);
            return rc;
        }
        m->slots[s].state = PS_SMAP_LIVE;
        strcpy(m->slots[s].endpoint, ep);
        m->nslots = m->nlive = s + 1;
    }
    return 0;
}

int ps_smap_add_slot(ps_smap *m, const char *endpoint, int *slot, char *why, size_t why_len)
{
    if (m->nslots >= PS_SMAP_MAX_SLOTS) {
        ps_errorf(why, why_len,
                  "cannot add a server: the map has had %d slots, the most it can (removed "
                  "slots are never reused)",
                  PS_SMAP_MAX_SLOTS);
        return PS_ETOOBIG;
    }
    int s = m->nslots;
    const char *ep = endpoint ? endpoint : "";
    int rc = check_endpoint(ep, strnlen(ep, PS_ENDPOINT_MAX), s, why, why_len);
    if (!rc)
        rc = check_unique(m, ep, s, why, why_len);
    if (rc)
        return rc;
    m->slots[s].state = PS_SMAP_LIVE;
    strcpy(m->slots[s].endpoint, ep);
    m->nslots++;
    m->nlive++;
    m->epoch++;
    *slot = s;
    return 0;
}

int ps_smap_remove_slot(ps_smap *m, int slot, char *why, size_t why_len)
{
    if (!slot_live(m, slot)) {
        ps_errorf(why, why_len, "cannot remove slot %d: it is %s", slot,
                  slot < 0 || slot >= m->nslots ? "not a slot" : "removed already");
        return PS_EINVAL;
    }
    if (m->nlive == 1) {
        ps_errorf(why, why_len, "cannot remove slot %d: it is the last live server", slot);
        return PS_EINVAL;
    }
    size_t held = ps_smap_held(m, slot, NULL, 0);
    if (held) {
        ps_errorf(why, why_len, "cannot remove slot %d: it still holds %zu moved objects (move "
                  "them off first)", slot, held);
        return PS_ESTATE;
    }
    m->slots[slot].state = PS_SMAP_REMOVED;
    m->nlive--;
    m->epoch++;
    return 0;
}

/* The override of id, or NULL: binary search, the array being sorted */
static const ps_smap_override *find_override(const ps_smap *m, const ps_smap_id *id)
{
    size_t lo = 0, hi = m->nover;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = ps_smap_id_cmp(&m->over[mid].id, id);
        if (!c)
            return &m->over[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int ps_smap_owner(const ps_smap *m, const ps_smap_id *id, int home)
{
    if (!m->nover)
        return home;
    const ps_smap_override *o = find_override(m, id);
    return o ? o->owner : home;
}

size_t ps_smap_held(const ps_smap *m, int slot, ps_smap_override *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < m->nover; i++)
        if (m->over[i].owner == slot) {
            if (k < cap)
                out[k] = m->over[i];
            k++;
        }
    return k;
}

static int by_move_id(const void *a, const void *b)
{
    return ps_smap_id_cmp(&((const ps_smap_move *)a)->id, &((const ps_smap_move *)b)->id);
}

int ps_smap_apply(ps_smap *m, const ps_smap_move *moves, size_t n, char *why, size_t why_len)
{
    char what[128];
    for (size_t i = 0; i < n; i++) {
        const ps_smap_move *mv = &moves[i];
        const char *bad = id_problem(&mv->id, m->nslots);
        id_text(&mv->id, what, sizeof what);
        if (!bad && (mv->home < 0 || mv->home >= m->nslots))
            bad = "its home is not a slot";
        if (!bad && mv->id.kind == PS_SMAP_PART && mv->id.a != (uint32_t)mv->home)
            bad = "a partition's home is not its a";
        if (!bad && !slot_live(m, mv->to))
            bad = "its destination is not a live slot";
        if (!bad && mv->to == mv->from)
            bad = "its destination is its source";
        if (!bad && ps_smap_owner(m, &mv->id, mv->home) != mv->from)
            bad = "its source is not its owner in the map";
        if (bad) {
            ps_errorf(why, why_len, "move %zu (%s, %d -> %d, home %d): %s", i, what, mv->from,
                      mv->to, mv->home, bad);
            return PS_EINVAL;
        }
    }
    /* more moves than a map may hold overrides cannot all be distinct and
     * away; the exact count is checked after the merge (moves home shrink it) */
    if (n > PS_SMAP_MAX_OVERRIDES) {
        ps_errorf(why, why_len, "%zu moves at once, more than %u", n, PS_SMAP_MAX_OVERRIDES);
        return PS_ETOOBIG;
    }
    ps_smap_move *sorted = malloc((n ? n : 1) * sizeof *sorted);
    ps_smap_override *next = malloc((m->nover + n ? m->nover + n : 1) * sizeof *next);
    if (!sorted || !next) {
        free(sorted);
        free(next);
        ps_errorf(why, why_len, "out of memory applying %zu moves", n);
        return PS_ENOMEM;
    }
    if (n)
        memcpy(sorted, moves, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, by_move_id);
    for (size_t i = 1; i < n; i++)
        if (!ps_smap_id_cmp(&sorted[i - 1].id, &sorted[i].id)) {
            id_text(&sorted[i].id, what, sizeof what);
            ps_errorf(why, why_len, "the moves name %s twice", what);
            free(sorted);
            free(next);
            return PS_EINVAL;
        }
    /* merge the two sorted lists: a moved object's entry is its new owner,
     * or none when it goes home */
    size_t i = 0, j = 0, k = 0;
    while (i < m->nover || j < n) {
        int c = i == m->nover ? 1 : j == n ? -1 : ps_smap_id_cmp(&m->over[i].id, &sorted[j].id);
        if (c < 0) {
            next[k++] = m->over[i++];
            continue;
        }
        if (sorted[j].to != sorted[j].home)
            next[k++] = (ps_smap_override){sorted[j].id, sorted[j].to};
        if (!c)
            i++;
        j++;
    }
    free(sorted);
    if (k > PS_SMAP_MAX_OVERRIDES) {
        free(next);
        ps_errorf(why, why_len, "the moves would leave %zu objects away from home, more than %u",
                  k, PS_SMAP_MAX_OVERRIDES);
        return PS_ETOOBIG;
    }
    free(m->over);
    m->over = next;
    m->nover = k;
    m->epoch++;
    return 0;
}

/* ---- planning ---- */

/* What both planners know of a checked inventory */
typedef struct inventory {
    uint64_t load[PS_SMAP_MAX_SLOTS];
    uint64_t total;
} inventory;

/* The planners sort pointers into the caller's inventory, which stays as
 * given (and qsort needs no context) */
typedef struct ref {
    const ps_smap_obj *o;
} ref;

static int by_ref_id(const void *a, const void *b)
{
    return ps_smap_id_cmp(&((const ref *)a)->o->id, &((const ref *)b)->o->id);
}

/* owner, then largest first, then id: each slot's objects in the order the
 * planners take them */
static int by_ref_owner_size(const void *a, const void *b)
{
    const ps_smap_obj *x = ((const ref *)a)->o, *y = ((const ref *)b)->o;
    if (x->owner != y->owner)
        return x->owner < y->owner ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return ps_smap_id_cmp(&x->id, &y->id);
}

/* Check inv against m and slot (as ps_smap_plan_add says) and sum the
 * loads.  refs gets the n objects sorted by (owner, bytes desc, id). */
static int check_inventory(const ps_smap *m, const ps_smap_obj *inv, size_t n, int slot,
                           const char *op, inventory *iv, ref *refs, char *why, size_t why_len)
{
    char what[128];
    if (!slot_live(m, slot)) {
        ps_errorf(why, why_len, "cannot plan to %s slot %d: it is %s", op, slot,
                  slot < 0 || slot >= m->nslots ? "not a slot" : "removed");
        return PS_EINVAL;
    }
    memset(iv, 0, sizeof *iv);
    for (size_t i = 0; i < n; i++) {
        const ps_smap_obj *o = &inv[i];
        const char *bad = id_problem(&o->id, m->nslots);
        if (!bad && (o->home < 0 || o->home >= m->nslots))
            bad = "its home is not a slot";
        if (!bad && o->id.kind == PS_SMAP_PART && o->id.a != (uint32_t)o->home)
            bad = "a partition's home is not its a";
        if (!bad && !slot_live(m, o->owner))
            bad = "its owner is not a live slot";
        if (!bad && ps_smap_owner(m, &o->id, o->home) != o->owner)
            bad = "its owner is not the map's";
        if (!bad && iv->total + o->bytes < iv->total)
            bad = "the bytes add up past 2^64";
        if (bad) {
            id_text(&o->id, what, sizeof what);
            ps_errorf(why, why_len, "inventory entry %zu (%s, home %d, owner %d): %s", i, what,
                      o->home, o->owner, bad);
            return PS_EINVAL;
        }
        iv->total += o->bytes;
        iv->load[o->owner] += o->bytes;
        refs[i].o = o;
    }
    qsort(refs, n, sizeof *refs, by_ref_id);
    size_t j = 0; /* the map's overrides, walked beside the sorted inventory */
    for (size_t i = 0; i < n; i++) {
        if (i && !ps_smap_id_cmp(&refs[i - 1].o->id, &refs[i].o->id)) {
            id_text(&refs[i].o->id, what, sizeof what);
            ps_errorf(why, why_len, "the inventory names %s twice", what);
            return PS_EINVAL;
        }
        if (j < m->nover && ps_smap_id_cmp(&m->over[j].id, &refs[i].o->id) < 0)
            break; /* an override sorts before this object and after the last: missing */
        if (j < m->nover && !ps_smap_id_cmp(&m->over[j].id, &refs[i].o->id))
            j++;
    }
    if (j < m->nover) {
        id_text(&m->over[j].id, what, sizeof what);
        ps_errorf(why, why_len, "the map places %s on slot %d but the inventory lacks it", what,
                  m->over[j].owner);
        return PS_EINVAL;
    }
    qsort(refs, n, sizeof *refs, by_ref_owner_size);
    return 0;
}

static int plan_alloc(ps_smap_plan *plan, int op, int slot, size_t n, ref **refs)
{
    memset(plan, 0, sizeof *plan);
    plan->op = op;
    plan->slot = slot;
    plan->moves = malloc((n ? n : 1) * sizeof *plan->moves);
    *refs = malloc((n ? n : 1) * sizeof **refs);
    if (!plan->moves || !*refs) {
        free(*refs);
        *refs = NULL;
        ps_smap_plan_free(plan);
        return PS_ENOMEM;
    }
    return 0;
}

static void plan_push(ps_smap_plan *plan, const ps_smap_obj *o, int to)
{
    plan->moves[plan->n++] = (ps_smap_move){o->id, o->bytes, o->home, o->owner, to};
    plan->bytes += o->bytes;
}

void ps_smap_plan_free(ps_smap_plan *plan)
{
    free(plan->moves);
    memset(plan, 0, sizeof *plan);
}

/* Fill the new slot up to target = total/L.  Each round takes, from the most
 * loaded slot that has one, the largest object that still fits (bytes <=
 * the need left) and leaves the new slot below that slot's load (so no move
 * is pointless).  The need only shrinks, so a slot's objects too large once
 * stay too large: a cursor per slot walks its largest-first list once.
 * When nothing fits, one smaller-than-twice-the-need object may overshoot,
 * when it leaves the new slot nearer the target.  So the new slot receives
 * at most need + the largest object, and ends at least target - the
 * largest: while it is below that, the most loaded slot is above the
 * target and all its objects fit. */
int ps_smap_plan_add(const ps_smap *m, const ps_smap_obj *inv, size_t n, int slot,
                     ps_smap_plan *plan, char *why, size_t why_len)
{
    ref *refs;
    if (plan_alloc(plan, PS_SMAP_ADD, slot, n, &refs)) {
        ps_errorf(why, why_len, "out of memory planning %zu objects", n);
        return PS_ENOMEM;
    }
    inventory iv;
    unsigned char *taken = calloc(n ? n : 1, 1);
    int rc = taken ? check_inventory(m, inv, n, slot, "add", &iv, refs, why, why_len) : PS_ENOMEM;
    if (rc) {
        if (rc == PS_ENOMEM)
            ps_errorf(why, why_len, "out of memory planning %zu objects", n);
        free(taken);
        free(refs);
        ps_smap_plan_free(plan);
        return rc;
    }
    size_t first[PS_SMAP_MAX_SLOTS + 1], cur[PS_SMAP_MAX_SLOTS];
    size_t r = 0;
    for (int s = 0; s < m->nslots; s++) {
        first[s] = r;
        while (r < n && refs[r].o->owner == s)
            r++;
        cur[s] = first[s];
    }
    first[m->nslots] = n;
    uint64_t *load = iv.load;
    uint64_t target = iv.total / (uint64_t)m->nlive;
    while (load[slot] < target) {
        uint64_t need = target - load[slot];
        int best = -1;
        for (int s = 0; s < m->nslots; s++) {
            if (s == slot || !slot_live(m, s))
                continue;
            while (cur[s] < first[s + 1] && (taken[cur[s]] || refs[cur[s]].o->bytes > need))
                cur[s]++;
            if (cur[s] == first[s + 1] || load[slot] + refs[cur[s]].o->bytes >= load[s])
                continue;
            if (best < 0 || load[s] > load[best])
                best = s;
        }
        if (best < 0)
            break;
        const ps_smap_obj *o = refs[cur[best]].o;
        taken[cur[best]] = 1;
        load[best] -= o->bytes;
        load[slot] += o->bytes;
        plan_push(plan, o, slot);
    }
    if (load[slot] < target) {
        /* the smallest object left, from the most loaded slot on ties */
        uint64_t need = target - load[slot];
        size_t pick = n;
        for (int s = 0; s < m->nslots; s++) {
            if (s == slot || !slot_live(m, s))
                continue;
            for (size_t k = first[s]; k < first[s + 1]; k++) {
                if (taken[k])
                    continue;
                const ps_smap_obj *o = refs[k].o;
                if (pick == n || o->bytes < refs[pick].o->bytes ||
                    (o->bytes == refs[pick].o->bytes && load[s] > load[refs[pick].o->owner]))
                    pick = k;
            }
        }
        if (pick < n) {
            const ps_smap_obj *o = refs[pick].o;
            if (o->bytes - need < need && load[slot] + o->bytes < load[o->owner]) {
                load[o->owner] -= o->bytes;
                load[slot] += o->bytes;
                plan_push(plan, o, slot);
            }
        }
    }
    free(taken);
    free(refs);
    return 0;
}

int ps_smap_plan_remove(const ps_smap *m, const ps_smap_obj *inv, size_t n, int slot,
                        ps_smap_plan *plan, char *why, size_t why_len)
{
    ref *refs;
    if (plan_alloc(plan, PS_SMAP_REMOVE, slot, n, &refs)) {
        ps_errorf(why, why_len, "out of memory planning %zu objects", n);
        return PS_ENOMEM;
    }
    inventory iv;
    int rc = check_inventory(m, inv, n, slot, "remove", &iv, refs, why, why_len);
    if (!rc && m->nlive == 1) {
        ps_errorf(why, why_len, "cannot plan to remove slot %d: it is the last live server", slot);
        rc = PS_EINVAL;
    }
    if (rc) {
        free(refs);
        ps_smap_plan_free(plan);
        return rc;
    }
    /* refs is by owner, largest first: slot's objects are one run */
    for (size_t k = 0; k < n; k++) {
        const ps_smap_obj *o = refs[k].o;
        if (o->owner != slot)
            continue;
        int best = -1;
        for (int s = 0; s < m->nslots; s++)
            if (s != slot && slot_live(m, s) && (best < 0 || iv.load[s] < iv.load[best]))
                best = s;
        iv.load[best] += o->bytes;
        plan_push(plan, o, best);
    }
    free(refs);
    return 0;
}

/* ---- log lines ---- */

static void append(char *buf, size_t len, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *pos, const char *fmt, ...)
{
    if (*pos >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *pos, len - *pos, fmt, ap);
    va_end(ap);
    if (w > 0)
        *pos += (size_t)w < len - *pos ? (size_t)w : len - *pos;
}

static const char *slot_endpoint(const ps_smap *m, int s)
{
    return s >= 0 && s < m->nslots ? m->slots[s].endpoint : "?";
}

void ps_smap_plan_describe(const ps_smap *m, const ps_smap_plan *plan, char *buf, size_t len)
{
    if (!len)
        return;
    buf[0] = '\0';
    size_t pos = 0;
    int add = plan->op == PS_SMAP_ADD;
    append(buf, len, &pos, "%s slot %d (%s): ", add ? "add" : "remove", plan->slot,
           slot_endpoint(m, plan->slot));
    if (!plan->n) {
        append(buf, len, &pos, "nothing to move");
        return;
    }
    size_t count[PS_SMAP_MAX_SLOTS] = {0};
    for (size_t i = 0; i < plan->n; i++) {
        int s = add ? plan->moves[i].from : plan->moves[i].to;
        if (s >= 0 && s < PS_SMAP_MAX_SLOTS)
            count[s]++;
    }
    append(buf, len, &pos, "%zu object%s, %.1f MB %s slots", plan->n, plan->n == 1 ? "" : "s",
           (double)plan->bytes / 1e6, add ? "from" : "to");
    const char *sep = " ";
    for (int s = 0; s < PS_SMAP_MAX_SLOTS; s++)
        if (count[s]) {
            append(buf, len, &pos, "%s%d (%zu)", sep, s, count[s]);
            sep = ", ";
        }
}

void ps_smap_describe(const ps_smap *m, char *buf, size_t len)
{
    if (!len)
        return;
    buf[0] = '\0';
    size_t pos = 0;
    append(buf, len, &pos, "epoch %llu: %d slots, %d live (", (unsigned long long)m->epoch,
           m->nslots, m->nlive);
    for (int s = 0; s < m->nslots; s++)
        append(buf, len, &pos, "%s%d %s%s", s ? ", " : "", s, m->slots[s].endpoint,
               m->slots[s].state == PS_SMAP_LIVE ? "" : " removed");
    append(buf, len, &pos, "); %zu object%s away from home", m->nover, m->nover == 1 ? "" : "s");
}

/* ---- the encoded map ---- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

size_t ps_smap_encoded_bytes(const ps_smap *m)
{
    size_t b = PS_SMAP_HEAD_BYTES;
    for (int s = 0; s < m->nslots; s++)
        b += 8 + pad8(strlen(m->slots[s].endpoint));
    return b + m->nover * PS_SMAP_OVERRIDE_BYTES;
}

void ps_smap_encode(const ps_smap *m, unsigned char *buf)
{
    memcpy(buf, smap_magic, 8);
    put64(buf + 8, m->epoch);
    put32(buf + 16, (uint32_t)m->nslots);
    put32(buf + 20, (uint32_t)m->nover);
    unsigned char *p = buf + PS_SMAP_HEAD_BYTES;
    for (int s = 0; s < m->nslots; s++) {
        size_t n = strlen(m->slots[s].endpoint);
        put32(p, m->slots[s].state);
        put32(p + 4, (uint32_t)n);
        memset(p + 8, 0, pad8(n));
        memcpy(p + 8, m->slots[s].endpoint, n);
        p += 8 + pad8(n);
    }
    for (size_t i = 0; i < m->nover; i++, p += PS_SMAP_OVERRIDE_BYTES) {
        const ps_smap_override *o = &m->over[i];
        put32(p, o->id.kind);
        put32(p + 4, o->id.a);
        put64(p + 8, o->id.key);
        put32(p + 16, o->id.b);
        put32(p + 20, (uint32_t)o->owner);
    }
}

static int decode_fail(ps_smap *m, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int decode_fail(ps_smap *m, char *why, size_t why_len, const char *fmt, ...)
{
    char msg[PS_ENDPOINT_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ps_errorf(why, why_len, "bad server map: %s", msg);
    ps_smap_free(m);
    return PS_EPROTO;
}

int ps_smap_decode(const unsigned char *buf, size_t len, ps_smap *m, char *why, size_t why_len)
{
    memset(m, 0, sizeof *m);
    if (len < PS_SMAP_HEAD_BYTES)
        return decode_fail(m, why, why_len, "%zu bytes, shorter than its %d-byte head", len,
                           PS_SMAP_HEAD_BYTES);
    if (memcmp(buf, smap_magic, 8))
        return decode_fail(m, why, why_len, "it does not start with \"PSSMAP1\"");
    uint64_t epoch = get64(buf + 8);
    uint32_t nslots = get32(buf + 16), nover = get32(buf + 20);
    if (nslots < 1 || nslots > PS_SMAP_MAX_SLOTS)
        return decode_fail(m, why, why_len, "%u slots, not 1..%d", nslots, PS_SMAP_MAX_SLOTS);
    if (nover > PS_SMAP_MAX_OVERRIDES)
        return decode_fail(m, why, why_len, "%u overrides, more than %u", nover,
                           PS_SMAP_MAX_OVERRIDES);
    if (alloc_slots(m)) {
        ps_errorf(why, why_len, "out of memory for the server map");
        return PS_ENOMEM;
    }
    m->epoch = epoch;
    size_t off = PS_SMAP_HEAD_BYTES;
    char why2[PS_ENDPOINT_MAX + 64];
    for (uint32_t s = 0; s < nslots; s++) {
        if (len - off < 8)
            return decode_fail(m, why, why_len, "truncated in slot %u's head (%zu bytes)", s,
                               len);
        uint32_t state = get32(buf + off), n = get32(buf + off + 4);
        if (state != PS_SMAP_LIVE && state != PS_SMAP_REMOVED)
            return decode_fail(m, why, why_len, "slot %u's state is %u, not 1 (live) or 2 "
                               "(removed)", s, state);
        if (n == 0 || n >= PS_ENDPOINT_MAX)
            return decode_fail(m, why, why_len, "slot %u's endpoint is %u bytes, not 1..%d", s, n,
                               PS_ENDPOINT_MAX - 1);
        off += 8;
        if (len - off < pad8(n))
            return decode_fail(m, why, why_len, "truncated in slot %u's endpoint (%zu bytes)", s,
                               len);
        const char *ep = (const char *)buf + off;
        if (check_endpoint(ep, n, (int)s, why2, sizeof why2))
            return decode_fail(m, why, why_len, "%s", why2);
        for (size_t k = n; k < pad8(n); k++)
            if (buf[off + k])
                return decode_fail(m, why, why_len, "slot %u's endpoint padding is not zeros", s);
        memcpy(m->slots[s].endpoint, ep, n);
        m->slots[s].endpoint[n] = '\0';
        m->slots[s].state = state;
        if (state == PS_SMAP_LIVE) {
            if (check_unique(m, m->slots[s].endpoint, (int)s, why2, sizeof why2))
                return decode_fail(m, why, why_len, "%s", why2);
            m->nlive++;
        }
        m->nslots = (int)s + 1;
        off += pad8(n);
    }
    if (!m->nlive)
        return decode_fail(m, why, why_len, "no slot is live");
    if ((len - off) / PS_SMAP_OVERRIDE_BYTES < nover || (len - off) % PS_SMAP_OVERRIDE_BYTES)
        return decode_fail(m, why, why_len, "%zu bytes after the slots for %u overrides of %d",
                           len - off, nover, PS_SMAP_OVERRIDE_BYTES);
    if ((len - off) / PS_SMAP_OVERRIDE_BYTES > nover)
        return decode_fail(m, why, why_len, "%zu bytes follow the last override",
                           len - off - (size_t)nover * PS_SMAP_OVERRIDE_BYTES);
    m->over = malloc((nover ? nover : 1) * sizeof *m->over);
    if (!m->over) {
        ps_smap_free(m);
        ps_errorf(why, why_len, "out of memory for %u overrides", nover);
        return PS_ENOMEM;
    }
    for (uint32_t i = 0; i < nover; i++, off += PS_SMAP_OVERRIDE_BYTES) {
        const unsigned char *p = buf + off;
        ps_smap_override o = {{get32(p), get64(p + 8), get32(p + 4), get32(p + 16)},
                              (int32_t)get32(p + 20)};
        const char *bad = id_problem(&o.id, m->nslots);
        if (!bad && (o.owner < 0 || o.owner >= m->nslots))
            bad = "its owner is not a slot";
        if (!bad && !slot_live(m, o.owner))
            bad = "its owner is a removed slot";
        if (!bad && o.id.kind == PS_SMAP_PART && o.id.a == (uint32_t)o.owner)
            bad = "a partition's owner is its home (that is no override)";
        if (!bad && i && ps_smap_id_cmp(&m->over[i - 1].id, &o.id) >= 0)
            bad = "it does not follow the one before in (kind, key, a, b) order";
        if (bad) {
            id_text(&o.id, why2, sizeof why2);
            return decode_fail(m, why, why_len, "override %u (%s, owner %d): %s", i, why2,
                               o.owner, bad);
        }
        m->over[i] = o;
        m->nover = i + 1;
    }
    return 0;
}
