/* Shared-memory arenas: the memory of the same-host data plane (DESIGN.md
 * "Data plane"; docs/SECURITY.md "Shared memory on one host" says what is
 * checked and why).
 *
 * A worker creates one arena: a memfd (memory with no name in any file
 * system), mode 0600, every page allocated at creation (so a full machine is
 * an error at start, not a SIGBUS later), then sealed against shrinking and
 * growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): nobody, its owner
 * included, can make it smaller than a server's mapping of it, so no access
 * of a server can fault.  It holds its tensors' weight and gradient buffers.
 * The worker tells each server the arena's path /proc/PID/fd/FD (its own
 * process and descriptor), size and a random nonce in its hello; a server on
 * the same host opens that path, which the kernel allows only to a process
 * that may inspect the worker (the same user, or root: the ptrace read
 * check), and maps it after checking that it is a sealed memfd of the right
 * size, owned by its own user (or one it was told to trust) with mode 0600,
 * whose header has the nonce (so it is the arena the worker means) and the
 * worker's network namespace (a process in another one, a simulated host,
 * counts as another host).  From then on a push names the offset of its
 * gradient in the arena and the server reads it in place; a pull names the
 * offset of its destination and the server writes the weights there;
 * ZeroMQ carries only the headers.
 *
 * Layout: a header page (magic, format, nonce, size, the owner's pid and
 * network namespace), then buffers handed out by ps_shm_alloc.
 *
 * Lifetime: the memory lives while the worker holds its descriptor or a
 * server its mapping; nothing is ever left in /dev/shm, also after SIGKILL.
 *
 * Thread-safety: an arena is set up by one thread; ps_shm_alloc is not
 * thread-safe.  Nothing here is on the hot path. */
#ifndef PS_SHM_H
#define PS_SHM_H

#include <stddef.h>
#include <stdint.h>

#define PS_SHM_NAME_MAX 48
/* Bytes before the first buffer (the header page). */
#define PS_SHM_HEADER_BYTES 4096
/* Buffers from ps_shm_alloc start on this boundary. */
#define PS_SHM_ALIGN 64
/* Users besides its own whose arenas a server maps (--shm-users). */
#define PS_SHM_MAX_USERS 16

typedef struct ps_shm_arena {
    char name[PS_SHM_NAME_MAX]; /* "/proc/1234/fd/7" */
    unsigned char *base;        /* the mapping; NULL when not mapped */
    size_t size;                /* bytes of the arena, header included */
    size_t used;                /* ps_shm_alloc's cursor */
    uint64_t nonce;
    int owner;                  /* created here: fd is the memfd */
    int fd;                     /* the owner's memfd, -1 otherwise */
} ps_shm_arena;

/* Create and map a new arena of at least `bytes` usable bytes (rounded up to
 * pages), allocated and sealed, with a fresh nonce.  PS_ENOMEM when the
 * memory is not there (it would take more than half of what the machine has
 * available, or the allocation failed), PS_EIO otherwise; why says, with the
 * sizes. */
int ps_shm_create(size_t bytes, ps_shm_arena *a, char *why, size_t why_len);

/* Map the arena a worker announced (its path, nonce and size), checking
 * everything ps_shm.h says; users[0..nusers) are the uids trusted besides
 * this process's own.  PS_ENOTFOUND when it is not on this host (no such
 * process or descriptor, another network namespace), PS_EAUTH when it may
 * not be trusted (another user's, another mode, not a sealed memfd, or the
 * kernel refused to open it), PS_EMISMATCH when it is another arena (size,
 * header or nonce differ), PS_EINVAL for a malformed path, PS_EIO
 * otherwise. */
int ps_shm_attach(const char *name, uint64_t nonce, size_t size, const uint32_t *users,
                  int nusers, ps_shm_arena *a, char *why, size_t why_len);

/* Unmap (and, the owner, close the memfd).  Safe on a zeroed or closed arena. */
void ps_shm_close(ps_shm_arena *a);

/* `bytes` from the arena, PS_SHM_ALIGN-aligned, zeroed; NULL when it is full
 * or not mapped. */
void *ps_shm_alloc(ps_shm_arena *a, size_t bytes);

/* Does [p, p + bytes) lie inside the arena's buffers?  Then *off is its
 * offset from the base. */
int ps_shm_contains(const ps_shm_arena *a, const void *p, size_t bytes, uint64_t *off);

/* Is [off, off + bytes) a valid, 4-byte aligned range of the arena's
 * buffers (not the header)?  For a server checking a worker's offsets. */
int ps_shm_range_ok(const ps_shm_arena *a, uint64_t off, uint64_t bytes);

/* --shm-users: a comma-separated list of user names or numeric uids into
 * users (at most PS_SHM_MAX_USERS), their count in *n.  PS_EINVAL naming the
 * one that is not a user. */
int ps_shm_parse_users(const char *list, uint32_t *users, int *n, char *why, size_t why_len);

#endif
