/* libFuzzer target: header frames through ps_proto_decode, the encode/decode
 * round trip and ps_proto_check_payload.  The checks are in fuzz_checks.h,
 * shared with tests/test_fuzz_regress.c.  Build and run: `make fuzz`. */
#include "fuzz_checks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[512];
    const char *bad = fuzz_check_proto(data, size, msg, sizeof msg);
    if (bad) {
        fprintf(stderr, "fuzz_proto: %s\n", bad);
        abort();
    }
    return 0;
}
