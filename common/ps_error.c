#include "ps_error.h"

#include <stdarg.h>
#include <stdio.h>

const char *ps_strerror(int code)
{
    switch (code) {
    case PS_OK: return "success";
    case PS_EINVAL: return "invalid argument";
    case PS_ENOMEM: return "out of memory";
    case PS_EPROTO: return "malformed or unexpected message";
    case PS_EIO: return "I/O error";
    case PS_ETIMEDOUT: return "timed out";
    case PS_ENOTFOUND: return "not found";
    case PS_ESTATE: return "not valid in the current state";
    case PS_EMISMATCH: return "configuration mismatch between peers";
    case PS_ECLOSED: return "shut down";
    case PS_EVERSION: return "protocol version mismatch";
    case PS_ETOOBIG: return "size too large";
    case PS_EDEVICE: return "compute device unusable";
    case PS_EAUTH: return "authentication refused";
    case PS_EDATA: return "bad data file";
    default: return "unknown error";
    }
}

void ps_errorf(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || !why_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}
