#include "reply.h"

#include <string.h>

void ps_reply_header(ps_header *r, uint32_t type, uint64_t seq, int32_t rank, uint64_t key,
                     uint32_t chunk)
{
    ps_header_init(r, type);
    r->flags = PS_FLAG_REPLY;
    r->seq = seq;
    r->rank = rank;
    r->key = key;
    r->chunk = chunk;
}

void ps_reply_error(ps_header *r, uint64_t seq, int32_t rank, uint64_t key, uint32_t chunk,
                    int code, const char *text)
{
    ps_reply_header(r, PS_MSG_ERROR, seq, rank, key, chunk);
    r->err_code = code;
    size_t n = strnlen(text, sizeof r->err_text - 1);
    memcpy(r->err_text, text, n);
    r->err_text[n] = 0;
}
