/* NumPy's .npy files (format 1.0), the arrays of an export
 * (docs/OPERATIONS.md "Export and serve"): written whole, read by mapping.
 * Only what exports hold: little-endian float32, uint64, uint32 and int64,
 * C order, one or two dimensions.  numpy.load(path, mmap_mode="r") reads
 * them without copying. */
#ifndef PS_NPY_H
#define PS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { PS_NPY_F4 = 1, PS_NPY_U8 = 2, PS_NPY_U4 = 3, PS_NPY_I8 = 4 };

/* The element size of a PS_NPY_ type (0: none). */
size_t ps_npy_elem(int dtype);

/* A file being written: the header, then the data in pieces. */
typedef struct ps_npy_out {
    FILE *f;
    uint64_t want, done; /* bytes of data the header promised, written so far */
} ps_npy_out;

/* Create path (mode 0644, replacing one there) with the header of a
 * rows x cols array (cols 0: one dimension of rows).  PS_EIO (why names the
 * file and errno). */
int ps_npy_create(ps_npy_out *o, const char *path, int dtype, uint64_t rows, uint64_t cols,
                  char *why, size_t why_len);
int ps_npy_write(ps_npy_out *o, const void *data, size_t bytes, char *why, size_t why_len);
/* Flush, fsync and close; PS_EIO when a write failed or fewer bytes than the
 * header's came. */
int ps_npy_close(ps_npy_out *o, const char *path, char *why, size_t why_len);
/* All of it at once. */
int ps_npy_save(const char *path, int dtype, uint64_t rows, uint64_t cols, const void *data,
                char *why, size_t why_len);

/* A file mapped for reading. */
typedef struct ps_npy_in {
    int dtype;
    int ndim;
    uint64_t rows, cols; /* cols 1 for one dimension */
    const void *data;
    void *map;
    size_t map_len;
} ps_npy_in;

/* Map path and check its header: the dtype, C order, one or two
 * dimensions, the data's bytes.  PS_ENOTFOUND (no such file), PS_EDATA
 * (not such a file: why says what), PS_EIO. */
int ps_npy_open(ps_npy_in *in, const char *path, char *why, size_t why_len);
void ps_npy_close_in(ps_npy_in *in);

#endif
