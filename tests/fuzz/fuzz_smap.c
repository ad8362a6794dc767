/* libFuzzer target: encoded server maps through ps_smap_decode and back
 * (the checks are in fuzz_checks.h, shared with tests/test_fuzz_regress.c).
 * Build and run: `make fuzz FUZZ_TARGETS=fuzz_smap`. */
#include "fuzz_checks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[512];
    const char *bad = fuzz_check_smap(data, size, msg, sizeof msg);
    if (bad) {
        fprintf(stderr, "fuzz_smap: %s\n", bad);
        abort();
    }
    return 0;
}
