#ifndef PS_TIME_H
#define PS_TIME_H
#include <stdint.h>
#include <time.h>

/* Monotonic clock in nanoseconds. */
static inline int64_t ps_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static inline double ps_now_s(void) { return (double)ps_now_ns() * 1e-9; }
#endif
