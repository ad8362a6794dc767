#!/usr/bin/python3
"""python/ps/data_ctr.py against the C generator of --data synthetic-ctr:N
(worker/data_ctr.c, written out by build/tests/ctr_dump): the same ids and
labels, bit for bit, and the same dense features to float32 rounding, so a
Python trainer (and the PyTorch reference, bench/torch_ctr_ref.py) sees
ps_worker's data."""

import os
import subprocess
import unittest

import numpy as np

import pstest
from ps import data_ctr

DUMP = os.path.join(pstest.BUILD, "tests", "ctr_dump")


def c_samples(start, n, seed, fields, rows, zipf):
    """(dense, ids, labels) of the C generator."""
    out = os.path.join(pstest.TMP, "ctr-%d-%d-%d.bin" % (start, n, seed))
    subprocess.run([DUMP, out, str(start), str(n), str(seed), str(fields), str(rows),
                    repr(zipf)], check=True, timeout=60)
    raw = open(out, "rb").read()
    labels = np.frombuffer(raw, dtype="<i4", count=n)
    dense = np.frombuffer(raw, dtype="<f4", count=n * data_ctr.DENSE, offset=4 * n)
    ids = np.frombuffer(raw, dtype="<u8", count=n * fields, offset=4 * n * (1 + data_ctr.DENSE))
    return dense.reshape(n, data_ctr.DENSE), ids.reshape(n, fields), labels


class SyntheticCtr(unittest.TestCase):
    def check_same(self, start, n, seed, fields, rows, zipf):
        cd, ci, cl = c_samples(start, n, seed, fields, rows, zipf)
        pd, pi, pl = data_ctr.generate(start, n, seed, fields, rows, zipf)
        self.assertEqual(pi.dtype, np.uint64)
        for what, p, c in (("ids", pi, ci), ("labels", pl, cl)):
            bad = np.flatnonzero((p != c).reshape(n, -1).any(axis=1))
            self.assertEqual(len(bad), 0, "%s differ in %d samples, the first %d"
                             % (what, len(bad), start + (bad[0] if len(bad) else 0)))
        far = np.abs(pd - cd) > 1e-6 * np.maximum(1.0, np.abs(cd))
        self.assertFalse(far.any(), "dense features differ by more than 1e-6 in %d values"
                         % far.sum())
        return pl

    def test_first_1000_samples_match_the_c_generator(self):
        labels = self.check_same(0, 1000, 1, data_ctr.FIELDS, data_ctr.ROWS, data_ctr.ZIPF)
        # both classes, near the planted 25% clicks
        self.assertTrue(150 < labels.sum() < 350, labels.sum())

    def test_test_split_and_other_settings_match_the_c_generator(self):
        # samples of a test set (after N = 200000), another seed, few fields
        # and rows, a flatter Zipf: every setting reaches both generators
        self.check_same(200000, 500, 7, 3, 50, 0.8)

    def test_id_spaces_past_the_table_match_the_c_generator(self):
        # past 2^22 ids the tail's ranks come from an integral: a billion
        # ids, and zipf 1 (its logarithm) just past the table
        self.check_same(0, 2000, 1, 8, 10 ** 9, 1.05)
        self.check_same(5000, 1000, 3, 4, data_ctr.TABLE_ROWS + 1000, 1.0)

    def test_auc_is_the_share_of_ordered_pairs_with_ties_counted_half(self):
        rng = np.random.default_rng(3)
        scores = rng.integers(0, 6, 300).astype(np.float64)  # many ties
        labels = (rng.random(300) < 0.3).astype(np.int64)
        p, n = scores[labels == 1], scores[labels == 0]
        pairs = (p[:, None] > n[None, :]).sum() + 0.5 * (p[:, None] == n[None, :]).sum()
        self.assertAlmostEqual(data_ctr.auc(scores, labels), pairs / (len(p) * len(n)), 12)
        self.assertEqual(data_ctr.auc(np.array([0.1, 0.4, 0.35, 0.8]),
                                      np.array([0, 0, 1, 1])), 0.75)


if __name__ == "__main__":
    pstest.main()
