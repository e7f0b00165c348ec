/* libFuzzer target: kvplan's readers of its own HDF5 files (runtime/util/h5io.c and its users):
 * kv_h5_open_read, the plan reader and validator (kv_plan_read), the planner's profile reader
 * (kv_profile_inputs_read, for a 2-layer, 2-KV-head model, and kv_profile_inputs_check) and
 * the whole of `kvplan inspect` (ki_load, text and JSON output to /dev/null, and for one input
 * in four the PNG pictures, written into a private directory and removed).
 *
 * Structure-aware: the input is not the file's bytes but a program that builds a well-formed
 * HDF5 file with hostile contents: attributes and datasets at the paths kvplan reads, with
 * any type (string / float64 / int64 attribute, float64 / int32 dataset), any value (NaN,
 * 1e300, negative, long or control-character strings) and any shape (rank 1..3, empty,
 * mismatched). That is the file an attacker makes with h5py. Byte-level mutation of the
 * HDF5 container itself is left out on purpose: it crashes libhdf5 1.10 inside its own
 * parser (e.g. H5A__close from H5Aiterate2 on a damaged attribute table) within a hundred
 * runs, a bug in HDF5 that kvplan cannot fix or catch; see docs/faults.md. */
#include <cairo.h>
#include <dirent.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <sys/stat.h>

#include "../../cli/inspect.h"
#include "fuzz_util.h"
#include "kvplan/h5io.h"
#include "kvplan/plan.h"
#include "kvplan/search.h"

static const char *const obj_paths[] = {
    "/budget/tokens",     "/budget/blocks",          "/heads/similarity",
    "/heads/importance",  "/heads/token_cos",        "/heads/cos_mean",
    "/layers/similarity", "/layers/cos_attn",        "/consistency/kendall_tau",
    "/search/perplexity", "/search/t_values",        "/search/r_values",
    "/search/p_values",   "/search/chunks",          "/search/baselines",
    "/search/heldout",    "/hardware/copy_h2d",      "/hardware/gemm_fp16",
    "/kvpr/split_row",    "/kvpr/seq_len",           "/kvpr/batch",
    "/batch/max_batch",   "/batch/kv_bytes_per_seq", "/prompts/tokens",
    "/budget/kv_type",    "/budget/policy",
};
static const char *const attr_objs[] = {"/",
                                        "/search",
                                        "/hardware",
                                        "/kvpr",
                                        "/batch",
                                        "/heads/similarity",
                                        "/budget/tokens",
                                        "/budget",
                                        "/budget/kv_type",
                                        "/budget/policy"};
