/* kvplan kvpr: the KVPR split point for one shape (and over the decode steps with --gen-len).
 * KVPR Eq. 6-11 generalised to GQA (DESIGN.md Planning 5); the solver is planner/kvpr.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"

static const char *help =
    "usage: kvplan kvpr [--profile P | --hardware NAME | --v-com BYTES_PER_S --v-gpu FLOP_PER_S]\n"
    "                   (--model MODEL | --hidden h --kv-heads k --head-dim d [--layers L])\n"
    "                   --batch b --seq-len s [--gen-len g] [--dtype-bytes p]\n"
    "                   [--schedule row|column] [--json]\n"
    "KVPR split point: how many of the s' offloaded tokens of a layer to recompute on the\n"
    "device from their activations while the rest of K and V is transferred (KVPR Eq. 6-11,\n"
    "generalised to GQA: K/V width h_kv = kv-heads x head-dim), solved with GLPK's MIP solver.\n"
    "  --profile P        v_com and v_gpu from a profile's /hardware fits\n"
    "  --hardware NAME    published figures: h100-sxm, h200, a100-40g-pcie4, l4\n"
    "                     (--hardware list prints them with their sources)\n"
    "  --v-com, --v-gpu   host->device bytes/s and device FLOP/s (override the above)\n"
    "  --layers L         number of layers (default 1, or the model's): totals are L x per layer\n"
    "  --seq-len s        current length s' (tokens whose K, V are in host memory)\n"
    "  --gen-len g        also tabulate the g decode steps, s' = s .. s + g - 1\n"
    "  --dtype-bytes p    bytes per element of X, K, V (default 2, fp16)\n"
    "  --schedule         column (default, activations are transferred too) or row\n"
    "  --json             one JSON object on the last line: split (tokens), time and\n"
    "                     time_no_recompute (seconds per layer), bound, ...; with --gen-len\n"
    "                     also decode.steps and decode.total_time (all layers)\n"
    "Numbers accept suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti (powers of 1024).\n";

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

int kv_cmd_kvpr(int argc, char **argv) {
    kv_error err = {0};
    const char *profile = NULL, *preset = NULL, *model_path = NULL, *sched_s = "column";
    const char *v_com_s = NULL, *v_gpu_s = NULL, *hidden_s = NULL, *kvh_s = NULL, *hd_s = NULL;
    const char *layers_s = NULL, *batch_s = NULL, *seq_s = NULL, *gen_s = NULL, *p_s = NULL;
    int json = 0;
    const kv_cli_optval opts[] = {
        {"--profile", &profile},  {"--hardware", &preset}, {"--model", &model_path},
        {"--schedule", &sched_s}, {"--v-com", &v_com_s},   {"--v-gpu", &v_gpu_s},
        {"--hidden", &hidden_s},  {"--kv-heads", &kvh_s},  {"--head-dim", &hd_s},
        {"--layers", &layers_s},  {"--batch", &batch_s},   {"--seq-len", &seq_s},
        {"--gen-len", &gen_s},    {"--dtype-bytes", &p_s},
    };
    int sc = kv_cli_scan("kvpr", argc, argv, opts, sizeof opts / sizeof opts[0], help, &json);
    if (sc >= 0) return sc;

    if (preset && !strcmp(preset, "list")) {
        int n = 0;
        const kv_hw_preset *t = kv_hw_presets(&n);
        printf("%-16s %10s %12s %14s %14s  %s\n", "preset", "memory GiB", "mem GB/s", "v_com GB/s",
               "v_gpu TFLOP/s", "source");
        for (int k = 0; k < n; k++)
            printf("%-16s %10.0f %12.0f %14.0f %14.1f  %s\n", t[k].key,
                   t[k].device_mem / 1073741824.0, t[k].mem_bw / 1e9, t[k].v_com / 1e9,
                   t[k].v_gpu / 1e12, t[k].source);
        return 0;
    }
    /* hardware figures */
    kv_hw hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.name, sizeof hw.name, "user");
    snprintf(hw.source, sizeof hw.source, "command line");
    if (profile && preset) {
        kv_fail(&err, KV_EINPUT, "give --profile or --hardware, not both");
        return kv_cli_report("kvpr", &err);
    }
    if (profile && kv_hw_from_profile(profile, &hw, &err)) return kv_cli_report("kvpr", &err);
    if (preset && kv_hw_from_preset(preset, &hw, &err)) return kv_cli_report("kvpr", &err);
    if (v_com_s && kv_cli_parse_qty(v_com_s, "--v-com", &hw.v_com, &err))
        return kv_cli_report("kvpr", &err);
    if (v_gpu_s && kv_cli_parse_qty(v_gpu_s, "--v-gpu", &hw.v_gpu, &err))
        return kv_cli_report("kvpr", &err);
    if (!profile && !preset && (!v_com_s || !v_gpu_s)) {
        kv_fail(&err, KV_EINPUT,
                "need the hardware: --profile P, --hardware NAME, or both "
                "--v-com BYTES_PER_S and --v-gpu FLOP_PER_S");
        return kv_cli_report("kvpr", &err);
    }

    /* shape */
    kv_kvpr_shape sh = {0, 0, 0, 0, 2.0};
    long layers = 1, v = 0, n_kv = 0, hd = 0;
    char model_desc[160] = "";
    if (model_path) {
        if (hidden_s || kvh_s || hd_s) {
            kv_fail(&err, KV_EINPUT, "give --model or --hidden/--kv-heads/--head-dim, not both");
            return kv_cli_report("kvpr", &err);
        }
        kv_model *m = NULL;
        if (kv_cli_load_model(model_path, &m, &err)) return kv_cli_report("kvpr", &err);
        sh.hidden = m->cfg.dim;
        n_kv = m->cfg.n_kv_heads;
        hd = m->cfg.head_dim;
        layers = m->cfg.n_layers;
        snprintf(model_desc, sizeof model_desc, "%s (%d query heads, %d KV heads)", model_path,
                 m->cfg.n_heads, m->cfg.n_kv_heads);
        kv_model_free(m);
    } else {
        if (!hidden_s || !kvh_s || !hd_s) {
            kv_fail(&err, KV_EINPUT,
                    "need --model MODEL or all of --hidden, --kv-heads, --head-dim");
            return kv_cli_report("kvpr", &err);
        }
        if (kv_parse_int(hidden_s, "--hidden", 1, 1L << 30, &v, &err))
            return kv_cli_report("kvpr", &err);
        sh.hidden = v;
        if (kv_parse_int(kvh_s, "--kv-heads", 1, 1L << 20, &n_kv, &err))
            return kv_cli_report("kvpr", &err);
        if (kv_parse_int(hd_s, "--head-dim", 1, 1L << 20, &hd, &err))
            return kv_cli_report("kvpr", &err);
    }
    if (layers_s && kv_parse_int(layers_s, "--layers", 1, 1L << 20, &layers, &err))
        return kv_cli_report("kvpr", &err);
    sh.kv_width = n_kv * hd;
    if (!batch_s || !seq_s) {
        kv_fail(&err, KV_EINPUT, "--batch b and --seq-len s are required");
        return kv_cli_report("kvpr", &err);
    }
    if (kv_parse_int(batch_s, "--batch", 0, 1L << 40, &sh.batch, &err))
        return kv_cli_report("kvpr", &err);
    if (kv_parse_int(seq_s, "--seq-len", 0, 1L << 40, &sh.seq, &err))
        return kv_cli_report("kvpr", &err);
    long gen = 0;
    if (gen_s && kv_parse_int(gen_s, "--gen-len", 1, 1L << 24, &gen, &err))
        return kv_cli_report("kvpr", &err);
    if (p_s && kv_parse_double(p_s, "--dtype-bytes", 0.0, 64.0, &sh.dtype_bytes, &err))
        return kv_cli_report("kvpr", &err);
    kv_schedule sched;
    if (kv_schedule_parse(sched_s, &sched, &err)) return kv_cli_report("kvpr", &err);

    kv_kvpr_result r;
    if (kv_kvpr_solve(&sh, hw.v_com, hw.v_gpu, sched, &r, &err)) return kv_cli_report("kvpr", &err);

    printf("KVPR split point (KVPR Eq. 6-11, generalised to GQA), %s-by-%s schedule\n",
           kv_schedule_name(sched), kv_schedule_name(sched));
    if (model_desc[0]) printf("model: %s\n", model_desc);
    printf("shape: b %ld, s' %ld, h %ld, h_kv %ld (%ld KV heads x %ld), p %g bytes, %ld layer%s\n",
           sh.batch, sh.seq, sh.hidden, sh.kv_width, n_kv, hd, sh.dtype_bytes, layers,
           layers == 1 ? "" : "s");
    printf("hardware: v_com %.4g GB/s, v_gpu %.4g TFLOP/s (%s)\n", hw.v_com / 1e9, hw.v_gpu / 1e12,
           hw.source);
    printf("split l = %ld of %ld tokens recomputed from activations\n", r.split, sh.seq);
    printf("time per layer: %.4g ms with recomputation, %.4g ms without (%+.1f%%)\n", ms(r.time),
           ms(r.time_no_recompute),
           r.time_no_recompute > 0 ? 100.0 * (r.time / r.time_no_recompute - 1.0) : 0.0);
    printf("  = activations %.4g ms + max(recompute %.4g ms, K/V transfer %.4g ms)\n",
           ms(r.t_activations), ms(r.t_recompute), ms(r.t_transfer));
    printf("bound by: %s\n", r.bound == KV_BOUND_COMPUTE ? "device recomputation (v_gpu)"
                                                         : "the host-device link (v_com)");
    printf("note: %s\n", r.note);
    if (layers > 1)
        printf("all %ld layers: %.4g ms with recomputation, %.4g ms without\n", layers,
               ms(r.time) * (double)layers, ms(r.time_no_recompute) * (double)layers);

    cJSON *root = cJSON_CreateObject();
    cJSON *steps = NULL;
    add_result(root, &r);
    cJSON_AddStringToObject(root, "schedule", kv_schedule_name(sched));
    cJSON_AddNumberToObject(root, "batch", (double)sh.batch);
    cJSON_AddNumberToObject(root, "seq_len", (double)sh.seq);
    cJSON_AddNumberToObject(root, "hidden", (double)sh.hidden);
    cJSON_AddNumberToObject(root, "kv_width", (double)sh.kv_width);
    cJSON_AddNumberToObject(root, "dtype_bytes", sh.dtype_bytes);
    cJSON_AddNumberToObject(root, "layers", (double)layers);
    cJSON_AddNumberToObject(root, "v_com", hw.v_com);
    cJSON_AddNumberToObject(root, "v_gpu", hw.v_gpu);
    cJSON_AddNumberToObject(root, "glpk_status", r.glpk_status);
    cJSON_AddBoolToObject(root, "activations_dearer", r.activations_dearer);
    cJSON_AddStringToObject(root, "note", r.note);
    int rc = 0;
    if (gen > 0) {
        double total = 0, total0 = 0;
        long every = gen <= 64 ? 1 : (gen + 31) / 32;
        printf("\ndecode steps (s' grows by one per step; times per layer%s)\n",
               every > 1 ? ", every few steps shown" : "");
        printf("%8s %10s %10s %14s %14s %9s\n", "step", "s'", "split l", "t (ms)", "t no-rec (ms)",
               "bound");
        cJSON *dec = cJSON_AddObjectToObject(root, "decode");
        steps = cJSON_AddArrayToObject(dec, "steps");
        for (long t = 1; t <= gen; t++) {
            kv_kvpr_shape st = sh;
            st.seq = sh.seq + t - 1;
            kv_kvpr_result rs;
            if ((rc = kv_kvpr_solve(&st, hw.v_com, hw.v_gpu, sched, &rs, &err))) break;
            total += rs.time;
            total0 += rs.time_no_recompute;
            if ((t - 1) % every == 0 || t == gen)
                printf("%8ld %10ld %10ld %14.4g %14.4g %9s\n", t, st.seq, rs.split, ms(rs.time),
                       ms(rs.time_no_recompute),
                       rs.bound == KV_BOUND_COMPUTE ? "compute" : "transfer");
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "step", (double)t);
            cJSON_AddNumberToObject(o, "seq_len", (double)st.seq);
            add_result(o, &rs);
            cJSON_AddItemToArray(steps, o);
        }
        if (!rc) {
            printf("decode total (%ld steps x %ld layer%s): %.4g ms with recomputation, %.4g ms "
                   "without (%+.1f%%)\n",
                   gen, layers, layers == 1 ? "" : "s", ms(total) * (double)layers,
                   ms(total0) * (double)layers, total0 > 0 ? 100.0 * (total / total0 - 1.0) : 0.0);
            cJSON_AddNumberToObject(dec, "gen_len", (double)gen);
            cJSON_AddNumberToObject(dec, "total_time", total * (double)layers);
            cJSON_AddNumberToObject(dec, "total_time_no_recompute", total0 * (double)layers);
        }
    }
    if (!rc && json) {
        char *txt = cJSON_PrintUnformatted(root);
        if (txt) printf("%s\n", txt);
        free(txt);
    }
    cJSON_Delete(root);
    return rc ? kv_cli_report("kvpr", &err) : 0;
}
