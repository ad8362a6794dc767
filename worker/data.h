/* Datasets for the worker: MNIST-format IDX files (Fashion-MNIST by default),
 * deterministic synthetic data for benchmarks, click-through data (Criteo's
 * text format and a synthetic generator, data_ctr.c), each worker's slice of
 * the per-epoch shuffle that training draws its batches from (drawn from the
 * portable RNG of rng.h).
 *
 * Everything here is host memory and plain C: no backend, no threads. */
#ifndef PS_DATA_H
#define PS_DATA_H

#include <stddef.h>
#include <stdint.h>

/* ---- datasets ----------------------------------------------------------- */

enum { PS_SPLIT_TRAIN = 0, PS_SPLIT_TEST = 1 };

#define PS_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* A dataset in host memory; owned by whoever loaded it, freed with
 * ps_dataset_free.  Click-through data keeps its dense features where images
 * keep their pixels (channels = the dense count, height = width = 1) and
 * adds num_fields categorical ids per sample. */
typedef struct ps_dataset {
    size_t count;                  /* samples */
    int channels, height, width;   /* per-sample image shape (1, 28, 28 for MNIST) */
    int num_classes;               /* 10 for MNIST-format data (more if labels go higher),
                                      2 for click-through data */
    float *images;                 /* count x channels*height*width, pixels in [0, 1], or
                                      the dense features */
    int32_t *labels;               /* count, each in [0, num_classes) */
    int num_fields;                /* click-through data: categorical fields; else 0 */
    uint64_t *ids;                 /* count x num_fields: field f of sample s at
                                      s * num_fields + f; NULL for images */
    char name[256];                /* where it came from, for logs */
} ps_dataset;

/* Per-sample element count: channels * height * width. */
size_t ps_dataset_sample_size(const ps_dataset *ds);

/* Read an IDX image file (magic 0x00000803: count, rows, cols, then bytes)
 * and an IDX label file (magic 0x00000801: count, then bytes), gzip or plain.
 * On error returns PS_EDATA and writes a message naming the file and the
 * problem (missing file, wrong magic, truncated, image/label count mismatch,
 * label out of range). */
int ps_dataset_load_idx(const char *images_path, const char *labels_path, ps_dataset **out,
                        char *why, size_t why_len);

/* Load the train (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz) or
 * test (t10k-...) split from dir (NULL: PS_DATA_DEFAULT_DIR); each file is
 * also found without the .gz suffix. */
int ps_dataset_load_dir(const char *dir, int split, ps_dataset **out, char *why, size_t why_len);

/* n synthetic samples, 1x28x28, 10 classes, learnable: each sample has a
 * 16-dim Gaussian latent z; its pixels are a fixed random linear map of z
 * plus a little noise, clamped to [0, 1], and its label the
 * argmax of a fixed random linear teacher on z plus small noise.  The maps
 * come from seed alone (every split of one seed shares them), the samples
 * from (seed, split), so train and test differ.  Deterministic on every
 * machine. */
int ps_dataset_synthetic(size_t n, uint64_t seed, int split, ps_dataset **out, char *why,
                         size_t why_len);

/* A --data value: "synthetic:N" (N samples, see above), a directory of IDX
 * files, or NULL/"" for PS_DATA_DEFAULT_DIR.  Errors: PS_EINVAL for a bad
 * synthetic:N or click-through data (ps_dataset_open_ctr), PS_EDATA for
 * unreadable files. */
int ps_dataset_open(const char *spec, int split, uint64_t seed, ps_dataset **out, char *why,
                    size_t why_len);

/* ---- click-through data (data_ctr.c) --------------------------------------
 * Samples of a label (0/1: a click), dense features and num_fields
 * categorical ids, for --model ctr:
 *
 *   synthetic-ctr:N[,test=H][,zipf=S]
 *       samples 0..N-1 train, the H after them (default max(1, N/10)) test;
 *       13 dense features; `fields` ids per sample, each field's Zipf
 *       distributed (exponent S, default 1.05) over ids 0..rows-1 (past
 *       2^22 ids the tail's inverse CDF is an integral's); labels
 *       drawn from a planted logistic rule over hidden weights of the ids
 *       and the dense features.  Every value is a pure function of (seed,
 *       sample, field): python/ps/data_ctr.py gives the same samples
 *       (formulas there) and so does any machine.
 *   criteo:PATH[,test=PATH2][,lines=N]
 *       the Criteo Display Advertising text format (plain or gzip): per line
 *       a label, 13 integer features, 26 categorical features as hex
 *       strings, tab-separated, any feature may be empty.  Integers x become
 *       log(1 + max(x, 0)) (DLRM's transform; empty: 0); categorical values
 *       become ps_criteo_id (empty: the field's own "missing" id).  The test
 *       set is PATH2, or else the last tenth of PATH's lines; lines=N reads
 *       only PATH's first N lines.  A line that breaks the format is refused
 *       with its number.  The whole file is held in memory (264 bytes a
 *       line).  PATH cannot hold a comma.
 *
 * The model's fields and rows come from --model ctr:... (ctr.h): synthetic
 * data has `fields` fields of `rows` ids, Criteo has 26 (other counts are
 * refused). */
#define PS_CTR_DENSE 13
#define PS_CRITEO_FIELDS 26

/* 1 when spec names click-through data (synthetic-ctr:... or criteo:...). */
int ps_dataset_is_ctr(const char *spec);

