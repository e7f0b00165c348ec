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
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/hwprobe.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const kv_hw_preset presets[] = {
    {"h100-sxm", "NVIDIA H100 SXM5 80GB (HBM3, PCIe Gen5 x16 host link)", 80 * GIB, 3.35e12, 64e9,
     989.4e12, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"},
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

int kv_hw_from_profile(const char *profile_path, kv_hw *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(profile_path, &f, err);
    if (rc) return rc;
    kv_hw_rates r;
    rc = kv_hw_read_rates(f, &r, err); /* the profiler's reader of /hardware */
    kv_h5_close(f);
    if (rc) return rc;
    snprintf(out->name, sizeof out->name, "%.50s (%s)", r.device_name, r.kind);
    out->v_com = r.v_com;
    out->v_gpu = r.v_gpu;
    out->mem_bw = r.mem_bw; /* memory traffic: 2 x copy_d2d@bandwidth */
    out->device_mem = r.device_mem_bytes > 0 ? (double)r.device_mem_bytes : 0.0;
    snprintf(out->source, sizeof out->source,
             "profile %.90s (/hardware/copy_h2d, /hardware/%.9s, 2 x copy_d2d)", profile_path,
             r.v_gpu_source);
    return KV_OK;
}
