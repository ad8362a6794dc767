/* libFuzzer target: IDX image and label files (plain or gzip) through
 * ps_dataset_load_idx.  The checks are in fuzz_checks.h, shared with
 * tests/test_fuzz_regress.c.  Build and run: `make fuzz`. */
#include "fuzz_checks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[512];
    const char *bad = fuzz_check_idx(data, size, msg, sizeof msg);
    if (bad) {
        fprintf(stderr, "fuzz_idx: %s\n", bad);
        abort();
    }
    return 0;
}