/* Both sets of a click-through --data value.  Errors (why says which):
 * PS_EINVAL for a bad spec or fields/rows that do not fit it, PS_EDATA for
 * an unreadable or malformed file, PS_ENOMEM. */
int ps_dataset_open_ctr(const char *spec, uint64_t seed, int fields, uint64_t rows,
                        ps_dataset **train, ps_dataset **test, char *why, size_t why_len);

/* Synthetic samples start .. start+n-1 (see above; rows up to 2^40: the
 * Zipf inverse holds a table of at most 2^22 running sums, 32 MiB, and
 * takes the ranks beyond them from an integral, data_ctr.py's formula). */
int ps_dataset_synthetic_ctr(uint64_t start, size_t n, uint64_t seed, int fields, uint64_t rows,
                             double zipf, ps_dataset **out, char *why, size_t why_len);

/* Read a Criteo file: at most max_lines lines (0: all). */
int ps_dataset_load_criteo(const char *path, size_t max_lines, ps_dataset **out, char *why,
                           size_t why_len);

/* The id of a categorical value (its hex string read as a number) of field
 * f < 64, or of the field's missing value: f in the top 6 bits, so fields
 * never share an id, and below them the top 58 bits of
 * ps_rng_hash(0, PS_CRITEO_TAG, f, value) (rng.h), or of
 * ps_rng_hash(0, PS_CRITEO_TAG, f + 64, 0) for a missing value. */
#define PS_CRITEO_TAG 0x63726974656f2121ull /* "criteo!!" */
uint64_t ps_criteo_id(int field, uint64_t value, int missing);

void ps_dataset_free(ps_dataset *ds);

/* ---- shards and batches -------------------------------------------------
 * The one data order of training, shared by all W workers of a run:
 *
 *   - Each epoch e the whole training set is shuffled from (seed, e) alone,
 *     identically on every worker (no communication needed): order[0..N).
 *   - Global batch k of the epoch is order[k*W*b .. (k+1)*W*b), and worker r
 *     (its rank) takes the r-th slice of b samples of it:
 *         order[k*W*b + r*b .. k*W*b + (r+1)*b).
 *   - An epoch has steps_per_epoch = floor(N / (W*b)) batches; the last
 *     N mod W*b samples of the order are left out of that epoch (they are
 *     elsewhere in the next epoch's order).
 *
 * Why this scheme:
 *   - Disjoint per epoch: within an epoch no sample is used twice, by one
 *     worker or by two; together the W shards cover exactly the first
 *     steps_per_epoch*W*b samples of the epoch's order.
 *   - W x b equals 1 x W*b: the union of the W slices of global batch k is
 *     the batch k that a single worker with batch W*b would take (the slices
 *     in rank order, concatenated, are that batch), so a sync run of W
 *     workers with batch b sees the same samples per step as one worker with
 *     batch W*b, and (up to float summation order) trains the same model.
 *   - Equal step counts: every worker makes the same number of steps per
 *     epoch (dropping the remainder instead of giving some workers a short or
 *     extra batch), which sync mode needs: each step waits for all W pushes.
 *
 * The order is a Fisher-Yates shuffle of 0..N-1 drawn from ps_rng seeded with
 * seed * 1000003 + epoch + 1, so a run is repeatable on every machine and an
 * epoch's order depends on (seed, epoch) only, not on the epochs visited
 * before it. */
typedef struct ps_data_shard ps_data_shard;

/* Worker `rank` of `world`, `batch` samples per step.  The shard keeps a
 * pointer to ds (which must outlive it).  PS_EINVAL (with a message in why)
 * when ds is NULL, world < 1, rank outside [0, world), batch < 1, or
 * world * batch > ds->count (not one step per epoch); PS_ENOMEM. */
int ps_data_shard_create(const ps_dataset *ds, int rank, int world, int batch, uint64_t seed,
                         ps_data_shard **out, char *why, size_t why_len);
void ps_data_shard_destroy(ps_data_shard *s);

/* From now on this worker is `rank` of `world` workers (world at most the
 * create's; steps per epoch stay the create's): an elastic job's members
 * (ps_worker re-splits at each epoch).  Global batch k of an epoch is then
 * samples [k * batch * world, (k + 1) * batch * world) of its order, split
 * among the world workers: a partition of that prefix.  PS_EINVAL. */
int ps_data_shard_set_split(ps_data_shard *s, int rank, int world);

/* floor(count / (world * batch)), at least 1: the same on every worker. */
size_t ps_data_shard_steps_per_epoch(const ps_data_shard *s);

/* Copy this worker's batch k (k < steps_per_epoch) of epoch e into host
 * buffers images [batch x sample_size] floats and labels [batch] int32.
 * Reshuffles when e differs from the epoch of the previous call, so walking
 * k = 0, 1, ... within an epoch shuffles once.  PS_EINVAL when k is out of
 * range (nothing copied). */
int ps_data_shard_fill(ps_data_shard *s, uint64_t epoch, size_t k, float *images,
                       int32_t *labels);

/* The same batch's categorical ids, ids [batch x num_fields], for
 * click-through data (PS_EINVAL for images, or k out of range). */
int ps_data_shard_fill_ids(ps_data_shard *s, uint64_t epoch, size_t k, uint64_t *ids);

/* Epoch e's order of the whole dataset (count dataset indices; the same for
 * every rank), reshuffling as ps_data_shard_fill does.  Valid until the next
 * call with another epoch, or destroy. */
const size_t *ps_data_shard_order(ps_data_shard *s, uint64_t epoch);

#endif