static const char *const attr_names[] = {"kvplan_version",
                                         "schema_version",
                                         "file_kind",
                                         "created",
                                         "command",
                                         "model_sha256",
                                         "model_path",
                                         "model_format",
                                         "model_n_layers",
                                         "model_n_kv_heads",
                                         "model_n_heads",
                                         "model_dim",
                                         "model_head_dim",
                                         "model_vocab_size",
                                         "ratio",
                                         "context_length",
                                         "block_size",
                                         "evict_block",
                                         "policy",
                                         "allocation",
                                         "t",
                                         "r",
                                         "p",
                                         "winner",
                                         "best_chunks",
                                         "best_perplexity",
                                         "units",
                                         "names",
                                         "rows",
                                         "kind",
                                         "device_name",
                                         "device_mem_bytes",
                                         "v_gpu",
                                         "v_com",
                                         "seed",
                                         "plan_schema",
                                         "min_tokens",
                                         "sha256",
                                         "codes"};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static unsigned take(rd *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static double take_num(rd *r) {
    static const double special[] = {0.0,          1.0,           -1.0,   0.5, 2.0,
                                     16.0,         1e300,         -1e300, NAN, INFINITY,
                                     2147483648.0, -2147483649.0, 1e-300, 4.0};
    unsigned k = take(r);
    if (k < 128) return special[k % N_OF(special)];
    uint64_t b = 0;
    for (int i = 0; i < 8; i++) b |= (uint64_t)take(r) << (8 * i);
    double d;
    memcpy(&d, &b, 8);
    return d;
}

static void build(kv_h5 *f, rd *r) {
    kv_error err = {0};
    /* a root that kv_h5_open_read accepts, unless the program overwrites it */
    kv_h5_attr_str(f, "/", "kvplan_version", "0.1.0", &err);
    kv_h5_attr_i64(f, "/", "schema_version", 1, &err);
    kv_h5_attr_str(f, "/", "file_kind", (take(r) & 1) ? "plan" : "profile", &err);
    for (int op = 0; op < 64 && r->n; op++) {
        unsigned code = take(r) % 5;
        if (code <= 2) { /* attribute */
            const char *obj = attr_objs[take(r) % N_OF(attr_objs)];
            const char *name = attr_names[take(r) % N_OF(attr_names)];
            if (code == 0) {
                char s[1200];
                size_t len = take(r) * 4u + take(r) % 4u;
                if (len >= sizeof s) len = sizeof s - 1;
                for (size_t i = 0; i < len; i++) s[i] = (char)(r->n ? take(r) : 'x');
                s[len] = '\0';
                kv_h5_attr_str(f, obj, name, s, &err);
            } else if (code == 1) {
                kv_h5_attr_f64(f, obj, name, take_num(r), &err);
            } else {
                long v = (long)(int32_t)(take(r) | take(r) << 8 | take(r) << 16 | take(r) << 24);
                kv_h5_attr_i64(f, obj, name, v, &err);
            }
        } else { /* dataset */
            const char *path = obj_paths[take(r) % N_OF(obj_paths)];
            int rank = 1 + (int)(take(r) % 3);
            long dims[3];
            size_t count = 1;
            for (int i = 0; i < rank; i++) {
                dims[i] = take(r) % 9;
                count *= (size_t)dims[i];
            }
            if (code == 3) {
                double *v = malloc((count ? count : 1) * sizeof *v);
                if (!v) return;
                for (size_t i = 0; i < count; i++) v[i] = take_num(r);
                kv_h5_write_f64(f, path, rank, dims, v, NULL, &err);
                free(v);
            } else {
                int *v = malloc((count ? count : 1) * sizeof *v);
                if (!v) return;
                for (size_t i = 0; i < count; i++)
                    v[i] = (int)(int8_t)take(r) * ((take(r) & 1) ? 1 : 1 << 20);
                kv_h5_write_i32(f, path, rank, dims, v, NULL, &err);
                free(v);
            }
        }
    }
}

static char dir[64], path[128], png_dir[96];

/* Remove the files in png_dir (the PNG writer's outputs and temporaries). */
static void clear_pngs(void) {
    DIR *d = opendir(png_dir);
    if (!d) return;
    struct dirent *e;
    char name[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(name, sizeof name, "%s/%s", png_dir, e->d_name);
            remove(name);
        }
    closedir(d);
}

/* the private directory goes when the fuzzer exits */
static void cleanup(void) {
    remove(path);
    clear_pngs();
    rmdir(png_dir);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *null_out;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvplan-fuzz-h5.XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/file.h5", dir);
        snprintf(png_dir, sizeof png_dir, "%s/png", dir);
        if (mkdir(png_dir, 0700) != 0) abort();
        atexit(cleanup);
        null_out = fopen("/dev/null", "w");
    }
    kv_error err = {0};
    kv_h5 *h = NULL;
    if (kv_h5_create(path, &h, &err) != KV_OK) abort();
    rd r = {data, size};
    build(h, &r);
    if (kv_h5_commit(h, &err) != KV_OK) return 0;
    kv_plan b;
    if (kv_plan_read(path, &b, &err) == KV_OK) kv_plan_free(&b);
    kv_model m;
    memset(&m, 0, sizeof m);
    m.cfg.n_layers = 2;
    m.cfg.n_kv_heads = 2;
    m.cfg.n_heads = 2;
    snprintf(m.path, sizeof m.path, "fuzz-model");
    kv_profile_inputs p;
    if (kv_profile_inputs_read(path, &m, &p, &err) == KV_OK) kv_profile_inputs_free(&p);
    (void)kv_profile_inputs_check(path, &err);
    ki_file f;
    if (ki_load(path, &f, &err) == KV_OK) {
        ki_print_text(null_out, &f);
        ki_print_json(null_out, &f, &err);
        /* the PNG writer too, for one input in four (drawing is slow) */
        int n = 0;
        if (size && (data[size - 1] & 3) == 0) {
            (void)ki_write_pngs(&f, png_dir, null_out, &n, &err);
            clear_pngs();
            /* as `kvplan inspect` does: cairo's and fontconfig's caches go, so that the leak
             * check after each input sees nothing left over */
            cairo_debug_reset_static_data();
            FcFini();
        }
    }
    ki_free(&f);
    return 0;
}
