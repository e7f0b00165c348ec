/* libFuzzer target: kvplan's readers of its own HDF5 files (runtime/h5io.c and its users):
 * kv_h5_open_read, the plan budget reader (kv_plan_budget_read), the profile reader of the
 * planner (kv_profile_inputs_read, for a 2-layer, 2-KV-head model) and the whole of
 * `kvplan inspect` (ki_load, text and JSON output to /dev/null). HDF5 itself is not
 * instrumented: what this finds is kvplan's handling of what HDF5 returns. */
#include "../../cli/inspect.h"
#include "fuzz_util.h"
#include "kvplan/h5io.h"
#include "kvplan/search.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *null_out;
    if (!null_out) null_out = fopen("/dev/null", "w");
    char path[64];
    int fd = fz_memfile("file.h5", data, size, path);
    if (fd < 0) return 0;
    kv_error err = {0};
    kv_plan_budget b;
    memset(&b, 0, sizeof b);
    if (kv_plan_budget_read(path, &b, &err) == KV_OK) kv_plan_budget_free(&b);
    kv_model m;
    memset(&m, 0, sizeof m);
    m.cfg.n_layers = 2;
    m.cfg.n_kv_heads = 2;
    m.cfg.n_heads = 2;
    snprintf(m.path, sizeof m.path, "fuzz-model");
    kv_profile_inputs p;
    if (kv_profile_inputs_read(path, &m, &p, &err) == KV_OK) kv_profile_inputs_free(&p);
    ki_file f;
    if (ki_load(path, &f, &err) == KV_OK) {
        ki_print_text(null_out, &f);
        ki_print_json(null_out, &f, &err);
    }
    ki_free(&f);
    close(fd);
    return 0;
}
