#include "ps_error.h"

#include <stdarg.h>
#include <stdio.h>

const char *ps_strerror(int code)
{
    switch (code) {
#define PS_ERR_CASE_(name, value, text) case name: return text;
        PS_ERRORS(PS_ERR_CASE_)
#undef PS_ERR_CASE_
    default:
        return "unknown error";
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

int ps_exit_status(int rc)
{
    switch (rc) {
    case PS_OK:
        return 0;
    case PS_EINVAL:
    case PS_EMISMATCH:
    case PS_EVERSION:
    case PS_EDEVICE:
    case PS_EAUTH:
    case PS_EDATA:
    case PS_ENOTFOUND:
        return 2;
    default:
        return 1;
    }
}
