/* kvplan HDF5 I/O (include/kvplan/h5io.h): atomic writes through a temporary file, validated
 * reads, provenance, datasets with units, attributes and the plan's budget part.
 *
 * HDF5 prints its error stack to stderr by default. Every public function here saves the
 * current automatic error handler, disables it for the duration of the call and restores it
 * before returning (h5_quiet_begin / h5_quiet_end), so kvplan's own messages are the only
 * output and no state of ours outlives a call. */
#include "kvplan/h5io.h"

#include <errno.h>
#include <hdf5.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef KVPLAN_VERSION_STRING
#define KVPLAN_VERSION_STRING "unknown"
#endif

struct kv_h5 {
    hid_t fid;
    int writing;         /* 1 for a file opened by kv_h5_create (in memory until commit) */
    uint64_t file_bytes; /* size on disk of a file opened for reading */
    char path[4096];     /* the final, user-visible path */
    char tmp[4200];      /* HDF5's name for the in-memory file (writing only; never on disk) */
};

/* ---- silencing HDF5's automatic error printing for the duration of one call ---- */
typedef struct h5_quiet {
    H5E_auto2_t fn;
    void *data;
} h5_quiet;

static void h5_quiet_begin(h5_quiet *q) {
    q->fn = NULL;
    q->data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void h5_quiet_end(const h5_quiet *q) {
    H5Eset_auto2(H5E_DEFAULT, q->fn, q->data);
}

/* ---- helpers ---- */

/* 1 when every component of the absolute `path` exists as a link (and resolves), else 0. */
static int path_exists(hid_t fid, const char *path) {
    if (!path || path[0] != '/') return 0;
    if (path[1] == '\0') return 1;
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf) return 0;
    memcpy(buf, path, n + 1);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            htri_t e = H5Lexists(fid, buf, H5P_DEFAULT);
            if (e <= 0) return 0;
            htri_t o = H5Oexists_by_name(fid, buf, H5P_DEFAULT);
            buf[i] = saved;
            if (o <= 0) return 0;
        }
    }
    return 1;
}

/* Create the groups along absolute path `grp` that are missing (the last component too). */
static int ensure_groups(kv_h5 *f, const char *grp, kv_error *err) {
    if (!grp || grp[0] != '/')
        return kv_fail(err, KV_EINTERNAL, "%s: object path '%s' is not absolute", f->path,
                       grp ? grp : "(null)");
    char buf[1024];
    size_t n = strlen(grp);
    if (n >= sizeof buf) return kv_fail(err, KV_EINTERNAL, "%s: path too long: %s", f->path, grp);
    memcpy(buf, grp, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        if (buf[i - 1] == '/') continue; /* "//" or trailing slash */
        char saved = buf[i];
        buf[i] = '\0';
        if (!path_exists(f->fid, buf)) {
            hid_t g = H5Gcreate2(f->fid, buf, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (g < 0)
                return kv_fail(err, KV_EINTERNAL, "%s: cannot create group %s", f->path, buf);
            H5Gclose(g);
        }
        buf[i] = saved;
    }
    return KV_OK;
}

/* Create the parent groups of dataset path `path`. */
static int ensure_parent(kv_h5 *f, const char *path, kv_error *err) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return KV_OK;
    char parent[1024];
    size_t n = (size_t)(slash - path);
    if (n >= sizeof parent)
        return kv_fail(err, KV_EINTERNAL, "%s: path too long: %s", f->path, path);
    memcpy(parent, path, n);
    parent[n] = '\0';
    return ensure_groups(f, parent, err);
}

static int check_writer(kv_h5 *f, const char *what, kv_error *err) {
    if (!f) return kv_fail(err, KV_EINTERNAL, "%s: no file", what);
    if (!f->writing)
        return kv_fail(err, KV_EINTERNAL, "%s: %s: file is open read-only", f->path, what);
    return KV_OK;
}

