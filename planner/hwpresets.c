/* Hardware figures for the KVPR split and Batch-Max sizing: published presets for what-if
 * planning, and the profiled figures of a profile.h5 (docs/hardware-schema.md).
 *
 * Preset table (one row per --hardware key). Conventions:
 *  - memory: the published capacity read as GiB (HBM/GDDR capacities are binary); the driver
 *    keeps a few hundred MiB, so a profiled device_mem_bytes is slightly lower;
 *  - memory bandwidth and PCIe: published decimal figures (1 GB/s = 1e9 bytes/s); NVIDIA quotes
 *    PCIe bandwidth for both directions together, v_com is one direction (half of it);
 *  - v_gpu: dense FP16 tensor-core throughput (datasheets quote 2x "with sparsity").
 *
 * | key            | memory      | mem bw     | PCIe (quoted -> v_com)  | FP16 dense   |
 * | h100-sxm       | 80 GB HBM3  | 3.35 TB/s  | Gen5 x16 128 -> 64 GB/s | 989.4 TFLOPS |
 * | h200           | 141 GB HBM3e| 4.8 TB/s   | Gen5 x16 128 -> 64 GB/s | 989.4 TFLOPS |
 * | a100-40g-pcie4 | 40 GB HBM2  | 1,555 GB/s | Gen4 x16  64 -> 32 GB/s | 312 TFLOPS   |
 * | l4             | 24 GB GDDR6 | 300 GB/s   | Gen4 x16  64 -> 32 GB/s | 121 TFLOPS   |
 * Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM column), NVIDIA H200 Tensor Core GPU
 * product page/datasheet (SXM column), NVIDIA A100 Tensor Core GPU datasheet (A100 40GB PCIe
 * column), NVIDIA L4 Tensor Core GPU datasheet. KVPR §1 uses the A100 PCIe 4.0 x16 link at
 * 32 GB/s, the a100-40g-pcie4 v_com. Also in docs/batch-sizing.md.
 */
#include "kvplan/kvpr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const kv_hw_preset presets[] = {
    {"h100-sxm", "NVIDIA H100 SXM5 80GB (HBM3, PCIe Gen5 x16 host link)", 80 * GIB, 3.35e12,
     64e9, 989.4e12, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"},
    {"h200", "NVIDIA H200 SXM 141GB (HBM3e, PCIe Gen5 x16 host link)", 141 * GIB, 4.8e12, 64e9,
     989.4e12, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column"},
    {"a100-40g-pcie4", "NVIDIA A100 40GB PCIe (HBM2, PCIe Gen4 x16)", 40 * GIB, 1.555e12, 32e9,
     312e12, "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB PCIe column; KVPR section 1"},
    {"l4", "NVIDIA L4 24GB (GDDR6, PCIe Gen4 x16)", 24 * GIB, 300e9, 32e9, 121e12,
     "NVIDIA L4 Tensor Core GPU datasheet"},
};

const kv_hw_preset *kv_hw_presets(int *n) {
    *n = (int)(sizeof presets / sizeof presets[0]);
    return presets;
}

int kv_hw_from_preset(const char *key, kv_hw *out, kv_error *err) {
    int n = 0;
    const kv_hw_preset *t = kv_hw_presets(&n);
    for (int i = 0; i < n; i++) {
        if (key && !strcmp(key, t[i].key)) {
            memset(out, 0, sizeof *out);
            snprintf(out->name, sizeof out->name, "%s", t[i].key);
            out->v_com = t[i].v_com;
            out->v_gpu = t[i].v_gpu;
            out->mem_bw = t[i].mem_bw;
            out->device_mem = t[i].device_mem;
            snprintf(out->source, sizeof out->source, "preset %s: %s", t[i].key, t[i].source);
            return KV_OK;
        }
    }
    char known[256] = "";
    for (int i = 0; i < n; i++) {
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", t[i].key);
    }
    return kv_fail(err, KV_EINPUT, "unknown hardware preset '%s' (known: %s)", key ? key : "",
                   known);
}

/* An optional float attribute: 0 when absent or unreadable. */
static double attr_or_zero(kv_h5 *f, const char *obj, const char *name) {
    double v = 0.0;
    if (!kv_h5_exists(f, obj) || !kv_h5_attr_exists(f, obj, name)) return 0.0;
    kv_error e = {0};
    if (kv_h5_read_attr_f64(f, obj, name, &v, &e)) return 0.0;
    return v;
}

int kv_hw_from_profile(const char *profile_path, kv_hw *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(profile_path, &f, err);
    if (rc) return rc;
    if (!kv_h5_exists(f, "/hardware")) {
        kv_h5_close(f);
        return kv_fail(err, KV_EINPUT,
                       "%s: no /hardware group (profile without hardware figures); pass "
                       "--v-com/--v-gpu or --hardware PRESET", profile_path);
    }
    out->v_com = attr_or_zero(f, "/hardware/copy_h2d", "bandwidth");
    out->v_gpu = attr_or_zero(f, "/hardware/gemm_fp16", "peak_flops_per_s");
    const char *gemm = "/hardware/gemm_fp16";
    if (!(out->v_gpu > 0)) {
        out->v_gpu = attr_or_zero(f, "/hardware/gemm", "peak_flops_per_s");
        gemm = "/hardware/gemm";
    }
    out->mem_bw = attr_or_zero(f, "/hardware/copy_d2d", "bandwidth");
    if (kv_h5_attr_exists(f, "/hardware", "device_mem_bytes")) {
        long mem = 0;
        kv_error e = {0};
        if (!kv_h5_read_attr_i64(f, "/hardware", "device_mem_bytes", &mem, &e) && mem > 0)
            out->device_mem = (double)mem;
    }
    char *name = NULL, *kind = NULL;
    kv_error e = {0};
    if (kv_h5_attr_exists(f, "/hardware", "device_name"))
        (void)kv_h5_read_attr_str(f, "/hardware", "device_name", &name, &e);
    if (kv_h5_attr_exists(f, "/hardware", "kind"))
        (void)kv_h5_read_attr_str(f, "/hardware", "kind", &kind, &e);
    snprintf(out->name, sizeof out->name, "%s%s%s%s", name ? name : "profiled device",
             kind ? " (" : "", kind ? kind : "", kind ? ")" : "");
    snprintf(out->source, sizeof out->source, "profile %s (/hardware/copy_h2d, %s)",
             profile_path, gemm);
    free(name);
    free(kind);
    kv_h5_close(f);
    if (!(out->v_com > 0))
        return kv_fail(err, KV_EINPUT, "%s: /hardware/copy_h2d has no positive bandwidth "
                       "attribute (v_com)", profile_path);
    if (!(out->v_gpu > 0))
        return kv_fail(err, KV_EINPUT, "%s: neither /hardware/gemm_fp16 nor /hardware/gemm has a "
                       "positive peak_flops_per_s (v_gpu)", profile_path);
    return KV_OK;
}
