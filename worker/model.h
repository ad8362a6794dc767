/* A model: a sequence of layers (layers.h) built from a --model spec, with its
 * parameters, its activations for batches of up to max_batch samples, and
 * forward/backward passes that hand control to the training loop between
 * layers (hooks), so pulls and pushes can overlap the compute.
 *
 * Specs:
 *   mlp:IN-H1-...-OUT  linear layers with ReLU between them (none after the
 *                      last); IN must equal the input's C*H*W and OUT the
 *                      number of classes.  e.g. mlp:784-256-128-10
 *   cnn                = cnn:32-64-1024
 *   cnn:C1-C2-F        conv5x5xC1-relu-pool2, conv5x5xC2-relu-pool2,
 *                      fcF-relu, fc(classes); input C x H x W with H and W
 *                      divisible by 4 (1x28x28 for MNIST)
 *   ctr[:KEY=VALUE,...] the click-through model (keys and defaults in ctr.h):
 *                      an embedding bag per categorical field, joined with
 *                      the dense features (side by side, or DLRM's pairwise
 *                      dots after a bottom MLP), then an MLP to one logit;
 *                      binary cross-entropy.  Its input is the dense
 *                      features (in_c x in_h x in_w = dense, 2 classes) plus
 *                      each batch's ids (ps_model_set_ids), whose rows come
 *                      from a row source (embedding.h) to the host, and
 *                      on to the device (ps_emb_dev) on a device backend
 *
 * Parameters: ps_model_params() is an array of ps_param (layers.h) whose index
 * is the key: for each layer with parameters, in layer order, its weights then
 * its bias.  A click-through model's tables are not params: their rows move
 * through a row source, one batch's unique rows at a time.  The model allocates one w and one g buffer per parameter (device
 * memory of the backend) and frees exactly those at destroy, whatever param->w
 * and param->g point to then.  The training loop may point param->w (and
 * param->g) at buffers of its own between calls, e.g. to swap a double
 * buffer; it owns and frees those.  Layers read param->w at call time.
 *
 * Initialization (deterministic from the seed, identical on every machine):
 * weights of a layer followed by ReLU are He-normal (std sqrt(2/fan_in)), the
 * others (the last layer) Glorot-normal (std sqrt(2/(fan_in+fan_out))), biases
 * zero; generated on the host and copied to the device.
 *
 * Not thread-safe: one training thread drives a model.  Functions that fail
 * return a PS_E* code (ps_error.h); those that take `why` explain there. */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "ctr.h"
#include "embedding.h"
#include "layers.h"

typedef struct ps_model ps_model;
typedef struct ps_dataset ps_dataset; /* data.h */

/* Called by ps_model_forward and ps_model_backward for each layer that has
 * parameters (params first_param .. first_param+num_params-1).  A non-zero
 * return stops the pass, which returns that code.  Either pointer may be
 * NULL. */
typedef struct ps_model_hooks {
    void *ctx;
    /* Forward, just before layer `layer` reads its parameters: the place to
     * wait for this layer's new weights (sync mode) and swap param->w. */
    int (*before_layer)(void *ctx, int layer, int first_param, int num_params);
    /* Backward (last layer first), as soon as this layer's gradients in
     * param->g have been issued on PS_STREAM_COMPUTE.  On an asynchronous
     * backend they are not finished yet: order any read after them (record an
     * event on PS_STREAM_COMPUTE, make PS_STREAM_COPY wait for it).  The next
     * backward overwrites param->g, so reads must finish before then (or the
     * hook swaps param->g). */
    int (*grad_ready)(void *ctx, int layer, int first_param, int num_params);
} ps_model_hooks;

/* Build the model for spec with inputs of in_c x in_h x in_w, num_classes
 * outputs and batches of up to max_batch; parameters are initialized from
 * seed.  The model keeps b (which must outlive it).  Errors: PS_EINVAL for a
 * bad spec or a spec that does not fit the input/classes, with why like
 * "--model mlp:784: need at least an input and an output size, e.g.
 * mlp:784-256-10"; PS_ENOMEM (or the backend's code) when allocation fails. */
int ps_model_create(const char *spec, int in_c, int in_h, int in_w, int num_classes,
                    int max_batch, ps_backend *b, uint64_t seed, ps_model **out, char *why,
                    size_t why_len);
void ps_model_destroy(ps_model *m);

/* Canonical spec ("cnn" reads back as "cnn:32-64-1024"); owned by the model. */
const char *ps_model_spec(const ps_model *m);
int ps_model_max_batch(const ps_model *m);
int ps_model_num_classes(const ps_model *m);
size_t ps_model_input_size(const ps_model *m); /* floats per sample */

int ps_model_num_layers(const ps_model *m);
const ps_layer *ps_model_layer(const ps_model *m, int layer);
/* Which params belong to `layer`: *first and *count (0 for relu, pool, ...). */
void ps_model_layer_params(const ps_model *m, int layer, int *first, int *count);

int ps_model_num_params(const ps_model *m);
/* The param array (ps_model_num_params entries), owned by the model. */
ps_param *ps_model_params(ps_model *m);
/* Sum of all param counts. */
size_t ps_model_param_floats(const ps_model *m);

/* Model-owned device buffers for one batch: input [max_batch x input_size]
 * and labels [max_batch].  ps_model_load_batch copies n host samples into
 * them on PS_STREAM_COMPUTE (so they are ordered before the next forward). */
float *ps_model_input(ps_model *m);
int32_t *ps_model_labels(ps_model *m);
int ps_model_load_batch(ps_model *m, const float *host_x, const int32_t *host_labels, int n);

