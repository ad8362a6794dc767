/* The frames after a message's header, checked against its type's row of
 * the message table (ps_proto.h: ps_proto_check_frames): how many, and the
 * bytes of each, for a dense payload and for a table's ids and rows. */
#include <stdio.h>

#include "ps_error.h"
#include "ps_proto.h"

int ps_payload_frames(int layout)
{
    switch (layout) {
    case PS_PL_VALUES:
    case PS_PL_IDS:
    case PS_PL_ROWS: return 1;
    case PS_PL_BYTES: return 1;
    case PS_PL_IDS_ROWS:
    case PS_PL_LOOKUP: return 2;
    case PS_PL_IDS_ROWS_IDS: return 3;
    default: return 0;
    }
}

static int takes_shm(const ps_msg_info *m) { return m->shm; }

/* The frames of a table's layout (PS_PL_IDS .. IDS_ROWS_IDS), checked:
 * `dim`, the counts against their limits, each frame's bytes (bytes NULL:
 * in the worker's arena, float32, no frame; ps_proto_sparse_shm_bytes). */
static int check_sparse(const ps_header *h, int layout, int reply, const size_t *bytes,
                        char *why, size_t why_len)
{
    const char *what = reply ? "reply" : "request";
    const char *name = ps_msg_type_name(h->type);
    if (h->dim < 1 || h->dim > PS_MAX_TABLE_DIM) {
        ps_errorf(why, why_len, "%s %s: rows of dim %u (1 .. %d)", name, what, h->dim,
            PS_MAX_TABLE_DIM);
        return PS_EPROTO;
    }
    uint64_t nids = h->count, nrows = h->count;
    if (nids > PS_MAX_SPARSE_IDS || (layout == PS_PL_IDS_ROWS_IDS && h->npull > PS_MAX_SPARSE_IDS)) {
        ps_errorf(why, why_len, "%s %s of %llu ids (and %llu to pull): at most %u per message",
            name, what, (unsigned long long)nids, (unsigned long long)h->npull,
            PS_MAX_SPARSE_IDS);
        return PS_ETOOBIG;
    }
    int has_rows = layout == PS_PL_ROWS || layout == PS_PL_IDS_ROWS ||
                   layout == PS_PL_IDS_ROWS_IDS;
    size_t es = ps_dtype_size(h->dtype);
    if (has_rows && es == 0) {
        ps_errorf(why, why_len, "%s %s: rows of unknown dtype %u", name, what, h->dtype);
        return PS_EPROTO;
    }
    if (!bytes && h->dtype != PS_DTYPE_F32) {
        ps_errorf(why, why_len, "%s %s in shared memory: rows are float32 (d = %d), got d = %u",
            name, what, PS_DTYPE_F32, h->dtype);
        return PS_EPROTO;
    }
    /* in the arena a request names room for its reply's rows too */
    if (!bytes && !reply && layout != PS_PL_IDS_ROWS)
        nrows = layout == PS_PL_IDS ? h->count : h->count > h->npull ? h->count : h->npull;
    if ((has_rows || !bytes) && nrows * h->dim * es > PS_MAX_PAYLOAD_BYTES) {
        ps_errorf(why, why_len, "%s %s: %llu rows of %u x %zu bytes are over the %llu-byte "
            "payload limit", name, what, (unsigned long long)nrows, h->dim, es,
            (unsigned long long)PS_MAX_PAYLOAD_BYTES);
        return PS_ETOOBIG;
    }
    /* frame by frame: what it is and the bytes it must have */
    const char *fname[3];
    uint64_t want[3];
    int nf = 0;
    if (layout != PS_PL_ROWS) {
        fname[nf] = "ids";
        want[nf++] = 8 * nids;
    }
    if (has_rows) {
        fname[nf] = "rows";
        want[nf++] = nrows * h->dim * es;
    }
    if (layout == PS_PL_IDS_ROWS_IDS) {
        fname[nf] = "ids to pull";
        want[nf++] = 8 * h->npull;
    }
    for (int i = 0; bytes && i < nf; i++)
        if (bytes[i] != want[i]) {
            ps_errorf(why, why_len, "%s %s: frame %d (%s) has %zu bytes, not %llu (n = %llu, "
                "np = %llu, dim = %u, d = %u)", name, what, i + 1, fname[i], bytes[i],
                (unsigned long long)want[i], (unsigned long long)h->count,
                (unsigned long long)h->npull, h->dim, h->dtype);
            return PS_EPROTO;
        }
    return 0;
}

/* A lookup's frames: 1 to PS_MAX_LOOKUP_TABLES tables of 16 bytes, `n` ids
 * (whose split over the tables the receiver checks); its reply is VALUES. */
