/* PS_CLONES_V3: a loop over floats built twice (gcc's target_clones), for
 * x86-64-v3 (AVX2: 8 lanes, integer operations included) and for plain
 * x86-64 (SSE2: 4 lanes); the loader picks the one the CPU runs.  For passes
 * whose result does not depend on the path (integer checks, or one IEEE
 * operation per element in a fixed order, which -std=c11 gcc does not
 * contract).  One plain build under AddressSanitizer and with other
 * compilers.  server/optimizer.c builds its kernels a third time, for FMA
 * alone (PS_OPT_FMA). */
#ifndef PS_CLONES_H
#define PS_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define PS_CLONES_V3 __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PS_CLONES_V3
#endif

#endif
