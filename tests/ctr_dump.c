/* Write synthetic click-through samples (worker/data_ctr.c) to a file, for
 * tests/python/test_data_ctr.py to compare with python/ps/data_ctr.py:
 *
 *   ctr_dump OUT START N SEED FIELDS ROWS ZIPF
 *
 * OUT holds, little-endian: labels int32[N], dense float32[N x 13], ids
 * uint64[N x FIELDS].  Exit 0, or 2 with a message. */
#include <stdio.h>
#include <stdlib.h>

#include "data.h"

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: ctr_dump OUT START N SEED FIELDS ROWS ZIPF\n");
        return 2;
    }
    char why[512];
    ps_dataset *ds;
    if (ps_dataset_synthetic_ctr(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                                 strtoull(argv[4], NULL, 10), atoi(argv[5]),
                                 strtoull(argv[6], NULL, 10), strtod(argv[7], NULL), &ds, why,
                                 sizeof why)) {
        fprintf(stderr, "ctr_dump: %s\n", why);
        return 2;
    }
    FILE *f = fopen(argv[1], "wb");
    size_t n = ds->count, nf = (size_t)ds->num_fields;
    int ok = f && fwrite(ds->labels, sizeof *ds->labels, n, f) == n &&
             fwrite(ds->images, sizeof *ds->images, n * PS_CTR_DENSE, f) == n * PS_CTR_DENSE &&
             fwrite(ds->ids, sizeof *ds->ids, n * nf, f) == n * nf;
    if (f && fclose(f) != 0)
        ok = 0;
    ps_dataset_free(ds);
    if (!ok) {
        fprintf(stderr, "ctr_dump: cannot write %s\n", argv[1]);
        return 2;
    }
    return 0;
}
