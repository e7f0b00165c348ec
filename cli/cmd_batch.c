/* kvplan batch: the largest batch for a device memory budget with the full KV cache, with
 * decode-only compression and with prefill-and-decode compression (Batch-Max §3-4), and the
 * decode tokens/s each predicts from the memory bandwidth. The arithmetic is planner/batch.c;
 * the workspace estimate is documented there and in docs/batch-sizing.md. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/batch.h"
#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"

static const char *help =
    "usage: kvplan batch --model MODEL --device-mem BYTES --prompt-len s --gen-len g\n"
    "                    [--plan PLAN] [--profile P | --hardware NAME] [--mem-bw BYTES_PER_S]\n"
    "                    [--dtype-bytes p] [--weight-bytes w] [--block-size b_s]\n"
    "                    [--evict-block e] [--json]\n"
    "Largest batch that fits in the device memory (weights + workspace + KV cache, every phase):\n"
    "  full            the whole cache, the prompt prefilled at once\n"
    "  decode-only     budgets applied after prefill (the prompt's full cache must fit first)\n"
    "  prefill+decode  Batch-Max Alg. 1: budgets + one eviction block during prefill and decode\n"
    "and the decode tokens/s each predicts when decode is memory-bandwidth bound.\n"
    "  --plan PLAN        a plan.h5 whose /budget/tokens give the per-head budgets (without it\n"
    "                     only the full-cache row is computed)\n"
    "  --profile P        device memory and memory bandwidth (2 x copy_d2d) from a profile\n"
    "  --hardware NAME    published figures: h100-sxm, h200, a100-40g-pcie4, l4\n"
    "  --device-mem, --mem-bw  explicit figures (override the above)\n"
    "  --dtype-bytes p    bytes per K, V and activation element (default 2, fp16)\n"
    "  --weight-bytes w   bytes per parameter as deployed (default p)\n"
    "  --block-size b_s   tokens per KV block (default: the plan's, else 16)\n"
    "  --evict-block e    Batch-Max eviction/prefill block (default b_s)\n"
    "Numbers accept suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti (powers of 1024).\n";

/* A quantity with an optional SI or binary suffix ("80Gi", "3.35T", "1e9"). */
static int parse_qty(const char *s, const char *opt, double *out, kv_error *err) {
    if (!s || !*s) return kv_fail(err, KV_EINPUT, "%s needs a number", opt);
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v))
        return kv_fail(err, KV_EINPUT, "%s: '%s' is not a finite number", opt, s);
    double mul = 1.0;
    if (*end) {
        static const char units[] = "KMGT";
        const char *u = strchr(units, end[0] == 'k' ? 'K' : end[0]);
        if (!u || !end[0]) return kv_fail(err, KV_EINPUT, "%s: '%s' is not a number", opt, s);
        int bin = end[1] == 'i';
        const char *rest = end + 1 + bin;
        if (*rest == 'B') rest++;
        if (*rest) return kv_fail(err, KV_EINPUT, "%s: '%s' has an unknown suffix", opt, s);
        mul = pow(bin ? 1024.0 : 1000.0, (double)(u - units + 1));
    }
    *out = v * mul;
    return KV_OK;
}

static const char *row_label[KV_BATCH_NMODES] = {"full cache", "decode-only", "prefill+decode"};