static int check_dset_args(kv_h5 *f, const char *path, int rank, const long *dims,
                           hsize_t hd[KV_H5_MAX_RANK], size_t *count, kv_error *err) {
    if (!path || path[0] != '/' || path[1] == '\0')
        return kv_fail(err, KV_EINTERNAL, "%s: dataset path '%s' must be absolute", f->path,
                       path ? path : "(null)");
    if (rank < 1 || rank > KV_H5_MAX_RANK || !dims)
        return kv_fail(err, KV_EINTERNAL, "%s: dataset %s: rank %d out of range 1..%d", f->path,
                       path, rank, KV_H5_MAX_RANK);
    size_t c = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return kv_fail(err, KV_EINTERNAL, "%s: dataset %s: negative dimension %ld", f->path,
                           path, dims[i]);
        hd[i] = (hsize_t)dims[i];
        if (dims[i] && c > SIZE_MAX / (size_t)dims[i])
            return kv_fail(err, KV_EINTERNAL, "%s: dataset %s is too large", f->path, path);
        c *= (size_t)dims[i];
    }
    *count = c;
    return KV_OK;
}

static int write_dataset(kv_h5 *f, const char *path, int rank, const long *dims, hid_t file_type,
                         hid_t mem_type, const void *data, const char *units, kv_error *err) {
    int rc = check_writer(f, path ? path : "dataset", err);
    if (rc) return rc;
    hsize_t hd[KV_H5_MAX_RANK];
    size_t count = 0;
    if ((rc = check_dset_args(f, path, rank, dims, hd, &count, err))) return rc;
    if (count > 0 && !data)
        return kv_fail(err, KV_EINTERNAL, "%s: dataset %s: no data", f->path, path);
    if ((rc = ensure_parent(f, path, err))) return rc;
    if (path_exists(f->fid, path) && H5Ldelete(f->fid, path, H5P_DEFAULT) < 0)
        return kv_fail(err, KV_EINTERNAL, "%s: cannot replace dataset %s", f->path, path);
    hid_t space = H5Screate_simple(rank, hd, NULL);
    if (space < 0) return kv_fail(err, KV_EINTERNAL, "%s: dataset %s: bad shape", f->path, path);
    hid_t ds = H5Dcreate2(f->fid, path, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (ds < 0) {
        H5Sclose(space);
        return kv_fail(err, KV_EINTERNAL, "%s: cannot create dataset %s", f->path, path);
    }
    herr_t w = 0;
    if (count > 0) w = H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(ds);
    H5Sclose(space);
    if (w < 0) return kv_fail(err, KV_EINTERNAL, "%s: cannot write dataset %s", f->path, path);
    if (units) return kv_h5_attr_str(f, path, "units", units, err);
    return KV_OK;
}

/* Open dataset `path` and get its shape: ds is left open (caller closes it). */
static int open_dataset_shape(kv_h5 *f, const char *path, hid_t *ds_out, int *rank,
                              hsize_t hd[KV_H5_MAX_RANK], kv_error *err) {
    *ds_out = -1;
    if (!path_exists(f->fid, path))
        return kv_fail(err, KV_EINPUT, "%s: missing dataset %s", f->path, path);
    H5O_info_t oi;
    if (H5Oget_info_by_name(f->fid, path, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET)
        return kv_fail(err, KV_EINPUT, "%s: %s is not a dataset", f->path, path);
    hid_t ds = H5Dopen2(f->fid, path, H5P_DEFAULT);
    if (ds < 0) return kv_fail(err, KV_EINPUT, "%s: %s is not a dataset", f->path, path);
    hid_t space = H5Dget_space(ds);
    int r = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    if (r < 0 || r > KV_H5_MAX_RANK) {
        if (space >= 0) H5Sclose(space);
        H5Dclose(ds);
        return kv_fail(err, KV_EINPUT, "%s: dataset %s has an unsupported shape (rank %d)", f->path,
                       path, r);
    }
    if (r > 0) H5Sget_simple_extent_dims(space, hd, NULL);
    H5Sclose(space);
    *rank = r;
    *ds_out = ds;
    return KV_OK;
}

/* A dataset may declare a shape far larger than the bytes stored for it (chunked storage
 * with fill values, or a forged header): refuse to allocate more than this many bytes for
 * one dataset unless the file itself is at least half as large. kvplan writes datasets
 * uncompressed, so a genuine dataset never needs more memory than twice its file. */
#define KV_H5_SMALL_DATASET_BYTES ((uint64_t)16 << 20)

static herr_t innermost_error(unsigned n, const H5E_error2_t *e, void *data) {
    if (n == 0 && e && e->desc) snprintf(data, 160, "%s", e->desc);
    return 0;
}

/* Why H5Dread failed on ds (call before any other HDF5 call clears the error stack), into
 * why[cap]: a filter this HDF5 library does not have, a checksum mismatch, a type that is not
 * numeric, else HDF5's innermost message. */
static void read_failure(hid_t ds, char *why, size_t cap) {
    char inner[160] = "";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, inner);
    hid_t dcpl = H5Dget_create_plist(ds);
    int nf = dcpl >= 0 ? H5Pget_nfilters(dcpl) : 0;
    for (int i = 0; i < nf; i++) {
        unsigned flags = 0, conf = 0;
        size_t nv = 0;
        char name[64] = "";
        H5Z_filter_t id =
            H5Pget_filter2(dcpl, (unsigned)i, &flags, &nv, NULL, sizeof name, name, &conf);
        if (id >= 0 && H5Zfilter_avail(id) <= 0) {
            snprintf(why, cap, "it needs HDF5 filter %d (%s), which this HDF5 library lacks",
                     (int)id, name[0] ? name : "unnamed");
            H5Pclose(dcpl);
            return;
        }
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    hid_t ty = H5Dget_type(ds);
    H5T_class_t cls = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
    if (ty >= 0) H5Tclose(ty);
    if (strstr(inner, "fletcher32") || strstr(inner, "checksum"))
        snprintf(why, cap, "its data fails its checksum (%s): the file is damaged", inner);
    else if (cls != H5T_INTEGER && cls != H5T_FLOAT)
        snprintf(why, cap, "it does not hold numbers");
    else
        snprintf(why, cap, "%s", inner[0] ? inner : "HDF5 read failed");
}

static int read_dataset(kv_h5 *f, const char *path, hid_t mem_type, size_t elem, int *rank,
                        long dims[KV_H5_MAX_RANK], void **data, kv_error *err) {
    *data = NULL;
    hid_t ds = -1;
    hsize_t hd[KV_H5_MAX_RANK];
    int r = 0;
    int rc = open_dataset_shape(f, path, &ds, &r, hd, err);
    if (rc) return rc;
    size_t count = 1;
    for (int i = 0; i < r; i++) {
        if (hd[i] > (hsize_t)LONG_MAX || (hd[i] && count > SIZE_MAX / elem / (size_t)hd[i])) {
            H5Dclose(ds);
            return kv_fail(err, KV_EINPUT, "%s: dataset %s is too large", f->path, path);
        }
        count *= (size_t)hd[i];
        dims[i] = (long)hd[i];
    }
    uint64_t bytes = (uint64_t)count * elem;
    uint64_t limit = f->file_bytes * 2 > KV_H5_SMALL_DATASET_BYTES ? f->file_bytes * 2
                                                                   : KV_H5_SMALL_DATASET_BYTES;
    if (!f->writing && bytes > limit) {
        H5Dclose(ds);
        return kv_fail(err, KV_EINPUT,
                       "%s: dataset %s declares %zu elements (%llu bytes), more than the "
                       "%llu-byte file can hold; the file is damaged or forged",
                       f->path, path, count, (unsigned long long)bytes,
                       (unsigned long long)f->file_bytes);
    }
    void *buf = kv_malloc(count ? count * elem : elem, path, err);
    if (!buf) {
        H5Dclose(ds);
        return KV_EINTERNAL;
    }
    herr_t rr = count ? H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) : 0;
    char why[256] = "";
    if (rr < 0) read_failure(ds, why, sizeof why);
    H5Dclose(ds);
    if (rr < 0) {
        free(buf);
        return kv_fail(err, KV_EINPUT, "%s: cannot read dataset %s: %s", f->path, path, why);
    }
    /* a scalar dataset reads as rank 1 of length 1 */
    if (r == 0) {
        r = 1;
        dims[0] = 1;
    }
    *rank = r;
    *data = buf;
    return KV_OK;
}

/* Open attribute `name` on `obj` for writing, replacing an existing one. */
static hid_t attr_create(kv_h5 *f, const char *obj, const char *name, hid_t type, hid_t space,
                         kv_error *err) {
    if (check_writer(f, name ? name : "attribute", err)) return -1;
    if (!obj || !name) {
        kv_fail(err, KV_EINTERNAL, "%s: attribute needs an object and a name", f->path);
        return -1;
    }
    if (!path_exists(f->fid, obj) && ensure_groups(f, obj, err)) return -1;
    hid_t o = H5Oopen(f->fid, obj, H5P_DEFAULT);
    if (o < 0) {
        kv_fail(err, KV_EINTERNAL, "%s: cannot open %s for attribute %s", f->path, obj, name);
        return -1;
    }
    if (H5Aexists(o, name) > 0) H5Adelete(o, name);
    hid_t a = H5Acreate2(o, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Oclose(o);
    if (a < 0)
        kv_fail(err, KV_EINTERNAL, "%s: cannot create attribute %s on %s", f->path, name, obj);
    return a;
}

static int attr_write_scalar(kv_h5 *f, const char *obj, const char *name, hid_t file_type,
                             hid_t mem_type, const void *value, kv_error *err) {
    hid_t space = H5Screate(H5S_SCALAR);
    if (space < 0) return kv_fail(err, KV_EINTERNAL, "%s: HDF5 dataspace failed", f->path);
    hid_t a = attr_create(f, obj, name, file_type, space, err);
    H5Sclose(space);
    if (a < 0) return err ? err->code : KV_EINTERNAL;
    herr_t w = H5Awrite(a, mem_type, value);
    H5Aclose(a);
    if (w < 0)
        return kv_fail(err, KV_EINTERNAL, "%s: cannot write attribute %s on %s", f->path, name,
                       obj);
    return KV_OK;
}

static hid_t attr_open(kv_h5 *f, const char *obj, const char *name, kv_error *err) {
    if (!path_exists(f->fid, obj)) {
        kv_fail(err, KV_EINPUT, "%s: missing object %s (looking for its attribute %s)", f->path,
                obj, name);
        return -1;
    }
    hid_t o = H5Oopen(f->fid, obj, H5P_DEFAULT);
    if (o < 0) {
        kv_fail(err, KV_EINPUT, "%s: cannot open %s", f->path, obj);
        return -1;
    }
    if (H5Aexists(o, name) <= 0) {
        H5Oclose(o);
        kv_fail(err, KV_EINPUT, "%s: missing attribute %s on %s", f->path, name, obj);
        return -1;
    }
    hid_t a = H5Aopen(o, name, H5P_DEFAULT);
    H5Oclose(o);
    if (a < 0) kv_fail(err, KV_EINPUT, "%s: cannot open attribute %s on %s", f->path, name, obj);
    return a;
}

static int attr_read_num(kv_h5 *f, const char *obj, const char *name, hid_t mem_type, void *value,
                         kv_error *err) {
    hid_t a = attr_open(f, obj, name, err);
    if (a < 0) return KV_EINPUT;
    hid_t space = H5Aget_space(a);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    if (space >= 0) H5Sclose(space);
    hid_t ft = H5Aget_type(a);
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    if (ft >= 0) H5Tclose(ft);
    herr_t r = -1;
    if (n == 1 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) r = H5Aread(a, mem_type, value);
    H5Aclose(a);
    if (r < 0)
        return kv_fail(err, KV_EINPUT, "%s: attribute %s on %s is not a single number", f->path,
                       name, obj);
    return KV_OK;
}

/* ---- files ---- */

/* The file being written lives in memory (HDF5's core driver without a backing store) and
 * reaches the disk only in kv_h5_commit, as one image written by kv_write_all into a fresh
 * temporary file. HDF5 therefore never does file I/O that can fail on a full disk: when its
 * own close of a file fails it keeps the file open and crashes later in its library shutdown
 * at exit (H5F__close_cb from H5_term_library, HDF5 1.10), which is how a full disk used to
 * end in a segfault. Plans and profiles are kilobytes to a few megabytes. */
#define KV_H5_CORE_INCREMENT (1 << 16)

int kv_h5_create(const char *final_path, kv_h5 **out, kv_error *err) {
    *out = NULL;
    if (!final_path || !*final_path) return kv_fail(err, KV_EINPUT, "no output file name given");
    int rc = kv_check_output(final_path, "output", NULL, 0, err);
    if (rc) return rc;
    kv_h5 *f = kv_calloc(1, sizeof *f, "HDF5 file handle", err);
    if (!f) return KV_EINTERNAL;
    f->fid = -1;
    if (strlen(final_path) >= sizeof f->path) {
        free(f);
        return kv_fail(err, KV_EINPUT, "%s: path too long", final_path);
    }
    snprintf(f->path, sizeof f->path, "%s", final_path);
    /* a name for HDF5's bookkeeping only (two open files must differ): nothing is created */
    static const char hex[] = "0123456789abcdef";
    uintptr_t id = (uintptr_t)f;
    char idhex[2 * sizeof id + 1];
    for (size_t i = 0; i < 2 * sizeof id; i++) idhex[i] = hex[(id >> (4 * i)) & 15];
    idhex[2 * sizeof id] = '\0';
    snprintf(f->tmp, sizeof f->tmp, "%s.core.%ld.%s", final_path, (long)getpid(), idhex);
    h5_quiet q;
    h5_quiet_begin(&q);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_fapl_core(fapl, KV_H5_CORE_INCREMENT, 0) >= 0 &&
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) >= 0)
        f->fid = H5Fcreate(f->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (fapl >= 0) H5Pclose(fapl);
    h5_quiet_end(&q);
    if (f->fid < 0) {
        free(f);
        return kv_fail(err, KV_EINTERNAL, "%s: HDF5 cannot create an in-memory file", final_path);
    }
    f->writing = 1;
    *out = f;
    return KV_OK;
}

int kv_h5_commit(kv_h5 *f, kv_error *err) {
    if (!f) return kv_fail(err, KV_EINTERNAL, "commit of no file");
    if (!f->writing) {
        kv_h5_close(f);
        return kv_fail(err, KV_EINTERNAL, "commit of a file opened read-only");
    }
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = KV_OK;
    unsigned char *image = NULL;
    ssize_t size = -1;
    if (H5Fflush(f->fid, H5F_SCOPE_GLOBAL) >= 0) size = H5Fget_file_image(f->fid, NULL, 0);
    if (size > 0) {
        image = kv_malloc((size_t)size, "HDF5 file image", err);
        if (!image)
            rc = KV_EINTERNAL;
        else if (H5Fget_file_image(f->fid, image, (size_t)size) != size)
            size = -1;
    }
    if (!rc && size <= 0)
        rc = kv_fail(err, KV_EINTERNAL, "%s: HDF5 could not produce the file's contents", f->path);
    if (H5Fclose(f->fid) < 0 && !rc)
        rc = kv_fail(err, KV_EINTERNAL, "%s: HDF5 could not close the in-memory file", f->path);
    f->fid = -1;
    h5_quiet_end(&q);
    if (!rc) rc = kv_write_file_atomic(f->path, image, (size_t)size, err);
    free(image);
    free(f);
    return rc;
}

void kv_h5_abort(kv_h5 *f) {
    if (!f) return;
    h5_quiet q;
    h5_quiet_begin(&q);
    if (f->fid >= 0) H5Fclose(f->fid);
    h5_quiet_end(&q);
    free(f);
}

int kv_h5_open_read(const char *path, kv_h5 **out, kv_error *err) {
    *out = NULL;
    if (!path || !*path) return kv_fail(err, KV_EINPUT, "no input file name given");
    int rc = kv_check_regular(path, "HDF5 file", err);
    if (rc) return rc;
    h5_quiet q;
    h5_quiet_begin(&q);
    kv_h5 *f = NULL;
    hid_t fapl = -1;
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        rc = kv_fail(err, KV_EINPUT,
                     "%s: not an HDF5 file (kvplan reads profile.h5 / plan.h5 "
                     "files written by kvplan profile and kvplan search)",
                     path);
        goto done;
    }
    f = kv_calloc(1, sizeof *f, "HDF5 file handle", err);
    if (!f) {
        rc = KV_EINTERNAL;
        goto done;
    }
    f->fid = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    {
        struct stat st;
        f->file_bytes = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    /* close degree strong: closing the file closes anything a reader left open */
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) >= 0)
        f->fid = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f->fid < 0) {
        free(f);
        f = NULL;
        rc = kv_fail(err, KV_EINPUT, "%s: cannot open the HDF5 file (damaged or locked?)", path);
        goto done;
    }
    if (H5Aexists(f->fid, "kvplan_version") <= 0 || H5Aexists(f->fid, "schema_version") <= 0) {
        rc = kv_fail(err, KV_EINPUT,
                     "%s: an HDF5 file, but not one of kvplan's (no "
                     "kvplan_version / schema_version attribute at its root)",
                     path);
        goto done;
    }
    long schema = 0;
    if ((rc = attr_read_num(f, "/", "schema_version", H5T_NATIVE_LONG, &schema, err))) {
        rc = kv_fail(err, KV_EINPUT, "%s: its schema_version attribute is not a number", path);
        goto done;
    }
    if (schema > KV_SCHEMA_VERSION) {
        rc = kv_fail(err, KV_EINPUT,
                     "%s: written with file schema version %ld, newer than this "
                     "kvplan %s understands (schema %d); upgrade kvplan to read it",
                     path, schema, KVPLAN_VERSION_STRING, KV_SCHEMA_VERSION);
        goto done;
    }
    if (schema < 1) {
        rc = kv_fail(err, KV_EINPUT, "%s: invalid schema_version %ld", path, schema);
        goto done;
    }
