/* kvplan kvpr: the KVPR split point for one shape (and over the decode steps with --gen-len).
 * KVPR Eq. 6-11 generalised to GQA (docs/design.md Planning 5); the solver is planner/kvpr.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"

typedef struct kvpr_args {
    const char *profile, *preset, *model, *schedule, *kv_type;
    double v_com, v_gpu;                          /* NAN = not given */
    long hidden, kv_heads, head_dim, layers, gen; /* 0 = not given */
    long batch, seq;                              /* -1 = not given */
    double dtype_bytes;
    int json;
} kvpr_args;

static const kv_opt kvpr_opts[] = {
    {"--profile", NULL, KV_OPT_STR, offsetof(kvpr_args, profile), "P",
     .help = "v_com and v_gpu from a profile's /hardware fits"},
    {"--hardware", NULL, KV_OPT_STR, offsetof(kvpr_args, preset), "NAME",
     .help = "published figures: h100-sxm, h200, a100-40g-pcie4, l4 (--hardware list prints "
             "them with their sources)"},
    {"--v-com", NULL, KV_OPT_QTY, offsetof(kvpr_args, v_com), "BYTES_PER_S", 0, 1e300,
     .help = "host->device bytes/s (overrides the above)"},
    {"--v-gpu", NULL, KV_OPT_QTY, offsetof(kvpr_args, v_gpu), "FLOP_PER_S", 0, 1e300,
     .help = "device FLOP/s (overrides the above)"},
    {"--model", NULL, KV_OPT_STR, offsetof(kvpr_args, model), "MODEL", .positional = 1,
     .help = "the shape from a model (llama2.c .bin, .gguf or Hugging Face directory)"},
    {"--hidden", NULL, KV_OPT_INT, offsetof(kvpr_args, hidden), "h", 1, 1 << 30,
     .help = "hidden size (without MODEL)"},
    {"--kv-heads", NULL, KV_OPT_INT, offsetof(kvpr_args, kv_heads), "k", 1, 1 << 20,
     .help = "KV heads (without MODEL)"},
    {"--head-dim", NULL, KV_OPT_INT, offsetof(kvpr_args, head_dim), "d", 1, 1 << 20,
     .help = "head dimension (without MODEL)"},
    {"--layers", NULL, KV_OPT_INT, offsetof(kvpr_args, layers), "L", 1, 1 << 20,
     .help = "number of layers (default 1, or the model's): totals are L x per layer"},
    {"--batch", NULL, KV_OPT_INT, offsetof(kvpr_args, batch), "b", 0, 1099511627776.0,
     .help = "batch size (required)"},
    {"--seq-len", NULL, KV_OPT_INT, offsetof(kvpr_args, seq), "s", 0, 1099511627776.0,
     .help = "current length s' (tokens whose K, V are in host memory; required)"},
    {"--gen-len", NULL, KV_OPT_INT, offsetof(kvpr_args, gen), "g", 1, 1 << 24,
     .help = "also tabulate the g decode steps, s' = s .. s + g - 1"},
    {"--dtype-bytes", NULL, KV_OPT_NUM, offsetof(kvpr_args, dtype_bytes), "p", 0.0625, 64,
     .def = "2", .help = "bytes per element of X, K, V (2: fp16; at least 1/16: half a bit)"},
    {"--kv-type", NULL, KV_OPT_STR, offsetof(kvpr_args, kv_type), "T",
     .help = "K and V bytes as a kvplan cache of type T stores them (f32, f16, q8, q4; "
             "scales included); default: --dtype-bytes"},
    {"--schedule", NULL, KV_OPT_STR, offsetof(kvpr_args, schedule), "S", .def = "column",
     .help = "column (activations are transferred too) or row"},
    {"--json", NULL, KV_OPT_FLAG, offsetof(kvpr_args, json),
     .help = "one JSON object on the last line: split (tokens), time and time_no_recompute "
             "(seconds per layer), bound, ...; with --gen-len also decode.steps and "
             "decode.total_time (all layers)"},
};

