/* glibc's allocator settings for the programs (ps_malloc.h). */
#include "ps_malloc.h"

#include <malloc.h>
#include <stdlib.h>

#define KEEP_MMAP_THRESHOLD (32 << 20) /* glibc's largest: HEAP_MAX_SIZE / 2 */
#define KEEP_TRIM_THRESHOLD (128 << 20)

void ps_malloc_keep_large(void)
{
    if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_"))
        return;
    /* either call turns glibc's dynamic threshold off: set both */
    mallopt(M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD);
    mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD);
}

void ps_malloc_release(void)
{
    malloc_trim(0);
}