done:
    if (fapl >= 0) H5Pclose(fapl);
    h5_quiet_end(&q);
    if (rc) {
        kv_h5_close(f);
        return rc;
    }
    *out = f;
    return KV_OK;
}

void kv_h5_close(kv_h5 *f) {
    if (!f) return;
    if (f->writing) {
        kv_h5_abort(f);
        return;
    }
    h5_quiet q;
    h5_quiet_begin(&q);
    if (f->fid >= 0) H5Fclose(f->fid);
    h5_quiet_end(&q);
    free(f);
}

const char *kv_h5_path(const kv_h5 *f) {
    return f ? f->path : "(no file)";
}

/* ---- datasets ---- */

int kv_h5_write_f64(kv_h5 *f, const char *path, int rank, const long *dims, const double *data,
                    const char *units, kv_error *err) {
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc =
        write_dataset(f, path, rank, dims, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, data, units, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_write_i32(kv_h5 *f, const char *path, int rank, const long *dims, const int *data,
                    const char *units, kv_error *err) {
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = write_dataset(f, path, rank, dims, H5T_STD_I32LE, H5T_NATIVE_INT, data, units, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_read_f64(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK], double **data,
                   kv_error *err) {
    *data = NULL;
    if (!f) return kv_fail(err, KV_EINTERNAL, "read of %s from no file", path);
    h5_quiet q;
    h5_quiet_begin(&q);
    void *buf = NULL;
    int rc = read_dataset(f, path, H5T_NATIVE_DOUBLE, sizeof(double), rank, dims, &buf, err);
    h5_quiet_end(&q);
    *data = buf;
    return rc;
}

int kv_h5_read_i32(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK], int **data,
                   kv_error *err) {
    *data = NULL;
    if (!f) return kv_fail(err, KV_EINTERNAL, "read of %s from no file", path);
    h5_quiet q;
    h5_quiet_begin(&q);
    void *buf = NULL;
    int rc = read_dataset(f, path, H5T_NATIVE_INT, sizeof(int), rank, dims, &buf, err);
    h5_quiet_end(&q);
    *data = buf;
    return rc;
}

int kv_h5_dataset_shape(kv_h5 *f, const char *path, int *rank, long dims[KV_H5_MAX_RANK],
                        kv_error *err) {
    if (!f) return kv_fail(err, KV_EINTERNAL, "shape of %s in no file", path);
    h5_quiet q;
    h5_quiet_begin(&q);
    hid_t ds = -1;
    hsize_t hd[KV_H5_MAX_RANK];
    int r = 0;
    int rc = open_dataset_shape(f, path, &ds, &r, hd, err);
    if (!rc) {
        H5Dclose(ds);
        for (int i = 0; i < r; i++) dims[i] = hd[i] > (hsize_t)LONG_MAX ? LONG_MAX : (long)hd[i];
        if (r == 0) dims[0] = 1;
        *rank = r ? r : 1;
    }
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_dataset_numeric(kv_h5 *f, const char *path) {
    if (!f) return 0;
    h5_quiet q;
    h5_quiet_begin(&q);
    int numeric = 0;
    if (path_exists(f->fid, path)) {
        hid_t ds = H5Dopen2(f->fid, path, H5P_DEFAULT);
        hid_t ty = ds >= 0 ? H5Dget_type(ds) : -1;
        H5T_class_t c = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
        numeric = c == H5T_INTEGER || c == H5T_FLOAT;
        if (ty >= 0) H5Tclose(ty);
        if (ds >= 0) H5Dclose(ds);
    }
    h5_quiet_end(&q);
    return numeric;
}

int kv_h5_exists(kv_h5 *f, const char *path) {
    if (!f) return 0;
    h5_quiet q;
    h5_quiet_begin(&q);
    int e = path_exists(f->fid, path);
    h5_quiet_end(&q);
    return e;
}

/* ---- attributes ---- */

int kv_h5_attr_str(kv_h5 *f, const char *obj, const char *name, const char *value, kv_error *err) {
    if (!value) value = "";
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = KV_OK;
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, strlen(value) + 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0)
        rc = kv_fail(err, KV_EINTERNAL, "%s: HDF5 string type failed", kv_h5_path(f));
    else
        rc = attr_write_scalar(f, obj, name, t, t, value, err);
    if (t >= 0) H5Tclose(t);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_attr_f64(kv_h5 *f, const char *obj, const char *name, double value, kv_error *err) {
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = attr_write_scalar(f, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_attr_i64(kv_h5 *f, const char *obj, const char *name, long value, kv_error *err) {
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = attr_write_scalar(f, obj, name, H5T_STD_I64LE, H5T_NATIVE_LONG, &value, err);
    h5_quiet_end(&q);
    return rc;
}

static int read_attr_str(kv_h5 *f, const char *obj, const char *name, char **value, kv_error *err) {
    hid_t a = attr_open(f, obj, name, err);
    if (a < 0) return KV_EINPUT;
    int rc = KV_OK;
    hid_t ft = H5Aget_type(a);
    hid_t space = H5Aget_space(a);
    hssize_t npts = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    if (ft < 0 || H5Tget_class(ft) != H5T_STRING || npts != 1) {
        rc = kv_fail(err, KV_EINPUT, "%s: attribute %s on %s is not a string", f->path, name, obj);
    } else if (H5Tis_variable_str(ft) > 0) {
        hid_t mt = H5Tcopy(ft);
        char *s = NULL;
        if (H5Aread(a, mt, &s) < 0 || !s) {
            rc = kv_fail(err, KV_EINPUT, "%s: cannot read attribute %s on %s", f->path, name, obj);
        } else {
            size_t n = strlen(s);
            *value = kv_malloc(n + 1, name, err);
            if (!*value)
                rc = KV_EINTERNAL;
            else
                memcpy(*value, s, n + 1);
        }
        if (s) H5free_memory(s);
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(ft);
        char *s = kv_malloc(n + 1, name, err);
        if (!s) {
            rc = KV_EINTERNAL;
        } else {
            hid_t mt = H5Tcopy(ft); /* same character set: HDF5 does not convert between them */
            H5Tset_size(mt, n + 1);
            H5Tset_strpad(mt, H5T_STR_NULLTERM);
            if (H5Aread(a, mt, s) < 0) {
                free(s);
                rc = kv_fail(err, KV_EINPUT, "%s: cannot read attribute %s on %s", f->path, name,
                             obj);
            } else {
                s[n] = '\0';
                *value = s;
            }
            H5Tclose(mt);
        }
    }
    if (space >= 0) H5Sclose(space);
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

int kv_h5_read_attr_str(kv_h5 *f, const char *obj, const char *name, char **value, kv_error *err) {
    *value = NULL;
    if (!f) return kv_fail(err, KV_EINTERNAL, "attribute %s of no file", name);
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = read_attr_str(f, obj, name, value, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_read_attr_f64(kv_h5 *f, const char *obj, const char *name, double *value, kv_error *err) {
    if (!f) return kv_fail(err, KV_EINTERNAL, "attribute %s of no file", name);
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = attr_read_num(f, obj, name, H5T_NATIVE_DOUBLE, value, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_read_attr_i64(kv_h5 *f, const char *obj, const char *name, long *value, kv_error *err) {
    if (!f) return kv_fail(err, KV_EINTERNAL, "attribute %s of no file", name);
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = attr_read_num(f, obj, name, H5T_NATIVE_LONG, value, err);
    h5_quiet_end(&q);
    return rc;
}

int kv_h5_attr_exists(kv_h5 *f, const char *obj, const char *name) {
    if (!f || !obj || !name) return 0;
    h5_quiet q;
    h5_quiet_begin(&q);
    int e = 0;
    if (path_exists(f->fid, obj)) {
        hid_t o = H5Oopen(f->fid, obj, H5P_DEFAULT);
        if (o >= 0) {
            e = H5Aexists(o, name) > 0;
            H5Oclose(o);
        }
    }
    h5_quiet_end(&q);
    return e;
}

/* ---- listing ---- */

typedef struct list_ctx {
    void (*fn)(void *user, const char *path);
    void *user;
} list_ctx;

static herr_t list_cb(hid_t group, const char *name, const H5L_info_t *info, void *op) {
    list_ctx *c = op;
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0) return 0;
    int is_ds = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (is_ds) {
        char path[1100];
        snprintf(path, sizeof path, "/%s", name);
        c->fn(c->user, path);
    }
    return 0;
}

int kv_h5_list_datasets(kv_h5 *f, void (*fn)(void *user, const char *path), void *user,
                        kv_error *err) {
    if (!f || !fn) return kv_fail(err, KV_EINTERNAL, "list of datasets: no file or callback");
    list_ctx c = {fn, user};
    h5_quiet q;
    h5_quiet_begin(&q);
    herr_t r = H5Lvisit(f->fid, H5_INDEX_NAME, H5_ITER_INC, list_cb, &c);
    h5_quiet_end(&q);
    if (r < 0) return kv_fail(err, KV_EINPUT, "%s: cannot list its datasets", f->path);
    return KV_OK;
}

static herr_t group_cb(hid_t group, const char *name, const H5L_info_t *info, void *op) {
    list_ctx *c = op;
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0) return 0;
    int is_grp = H5Iget_type(o) == H5I_GROUP;
    H5Oclose(o);
    if (is_grp) {
        char path[1100];
        snprintf(path, sizeof path, "/%s", name);
        c->fn(c->user, path);
    }
    return 0;
}

int kv_h5_list_groups(kv_h5 *f, void (*fn)(void *user, const char *path), void *user,
                      kv_error *err) {
    if (!f || !fn) return kv_fail(err, KV_EINTERNAL, "list of groups: no file or callback");
    list_ctx c = {fn, user};
    h5_quiet q;
    h5_quiet_begin(&q);
    herr_t r = H5Lvisit(f->fid, H5_INDEX_NAME, H5_ITER_INC, group_cb, &c);
    h5_quiet_end(&q);
    if (r < 0) return kv_fail(err, KV_EINPUT, "%s: cannot list its groups", f->path);
    return KV_OK;
}

typedef struct attr_ctx {
    void (*fn)(void *user, const char *name, char kind);
    void *user;
} attr_ctx;

static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *op) {
    (void)info;
    attr_ctx *c = op;
    char kind = '?';
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a >= 0) {
        hid_t t = H5Aget_type(a), s = H5Aget_space(a);
        hssize_t n = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
        H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
        if (n == 1 && cls == H5T_STRING)
            kind = 's';
        else if (n == 1 && cls == H5T_INTEGER)
            kind = 'i';
        else if (n == 1 && cls == H5T_FLOAT)
            kind = 'f';
        if (t >= 0) H5Tclose(t);
        if (s >= 0) H5Sclose(s);
        H5Aclose(a);
    }
    c->fn(c->user, name, kind);
    return 0;
}

int kv_h5_list_attrs(kv_h5 *f, const char *obj, void (*fn)(void *user, const char *name, char kind),
                     void *user, kv_error *err) {
    if (!f || !fn || !obj)
        return kv_fail(err, KV_EINTERNAL, "list of attributes: no file, object or callback");
    attr_ctx c = {fn, user};
    h5_quiet q;
    h5_quiet_begin(&q);
    int rc = KV_OK;
    hid_t o = path_exists(f->fid, obj) ? H5Oopen(f->fid, obj, H5P_DEFAULT) : -1;
    if (o < 0) {
        rc = kv_fail(err, KV_EINPUT, "%s: missing object %s", f->path, obj);
    } else {
        hsize_t idx = 0;
        if (H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_cb, &c) < 0)
            rc = kv_fail(err, KV_EINPUT, "%s: cannot list the attributes of %s", f->path, obj);
        H5Oclose(o);
    }
    h5_quiet_end(&q);
    return rc;
}