const kv_cli_spec kv_spec_kvpr = {
    "kvpr",
    "usage: kvplan kvpr [--profile P | --hardware NAME | --v-com BYTES_PER_S --v-gpu FLOP_PER_S]\n"
    "                   (MODEL | --hidden h --kv-heads k --head-dim d [--layers L])\n"
    "                   --batch b --seq-len s [--gen-len g] [--dtype-bytes p]\n"
    "                   [--schedule row|column] [--json]\n",
    "KVPR split point: how many of the s' offloaded tokens of a layer to recompute on the\n"
    "device from their activations while the rest of K and V is transferred (KVPR Eq. 6-11,\n"
    "generalised to GQA: K/V width h_kv = kv-heads x head-dim), solved with GLPK's MIP solver.\n",
    "Numbers accept suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti (powers of 1024).\n",
    {{NULL, kvpr_opts, sizeof kvpr_opts / sizeof kvpr_opts[0], 0}},
};

static double ms(double s) {
    return s * 1e3;
}

static void add_result(cJSON *o, const kv_kvpr_result *r) {
    cJSON_AddNumberToObject(o, "split", (double)r->split);
    cJSON_AddNumberToObject(o, "time", r->time);
    cJSON_AddNumberToObject(o, "time_no_recompute", r->time_no_recompute);
    cJSON_AddNumberToObject(o, "t_activations", r->t_activations);
    cJSON_AddNumberToObject(o, "t_recompute", r->t_recompute);
    cJSON_AddNumberToObject(o, "t_transfer", r->t_transfer);
    cJSON_AddStringToObject(o, "bound", r->bound == KV_BOUND_COMPUTE ? "compute" : "transfer");
}

static void print_presets(void) {
    int n = 0;
    const kv_hw_preset *t = kv_hw_presets(&n);
    printf("%-16s %10s %12s %14s %14s  %s\n", "preset", "memory GiB", "mem GB/s", "v_com GB/s",
           "v_gpu TFLOP/s", "source");
    for (int k = 0; k < n; k++)
        printf("%-16s %10.0f %12.0f %14.0f %14.1f  %s\n", t[k].key, t[k].device_mem / 1073741824.0,
               t[k].mem_bw / 1e9, t[k].v_com / 1e9, t[k].v_gpu / 1e12, t[k].source);
}

/* The hardware figures: a profile's fits or a preset, overridden by --v-com / --v-gpu. */
static int get_hw(const kvpr_args *a, kv_hw *hw, kv_error *err) {
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "user");
    snprintf(hw->source, sizeof hw->source, "command line");
    if (a->profile && a->preset)
        return kv_fail(err, KV_EINPUT, "give --profile or --hardware, not both");
    if (a->profile && kv_hw_from_profile(a->profile, hw, err)) return err->code;
    if (a->preset && kv_hw_from_preset(a->preset, hw, err)) return err->code;
    if (!isnan(a->v_com)) hw->v_com = a->v_com;
    if (!isnan(a->v_gpu)) hw->v_gpu = a->v_gpu;
    if (!a->profile && !a->preset && (isnan(a->v_com) || isnan(a->v_gpu)))
        return kv_fail(err, KV_EINPUT,
                       "need the hardware: --profile P, --hardware NAME, or both "
                       "--v-com BYTES_PER_S and --v-gpu FLOP_PER_S");
    return KV_OK;
}

/* The shape: from MODEL or --hidden / --kv-heads / --head-dim; *layers, *n_kv, *hd for the
 * report, model_desc names the model ("" without one). */
static int get_shape(const kvpr_args *a, kv_kvpr_shape *sh, long *layers, long *n_kv, long *hd,
                     char *model_desc, size_t cap, kv_error *err) {
    *sh = (kv_kvpr_shape){0, 0, 0, 0, a->dtype_bytes, 0};
    *layers = 1;
    model_desc[0] = '\0';
    if (a->model) {
        if (a->hidden || a->kv_heads || a->head_dim)
            return kv_fail(err, KV_EINPUT,
                           "give --model or --hidden/--kv-heads/--head-dim, not both");
        kv_model *m = NULL;
        if (kv_cli_load_model(a->model, &m, err)) return err->code;
        sh->hidden = m->cfg.dim;
        *n_kv = m->cfg.n_kv_heads;
        *hd = m->cfg.head_dim;
        *layers = m->cfg.n_layers;
        snprintf(model_desc, cap, "%s (%d query heads, %d KV heads)", a->model, m->cfg.n_heads,
                 m->cfg.n_kv_heads);
        kv_model_free(m);
    } else {
        if (!a->hidden || !a->kv_heads || !a->head_dim)
            return kv_fail(err, KV_EINPUT,
                           "need --model MODEL or all of --hidden, --kv-heads, --head-dim");
        sh->hidden = a->hidden;
        *n_kv = a->kv_heads;
        *hd = a->head_dim;
    }
    if (a->layers) *layers = a->layers;
    sh->kv_width = *n_kv * *hd;
    if (a->kv_type) { /* K and V as a kvplan cache of this type stores them, scales included */
        kv_cache_type t = KV_TYPE_DEFAULT;
        if (kv_type_parse(a->kv_type, &t, err)) return kv_fail_context(err, "--kv-type");
        sh->kv_bytes = (double)kv_type_token_bytes(t, (int)*hd) / (2.0 * (double)*hd);
    }
    if (a->batch < 0 || a->seq < 0)
        return kv_fail(err, KV_EINPUT, "--batch b and --seq-len s are required");
    sh->batch = a->batch;
    sh->seq = a->seq;
    return KV_OK;
}

