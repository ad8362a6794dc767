"""Ctrl-C while libps waits.

Python runs its SIGINT handler (the KeyboardInterrupt) in the main thread,
between bytecodes; a worker blocked in libps (a sync pull, a barrier, the
start) sits inside one C call, so the KeyboardInterrupt would wait for that
call to end, which may be never.  So, when the first client opens in the
main thread, this module points Python's wakeup fd (signal.set_wakeup_fd:
Python's own C handler writes the signal number there at once) at a socket
that a daemon thread reads.  On a SIGINT that Python turns into a
KeyboardInterrupt (its default handler is in place), the thread interrupts
every open client (ps_client_interrupt: whatever waits in libps returns
PS_ECLOSED within milliseconds); the main thread, back from C, raises the
KeyboardInterrupt, and an uncaught one ends the process as SIGINT does
(status 130 in a shell).  A SIGINT handler of the program's own is left
alone: then nothing is interrupted.  A wakeup fd the program had set is
still written to.
"""

import os
import signal
import socket
import threading
import weakref

_lock = threading.Lock()
_handles = weakref.WeakSet()  # client._Handle objects not yet closed
_installed = False


def _interrupt_all(lib):
    with _lock:
        for h in list(_handles):
            if h.ptr:
                h.interrupt()


def _watch(sock, lib, previous_fd):
    while True:
        try:
            data = sock.recv(64)
        except OSError:
            return
        if not data:
            return
        if previous_fd >= 0:
            try:
                os.write(previous_fd, data)
            except OSError:
                pass
        if (signal.SIGINT in data and
                signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            _interrupt_all(lib)


def _install(lib):
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        r.close()
        w.close()
        return
    _installed = True
    _install.keep = (r, w)  # open for the life of the process
    threading.Thread(target=_watch, args=(r, lib, previous), name="ps-sigint",
                     daemon=True).start()


def watch(handle, lib):
    """Interrupt handle's client on Ctrl-C, until forget(handle)."""
    with _lock:
        _handles.add(handle)
    _install(lib)


def forget(handle):
    """Before the client closes: it must not be interrupted once close began."""
    with _lock:
        _handles.discard(handle)
