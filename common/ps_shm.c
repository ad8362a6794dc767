#include "ps_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_error.h"

#define MAGIC "PSSHMAR1"
#define FORMAT 1u

/* The header page, at offset 0 of every arena. */
typedef struct shm_header {
    char magic[8];
    uint32_t format, header_bytes;
    uint64_t nonce, size;
    int32_t pid, pad;
    uint64_t start; /* the owner's process start time, /proc/PID/stat field 22 */
} shm_header;

/* Start time of process pid in clock ticks since boot, 0 when unknown. */
static uint64_t proc_start(int32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    /* the command name may hold spaces and parentheses: fields follow the last ')' */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    /* p + 2 is field 3 (state); the start time is field 22 */
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

static int alive(int32_t pid, uint64_t start)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    uint64_t now = proc_start(pid);
    /* a different start time: the pid was reused by another process */
    return now == 0 || start == 0 || now == start;
}

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

int ps_shm_create(size_t bytes, ps_shm_arena *a, char *why, size_t why_len)
{
    memset(a, 0, sizeof *a);
    ps_shm_sweep_stale();
    uint64_t rnd[2];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        ps_errorf(why, why_len, "no random bytes for the arena's name: %s", strerror(errno));
        return PS_EIO;
    }
    snprintf(a->name, sizeof a->name, "/ps-%d-%016llx", (int)getpid(),
             (unsigned long long)rnd[0]);
    a->nonce = rnd[1] | 1; /* never 0: 0 means "no arena" in a hello */
    a->size = page_round(PS_SHM_HEADER_BYTES + bytes);
    int fd = shm_open(a->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        ps_errorf(why, why_len, "shm_open %s: %s", a->name, strerror(errno));
        return PS_EIO;
    }
    /* exact mode whatever the umask: only this user (and root) may map it */
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)a->size) != 0) {
        ps_errorf(why, why_len, "sizing %s to %zu bytes: %s", a->name, a->size, strerror(errno));
        close(fd);
        shm_unlink(a->name);
        return PS_EIO;
    }
    void *p = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ps_errorf(why, why_len, "mmap %s: %s", a->name, strerror(errno));
        shm_unlink(a->name);
        return PS_EIO;
    }
    a->base = p;
    a->owner = 1;
    a->owner_pid = (int32_t)getpid();
    a->owner_start = proc_start(a->owner_pid);
    a->used = PS_SHM_HEADER_BYTES;
    shm_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.format = FORMAT;
    h.header_bytes = PS_SHM_HEADER_BYTES;
    h.nonce = a->nonce;
    h.size = a->size;
    h.pid = a->owner_pid;
    h.start = a->owner_start;
    memcpy(a->base, &h, sizeof h);
    return 0;
}

int ps_shm_attach(const char *name, uint64_t nonce, size_t size, ps_shm_arena *a, char *why,
                  size_t why_len)
{
    memset(a, 0, sizeof *a);
    if (!name || name[0] != '/' || strlen(name) >= sizeof a->name || strchr(name + 1, '/') ||
        strncmp(name, "/ps-", 4) != 0 || size < PS_SHM_HEADER_BYTES || nonce == 0) {
        ps_errorf(why, why_len, "not an arena name, size and nonce: '%s', %zu bytes",
            name ? name : "", size);
        return PS_EINVAL;
    }
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        ps_errorf(why, why_len, "shm_open %s: %s", name, strerror(e));
        return e == ENOENT ? PS_ENOTFOUND : e == EACCES ? PS_EAUTH : PS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size) {
        ps_errorf(why, why_len, "%s has %lld bytes, the worker said %zu", name,
            (long long)st.st_size, size);
        close(fd);
        return PS_EMISMATCH;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ps_errorf(why, why_len, "mmap %s: %s", name, strerror(errno));
        return PS_EIO;
    }
    shm_header h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, MAGIC, 8) != 0 || h.format != FORMAT ||
        h.header_bytes != PS_SHM_HEADER_BYTES || h.nonce != nonce || h.size != size) {
        ps_errorf(why, why_len, "%s is not the worker's arena (header or nonce differ)", name);
        munmap(p, size);
        return PS_EMISMATCH;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    a->base = p;
    a->size = size;
    a->nonce = nonce;
    a->owner_pid = h.pid;
    a->owner_start = h.start;
    a->used = size;
    return 0;
}

void ps_shm_close(ps_shm_arena *a)
{
    if (!a)
        return;
    if (a->base)
        munmap(a->base, a->size);
    if (a->owner && a->name[0])
        shm_unlink(a->name);
    memset(a, 0, sizeof *a);
}

void *ps_shm_alloc(ps_shm_arena *a, size_t bytes)
{
    if (!a->base || !a->owner)
        return NULL;
    size_t at = (a->used + PS_SHM_ALIGN - 1) & ~(size_t)(PS_SHM_ALIGN - 1);
    if (bytes > a->size || at > a->size - bytes)
        return NULL;
    a->used = at + bytes;
    memset(a->base + at, 0, bytes);
    return a->base + at;
}

int ps_shm_contains(const ps_shm_arena *a, const void *p, size_t bytes, uint64_t *off)
{
    if (!a->base || !p)
        return 0;
    uintptr_t b = (uintptr_t)a->base, q = (uintptr_t)p;
    if (q < b + PS_SHM_HEADER_BYTES || q >= b + a->size || bytes > b + a->size - q)
        return 0;
    if (off)
        *off = (uint64_t)(q - b);
    return 1;
}

int ps_shm_range_ok(const ps_shm_arena *a, uint64_t off, uint64_t bytes)
{
    return a->base && off >= PS_SHM_HEADER_BYTES && off % sizeof(float) == 0 &&
           off <= a->size && bytes <= a->size - off;
}

int ps_shm_owner_alive(const ps_shm_arena *a) { return alive(a->owner_pid, a->owner_start); }

int ps_shm_unlink(const char *name) { return shm_unlink(name) == 0 ? 0 : -1; }

/* /dev/shm/ps-<pid>-<hex>: the pid, or -1 when the name is not an arena's. */
static int arena_pid(const char *entry)
{
    if (strncmp(entry, "ps-", 3) != 0)
        return -1;
    char *end;
    long pid = strtol(entry + 3, &end, 10);
    if (end == entry + 3 || *end != '-' || pid <= 0 || strlen(end + 1) != 16)
        return -1;
    return (int)pid;
}

int ps_shm_sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    uid_t me = geteuid();
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = arena_pid(e->d_name);
        if (pid < 0)
            continue;
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || st.st_uid != me)
            continue;
        /* the owner and its start time are in the header */
        uint64_t start = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            shm_header h;
            if (read(fd, &h, sizeof h) == (ssize_t)sizeof h && memcmp(h.magic, MAGIC, 8) == 0 &&
                h.pid == pid)
                start = h.start;
            close(fd);
        }
        if (alive(pid, start))
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

int ps_shm_list(char (*names)[PS_SHM_NAME_MAX], int max)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (arena_pid(e->d_name) < 0)
            continue;
        if (names && n < max && strlen(e->d_name) + 2 <= PS_SHM_NAME_MAX) {
            names[n][0] = '/';
            memcpy(names[n] + 1, e->d_name, strlen(e->d_name) + 1);
        }
        n++;
    }
    closedir(d);
    return n;
}