static void print_split(const kv_kvpr_shape *sh, const kv_hw *hw, kv_schedule sched,
                        const kv_kvpr_result *r, long layers, long n_kv, long hd,
                        const char *model_desc) {
    printf("KVPR split point (KVPR Eq. 6-11, generalised to GQA), %s-by-%s schedule\n",
           kv_schedule_name(sched), kv_schedule_name(sched));
    if (model_desc[0]) printf("model: %s\n", model_desc);
    printf("shape: b %ld, s' %ld, h %ld, h_kv %ld (%ld KV heads x %ld), p %g bytes, %ld layer%s\n",
           sh->batch, sh->seq, sh->hidden, sh->kv_width, n_kv, hd, sh->dtype_bytes, layers,
           layers == 1 ? "" : "s");
    printf("hardware: v_com %.4g GB/s, v_gpu %.4g TFLOP/s (%s)\n", hw->v_com / 1e9,
           hw->v_gpu / 1e12, hw->source);
    printf("split l = %ld of %ld tokens recomputed from activations\n", r->split, sh->seq);
    printf("time per layer: %.4g ms with recomputation, %.4g ms without (%+.1f%%)\n", ms(r->time),
           ms(r->time_no_recompute),
           r->time_no_recompute > 0 ? 100.0 * (r->time / r->time_no_recompute - 1.0) : 0.0);
    printf("  = activations %.4g ms + max(recompute %.4g ms, K/V transfer %.4g ms)\n",
           ms(r->t_activations), ms(r->t_recompute), ms(r->t_transfer));
    printf("bound by: %s\n", r->bound == KV_BOUND_COMPUTE ? "device recomputation (v_gpu)"
                                                          : "the host-device link (v_com)");
    printf("note: %s\n", r->note);
    if (layers > 1)
        printf("all %ld layers: %.4g ms with recomputation, %.4g ms without\n", layers,
               ms(r->time) * (double)layers, ms(r->time_no_recompute) * (double)layers);
}

static cJSON *result_json(const kv_kvpr_shape *sh, const kv_hw *hw, kv_schedule sched,
                          const kv_kvpr_result *r, long layers) {
    cJSON *root = cJSON_CreateObject();
    add_result(root, r);
    cJSON_AddStringToObject(root, "schedule", kv_schedule_name(sched));
    cJSON_AddNumberToObject(root, "batch", (double)sh->batch);
    cJSON_AddNumberToObject(root, "seq_len", (double)sh->seq);
    cJSON_AddNumberToObject(root, "hidden", (double)sh->hidden);
    cJSON_AddNumberToObject(root, "kv_width", (double)sh->kv_width);
    cJSON_AddNumberToObject(root, "dtype_bytes", sh->dtype_bytes);
    cJSON_AddNumberToObject(root, "layers", (double)layers);
    cJSON_AddNumberToObject(root, "v_com", hw->v_com);
    cJSON_AddNumberToObject(root, "v_gpu", hw->v_gpu);
    cJSON_AddNumberToObject(root, "glpk_status", r->glpk_status);
    cJSON_AddBoolToObject(root, "activations_dearer", r->activations_dearer);
    cJSON_AddStringToObject(root, "note", r->note);
    return root;
}

