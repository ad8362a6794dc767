"""Synthetic click-through data, bit for bit what ps_worker's
--data synthetic-ctr:N generates (worker/data_ctr.c): pure numpy, no torch,
no libps.

Sample i (train: 0..N-1, test: N..N+H-1, H = max(1, N // 10) or the test=H
of synthetic-ctr:N,test=H) has FIELDS
categorical ids, DENSE dense features and a label, each drawn from a
counter-based generator, so any sample can be made alone:

    mix(x)               the output of one splitmix64 step from state x:
                         z = x + 0x9E3779B97F4A7C15,
                         z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9,
                         z = (z ^ z >> 27) * 0x94D049BB133111EB, z ^ z >> 31
    h(tag, a, b)         mix(mix(mix(seed ^ tag) ^ a) ^ b)    (all mod 2^64)
    U(tag, a, b)         (2 * (h >> 12) + 1) / 2^53, in (0, 1); 1 - U is exact

  ids       field f of sample i: the Zipf rank (0-based) of U(TAG_IDS, i, f)
            by inverse CDF over `rows` ranks: weights w_k = k^-s for
            k = 1..rows (s = zipf, 1.05 by default), cdf = their running
            sum in order; id = the number of cdf entries <= U * cdf[-1]
            (at most rows - 1).  k^-s is exp(-s log k) with the exp and
            log below.  Past TABLE_ROWS (2^22) ranks the table stops: cdf
            holds the first T = TABLE_ROWS sums and the mass of the rest is
            F(rows + 1/2) - F(T + 1/2) with F(x) = x^(1-s) / (1-s)
            (ln x for s = 1, x^a as exp(a log x)); a v past cdf[-1] is
            rank floor(F^-1(F(T + 1/2) + v - cdf[-1]) - 1/2), within
            [T, rows - 1].
  dense     feature j: r = U(TAG_DENSE, i, j), scale s_j = 2^j, raw count
            x = floor(s_j * r / (1 - r)) (a heavy tail like Criteo's
            counts); the feature is float32(log(1 + x)), DLRM's transform.
  label     logit z = BIAS + sum over f of WEIGHT * (2 U(TAG_WEIGHT, f, id_f) - 1)
                     + sum over j of c_j * (x_j / (x_j + s_j) - 1/2),
            c_j = DENSE_WEIGHT * (2 U(TAG_COEF, j, 0) - 1), added in that
            order; u = U(TAG_LABEL, i, 0); label 1 when
            log(u) - log(1 - u) < z, i.e. Bernoulli(sigmoid(z)).

Every (field, id) has its hidden weight, a pure function of (seed, field,
id): the frequent ids can be learned in one pass, the rare ones cannot, as
in real click logs.  The logs and exps are ours (only +, -, *, / and
frexp/ldexp, which IEEE-754 rounds the same everywhere), so ids and labels
match the C generator exactly; the dense features go through the
platform's log1p and match to float32 rounding.

    from ps import data_ctr
    dense, ids, labels = data_ctr.generate(0, 1000, seed=1)
    (train, test) = data_ctr.splits(200000, seed=1)
"""

import numpy as np

DENSE = 13
FIELDS = 26
ROWS = 1000000
ZIPF = 1.05
TABLE_ROWS = 1 << 22

# the planted rule: about 25% positives (as Criteo); the true logits rank the
# test samples with an AUC near 0.9, a model that learned the frequent ids in
# one pass of 200000 samples reaches about 0.8
BIAS = -2.0
WEIGHT = 0.75
DENSE_WEIGHT = 3.0

TAG_IDS = 0x6374722d69647321     # "ctr-ids!"
TAG_DENSE = 0x6374722d64656e73   # "ctr-dens"
TAG_WEIGHT = 0x6374722d77656967  # "ctr-weig"
TAG_COEF = 0x6374722d636f6566    # "ctr-coef"
TAG_LABEL = 0x6374722d6c61626c   # "ctr-labl"

_U64 = np.uint64
_LN2 = float.fromhex("0x1.62e42fefa39efp-1")


def _mix(x):
    """splitmix64's output for state x (uint64 array)."""
    z = x + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _hash(seed, tag, a, b):
    with np.errstate(over="ignore"):
        h = _mix(np.asarray((seed ^ tag) & 0xFFFFFFFFFFFFFFFF, dtype=_U64))
        h = _mix(h ^ np.asarray(a, dtype=_U64))
        return _mix(h ^ np.asarray(b, dtype=_U64))


def _uniform(seed, tag, a, b):
    """U(tag, a, b) in (0, 1), float64."""
    k = (_hash(seed, tag, a, b) >> _U64(12)).astype(np.float64)
    return (2.0 * k + 1.0) * 2.0 ** -53


