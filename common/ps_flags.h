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

/* The helpers the programs' main() share for their command lines. */

/* Print msg (one line) on stderr; returns 2, the exit status for bad flags. */
int ps_flag_error(const char *msg);

/* When arg is --help or -h, print usage on stdout; when it is --version,
 * print "<prog> <version>".  1 when it was one of them (main then exits 0),
 * else 0. */
int ps_flag_help_version(const char *prog, const char *usage, const char *arg);

/* A flag that takes a value, as "--flag value" or "--flag=value": when
 * argv[*i] is one of valued (NULL-terminated), returns that entry and sets
 * *val to the value, or to NULL when there is none (*i moves past a value
 * in the next argument).  NULL when argv[*i] is none of them. */
const char *ps_flag_value(int argc, char **argv, int *i, const char *const *valued,
                          const char **val);

#endif
