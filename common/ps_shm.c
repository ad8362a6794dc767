#include "ps_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "ps_error.h"

#define MAGIC "PSSHMAR2"
#define FORMAT 2u
/* what the owner seals, and what a server requires: the size cannot change */
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW)
/* statfs f_type of shmem, where a memfd lives (linux/magic.h) */
#define TMPFS_MAGIC_ 0x01021994

/* The header page, at offset 0 of every arena. */
typedef struct shm_header {
    char magic[8];
    uint32_t format, header_bytes;
    uint64_t nonce, size;
    int32_t pid, pad;              /* the owner's process */
    uint64_t netns_dev, netns_ino; /* the owner's network namespace; 0 0: unknown */
} shm_header;

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* This process's network namespace (0 0 when /proc cannot say). */
static void netns(uint64_t *dev, uint64_t *ino)
{
    struct stat st;
    *dev = *ino = 0;
    if (stat("/proc/self/ns/net", &st) == 0) {
        *dev = (uint64_t)st.st_dev;
        *ino = (uint64_t)st.st_ino;
    }
}

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

int ps_shm_create(size_t bytes, ps_shm_arena *a, char *why, size_t why_len)
{
    memset(a, 0, sizeof *a);
    a->fd = -1;
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        ps_errorf(why, why_len, "no random bytes for the arena's nonce: %s", strerror(errno));
        return PS_EIO;
    }
    a->nonce = rnd | 1; /* never 0: 0 means "no arena" in a hello */
    a->size = page_round(PS_SHM_HEADER_BYTES + bytes);
    /* every page is allocated now: more than the machine can spare would
     * push it into the OOM killer instead of failing here */
    uint64_t avail = mem_available();
    if (avail && a->size > avail / 2) {
        ps_errorf(why, why_len, "an arena of %.1f MiB would take more than half of the %.1f MiB "
            "of memory available", mib(a->size), mib(avail));
        return PS_ENOMEM;
    }
    int fd = memfd_create("ps-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        ps_errorf(why, why_len, "memfd_create: %s", strerror(errno));
        return PS_EIO;
    }
    int rc = 0;
    /* exact mode whatever the umask: servers refuse any other */
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)a->size) != 0) {
        ps_errorf(why, why_len, "sizing the arena to %zu bytes: %s", a->size, strerror(errno));
        rc = PS_EIO;
    } else if ((rc = posix_fallocate(fd, 0, (off_t)a->size)) != 0) {
        ps_errorf(why, why_len, "cannot allocate %.1f MiB of memory for the arena: %s",
            mib(a->size), strerror(rc));
        rc = rc == ENOSPC || rc == ENOMEM ? PS_ENOMEM : PS_EIO;
    } else if (fcntl(fd, F_ADD_SEALS, SEALS | F_SEAL_SEAL) != 0) {
        ps_errorf(why, why_len, "sealing the arena: %s", strerror(errno));
        rc = PS_EIO;
    }
    void *p = MAP_FAILED;
    if (!rc && (p = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
                   MAP_FAILED) {
        ps_errorf(why, why_len, "mmap of the %.1f MiB arena: %s", mib(a->size), strerror(errno));
        rc = PS_ENOMEM;
    }
    if (rc) {
        close(fd);
        return rc;
    }
    a->base = p;
    a->fd = fd;
    a->owner = 1;
    a->used = PS_SHM_HEADER_BYTES;
    snprintf(a->name, sizeof a->name, "/proc/%d/fd/%d", (int)getpid(), fd);
    shm_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.format = FORMAT;
    h.header_bytes = PS_SHM_HEADER_BYTES;
    h.nonce = a->nonce;
    h.size = a->size;
    h.pid = (int32_t)getpid();
    netns(&h.netns_dev, &h.netns_ino);
    memcpy(a->base, &h, sizeof h);
    return 0;
}

/* "/proc/PID/fd/FD", exactly (no sign, no leading zero, nothing after):
 * 0 with pid and fd, else -1. */
