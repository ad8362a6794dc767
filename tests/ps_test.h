/* Minimal test harness.  A test program defines cases with PS_TEST(name) and
 * gets main() from ps_test.c, which runs every case (or those named on the
 * command line) and prints one line per case:
 *   PASS name
 *   FAIL name: file:line: what
 *   SKIP name: why
 * tests/run.sh counts those lines and prints "N passed, N failed, N skipped". */
#ifndef PS_TEST_H
#define PS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*ps_test_fn)(void);
void ps_test_register(const char *name, ps_test_fn fn);
void ps_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ps_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 once the running case has failed or been skipped (stop early). */
int ps_test_stopped(void);

#define PS_TEST(name)                                                            \
    static void name(void);                                                      \
    __attribute__((constructor)) static void ps_test_reg_##name(void)            \
    {                                                                            \
        ps_test_register(#name, name);                                           \
    }                                                                            \
    static void name(void)

/* Each check records a failure and returns from the test function. */
#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            ps_test_fail(__FILE__, __LINE__, "%s", #cond);                       \
            return;                                                              \
        }                                                                        \
    } while (0)
#define CHECK_MSG(cond, ...)                                                     \
    do {                                                                         \
        if (!(cond)) {                                                           \
            ps_test_fail(__FILE__, __LINE__, __VA_ARGS__);                       \
            return;                                                              \
        }                                                                        \
    } while (0)
#define CHECK_OK(expr)                                                           \
    do {                                                                         \
        int ps_rc_ = (expr);                                                     \
        if (ps_rc_ != 0) {                                                       \
            ps_test_fail(__FILE__, __LINE__, "%s returned %d", #expr, ps_rc_);   \
            return;                                                              \
        }                                                                        \
    } while (0)
#define CHECK_EQ_INT(a, b)                                                       \
    do {                                                                         \
        long long ps_a_ = (long long)(a), ps_b_ = (long long)(b);                \
        if (ps_a_ != ps_b_) {                                                    \
            ps_test_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld",  \
                         #a, ps_a_, #b, ps_b_);                                  \
            return;                                                              \
        }                                                                        \
    } while (0)
/* two strings are equal (a may be NULL; b is not) */
#define CHECK_STR(a, b)                                                          \
    do {                                                                         \
        const char *ps_a_ = (a), *ps_b_ = (b);                                   \
        CHECK_MSG(ps_a_ && !strcmp(ps_a_, ps_b_), "%s is\n  '%s', expected\n  '%s'", \
                  #a, ps_a_ ? ps_a_ : "(null)", ps_b_);                          \
    } while (0)
/* |a - b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                    \
    do {                                                                         \
        double ps_a_ = (double)(a), ps_b_ = (double)(b);                         \
        double ps_s_ = fabs(ps_b_) > 1.0 ? fabs(ps_b_) : 1.0;                   \
        if (!(fabs(ps_a_ - ps_b_) <= (tol) * ps_s_)) {                           \
            ps_test_fail(__FILE__, __LINE__, "%s = %.9g, expected %.9g (tol %g)",\
                         #a, ps_a_, ps_b_, (double)(tol));                       \
            return;                                                              \
        }                                                                        \
    } while (0)
#define SKIP(...)                                                                \
    do {                                                                         \
        ps_test_skip(__VA_ARGS__);                                               \
        return;                                                                  \
    } while (0)

/* Helpers for tests that start processes and servers. */
/* A free TCP port on 127.0.0.1 (bound, read back, closed). */
int ps_test_free_port(void);
/* Path of a program in bin/ (PS_BIN_DIR or "bin"). */
const char *ps_test_bin(const char *prog, char *buf, size_t len);
/* Start argv[0] with argv; stdout/stderr to log_path (NULL: inherit).
 * Returns the pid, or -1.  Every started child is killed (SIGKILL) when the
 * test program exits, so no process outlives it. */
int ps_test_spawn(char *const argv[], const char *log_path);
/* Wait for pid up to timeout_ms; returns its exit status (0-255, 128+sig when
 * killed by a signal), or -1 on timeout (the child is then killed). */
int ps_test_wait(int pid, int timeout_ms);
/* Send SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit status. */
int ps_test_stop(int pid, int timeout_ms);
/* A scratch directory unique to this test program (created, removed at exit
 * unless PS_TEST_KEEP is set). */
const char *ps_test_tmpdir(void);
/* Start bin/<prog> (see ps_test_bin) with the NULL-terminated args; output to
 * log_path as ps_test_spawn.  Returns the pid, or -1. */
int ps_test_spawn_args(const char *prog, const char *const *args, const char *log_path);
/* The same with the arguments split from words at spaces (so no argument
 * may hold a space or be empty; at most 63 of them). */
int ps_test_spawn_words(const char *prog, const char *words, const char *log_path);
/* Sleep ms milliseconds (resumed after a signal). */
void ps_test_sleep_ms(int ms);

/* A real etcd (the coordination service of replicated servers) on free
 * loopback ports, its data in the test's scratch directory: 0 with its pid
 * and client URL, or -1 (the etcd program is missing: the test skips, or
 * it did not start: log_path says why).  Stopped by ps_test_stop(pid) or
 * at the program's exit, as every child. */
typedef struct ps_test_etcd {
    int pid;
    char url[64];
} ps_test_etcd;
int ps_test_etcd_start(ps_test_etcd *e, const char *log_path);

/* Helpers for tests that read what programs wrote. */
/* The whole of a file (also /proc files, which have no size), with a NUL
 * after it; *len (when len is not NULL) is its length without the NUL.
 * NULL when it cannot be opened or read.  The caller frees it. */
char *ps_test_read_file(const char *path, size_t *len);
/* 1 when the file at path contains needle, else 0 (also when unreadable). */
int ps_test_file_has(const char *path, const char *needle);
/* Wait until the file at path contains needle: 0, or -1 after timeout_ms or
 * as soon as pid (when > 0) has exited. */
int ps_test_wait_for_text(const char *path, const char *needle, int timeout_ms, int pid);
/* A "<field>: N kB" line of /proc/<pid>/status (field "VmRSS", "VmHWM"):
 * N, or -1. */
long ps_test_status_kb(int pid, const char *field);

#endif
