/* Datasets for the worker: MNIST-format IDX files (Fashion-MNIST by default),
 * deterministic synthetic data for benchmarks, per-worker shards with a
 * per-epoch shuffle, and the portable RNG these (and weight init) draw from.
 *
 * Everything here is host memory and plain C: no backend, no threads. */
#ifndef PS_DATA_H
#define PS_DATA_H

#include <stddef.h>
#include <stdint.h>

/* ---- portable RNG ------------------------------------------------------
 * xoshiro256** seeded through splitmix64, uniform doubles from the top 53
 * bits, normals by the Marsaglia polar method with our own log (only +,-,*,/
 * and sqrt, which IEEE-754 rounds exactly), so a seed gives the same stream,
 * bit for bit, on every machine and libm. */
typedef struct ps_rng {
    uint64_t s[4];
    double spare; /* second normal of the last polar pair */
    int has_spare;
} ps_rng;

/* splitmix64 step: mixes *state and advances it; also a good 64-bit hash. */
uint64_t ps_splitmix64(uint64_t *state);
void ps_rng_seed(ps_rng *r, uint64_t seed);
uint64_t ps_rng_next(ps_rng *r);
/* uniform in [0, 1) */
double ps_rng_uniform(ps_rng *r);
/* uniform integer in [0, n), unbiased; n > 0 */
uint64_t ps_rng_below(ps_rng *r, uint64_t n);
/* standard normal */
double ps_rng_normal(ps_rng *r);

/* ---- datasets ----------------------------------------------------------- */

enum { PS_SPLIT_TRAIN = 0, PS_SPLIT_TEST = 1 };

#define PS_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* A dataset in host memory; owned by whoever loaded it, freed with
 * ps_dataset_free. */
typedef struct ps_dataset {
    size_t count;                  /* samples */
    int channels, height, width;   /* per-sample image shape (1, 28, 28 for MNIST) */
    int num_classes;               /* 10 for MNIST-format data (more if labels go higher) */
    float *images;                 /* count x channels*height*width, pixels in [0, 1] */
    int32_t *labels;               /* count, each in [0, num_classes) */
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
 * synthetic:N, PS_EDATA for unreadable files. */
int ps_dataset_open(const char *spec, int split, uint64_t seed, ps_dataset **out, char *why,
                    size_t why_len);

void ps_dataset_free(ps_dataset *ds);

/* ---- shards and batches -------------------------------------------------
 * Worker `rank` of `world` owns the samples i with i % world == rank: shards
 * are disjoint, cover the dataset, and differ in size by at most one.  Each
 * epoch visits the shard in an order shuffled from (seed, epoch, rank), so a
 * run is repeatable and every worker draws a different order. */
typedef struct ps_data_shard ps_data_shard;

/* The shard keeps a pointer to ds (which must outlive it) and starts at
 * epoch 0, position 0.  PS_EINVAL when world < 1, rank outside [0, world), or
 * the shard would be empty. */
int ps_data_shard_create(const ps_dataset *ds, int rank, int world, uint64_t seed,
                         ps_data_shard **out, char *why, size_t why_len);
void ps_data_shard_destroy(ps_data_shard *s);

size_t ps_data_shard_size(const ps_data_shard *s);
uint64_t ps_data_shard_epoch(const ps_data_shard *s);
/* Jump to the start of epoch e (reshuffles). */
void ps_data_shard_set_epoch(ps_data_shard *s, uint64_t epoch);
/* Dataset index of the j-th sample (j < ps_data_shard_size) in this epoch's order. */
size_t ps_data_shard_index(const ps_data_shard *s, size_t j);

/* Copy the next batch of up to max_n samples into host buffers images
 * [max_n x sample_size] floats and labels [max_n] int32, and set *n to the
 * number copied and *epoch (may be NULL) to the epoch they belong to.  A batch
 * never spans two epochs: the last batch of an epoch may be short, and the
 * call after it starts the next epoch (reshuffled).  Never returns 0 samples. */
int ps_data_shard_next_batch(ps_data_shard *s, int max_n, float *images, int32_t *labels,
                             int *n, uint64_t *epoch);

#endif
