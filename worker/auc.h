/* Area under the ROC curve, exact: the test metric of click-through models
 * (test accuracy says little when a quarter of the labels are clicks). */
#ifndef PS_AUC_H
#define PS_AUC_H

#include <stddef.h>
#include <stdint.h>

/* The AUC of scores against labels 0/1 (n of each): the probability that a
 * random positive scores above a random negative, a tie counting one half
 * (the rank-sum statistic with tied scores sharing their average rank).
 * Counted in integers over the sorted scores until one final division, so
 * it is exact whatever the order of the input.  Sorts a copy: O(n log n), n pairs of
 * scratch.  PS_EINVAL when n is 0, a label is not 0 or 1, or one class is
 * missing (no AUC exists); PS_EDATA when a score is NaN; PS_ENOMEM. */
int ps_auc(const float *scores, const int32_t *labels, size_t n, double *auc);

#endif
