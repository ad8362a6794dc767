#include "ps_fs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_error.h"

int ps_mkdir_p(const char *path, mode_t last_mode, int *created)
{
    char p[4096];
    if (created)
        *created = 0;
    if (!path || !*path) {
        errno = ENOENT;
        return -1;
    }
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') /* "out/" is "out" */
        p[--n] = 0;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    if (mkdir(p, last_mode) == 0) {
        if (created)
            *created = 1;
        return chmod(p, last_mode); /* exact mode whatever the umask */
    }
    if (errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(p, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int ps_check_output_dir(const char *flag, const char *dir, char *why, size_t why_len)
{
    if (ps_mkdir_p(dir, 0755, NULL) != 0) {
        ps_errorf(why, why_len, "%s %s: cannot create the directory: %s", flag, dir,
            strerror(errno));
        return PS_EIO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        ps_errorf(why, why_len, "%s %s: the directory is not writable: %s", flag, dir,
            strerror(errno));
        return PS_EIO;
    }
    return 0;
}

int ps_check_output_file(const char *flag, const char *path, char *why, size_t why_len)
{
    char dir[4096];
    if (!path || !*path) {
        ps_errorf(why, why_len, "%s needs a file name", flag);
        return PS_EINVAL;
    }
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
        ps_errorf(why, why_len, "%s: the path is too long", flag);
        return PS_EINVAL;
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = 0; /* "/x": the root */
    else if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        ps_errorf(why, why_len, "%s %s: is a directory; give a file name", flag, path);
        return PS_EINVAL;
    }
    if (ps_mkdir_p(dir, 0755, NULL) != 0) {
        ps_errorf(why, why_len, "%s %s: cannot create the directory '%s': %s", flag, path, dir,
            strerror(errno));
        return PS_EIO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        ps_errorf(why, why_len, "%s %s: cannot write in the directory '%s': %s", flag, path, dir,
            strerror(errno));
        return PS_EIO;
    }
    if (access(path, F_OK) == 0 && access(path, W_OK) != 0) {
        ps_errorf(why, why_len, "%s %s: the file exists and is not writable: %s", flag, path,
            strerror(errno));
        return PS_EIO;
    }
    return 0;
}