def log(x):
    """Natural log of x > 0 (float64 array) as worker/rng.c's ps_rng_log:
    frexp, then 2 atanh((m - 1) / (m + 1)) by its series."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    small = m < 0.70710678118654752440
    m = np.where(small, m * 2.0, m)
    e = np.where(small, e - 1, e)
    t = (m - 1.0) / (m + 1.0)
    t2 = t * t
    s = np.zeros_like(t)
    for k in range(27, 0, -2):
        s = s * t2 + 1.0 / k
    return 2.0 * t * s + e.astype(np.float64) * _LN2


def exp(x):
    """e^x (float64 array) as worker/rng.c's ps_rng_exp: x = n ln 2 + r with
    |r| <= ln(2)/2, Taylor series of e^r by Horner, times 2^n."""
    x = np.asarray(x, dtype=np.float64)
    n = np.clip(np.floor(x / _LN2 + 0.5), -1100.0, 1100.0)
    r = x - n * _LN2
    p = np.ones_like(r)
    for k in range(17, 0, -1):
        p = 1.0 + r * p / k
    return np.ldexp(p, n.astype(np.int64))


def zipf_cdf(rows=ROWS, zipf=ZIPF):
    """The running sum of k^-zipf for k = 1..min(rows, TABLE_ROWS), float64
    (the inverse-CDF table of the ids).  The terms are made a slice at a
    time, so log's and exp's temporaries stay small beside the 32 MiB
    table (a worker's peak memory must not follow the id space), then
    summed in one sequential pass: the same sums as ps_worker's."""
    n = min(rows, TABLE_ROWS)
    out = np.empty(n, dtype=np.float64)
    for lo in range(0, n, 1 << 16):
        hi = min(n, lo + (1 << 16))
        out[lo:hi] = exp(-zipf * log(np.arange(lo + 1, hi + 1, dtype=np.float64)))
    return np.cumsum(out, out=out)


def _zipf_f(x, s):
    return log(x) if s == 1.0 else exp((1.0 - s) * log(x)) / (1.0 - s)


def _zipf_f_inv(y, s):
    return exp(y) if s == 1.0 else exp(log((1.0 - s) * y) / (1.0 - s))


def _zipf_ranks(u, cdf, rows, zipf):
    """The ranks of uniforms u (float64 array) by the table and, past it,
    the tail's integral."""
    nt = len(cdf)
    if rows == nt:
        return np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), rows - 1)
    f0 = float(_zipf_f(np.float64(nt + 0.5), zipf))
    total = cdf[-1] + (float(_zipf_f(np.float64(rows + 0.5), zipf)) - f0)
    v = u * total
    head = np.minimum(np.searchsorted(cdf, v, side="right"), nt - 1)
    tail = v >= cdf[-1]
    x = _zipf_f_inv(f0 + (v[tail] - cdf[-1]), zipf) - 0.5
    k = np.where(x < float(rows), np.floor(np.maximum(x, 0.0)), float(rows - 1))
    head = head.astype(_U64)
    head[tail] = np.clip(k, nt, rows - 1).astype(_U64)
    return head


def test_count(n):
    """How many held-out samples follow N training samples."""
    return max(1, n // 10)


def generate(start, n, seed=1, fields=FIELDS, rows=ROWS, zipf=ZIPF, cdf=None):
    """Samples start .. start+n-1: (dense float32 [n, DENSE], ids uint64
    [n, fields], labels int32 [n]).  cdf: zipf_cdf(rows, zipf), when the
    caller keeps it between calls."""
    if cdf is None:
        cdf = zipf_cdf(rows, zipf)
    i = np.arange(start, start + n, dtype=_U64)
    ids = np.empty((n, fields), dtype=_U64)
    z = np.full(n, BIAS)
    for f in range(fields):
        ids[:, f] = _zipf_ranks(_uniform(seed, TAG_IDS, i, f), cdf, rows, zipf)
        z = z + WEIGHT * (2.0 * _uniform(seed, TAG_WEIGHT, f, ids[:, f]) - 1.0)
    dense = np.empty((n, DENSE), dtype=np.float32)
    for j in range(DENSE):
        r = _uniform(seed, TAG_DENSE, i, j)
        s = float(1 << j)
        x = np.floor(s * r / (1.0 - r))
        dense[:, j] = np.log1p(x).astype(np.float32)
        c = DENSE_WEIGHT * (2.0 * _uniform(seed, TAG_COEF, j, 0) - 1.0)
        z = z + c * (x / (x + s) - 0.5)
    u = _uniform(seed, TAG_LABEL, i, 0)
    labels = (log(u) - log(1.0 - u) < z).astype(np.int32)
    return dense, ids, labels


def splits(n, seed=1, fields=FIELDS, rows=ROWS, zipf=ZIPF):
    """synthetic-ctr:N's training set (samples 0..N-1) and test set (the
    test_count(N) samples after them), each (dense, ids, labels)."""
    cdf = zipf_cdf(rows, zipf)
    train = generate(0, n, seed, fields, rows, zipf, cdf)
    test = generate(n, test_count(n), seed, fields, rows, zipf, cdf)
    return train, test


def auc(scores, labels):
    """Exact test AUC, ranks with ties averaged, as ps_worker reports it
    (worker/auc.h): scores and labels (0/1) numpy arrays of one length."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[order[i:j]] = (i + j + 1) / 2.0  # 1-based average rank of the run
        i = j
    pos = labels.sum()
    neg = len(labels) - pos
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