static int parse_name(const char *name, int *pid, int *fd)
{
    long p = -1, f = -1;
    char *end;
    if (strncmp(name, "/proc/", 6) != 0 || name[6] < '1' || name[6] > '9')
        return -1;
    p = strtol(name + 6, &end, 10);
    if (strncmp(end, "/fd/", 4) != 0 || end[4] < '0' || end[4] > '9')
        return -1;
    f = strtol(end + 4, &end, 10);
    char canon[PS_SHM_NAME_MAX];
    if (*end || p < 1 || p > 1 << 30 || f < 0 || f > 1 << 30)
        return -1;
    snprintf(canon, sizeof canon, "/proc/%ld/fd/%ld", p, f);
    if (strcmp(canon, name) != 0)
        return -1;
    *pid = (int)p;
    *fd = (int)f;
    return 0;
}

/* "uid 1001 (mallory)", or without the name when there is none. */
static void user_text(uint32_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r((uid_t)uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, len, "uid %u (%s)", uid, res->pw_name);
    else
        snprintf(buf, len, "uid %u", uid);
}

static int trusted(uint32_t uid, const uint32_t *users, int nusers)
{
    if (uid == (uint32_t)geteuid())
        return 1;
    for (int i = 0; i < nusers; i++)
        if (users[i] == uid)
            return 1;
    return 0;
}

/* What the path names may be trusted: a regular file of a trusted user,
 * mode 0600, of the announced size.  0, or an error with why. */
static int check_file(const char *name, const struct stat *st, size_t size,
                      const uint32_t *users, int nusers, char *why, size_t why_len)
{
    if (!S_ISREG(st->st_mode)) {
        ps_errorf(why, why_len, "%s is not an arena (not a regular file)", name);
        return PS_EAUTH;
    }
    if (!trusted((uint32_t)st->st_uid, users, nusers)) {
        char who[96];
        user_text((uint32_t)st->st_uid, who, sizeof who);
        ps_errorf(why, why_len, "arena owned by %s, not this server's user: refused "
            "(--shm-users trusts others)", who);
        return PS_EAUTH;
    }
    if ((st->st_mode & 07777) != 0600) {
        ps_errorf(why, why_len, "arena of mode 0%o, not 0600: refused",
            (unsigned)(st->st_mode & 07777));
        return PS_EAUTH;
    }
    if ((uint64_t)st->st_size != (uint64_t)size) {
        ps_errorf(why, why_len, "%s has %lld bytes, the worker said %zu", name,
            (long long)st->st_size, size);
        return PS_EMISMATCH;
    }
    return 0;
}