static int check_lookup(const ps_header *h, const size_t *bytes, char *why, size_t why_len)
{
    if (h->count > PS_MAX_SPARSE_IDS) {
        ps_errorf(why, why_len, "lookup request of %llu ids: at most %u per message",
            (unsigned long long)h->count, PS_MAX_SPARSE_IDS);
        return PS_ETOOBIG;
    }
    if (bytes[0] < PS_LOOKUP_ENTRY_BYTES || bytes[0] % PS_LOOKUP_ENTRY_BYTES ||
        bytes[0] / PS_LOOKUP_ENTRY_BYTES > PS_MAX_LOOKUP_TABLES) {
        ps_errorf(why, why_len, "lookup request: frame 1 (tables) has %zu bytes, not 1 to %d "
            "entries of %d", bytes[0], PS_MAX_LOOKUP_TABLES, PS_LOOKUP_ENTRY_BYTES);
        return PS_EPROTO;
    }
    if (bytes[1] != 8 * h->count) {
        ps_errorf(why, why_len, "lookup request: frame 2 (ids) has %zu bytes, not %llu (n = %llu)",
            bytes[1], 8 * (unsigned long long)h->count, (unsigned long long)h->count);
        return PS_EPROTO;
    }
    return 0;
}

int ps_proto_check_frames(const ps_header *h, int nframes, const size_t *bytes, char *why,
                          size_t why_len)
{
    int reply = (h->flags & PS_FLAG_REPLY) != 0;
    int layout = reply ? ps_msg_reply_layout(h->type) : ps_msg_request_layout(h->type);
    int needs = layout == PS_PL_VALUES;
    if (h->flags & PS_FLAG_SHM) {
        /* the payload (or a pull's destination) is in the worker's arena */
        const ps_msg_info *m = ps_msg_info_of(h->type);
        if (!m || !m->shm) {
            char list[128];
            ps_errorf(why, why_len, "a %s carries no payload: the shared-memory flag is for %s",
                ps_msg_type_name(h->type), ps_msg_names(list, sizeof list, takes_shm));
            return PS_EPROTO;
        }
        if (nframes != 0) {
            ps_errorf(why, why_len, "%s %s in shared memory takes no payload frame, got %d",
                ps_msg_type_name(h->type), reply ? "reply" : "request", nframes);
            return PS_EPROTO;
        }
        if (layout >= PS_PL_IDS)
            return check_sparse(h, layout, reply, NULL, why, why_len);
        /* a request whose reply has a payload names where it goes */
        if ((needs || (!reply && ps_msg_reply_has_payload(h->type))) &&
            (h->count == 0 || ps_dtype_size(h->dtype) == 0)) {
            ps_errorf(why, why_len, "%s %s in shared memory needs a count and a dtype",
                ps_msg_type_name(h->type), reply ? "reply" : "request");
            return PS_EPROTO;
        }
        return 0;
    }
    int want = ps_payload_frames(layout);
    if (nframes != want) {
        if (want == 0)
            ps_errorf(why, why_len, "%s %s carries no payload, got %d extra frame(s)",
                ps_msg_type_name(h->type), reply ? "reply" : "request", nframes);
        else if (want == 1)
            ps_errorf(why, why_len, "%s %s needs exactly one payload frame, got %d",
                ps_msg_type_name(h->type), reply ? "reply" : "request", nframes);
        else
            ps_errorf(why, why_len, "%s %s needs %d frames after its header, got %d",
                ps_msg_type_name(h->type), reply ? "reply" : "request", want, nframes);
        return PS_EPROTO;
    }
    if (!want)
        return 0;
    if (layout == PS_PL_LOOKUP)
        return check_lookup(h, bytes, why, why_len);
    if (layout == PS_PL_BYTES) {
        if (h->count > ps_msg_bytes_limit(h->type) || bytes[0] != h->count) {
            ps_errorf(why, why_len, "%s: a frame of %zu bytes, `n` says %llu (at most %llu)",
                ps_msg_type_name(h->type), bytes[0], (unsigned long long)h->count,
                (unsigned long long)ps_msg_bytes_limit(h->type));
            return PS_EPROTO;
        }
        return 0;
    }
    if (layout != PS_PL_VALUES)
        return check_sparse(h, layout, reply, bytes, why, why_len);
    size_t es = ps_dtype_size(h->dtype);
    if (es == 0) {
        ps_errorf(why, why_len, "unknown dtype %u", h->dtype);
        return PS_EPROTO;
    }
    if (h->count == 0 || h->count * es != bytes[0]) {
        ps_errorf(why, why_len, "payload of %zu bytes does not match count %llu x %zu bytes",
            bytes[0], (unsigned long long)h->count, es);
        return PS_EPROTO;
    }
    return 0;
}

int ps_proto_check_payload(const ps_header *h, int nframes, size_t payload_bytes, char *why,
                           size_t why_len)
{
    size_t bytes[3] = {payload_bytes, 0, 0};
    return ps_proto_check_frames(h, nframes, bytes, why, why_len);
}

uint64_t ps_proto_sparse_shm_bytes(const ps_header *h, uint64_t *reply_at)
{
    uint64_t row = (uint64_t)h->dim * sizeof(float);
    if (h->type == PS_MSG_SPULL) {
        *reply_at = 8 * h->count;
        return *reply_at + h->count * row;
    }
    *reply_at = (8 + row) * h->count + (h->type == PS_MSG_SPUSHPULL ? 8 * h->npull : 0);
    return *reply_at + (h->type == PS_MSG_SPUSHPULL ? h->npull * row : 0);
}
