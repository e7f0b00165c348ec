/* kvplan HDF5 I/O: the one place that reads and writes kvplan's HDF5 files (schema v1,
 * docs/design.md "Files"). Every module uses these helpers.
 *
 * Writing is atomic: kv_h5_create opens a temporary file beside the target; kv_h5_commit
 * closes it and renames it into place; kv_h5_abort removes it. A crash or an error never
 * leaves a half-written file under the final name, and never replaces a good file.
 * Datasets are float64 unless they count something (int32); a `units` attribute is written
 * when `units` is not NULL. Dataset paths are absolute ("/heads/similarity"); missing
 * intermediate groups are created.
 */
#ifndef KVPLAN_H5IO_H
#define KVPLAN_H5IO_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Newest schema this build reads; files are written with it (plan files: v2, see
 * kvplan/plan.h; v1 files stay readable). */
#define KV_SCHEMA_VERSION 2
#define KV_H5_MAX_RANK 8

typedef struct kv_h5 kv_h5;

/* Start a new file for `final_path` (checked first with kv_check_output). The file is built in
 * memory (HDF5 core driver) and written to disk only by kv_h5_commit, through a temporary
 * file with an unpredictable name (kv_temp_create) renamed into place. Caller owns *out and
 * must end it with kv_h5_commit or kv_h5_abort. */
int kv_h5_create(const char *final_path, kv_h5 **out, kv_error *err);
/* Write the file: its image into a new temporary file (fsync), rename into place, free.
 * On failure (disk full: KV_EINTERNAL with the system's reason) the temporary is removed,
 * an old file under the final name is untouched, and no HDF5 object is left open. */
int kv_h5_commit(kv_h5 *f, kv_error *err);
/* Close and remove the temporary file, free. Safe on NULL. */
void kv_h5_abort(kv_h5 *f);

/* Open an existing kvplan file read-only. KV_EINPUT when it is not HDF5, not a kvplan file
 * (no kvplan_version / schema_version attributes), or of a newer schema than this build. */
int kv_h5_open_read(const char *path, kv_h5 **out, kv_error *err);
void kv_h5_close(kv_h5 *f);
const char *kv_h5_path(const kv_h5 *f); /* the final (user-visible) path */

/* Datasets. dims has `rank` entries (rank 1..KV_H5_MAX_RANK). */
int kv_h5_write_f64(kv_h5 *f, const char *path, int rank, const long *dims, const double *data,
                    const char *units, kv_error *err);
int kv_h5_write_i32(kv_h5 *f, const char *path, int rank, const long *dims, const int *data,
                    const char *units, kv_error *err);
/* Read a whole dataset, converting to the requested type; caller frees *data. rank and dims
 * receive the shape. KV_EINPUT names the file and the dataset when it is missing. */
int kv_h5_read_f64(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK], double **data,
                   kv_error *err);
int kv_h5_read_i32(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK], int **data,
                   kv_error *err);
/* Shape of a dataset without reading its data (check it before kv_h5_read_*): rank and dims
 * as kv_h5_read_f64 would return them. KV_EINPUT names the file and dataset when it is
 * missing or not a dataset. The readers above also refuse a dataset whose declared shape
 * needs more memory than max(16 MiB, twice the file's size), before allocating. */
int kv_h5_dataset_shape(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK],
                        kv_error *err);
/* 1 when `path` is a dataset of integers or floating-point numbers (what kv_h5_read_f64
 * converts), else 0 (strings, compounds, a missing path). Reads no data. */
int kv_h5_dataset_numeric(kv_h5 *f, const char *path);
/* 1 when the object (group or dataset) exists, else 0. */
int kv_h5_exists(kv_h5 *f, const char *path);

/* Attributes on an object ("/" for the root, a group or a dataset path). */
int kv_h5_attr_str(kv_h5 *f, const char *obj, const char *name, const char *value, kv_error *err);
int kv_h5_attr_f64(kv_h5 *f, const char *obj, const char *name, double value, kv_error *err);
int kv_h5_attr_i64(kv_h5 *f, const char *obj, const char *name, long value, kv_error *err);
/* Readers: caller frees *value for strings. KV_EINPUT when missing. */
int kv_h5_read_attr_str(kv_h5 *f, const char *obj, const char *name, char **value, kv_error *err);
int kv_h5_read_attr_f64(kv_h5 *f, const char *obj, const char *name, double *value, kv_error *err);
int kv_h5_read_attr_i64(kv_h5 *f, const char *obj, const char *name, long *value, kv_error *err);
int kv_h5_attr_exists(kv_h5 *f, const char *obj, const char *name);

/* Visit every dataset (depth-first, name order): callback gets its absolute path. */
int kv_h5_list_datasets(kv_h5 *f, void (*fn)(void *user, const char *path), void *user,
                        kv_error *err);

/* Visit every group below the root (depth-first, name order): callback gets its absolute
 * path. */
int kv_h5_list_groups(kv_h5 *f, void (*fn)(void *user, const char *path), void *user,
                      kv_error *err);
/* Visit the attributes of object `obj` in name order. `kind` is 's' for a string, 'i' for a
 * single integer, 'f' for a single floating-point number and '?' for anything else (arrays,
 * compound types), which the typed readers above refuse. KV_EINPUT when obj is missing. */
int kv_h5_list_attrs(kv_h5 *f, const char *obj, void (*fn)(void *user, const char *name, char kind),
                     void *user, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