int kv_cmd_batch(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *plan_path = NULL, *profile = NULL, *preset = NULL;
    const char *mem_s = NULL, *bw_s = NULL, *s_s = NULL, *g_s = NULL, *p_s = NULL, *w_s = NULL;
    const char *bs_s = NULL, *e_s = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        struct {
            const char *name;
            const char **val;
        } opts[] = {
            {"--model", &model_path}, {"--plan", &plan_path},   {"--profile", &profile},
            {"--hardware", &preset},  {"--device-mem", &mem_s}, {"--mem-bw", &bw_s},
            {"--prompt-len", &s_s},   {"--gen-len", &g_s},      {"--dtype-bytes", &p_s},
            {"--weight-bytes", &w_s}, {"--block-size", &bs_s},  {"--evict-block", &e_s},
        };
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !r; k++)
            r = kv_cli_opt(argc, argv, &i, opts[k].name, opts[k].val, &err);
        if (r < 0) return kv_cli_report("batch", &err);
        if (r) continue;
        fprintf(stderr, "kvplan batch: unknown %s %s\n%s",
                argv[i][0] == '-' ? "option" : "argument", argv[i], help);
        return 1;
    }
    if (!model_path || !s_s || !g_s) {
        kv_fail(&err, KV_EINPUT, "--model MODEL, --prompt-len s and --gen-len g are required");
        return kv_cli_report("batch", &err);
    }
    if (profile && preset) {
        kv_fail(&err, KV_EINPUT, "give --profile or --hardware, not both");
        return kv_cli_report("batch", &err);
    }
    kv_hw hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.source, sizeof hw.source, "command line");
    int rc = KV_OK;
    if (profile && kv_hw_from_profile(profile, &hw, &err)) return kv_cli_report("batch", &err);
    if (preset && kv_hw_from_preset(preset, &hw, &err)) return kv_cli_report("batch", &err);
    if (mem_s && parse_qty(mem_s, "--device-mem", &hw.device_mem, &err))
        return kv_cli_report("batch", &err);
    if (bw_s && parse_qty(bw_s, "--mem-bw", &hw.mem_bw, &err)) return kv_cli_report("batch", &err);
    if (!(hw.device_mem > 0)) {
        kv_fail(&err, KV_EINPUT,
                mem_s ? "--device-mem must be positive (got %s)"
                      : "need the device memory: --device-mem BYTES, --profile P "
                        "or --hardware NAME%s",
                mem_s ? mem_s : "");
        return kv_cli_report("batch", &err);
    }
    double p = 2.0, w = -1.0;
    long s = 0, g = 0, bs = 0, e = 0;
    if (p_s && kv_parse_double(p_s, "--dtype-bytes", 1e-3, 64.0, &p, &err))
        return kv_cli_report("batch", &err);
    if (w_s && kv_parse_double(w_s, "--weight-bytes", 1e-3, 64.0, &w, &err))
        return kv_cli_report("batch", &err);
    if (kv_parse_int(s_s, "--prompt-len", 0, 1L << 30, &s, &err))
        return kv_cli_report("batch", &err);
    if (kv_parse_int(g_s, "--gen-len", 0, 1L << 30, &g, &err)) return kv_cli_report("batch", &err);
    if (bs_s && kv_parse_int(bs_s, "--block-size", 1, 1L << 20, &bs, &err))
        return kv_cli_report("batch", &err);
    if (e_s && kv_parse_int(e_s, "--evict-block", 1, 1L << 20, &e, &err))
        return kv_cli_report("batch", &err);

    kv_model *m = NULL;
    kv_plan plan;
    memset(&plan, 0, sizeof plan);
    int have_plan = 0;
    rc = kv_cli_load_model(model_path, &m, &err);
    if (!rc && plan_path) {
        rc = kv_plan_read(plan_path, &plan, &err);
        have_plan = !rc;
        if (!rc) rc = kv_plan_check_model(&plan, m, &err);
    }
    kv_batch_config c;
    kv_batch_result res;
    if (!rc) {
        kv_batch_config_from_model(m, p, &c);
        c.weight_bytes = w > 0 ? w : p;
        c.device_mem = hw.device_mem;
        c.mem_bw = hw.mem_bw;
        c.prompt_len = s;
        c.gen_len = g;
        c.block_size =
            (int)(bs > 0 ? bs : (have_plan && plan.block_size > 0 ? plan.block_size : 16));
        c.evict_block = (int)(e > 0 ? e : c.block_size);
        c.budget = have_plan ? plan.budget : NULL;
        rc = kv_batch_size(&c, &res, &err);
    }
    if (!rc) {
        printf("Batch sizing (Batch-Max §3-4): %s, prompt %ld + %ld generated tokens\n", model_path,
               s, g);
        printf("device memory: %.0f bytes (%.3f GiB, %s)\n", hw.device_mem,
               hw.device_mem / 1073741824.0, mem_s ? "--device-mem" : hw.source);
        printf("weights: %.0f parameters x %g bytes = %.0f bytes; free for the batch: %.0f bytes\n",
               c.n_params, c.weight_bytes, res.weights, res.free_for_batch);
        printf("KV: %g bytes per element, blocks of %d tokens, eviction block %d%s%s\n", p,
               c.block_size, c.evict_block, have_plan ? ", budgets from " : " (no plan)",
               have_plan ? plan_path : "");
        printf("workspace per sequence: one layer's activations at p bytes for the tokens in "
               "flight, one fp32 score row per query head, fp32 logits (docs/batch-sizing.md)\n");
        printf("%-16s %10s %16s %16s %8s %14s\n", "mode", "max batch", "KV bytes/seq",
               "workspace/seq", "limit", "decode tok/s");
        for (int k = 0; k < KV_BATCH_NMODES; k++) {
            const kv_batch_row *r = &res.row[k];
            if (!r->available) {
                printf("%-16s %10s   (needs --plan PLAN for the budgets)\n", row_label[k], "n/a");
                continue;
            }
            double kvb = r->prefill_limits ? r->kv_prefill : r->kv_decode;
            double wsb = r->prefill_limits ? r->ws_prefill : r->ws_decode;
            char tps[32];
            if (hw.mem_bw > 0)
                snprintf(tps, sizeof tps, "%.4g", r->tokens_per_s);
            else
                snprintf(tps, sizeof tps, "n/a");
            printf("%-16s %10ld %16.0f %16.0f %8s %14s\n", row_label[k], r->max_batch, kvb, wsb,
                   r->prefill_limits ? "prefill" : "decode", tps);
            if (r->max_batch == 0)
                printf("  %s: one sequence needs %.0f bytes, %.0f are free\n", row_label[k],
                       r->per_seq, res.free_for_batch);
        }
        if (hw.mem_bw > 0)
            printf("decode tokens/s: b x g / sum of (weights read + b x KV read) / %.4g GB/s\n",
                   hw.mem_bw / 1e9);
        else
            printf(
                "decode tokens/s need the memory bandwidth: --mem-bw, --profile or --hardware\n");
        if (json) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddNumberToObject(root, "device_mem", hw.device_mem);
            cJSON_AddNumberToObject(root, "weights", res.weights);
            cJSON_AddNumberToObject(root, "mem_bw", hw.mem_bw);
            cJSON_AddNumberToObject(root, "prompt_len", (double)s);
            cJSON_AddNumberToObject(root, "gen_len", (double)g);
            cJSON_AddNumberToObject(root, "block_size", c.block_size);
            cJSON_AddNumberToObject(root, "evict_block", c.evict_block);
            for (int k = 0; k < KV_BATCH_NMODES; k++) {
                const kv_batch_row *r = &res.row[k];
                if (!r->available) {
                    cJSON_AddNullToObject(root, kv_batch_mode_name((kv_batch_mode)k));
                    continue;
                }
                cJSON *o = cJSON_AddObjectToObject(root, kv_batch_mode_name((kv_batch_mode)k));
                cJSON_AddNumberToObject(o, "max_batch", (double)r->max_batch);
                cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
                cJSON_AddNumberToObject(o, "per_seq_bytes", r->per_seq);
                cJSON_AddNumberToObject(o, "kv_prefill", r->kv_prefill);
                cJSON_AddNumberToObject(o, "kv_decode", r->kv_decode);
                cJSON_AddNumberToObject(o, "ws_prefill", r->ws_prefill);
                cJSON_AddNumberToObject(o, "ws_decode", r->ws_decode);
                cJSON_AddStringToObject(o, "limit", r->prefill_limits ? "prefill" : "decode");
            }
            char *txt = cJSON_PrintUnformatted(root);
            if (txt) printf("%s\n", txt);
            free(txt);
            cJSON_Delete(root);
        }
    }
    if (have_plan) kv_plan_free(&plan);
    kv_model_free(m);
    return rc ? kv_cli_report("batch", &err) : 0;
}
