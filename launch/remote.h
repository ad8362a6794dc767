/* The remote side of ps_launch over ssh: `ps_launch --remote-child PROGRAM
 * ARGS...` is what each ssh command runs on its host.  ssh without a
 * terminal passes no signal on and leaves a program running when the
 * connection ends; this small wrapper gives the launcher that control back.
 *
 *  - It starts PROGRAM ARGS in a process group of its own, with stdin a pipe
 *    that only this wrapper holds (so a program that watches its stdin, like
 *    `ps_server --exit-on-stdin-eof`, ends even if the wrapper is killed) and
 *    stdout/stderr those of the wrapper (the ssh channel).
 *  - It reads its own stdin (the launcher's end of the ssh channel) for
 *    lines naming a signal: "INT", "TERM", "HUP" or "KILL", and sends that
 *    signal to the program's process group.  End of file (the launcher
 *    closed it, died, or the connection dropped) sends SIGTERM, then SIGKILL
 *    after PS_REMOTE_GRACE_MS.  SIGINT, SIGTERM and SIGHUP sent to the
 *    wrapper itself are passed on the same way.
 *  - When the program has ended it kills what is left in its process group,
 *    writes one last line on stderr, "ps_launch-remote: exit N" or
 *    "ps_launch-remote: signal N", and exits N, or 128 + N after a signal.
 *    ssh reports a remote death by signal as its own status 255; the line
 *    lets the launcher tell the two apart (ps_launch_remote_status). */
#ifndef PS_LAUNCH_REMOTE_H
#define PS_LAUNCH_REMOTE_H

#define PS_REMOTE_FLAG "--remote-child"
#define PS_REMOTE_MARK "ps_launch-remote: "
#define PS_REMOTE_GRACE_MS 5000

/* Run argv[0..argc-1] as described above; returns the wrapper's exit status
 * (127 when the program cannot be started, with a message on stderr, and 2
 * when argc is 0).  Installs signal handlers: call it once, from main. */
int ps_launch_remote_child(int argc, char **argv);

/* Parse a line the wrapper wrote ("ps_launch-remote: exit 3" or
 * "... signal 9", without the newline) into a wait status as waitpid gives
 * it.  1 when it is such a line (*status set), else 0. */
int ps_launch_remote_status(const char *line, int *status);

#endif