/* Forward n (1..max_batch) samples x (device, n x input_size).  With labels
 * (device int32, n) it also computes the softmax cross-entropy (ctr: the
 * binary cross-entropy of its one logit): the gradient of the logits for
 * ps_model_backward and, when non-NULL, the mean loss and the number of
 * correct predictions (host; asking for them waits for the device).  labels
 * NULL: inference only, backward is refused.  x and labels must stay
 * unchanged until the backward of this forward has returned.  A ctr model
 * reads the n samples' rows of the last ps_model_set_ids and
 * ps_model_fetch_rows (PS_ESTATE without them). */
int ps_model_forward(ps_model *m, const float *x, const int32_t *labels, int n,
                     const ps_model_hooks *hooks, float *loss, int *correct);
/* ps_model_forward that does not wait for the loss: loss and correct (either
 * may be NULL) are host memory from the backend's alloc_host, filled when
 * PS_STREAM_COMPUTE gets there (read them after stream_sync of it); on the
 * CPU, and for the ctr model's host-side loss, before it returns. */
int ps_model_forward_deferred(ps_model *m, const float *x, const int32_t *labels, int n,
                              const ps_model_hooks *hooks, float *loss, int *correct);
/* Logits of the last forward: device, n x num_classes (ctr: n x 1). */
const float *ps_model_logits(const ps_model *m);

/* Backward of the last forward with labels, last layer first (an MLP: its
 * input gradients last layer first, then its parameter gradients first layer
 * first, the order the next forward needs them); fills every param->g (the
 * mean over the batch) and calls hooks->grad_ready per layer as its
 * gradients are done;
 * a ctr model's row gradients are ready for ps_model_push_rows when it
 * returns.  PS_ESTATE when there is no such forward. */
int ps_model_backward(ps_model *m, const ps_model_hooks *hooks);

/* Plain local SGD on the current buffers: w -= lr * g for every param (the
 * compute-only baseline, no servers). */
int ps_model_sgd_step(ps_model *m, float lr);

/* Accuracy (fraction correct) and mean loss over all of ds, in batches of
 * max_batch through the model's own buffers, with the current param->w.  ds
 * must match the model's input size and classes.  Either output may be NULL.
 * Not for ctr models (PS_EINVAL): ps_model_evaluate_ctr. */
int ps_model_evaluate(ps_model *m, const ps_dataset *ds, double *accuracy, double *mean_loss,
                      char *why, size_t why_len);

/* ---- the click-through model's tables ----------------------------------
 * Each step: ps_model_set_ids (the batch's ids, deduplicated per table),
 * ps_model_fetch_rows (their rows from the row source), load, forward,
 * backward, ps_model_push_rows (one gradient row per unique id).  With a
 * source that fetches ahead (the servers' tables, embedding.h), each step
 * instead hands the next batch's ids (ps_model_ahead_ids) and takes this
 * batch's rows (ps_model_take_rows), which the source deduplicated and
 * fetched while the batch before computed.  The model calls only the row
 * source's functions, so where the rows live (local tables, the servers) is
 * the caller's choice.  On an mlp or cnn model these return PS_EINVAL. */

/* Tables (one per field) and their row width; 0 for mlp and cnn. */
int ps_model_num_tables(const ps_model *m);
int ps_model_table_dim(const ps_model *m);
/* The parsed spec of a ctr model (ctr.h), NULL for the others. */
const ps_ctr_spec *ps_model_ctr_spec(const ps_model *m);
/* Its batch's sparse side (ctr.h: each table's unique ids, rows, grads). */
ps_ctr_sparse *ps_model_sparse(ps_model *m);

/* ids[s * tables + t]: table t's id of sample s, for s < n (host). */
int ps_model_set_ids(ps_model *m, const uint64_t *ids, int n);
int ps_model_fetch_rows(ps_model *m, ps_row_source *src);
/* step: the worker's step the gradients belong to. */
int ps_model_push_rows(ps_model *m, ps_row_source *src, int64_t step);
/* The next batch's ids (as set_ids'), to src ahead; this batch's rows from
 * src (ctr.h: ps_ctr_sparse_ahead, ps_ctr_sparse_take). */
int ps_model_ahead_ids(ps_model *m, ps_row_source *src, const uint64_t *ids, int n);
int ps_model_take_rows(ps_model *m, ps_row_source *src, int n);

/* Test AUC (auc.h) and mean loss over all of ds, a click-through dataset
 * (data.h) that fits the model, in batches of max_batch with the current
 * weights and src's rows (fetching creates the rows of ids never trained,
 * at their initial values).  mean_loss may be NULL; scores_fp (may be
 * NULL) gets the FNV-1a of every sample's score (float32 bits, host
 * order): equal for two runs exactly when they score the set alike, e.g.
 * two sync runs that trained the same model.  Errors: PS_EINVAL (with why)
 * for data that does not fit or labels of one class, PS_EDATA when the
 * scores are NaN (training diverged). */
int ps_model_evaluate_ctr(ps_model *m, const ps_dataset *ds, ps_row_source *src, double *auc,
                          double *mean_loss, uint64_t *scores_fp, char *why, size_t why_len);

/* Save every param->w to path (written to path.tmp then renamed, so a crash
 * never leaves half a file): magic, version, spec, param counts, the weights
 * (float32 little-endian), and a CRC32 of all of it.  A ctr model's tables
 * do not fit this file: save and load refuse it (PS_EINVAL). */
int ps_model_save(ps_model *m, const char *path, char *why, size_t why_len);
/* Load a file written by ps_model_save into every param->w.  Refused, with
 * the model unchanged: PS_EIO when it cannot be read, PS_EDATA when it is not
 * a model file, has another version, is truncated or fails the checksum,
 * PS_EMISMATCH when it holds another model (spec or param counts). */
int ps_model_load(ps_model *m, const char *path, char *why, size_t why_len);

#endif