int ps_shm_attach(const char *name, uint64_t nonce, size_t size, const uint32_t *users,
                  int nusers, ps_shm_arena *a, char *why, size_t why_len)
{
    memset(a, 0, sizeof *a);
    a->fd = -1;
    int pid = 0, wfd = 0;
    if (!name || parse_name(name, &pid, &wfd) != 0 || size < PS_SHM_HEADER_BYTES ||
        nonce == 0) {
        ps_errorf(why, why_len, "not an arena path, size and nonce: '%.48s', %zu bytes",
            name ? name : "", size);
        return PS_EINVAL;
    }
    /* the link's target, before opening anything: a device or a fifo is
     * never opened, nor another user's file */
    struct stat st, st2;
    if (stat(name, &st) != 0) {
        int e = errno;
        ps_errorf(why, why_len, "%s: %s", name, strerror(e));
        return e == ENOENT || e == ESRCH ? PS_ENOTFOUND
               : e == EACCES || e == EPERM ? PS_EAUTH
                                           : PS_EIO;
    }
    int rc = check_file(name, &st, size, users, nusers, why, why_len);
    if (rc)
        return rc;
    /* the kernel opens another process's descriptor only for who may
     * inspect that process: its user, or root */
    int fd = open(name, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        ps_errorf(why, why_len, "open %s: %s", name, strerror(e));
        return e == ENOENT ? PS_ENOTFOUND : e == EACCES || e == EPERM ? PS_EAUTH : PS_EIO;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    struct statfs fs;
    if (fstat(fd, &st2) != 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
        ps_errorf(why, why_len, "%s changed while it was opened", name);
        rc = PS_EMISMATCH;
    } else if ((rc = check_file(name, &st2, size, users, nusers, why, why_len)) != 0) {
        ;
    } else if (seals < 0 || (seals & SEALS) != SEALS) {
        /* a file that can shrink under the mapping would make a read of the
         * server fault (SIGBUS) */
        ps_errorf(why, why_len, "the arena is not sealed against shrinking (not a memfd of "
            "this version's libps?): refused");
        rc = PS_EAUTH;
    } else if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC_) {
        /* a hugetlbfs memfd, say: a fault there can fail for want of huge pages */
        ps_errorf(why, why_len, "the arena is not plain shared memory (a memfd of huge pages?): "
            "refused");
        rc = PS_EAUTH;
    }
    void *p = MAP_FAILED;
    if (!rc && (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        ps_errorf(why, why_len, "mmap %s: %s", name, strerror(errno));
        rc = PS_EIO;
    }
    close(fd);
    if (rc)
        return rc;
    shm_header h;
    memcpy(&h, p, sizeof h);
    uint64_t dev, ino;
    netns(&dev, &ino);
    if (memcmp(h.magic, MAGIC, 8) != 0 || h.format != FORMAT ||
        h.header_bytes != PS_SHM_HEADER_BYTES || h.nonce != nonce || h.size != size ||
        h.pid != pid) {
        ps_errorf(why, why_len, "%s is not the worker's arena (header or nonce differ)", name);
        rc = PS_EMISMATCH;
    } else if (dev && ino && h.netns_ino && (h.netns_dev != dev || h.netns_ino != ino)) {
        /* a process of another network namespace: another host, for us */
        ps_errorf(why, why_len, "the worker is in another network namespace");
        rc = PS_ENOTFOUND;
    }
    if (rc) {
        munmap(p, size);
        return rc;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    a->base = p;
    a->size = size;
    a->nonce = nonce;
    a->used = size;
    return 0;
}

void ps_shm_close(ps_shm_arena *a)
{
    if (!a)
        return;
    if (a->base)
        munmap(a->base, a->size);
    if (a->owner && a->fd >= 0)
        close(a->fd);
    memset(a, 0, sizeof *a);
    a->fd = -1;
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

int ps_shm_parse_users(const char *list, uint32_t *users, int *n, char *why, size_t why_len)
{
    *n = 0;
    const char *p = list ? list : "";
    while (*p) {
        size_t len = strcspn(p, ",");
        char name[64];
        if (len == 0 || len >= sizeof name) {
            ps_errorf(why, why_len, "--shm-users: '%.*s' is not a user name or uid", (int)len,
                p);
            return PS_EINVAL;
        }
        memcpy(name, p, len);
        name[len] = 0;
        p += len + (p[len] == ',');
        char *end;
        unsigned long uid = strtoul(name, &end, 10);
        if (name[0] < '0' || name[0] > '9' || *end || uid > 0xfffffffeul) {
            struct passwd pw, *res = NULL;
            char tmp[1024];
            if (getpwnam_r(name, &pw, tmp, sizeof tmp, &res) != 0 || !res) {
                ps_errorf(why, why_len, "--shm-users: there is no user '%s'", name);
                return PS_EINVAL;
            }
            uid = res->pw_uid;
        }
        if (*n == PS_SHM_MAX_USERS) {
            ps_errorf(why, why_len, "--shm-users: at most %d users", PS_SHM_MAX_USERS);
            return PS_EINVAL;
        }
        users[(*n)++] = (uint32_t)uid;
    }
    return 0;
}
