/* Tests of runtime/util/h5io.c: round trips, atomic writes, provenance, rejection of bad files, and
 * the plan budget part. */
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvplan/h5io.h"
#include "testutil.h"

/* A stories260K-shaped model description (no weights: only what provenance reads). */

static const char *SHA_A = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/* Number of entries in tu_tmpdir() whose name contains ".tmp.". */
static int count_temporaries(void) {
    DIR *d = opendir(tu_tmpdir());
    int n = 0;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void test_roundtrip(void) {
    const char *path = tu_tmp("rt.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "kvplan test --x 1", &m, &err), KV_OK);
    double a[2 * 3 * 4];
    for (int i = 0; i < 24; i++) a[i] = i * 0.5 - 3.0;
    a[7] = NAN;
    long d3[3] = {2, 3, 4};
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/deep/er/cube", 3, d3, a, "seconds", &err), KV_OK);
    int b[5] = {1, -2, 3, 2147483647, 0};
    long d1[1] = {5};
    CU_ASSERT_EQUAL(kv_h5_write_i32(f, "/ints", 1, d1, b, NULL, &err), KV_OK);
    /* replacing a dataset keeps only the new content */
    int b2[2] = {9, 8};
    long d1b[1] = {2};
    CU_ASSERT_EQUAL(kv_h5_write_i32(f, "/deep/replaced", 1, d1, b, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_i32(f, "/deep/replaced", 1, d1b, b2, "blocks", &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_str(f, "/deep", "note", "héllo", &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_f64(f, "/deep/er/cube", "scale", 0.125, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_i64(f, "/", "big", 1L << 40, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_i64(f, "/", "big", 77, &err), KV_OK); /* overwrite */
    CU_ASSERT_EQUAL(kv_h5_attr_str(f, "/newgroup/sub", "kind", "cpu", &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_str(f, "/", "empty", "", &err), KV_OK);
    /* not visible under the final name before commit */
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL(access(path, F_OK), 0);
    CU_ASSERT_EQUAL(count_temporaries(), 0);

    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(kv_h5_path(f), path);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *ra = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, "/deep/er/cube", &rank, dims, &ra, &err), KV_OK);
    CU_ASSERT_EQUAL(rank, 3);
    CU_ASSERT_EQUAL(dims[0], 2);
    CU_ASSERT_EQUAL(dims[1], 3);
    CU_ASSERT_EQUAL(dims[2], 4);
    for (int i = 0; i < 24; i++) {
        if (i == 7) {
            CU_ASSERT(isnan(ra[i]));
        } else {
            CU_ASSERT_DOUBLE_EQUAL(ra[i], a[i], 0.0);
        }
    }
    free(ra);
    int *ri = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/ints", &rank, dims, &ri, &err), KV_OK);
    CU_ASSERT_EQUAL(rank, 1);
    CU_ASSERT_EQUAL(dims[0], 5);
    CU_ASSERT_EQUAL(memcmp(ri, b, sizeof b), 0);
    free(ri);
    /* int32 read as float64 converts */
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, "/ints", &rank, dims, &ra, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(ra[1], -2.0, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(ra[3], 2147483647.0, 0.0);
    free(ra);
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/deep/replaced", &rank, dims, &ri, &err), KV_OK);
    CU_ASSERT_EQUAL(dims[0], 2);
    CU_ASSERT_EQUAL(ri[0], 9);
    CU_ASSERT_EQUAL(ri[1], 8);
    free(ri);

    char *s = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/deep/er/cube", "units", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "seconds");
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/deep/replaced", "units", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "blocks");
    free(s);
    CU_ASSERT_FALSE(kv_h5_attr_exists(f, "/ints", "units"));
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/deep", "note", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "héllo");
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "empty", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "x", "");
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/newgroup/sub", "kind", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "cpu");
    free(s);
    double dv = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/deep/er/cube", "scale", &dv, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(dv, 0.125, 0.0);
    long lv = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/", "big", &lv, &err), KV_OK);
    CU_ASSERT_EQUAL(lv, 77);
    /* a string attribute is not a number */
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/deep", "note", &dv, &err), KV_EINPUT);

    CU_ASSERT_TRUE(kv_h5_exists(f, "/"));
    CU_ASSERT_TRUE(kv_h5_exists(f, "/deep/er"));
    CU_ASSERT_TRUE(kv_h5_exists(f, "/deep/er/cube"));
    CU_ASSERT_FALSE(kv_h5_exists(f, "/deep/nope/cube"));
    CU_ASSERT_FALSE(kv_h5_exists(f, "/nope"));
    CU_ASSERT_TRUE(kv_h5_attr_exists(f, "/", "created"));
    CU_ASSERT_FALSE(kv_h5_attr_exists(f, "/", "nope"));
    CU_ASSERT_FALSE(kv_h5_attr_exists(f, "/nope", "x"));
    kv_h5_close(f);
}

static void test_provenance(void) {
    const char *path = tu_tmp("prov.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "kvplan profile m.bin", &m, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    char *s = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "kvplan_version", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", KVPLAN_VERSION_STRING);
    free(s);
    long v = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/", "schema_version", &v, &err), KV_OK);
    CU_ASSERT_EQUAL(v, KV_SCHEMA_VERSION);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "created", &s, &err), KV_OK);
    /* 2026-11-22T02:45:27Z */
    CU_ASSERT_EQUAL(strlen(s), 20);
    CU_ASSERT_EQUAL(s[4], '-');
    CU_ASSERT_EQUAL(s[10], 'T');
    CU_ASSERT_EQUAL(s[19], 'Z');
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "command", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s, "kvplan profile m.bin");
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "model_sha256", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s, SHA_A);
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "model_format", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s, "llama2c");
    free(s);
    const char *names[] = {"model_dim",        "model_hidden_dim", "model_n_layers",
                           "model_n_heads",    "model_n_kv_heads", "model_head_dim",
                           "model_vocab_size", "model_seq_len"};
    const long want[] = {64, 172, 5, 8, 4, 8, 512, 512};
    for (int i = 0; i < 8; i++) {
        CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/", names[i], &v, &err), KV_OK);
        CU_ASSERT_EQUAL(v, want[i]);
    }
    kv_h5_close(f);
}

static void test_abort_keeps_good_file(void) {
    const char *path = tu_tmp("keep.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    double one = 1.0, two = 2.0;
    long d[1] = {1};
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "first", NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/x", 1, d, &one, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    struct stat st0;
    CU_ASSERT_EQUAL_FATAL(stat(path, &st0), 0);

    /* a second write that is aborted half-way */
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "second", NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/x", 1, d, &two, NULL, &err), KV_OK);
    /* the file is built in memory: nothing is on disk until kv_h5_commit */
    CU_ASSERT_EQUAL(count_temporaries(), 0);
    kv_h5_abort(f);
    CU_ASSERT_EQUAL(count_temporaries(), 0);
    kv_h5_abort(NULL);

    struct stat st1;
    CU_ASSERT_EQUAL_FATAL(stat(path, &st1), 0);
    CU_ASSERT_EQUAL(st0.st_ino, st1.st_ino);
    CU_ASSERT_EQUAL(st0.st_size, st1.st_size);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    int rank;
    long dims[KV_H5_MAX_RANK];
    double *x = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, "/x", &rank, dims, &x, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(x[0], 1.0, 0.0);
    free(x);
    char *s = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "command", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "first");
    free(s);
    CU_ASSERT_STRING_EQUAL(kv_h5_read_attr_str(f, "/", "model_sha256", &s, &err) ? "" : s, "");
    free(s);
    kv_h5_close(f);

    /* a committed rewrite replaces it */
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "third", NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/x", 1, d, &two, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, "/x", &rank, dims, &x, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(x[0], 2.0, 0.0);
    free(x);
    kv_h5_close(f);
}

static void test_create_unwritable(void) {
    kv_error err = {0};
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL(kv_h5_create("/nonexistent-dir-kvplan/x.h5", &f, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent-dir-kvplan/x.h5"));
}

/* Suite fixture: foreign.h5 (an HDF5 file that is not kvplan's: one group /data) and good.h5
 * (a kvplan file with provenance only) under tu_tmpdir(), read by test_bad_files and
 * test_quiet_errors. Non-zero, with the reason printed, when either cannot be written. */
static int h5io_init(void) {
    hid_t fid = H5Fcreate(tu_tmp("foreign.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (fid < 0) {
        fprintf(stderr, "h5io fixture: cannot create %s\n", tu_tmp("foreign.h5"));
        return 1;
    }
    hid_t g = H5Gcreate2(fid, "/data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(g);
    H5Fclose(fid);
    kv_error err = {0};
    kv_h5 *f = NULL;
    int rc = kv_h5_create(tu_tmp("good.h5"), &f, &err);
    if (!rc) {
        rc = kv_h5_write_provenance(f, "good", NULL, &err);
        if (rc)
            kv_h5_abort(f);
        else
            rc = kv_h5_commit(f, &err);
    }
    if (rc) fprintf(stderr, "h5io fixture: %s\n", err.msg);
    return rc ? 1 : 0;
}

static void test_bad_files(void) {
    kv_error err = {0};
    kv_h5 *f = NULL;
    /* missing */
    CU_ASSERT_EQUAL(kv_h5_open_read(tu_tmp("missing.h5"), &f, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "missing.h5"));
    /* not HDF5 */
    const char *txt = tu_tmp("text.h5");
    FILE *fp = fopen(txt, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    fputs("this is not an HDF5 file\n", fp);
    fclose(fp);
    CU_ASSERT_EQUAL(kv_h5_open_read(txt, &f, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "text.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not an HDF5 file"));
    /* HDF5, but not kvplan's (the suite fixture's) */
    const char *foreign = tu_tmp("foreign.h5");
    CU_ASSERT_EQUAL(kv_h5_open_read(foreign, &f, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "foreign.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not one of kvplan's"));
    /* newer schema */
    const char *newer = tu_tmp("newer.h5");
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(newer, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "future", NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_i64(f, "/", "schema_version", KV_SCHEMA_VERSION + 1, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_open_read(newer, &f, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "newer.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "schema version 3"));
    /* missing dataset / attribute in a good file (the suite fixture's) */
    const char *good = tu_tmp("good.h5");
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(good, &f, &err), KV_OK);
    int rank;
    long dims[KV_H5_MAX_RANK];
    double *x = (double *)&rank;
    CU_ASSERT_EQUAL(kv_h5_read_f64(f, "/heads/importance", &rank, dims, &x, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(x);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "good.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/heads/importance"));
    /* a group is not a dataset */
    long lv;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/", "ratio", &lv, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "ratio"));
    /* writing to a read-only file is refused */
    double one = 1;
    long d[1] = {1};
    CU_ASSERT_NOT_EQUAL(kv_h5_write_f64(f, "/x", 1, d, &one, NULL, &err), KV_OK);
    kv_h5_close(f);
}

/* A kvplan file touched by another tool (h5py style): variable-length string attributes, an
 * int32 schema_version, a float32 dataset. The readers convert. */
static void test_other_writers(void) {
    const char *path = tu_tmp("h5py_style.h5");
    hid_t fid = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(fid >= 0);
    hid_t scalar = H5Screate(H5S_SCALAR);
    hid_t vstr = H5Tcopy(H5T_C_S1);
    H5Tset_size(vstr, H5T_VARIABLE);
    H5Tset_cset(vstr, H5T_CSET_UTF8);
    const char *ver = "0.0.9";
    hid_t a = H5Acreate2(fid, "kvplan_version", vstr, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, vstr, &ver);
    H5Aclose(a);
    int schema = 1;
    a = H5Acreate2(fid, "schema_version", H5T_STD_I32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &schema);
    H5Aclose(a);
    hsize_t d[2] = {2, 3};
    hid_t sp = H5Screate_simple(2, d, NULL);
    hid_t ds = H5Dcreate2(fid, "/x", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float v[6] = {0.5f, 1.5f, -2.0f, 3.25f, 4.0f, 5.0f};
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    const char *units = "tokens";
    a = H5Acreate2(ds, "units", vstr, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, vstr, &units);
    H5Aclose(a);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Tclose(vstr);
    H5Sclose(scalar);
    H5Fclose(fid);

    kv_error err = {0};
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    char *s = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/", "kvplan_version", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "0.0.9");
    free(s);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/x", "units", &s, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(s ? s : "", "tokens");
    free(s);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *x = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, "/x", &rank, dims, &x, &err), KV_OK);
    CU_ASSERT_EQUAL(rank, 2);
    CU_ASSERT_EQUAL(dims[1], 3);
    CU_ASSERT_DOUBLE_EQUAL(x[3], 3.25, 0);
    free(x);
    int *xi = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/x", &rank, dims, &xi, &err), KV_OK);
    CU_ASSERT_EQUAL(xi[5], 5);
    free(xi);
    kv_h5_close(f);
}

/* HDF5 must not print its own error stack when kvplan reports an error. */
static void test_quiet_errors(void) {
    const char *log = tu_tmp("stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CU_ASSERT_FATAL(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    kv_error err = {0};
    kv_h5 *f = NULL;
    int rc1 = kv_h5_open_read(tu_tmp("foreign.h5"), &f, &err);
    int rc2 = kv_h5_open_read(tu_tmp("good.h5"), &f, &err);
    int rank;
    long dims[KV_H5_MAX_RANK];
    double *x = NULL;
    int rc3 = f ? kv_h5_read_f64(f, "/no/such", &rank, dims, &x, &err) : -1;
    char *s = NULL;
    int rc4 = f ? kv_h5_read_attr_str(f, "/", "nothing", &s, &err) : -1;
    kv_h5_close(f);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CU_ASSERT_EQUAL(rc1, KV_EINPUT);
    CU_ASSERT_EQUAL(rc2, KV_OK);
    CU_ASSERT_EQUAL(rc3, KV_EINPUT);
    CU_ASSERT_EQUAL(rc4, KV_EINPUT);
    struct stat st;
    CU_ASSERT_EQUAL(stat(log, &st), 0);
    CU_ASSERT_EQUAL(st.st_size, 0);
}

static void append(void *user, const char *p) {
    char *buf = user;
    strncat(buf, p, 255 - strlen(buf));
    strncat(buf, ";", 255 - strlen(buf));
}

static void append_attr(void *user, const char *name, char kind) {
    char *buf = user;
    size_t n = strlen(buf);
    snprintf(buf + n, 256 - n, "%s=%c;", name, kind);
}

static void test_list(void) {
    const char *path = tu_tmp("list.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    double v = 1;
    long d[1] = {1};
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "list", NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/b/y", 1, d, &v, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/a", 1, d, &v, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/b/x/z", 1, d, &v, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_attr_str(f, "/emptygroup", "k", "v", &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    char got[256] = "";
    CU_ASSERT_EQUAL(kv_h5_list_datasets(f, append, got, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(got, "/a;/b/x/z;/b/y;");
    got[0] = '\0';
    CU_ASSERT_EQUAL(kv_h5_list_groups(f, append, got, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(got, "/b;/b/x;/emptygroup;");
    got[0] = '\0';
    CU_ASSERT_EQUAL(kv_h5_list_attrs(f, "/", append_attr, got, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(got, "command=s;created=s;kvplan_version=s;model_sha256=s;"
                                "schema_version=i;");
    got[0] = '\0';
    CU_ASSERT_EQUAL(kv_h5_list_attrs(f, "/emptygroup", append_attr, got, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(got, "k=s;");
    CU_ASSERT_EQUAL(kv_h5_list_attrs(f, "/nothing", append_attr, got, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nothing"));
    kv_h5_close(f);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"round trip of datasets and attributes", test_roundtrip},
        {"provenance attributes", test_provenance},
        {"aborted write keeps the good file", test_abort_keeps_good_file},
        {"create in an unwritable place", test_create_unwritable},
        {"bad files are rejected", test_bad_files},
        {"files touched by other HDF5 writers", test_other_writers},
        {"HDF5 prints nothing itself", test_quiet_errors},
        {"list datasets, groups and attributes", test_list},
    };
    const tu_suite suite = {"h5io", h5io_init, NULL, tests, sizeof tests / sizeof tests[0]};
    return tu_main_suites(argc, argv, &suite, 1);
}
