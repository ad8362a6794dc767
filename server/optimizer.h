/* Optimizers: one update step over a chunk's float arrays.
 *
 * Every kernel is a plain loop over restrict-qualified arrays with no branch in
 * its body, so gcc vectorizes it at -O3.  Each is torch.optim's single-tensor
 * step (torch 1.13), operation for operation and rounding for rounding
 * (optimizer.c says how), fma(a, b, c) being a * b + c rounded once.  With
 * g' = fma(w, wd, g) (g when wd is 0; adamw: g):
 *   sgd       w = fma(g', -lr, w)
 *   momentum  v = v * mu + g';             w = fma(v, -lr, w)
 *   nesterov  v = v * mu + g';             w = fma(fma(v, mu, g'), -lr, w)
 *   adagrad   h = fma(g', g', h);          w = w + (-lr * g') / (sqrt(h) + eps)
 *   adam      m = fma(g', 1 - b1, m * b1); v = fma((1 - b2) * g', g', v * b2)
 *             w = w + (-lr / (1 - b1^t) * m) / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   adamw     w = w * (1 - lr * wd) first (decoupled weight decay), then adam
 *             with g' = g
 *   average   w = g   (sync: g is the round's mean; the workers step with it)
 *   add       w += g  (g: a worker's weight delta, or the sum of several)
 * where t is the chunk's update count including this step (1, 2, ...): adam's
 * bias correction uses it, and with --lr-decay the rate is ps_opt_lr_at(t).
 *
 * In place or out of place: the *_to kernels and ps_opt_apply_to read the
 * weights from w_in and write the new weights to w_out in the same single
 * pass (w_in is left alone when they differ).  w_in == w_out is the in-place
 * update; otherwise the two must not overlap.  Both run the same arithmetic,
 * operation for operation, so the results are bitwise identical (the server
 * updates out of place while a pull reply still sends the old weights).
 *
 * State: the caller owns every array.  ps_opt_state_arrays() says how many
 * state arrays of n floats a kind needs (0, 1 or 2); they must start zeroed
 * and stay with the chunk between steps (s0 = v / h / m, s1 = adam's and
 * adamw's v).
 * State is always updated in place. */
#ifndef PS_OPTIMIZER_H
#define PS_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "ps_proto.h"

/* Learning rate of update t (1, 2, ...): lr * lr_decay^floor((t-1)/lr_decay_every),
 * or lr when lr_decay_every is 0. */
float ps_opt_lr_at(const ps_opt_config *cfg, int64_t t);

/* Number of n-float state arrays the optimizer kind keeps per chunk. */
int ps_opt_state_arrays(int kind);

/* One step.  w, s0, s1 are updated in place; g is read only.  s0/s1 may be
 * NULL when the kind needs fewer arrays.  No pointer may alias another.
 * Returns PS_EINVAL for an unknown kind (nothing changed). */
int ps_opt_apply(const ps_opt_config *cfg, float *w, float *s0, float *s1, const float *g,
                 size_t n, int64_t t);

/* The same step reading w_in and writing w_out (equal: in place, exactly
 * ps_opt_apply; different: they must not overlap, and w_in is unchanged).
 * No other pointer may alias another or w_in / w_out. */
int ps_opt_apply_to(const ps_opt_config *cfg, const float *w_in, float *w_out, float *s0,
                    float *s1, const float *g, size_t n, int64_t t);

/* The shortest decimal that rounds to the float f, as a double (0.9f ->
 * 0.9): the number adam's kernels take a hyper-parameter for where torch
 * computes in double (optimizer.c says why). */
double ps_opt_decimal(float f);

/* ---- the results checked (--on-nonfinite refuse and skip) ----
 * An update whose result is not finite (a weight or its optimizer state
 * driven to NaN or +-Inf by finite gradients: an overflow) must not be
 * applied.  With guard, each value whose new weight or state would not be
 * finite keeps its old weight and state (out of place: w_out gets the old
 * weight); every other value is updated exactly as without it (torch's
 * step bit for bit).  The check is in the kernels' own passes: each result
 * is computed once and checked as it is stored; in a block of values where
 * one is not finite, a second loop puts its old ones back (optimizer.c says
 * how).  Returns how many values kept their old ones (0: the step was
 * applied whole; always 0 without guard). */
size_t ps_opt_apply_checked(const ps_opt_config *cfg, const float *w_in, float *w_out,
                            float *s0, float *s1, const float *g, size_t n, int64_t t,
                            int guard);
/* In place, at rate lr as given (the table store's rows: their own rate and
 * adam count). */
size_t ps_opt_sgd_checked(float *w, const float *g, size_t n, float lr, float wd, int guard);
size_t ps_opt_momentum_checked(float *w, float *v, const float *g, size_t n, float lr, float mu,
                               float wd, int guard);
size_t ps_opt_nesterov_checked(float *w, float *v, const float *g, size_t n, float lr, float mu,
                               float wd, int guard);
size_t ps_opt_adagrad_checked(float *w, float *h, const float *g, size_t n, float lr, float eps,
                              float wd, int guard);
size_t ps_opt_adam_checked(float *w, float *m, float *v, const float *g, size_t n, float lr,
                           float b1, float b2, float eps, float wd, int64_t t, int guard);

/* x[i] = sqrtf(x[i]), vectorized (see optimizer.c): for kernels built the
 * same way elsewhere (server/table_opt.c). */
void ps_opt_sqrt_block(float *restrict x, size_t n);

/* The kernels themselves, for tests and benchmarks: in place ... */
void ps_opt_sgd(float *restrict w, const float *restrict g, size_t n, float lr, float wd);
void ps_opt_momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd);
void ps_opt_nesterov(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd);
void ps_opt_adagrad(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                    float lr, float eps, float wd);
void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t);
void ps_opt_adamw(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                  size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t);

/* ... and from w_in to w_out (which may be equal; see above). */
void ps_opt_sgd_to(const float *w_in, float *w_out, const float *g, size_t n, float lr,
                   float wd);
void ps_opt_momentum_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd);
void ps_opt_nesterov_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd);
void ps_opt_adagrad_to(const float *w_in, float *w_out, float *h, const float *g, size_t n,
                       float lr, float eps, float wd);
void ps_opt_adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t);
void ps_opt_adamw_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                     size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t);

#endif
