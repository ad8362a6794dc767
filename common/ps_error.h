/* Error codes shared by every module.  Functions that can fail return 0 or a
 * PS_E* code (always positive); only main() decides to exit. */
#ifndef PS_ERROR_H
#define PS_ERROR_H

#include <stddef.h>

enum {
    PS_OK = 0,
    PS_EINVAL = 1,     /* bad argument or flag value */
    PS_ENOMEM = 2,     /* allocation failed */
    PS_EPROTO = 3,     /* malformed or unexpected message */
    PS_EIO = 4,        /* socket, file or device I/O failed */
    PS_ETIMEDOUT = 5,  /* a deadline passed */
    PS_ENOTFOUND = 6,  /* unknown key, chunk or file */
    PS_ESTATE = 7,     /* operation not valid now (push before init, ...) */
    PS_EMISMATCH = 8,  /* peers disagree on mode, model or config */
    PS_ECLOSED = 9,    /* the client or server is shutting down */
    PS_EVERSION = 10,  /* wire protocol version differs */
    PS_ETOOBIG = 11,   /* a size is beyond what we accept */
    PS_EDEVICE = 12,   /* compute device unusable (no GPU, CUDA error) */
    PS_EAUTH = 13,     /* authentication refused */
    PS_EDATA = 14,     /* bad data file (magic, truncated, checksum) */
    PS_ECODE_MAX = 14
};

/* Short, static description of a PS_E* code; never NULL. */
const char *ps_strerror(int code);

/* printf into a caller's `why` buffer (truncated to why_len, always
 * terminated).  why may be NULL or why_len 0: then it writes nothing, so
 * callers can pass their own optional buffer straight through. */
void ps_errorf(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
