/* Files and directories the programs create: mkdir -p, and checking an
 * output file's place before a run starts (so a bad --log-csv fails at
 * start, not after the cluster trained). */
#ifndef PS_FS_H
#define PS_FS_H

#include <stddef.h>
#include <sys/types.h>

/* mkdir -p: create path and its missing parents (parents 0755, path itself
 * last_mode, chmod'ed exactly whatever the umask when this call made it).
 * 0, or -1 with errno set (ENOTDIR when path exists and is no directory).
 * *created (may be NULL) says whether path itself was made here. */
int ps_mkdir_p(const char *path, mode_t last_mode, int *created);

/* Make sure the file `path` (given with flag `flag`, for the message) can be
 * written: its directory is created when missing and must be writable, and
 * an existing file must be writable.  Nothing is created but directories.
 * 0, or PS_EIO with "<flag> <path>: cannot create directory 'D': <errno
 * text>" or similar in why. */
int ps_check_output_file(const char *flag, const char *path, char *why, size_t why_len);

/* Like ps_check_output_file for a directory that files go into. */
int ps_check_output_dir(const char *flag, const char *dir, char *why, size_t why_len);

#endif
