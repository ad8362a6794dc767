"""ps: the Python client of the parameter server, a thin ctypes binding over
libps.so (no compiler needed), and ps.torch, the PyTorch wrapper.

    import ps
    with ps.Client() as c:               # PS_SERVERS, PS_RANK, ... from the environment
        c.register(0, w.size)
        c.start()
        c.init(0, w).wait()
        c.push(0, grad, step=0).wait()
        c.pull(0, w, step=1).wait()

The library is found through PS_LIBRARY, then lib/libps.so of the source
tree this package sits in, then where `make install` put it, then the
loader's search path (libps.so.0).
"""

from . import _lib
from .client import (ASYNC, RANK_ENV, SERVERS_ENV, SIZE_ENV, SYNC, Client, PSError, Request,
                     parse_mode, table_options)

__version__ = "0.1.0"

library_path = _lib.path


def strerror(code):
    """Short text of a PS_E* code."""
    return _lib.strerror(code)


# the PS_E* codes: ps.EINVAL, ps.EMISMATCH, ...
for _code, _name in enumerate(_lib.ERRORS):
    globals()[_name] = _code
del _code, _name

__all__ = ["Client", "Request", "PSError", "SYNC", "ASYNC", "strerror", "parse_mode",
           "table_options", "library_path", "RANK_ENV", "SIZE_ENV", "SERVERS_ENV"] + \
    list(_lib.ERRORS)