/* The gen decode steps (s' grows by one per step): a table and root's "decode" object. */
static int decode_steps(const kv_kvpr_shape *sh, const kv_hw *hw, kv_schedule sched, long gen,
                        long layers, cJSON *root, kv_error *err) {
    double total = 0, total0 = 0;
    long every = gen <= 64 ? 1 : (gen + 31) / 32;
    printf("\ndecode steps (s' grows by one per step; times per layer%s)\n",
           every > 1 ? ", every few steps shown" : "");
    printf("%8s %10s %10s %14s %14s %9s\n", "step", "s'", "split l", "t (ms)", "t no-rec (ms)",
           "bound");
    cJSON *dec = cJSON_AddObjectToObject(root, "decode");
    cJSON *steps = cJSON_AddArrayToObject(dec, "steps");
    for (long t = 1; t <= gen; t++) {
        kv_kvpr_shape st = *sh;
        st.seq = sh->seq + t - 1;
        kv_kvpr_result rs;
        int rc = kv_kvpr_solve(&st, hw->v_com, hw->v_gpu, sched, &rs, err);
        if (rc) return rc;
        total += rs.time;
        total0 += rs.time_no_recompute;
        if ((t - 1) % every == 0 || t == gen)
            printf("%8ld %10ld %10ld %14.4g %14.4g %9s\n", t, st.seq, rs.split, ms(rs.time),
                   ms(rs.time_no_recompute), rs.bound == KV_BOUND_COMPUTE ? "compute" : "transfer");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)t);
        cJSON_AddNumberToObject(o, "seq_len", (double)st.seq);
        add_result(o, &rs);
        cJSON_AddItemToArray(steps, o);
    }
    printf("decode total (%ld steps x %ld layer%s): %.4g ms with recomputation, %.4g ms "
           "without (%+.1f%%)\n",
           gen, layers, layers == 1 ? "" : "s", ms(total) * (double)layers,
           ms(total0) * (double)layers, total0 > 0 ? 100.0 * (total / total0 - 1.0) : 0.0);
    cJSON_AddNumberToObject(dec, "gen_len", (double)gen);
    cJSON_AddNumberToObject(dec, "total_time", total * (double)layers);
    cJSON_AddNumberToObject(dec, "total_time_no_recompute", total0 * (double)layers);
    return KV_OK;
}

int kv_cmd_kvpr(int argc, char **argv) {
    kvpr_args a = {.v_com = NAN, .v_gpu = NAN, .batch = -1, .seq = -1};
    int code = kv_cli_parse(&kv_spec_kvpr, argc, argv, &a);
    if (code >= 0) return code;
    if (a.preset && !strcmp(a.preset, "list")) {
        print_presets();
        return 0;
    }
    /* build: hardware, shape, schedule */
    kv_error err = {0};
    kv_hw hw;
    kv_kvpr_shape sh;
    long layers = 1, n_kv = 0, hd = 0;
    char model_desc[160];
    kv_schedule sched;
    if (get_hw(&a, &hw, &err)) return kv_cli_report("kvpr", &err);
    if (get_shape(&a, &sh, &layers, &n_kv, &hd, model_desc, sizeof model_desc, &err))
        return kv_cli_report("kvpr", &err);
    if (kv_schedule_parse(a.schedule, &sched, &err)) return kv_cli_report("kvpr", &err);
    /* run: the split point at s' */
    kv_kvpr_result r;
    if (kv_kvpr_solve(&sh, hw.v_com, hw.v_gpu, sched, &r, &err)) return kv_cli_report("kvpr", &err);
    /* figures far from any machine (--v-com 1e-300) make the times overflow: refused, not
     * printed as "inf ms" */
    double worst = (r.time > r.time_no_recompute ? r.time : r.time_no_recompute) * (double)layers;
    if (!isfinite(worst) || worst > 1e15) {
        kv_fail(&err, KV_EINPUT,
                "the step time for v_com %g bytes/s and v_gpu %g FLOP/s is %g s, not a finite "
                "time of a real machine; check --v-com / --v-gpu (or the profile's fits)",
                hw.v_com, hw.v_gpu, worst);
        return kv_cli_report("kvpr", &err);
    }
    /* report: text, the decode steps, JSON */
    print_split(&sh, &hw, sched, &r, layers, n_kv, hd, model_desc);
    cJSON *root = result_json(&sh, &hw, sched, &r, layers);
    int rc = a.gen > 0 ? decode_steps(&sh, &hw, sched, a.gen, layers, root, &err) : KV_OK;
    if (!rc && a.json) {
        char *txt = cJSON_PrintUnformatted(root);
        if (txt) printf("%s\n", txt);
        free(txt);
    }
    cJSON_Delete(root);
    return rc ? kv_cli_report("kvpr", &err) : 0;
}
