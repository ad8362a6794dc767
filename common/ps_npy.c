/* .npy files (ps_npy.h). */
#include "ps_npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_error.h"

static const char *descr(int dtype)
{
    switch (dtype) {
    case PS_NPY_F4: return "<f4";
    case PS_NPY_U8: return "<u8";
    case PS_NPY_U4: return "<u4";
    case PS_NPY_I8: return "<i8";
    default: return NULL;
    }
}

size_t ps_npy_elem(int dtype)
{
    return dtype == PS_NPY_F4 || dtype == PS_NPY_U4 ? 4 : dtype == PS_NPY_U8 || dtype == PS_NPY_I8 ? 8 : 0;
}

int ps_npy_create(ps_npy_out *o, const char *path, int dtype, uint64_t rows, uint64_t cols,
                  char *why, size_t why_len)
{
    memset(o, 0, sizeof *o);
    char head[256], shape[64];
    if (cols)
        snprintf(shape, sizeof shape, "(%llu, %llu)", (unsigned long long)rows,
                 (unsigned long long)cols);
    else
        snprintf(shape, sizeof shape, "(%llu,)", (unsigned long long)rows);
    int n = snprintf(head + 10, sizeof head - 10,
                     "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr(dtype), shape);
    /* magic, version 1.0, u16 length, the dict padded with spaces to a
     * multiple of 64 bytes in all, ending in a newline */
    size_t total = ((size_t)(10 + n + 1) + 63) & ~(size_t)63;
    memset(head + 10 + n, ' ', total - 10 - (size_t)n);
    head[total - 1] = '\n';
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (char)((total - 10) & 0xff);
    head[9] = (char)((total - 10) >> 8);
    o->f = fopen(path, "wb");
    if (!o->f) {
        ps_errorf(why, why_len, "cannot create %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    setvbuf(o->f, NULL, _IOFBF, 1 << 20);
    o->want = rows * (cols ? cols : 1) * ps_npy_elem(dtype);
    if (fwrite(head, 1, total, o->f) != total) {
        ps_errorf(why, why_len, "cannot write %s: %s", path, strerror(errno));
        fclose(o->f);
        o->f = NULL;
        return PS_EIO;
    }
    return 0;
}

int ps_npy_write(ps_npy_out *o, const void *data, size_t bytes, char *why, size_t why_len)
{
    if (bytes && fwrite(data, 1, bytes, o->f) != bytes) {
        ps_errorf(why, why_len, "write failed: %s", strerror(errno));
        return PS_EIO;
    }
    o->done += bytes;
    return 0;
}

int ps_npy_close(ps_npy_out *o, const char *path, char *why, size_t why_len)
{
    if (!o->f)
        return PS_EIO;
    int bad = fflush(o->f) != 0 || fsync(fileno(o->f)) != 0;
    int e = errno;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad || o->done != o->want) {
        ps_errorf(why, why_len, "cannot write %s: %s", path,
                  bad ? strerror(e) : "fewer bytes than its header says");
        return PS_EIO;
    }
    return 0;
}

int ps_npy_save(const char *path, int dtype, uint64_t rows, uint64_t cols, const void *data,
                char *why, size_t why_len)
{
    ps_npy_out o;
    int rc = ps_npy_create(&o, path, dtype, rows, cols, why, why_len);
    if (rc)
        return rc;
    if ((rc = ps_npy_write(&o, data, (size_t)o.want, why, why_len)) != 0) {
        fclose(o.f);
        return rc;
    }
    return ps_npy_close(&o, path, why, why_len);
}

/* The value of 'key': in the header dict (a pointer after the colon), or NULL. */
static const char *dict_at(const char *d, const char *key)
{
    const char *p = strstr(d, key);
    if (!p)
        return NULL;
    p = strchr(p + strlen(key), ':');
    if (!p)
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

int ps_npy_open(ps_npy_in *in, const char *path, char *why, size_t why_len)
{
    memset(in, 0, sizeof *in);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ps_errorf(why, why_len, "cannot open %s: %s", path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ps_errorf(why, why_len, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return PS_EIO;
    }
    size_t len = (size_t)st.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
        ps_errorf(why, why_len, "%s: %s", path, len ? strerror(errno) : "empty file");
        return len ? PS_EIO : PS_EDATA;
    }
    const unsigned char *b = map;
    char dict[1024];
    size_t hl = len >= 10 ? (size_t)b[8] | (size_t)b[9] << 8 : 0;
    const char *bad = NULL;
    if (len < 10 || memcmp(b, "\x93NUMPY\x01\x00", 8) != 0)
        bad = "not a .npy file of format 1.0";
    else if (10 + hl > len || hl >= sizeof dict)
        bad = "its header runs past the file";
    if (!bad) {
        memcpy(dict, b + 10, hl);
        dict[hl] = 0;
        const char *ds = dict_at(dict, "'descr'"), *fo = dict_at(dict, "'fortran_order'"),
                   *sh = dict_at(dict, "'shape'");
        in->dtype = 0;
        for (int t = PS_NPY_F4; ds && t <= PS_NPY_I8; t++)
            if (!strncmp(ds + 1, descr(t), 3) && ds[4] == ds[0])
                in->dtype = t;
        char *end = NULL;
        if (!in->dtype)
            bad = "its dtype is not one of <f4, <u8, <u4, <i8";
        else if (!fo || strncmp(fo, "False", 5) != 0)
            bad = "it is in Fortran order";
        else if (!sh || *sh != '(')
            bad = "its header has no shape";
        else {
            in->rows = strtoull(sh + 1, &end, 10);
            in->ndim = 1;
            in->cols = 1;
            while (*end == ' ')
                end++;
            if (*end == ',') {
                end++;
                while (*end == ' ')
                    end++;
                if (*end != ')') {
                    in->cols = strtoull(end, &end, 10);
                    in->ndim = 2;
                    while (*end == ' ' || *end == ',')
                        end++;
                }
            }
            if (*end != ')')
                bad = "its shape is not one or two dimensions";
            else if (in->rows * in->cols * ps_npy_elem(in->dtype) != len - 10 - hl)
                bad = "its data is not the size its shape says";
        }
    }
    if (bad) {
        munmap(map, len);
        ps_errorf(why, why_len, "%s: %s", path, bad);
        return PS_EDATA;
    }
    in->map = map;
    in->map_len = len;
    in->data = b + 10 + hl;
    return 0;
}

void ps_npy_close_in(ps_npy_in *in)
{
    if (in->map)
        munmap(in->map, in->map_len);
    memset(in, 0, sizeof *in);
}
