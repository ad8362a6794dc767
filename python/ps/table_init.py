"""A table row's first values and its place, bit for bit what the servers
compute (common/ps_table_row.h): pure numpy, no torch, no libps.

With uint64 arithmetic modulo 2^64:

    mix(x)   x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27;
             x *= 0x94d049bb133111eb; x ^= x >> 31
    sm(x)    mix(x + 0x9e3779b97f4a7c15)          (one SplitMix64 output)
    k        sm(sm(sm(seed) ^ table) ^ id)
    r(j)     sm(k + j * 0x9e3779b97f4a7c15)

element i of the row of id is 0 (zeros), a * f with
f = float32((r(i) >> 40) - 2^23) * 2^-23 (uniform in [-a, a), the product
in float32), or float32(s * sqrt(-2 ln u1) cos(2 pi u2)) in double with
u1 = ((r(2i) >> 11) + 1) 2^-53, u2 = (r(2i+1) >> 11) 2^-53 (normal(0, s);
equal to the C one up to the last bit of numpy's log and cos).

A row's place: h = sm(sm(table ^ 0x7461626c652d726f) ^ id), server h mod S,
partition (h // S) mod P (P: that server's update threads).

tests/test_table.c runs this file against the servers' C code.

    from ps import table_init
    rows = table_init.initial_rows(seed=7, table=3, ids=[1, 2], dim=8, init="uniform",
                                   scale=0.05)
"""

import numpy as np

ZEROS, UNIFORM, NORMAL = 0, 1, 2   # enum ps_table_init (include/ps_types.h)
INITS = {"zeros": ZEROS, "uniform": UNIFORM, "normal": NORMAL}

_U = np.uint64
_G = _U(0x9e3779b97f4a7c15)


def _mix(x):
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _U(30))) * _U(0xbf58476d1ce4e5b9)
        x = (x ^ (x >> _U(27))) * _U(0x94d049bb133111eb)
    return x ^ (x >> _U(31))


def _sm(x):
    with np.errstate(over="ignore"):
        return _mix(x + _G)


def _ids(ids):
    return np.atleast_1d(np.asarray(ids, dtype=np.uint64))


def initial_rows(seed, table, ids, dim, init="uniform", scale=0.05):
    """float32 array (len(ids), dim): the first values of each id's row."""
    kind = INITS[init] if isinstance(init, str) else int(init)
    ids = _ids(ids)
    out = np.zeros((len(ids), dim), dtype=np.float32)
    if kind not in (UNIFORM, NORMAL):
        return out
    k = _sm(_sm(_sm(np.array([seed], dtype=_U)) ^ _U(table)) ^ ids)
    with np.errstate(over="ignore"):
        r = _sm(k[:, None] + np.arange(2 * dim, dtype=_U)[None, :] * _G)
    s = np.float32(scale)
    if kind == UNIFORM:
        f = ((r[:, :dim] >> _U(40)).astype(np.int64) - 2**23).astype(np.float32)
        return s * (f * np.float32(2.0**-23))
    u1 = ((r[:, 0::2] >> _U(11)) + _U(1)).astype(np.float64) * 2.0**-53
    u2 = (r[:, 1::2] >> _U(11)).astype(np.float64) * 2.0**-53
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    return (np.float64(s) * z).astype(np.float32)


def row_hash(table, ids):
    """uint64 array: h of each id of the table."""
    return _sm(_sm(np.array([table], dtype=_U) ^ _U(0x7461626c652d726f)) ^ _ids(ids))


def place(table, ids, num_servers, parts):
    """(server, partition) arrays of each id; parts: the update threads of
    each server (a sequence, or one number for all)."""
    h = row_hash(table, ids)
    server = (h % _U(num_servers)).astype(np.int64)
    p = np.broadcast_to(np.asarray(parts, dtype=np.uint64), (num_servers,))[server]
    return server, ((h // _U(num_servers)) % p).astype(np.int64)
