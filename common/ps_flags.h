/* Strict parsing of flag values.  Each returns 0 or PS_EINVAL and, on error,
 * writes "<prog>: <flag> must be ..., got '<text>'" into why. */
#ifndef PS_FLAGS_H
#define PS_FLAGS_H

#include <stddef.h>
#include <stdint.h>

int ps_parse_int(const char *prog, const char *flag, const char *text, long long lo, long long hi,
                 long long *out, char *why, size_t why_len);
int ps_parse_float(const char *prog, const char *flag, const char *text, double lo, double hi,
                   double *out, char *why, size_t why_len);
/* Sizes: "4M", "64KiB", "1048576", "1G" (K/M/G are powers of 1024). */
int ps_parse_size(const char *prog, const char *flag, const char *text, uint64_t lo, uint64_t hi,
                  uint64_t *out, char *why, size_t why_len);

/* Print msg (one line) on stderr; returns 2, the exit status for bad flags.
 * (The programs' command lines are parsed from the settings table:
 * common/ps_settings.h.) */
int ps_flag_error(const char *msg);

#endif
