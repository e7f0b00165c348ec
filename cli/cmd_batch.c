/* kvplan batch: the largest batch for a device memory budget with the full KV cache, with
 * decode-only compression and with prefill-and-decode compression (Batch-Max §3-4), and the
 * decode tokens/s each predicts from the memory bandwidth. The arithmetic is planner/batch.c;
 * the workspace estimate is documented there and in docs/batch-sizing.md. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/batch.h"
#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"

typedef struct batch_args {
    const char *model, *plan, *profile, *preset;
    double device_mem, mem_bw;        /* NAN = not given */
    long prompt_len, gen_len;         /* -1 = not given */
    double dtype_bytes, weight_bytes; /* weight_bytes -1 = dtype_bytes */
    long block_size, evict_block;     /* 0 = not given */
    int json;
} batch_args;

static const kv_opt batch_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(batch_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--device-mem", NULL, KV_OPT_QTY, offsetof(batch_args, device_mem), "BYTES", 0, 1e300,
     .help = "device memory (overrides --profile / --hardware)"},
    {"--prompt-len", NULL, KV_OPT_INT, offsetof(batch_args, prompt_len), "s", 0, 1 << 30,
     .help = "prompt tokens (required)"},
    {"--gen-len", NULL, KV_OPT_INT, offsetof(batch_args, gen_len), "g", 0, 1 << 30,
     .help = "generated tokens (required)"},
    {"--plan", NULL, KV_OPT_STR, offsetof(batch_args, plan), "PLAN",
     .help = "a plan.h5 whose /budget/tokens give the per-head budgets and, for schema v3, "
             "/budget/kv_type the stored K/V bytes per head (without it only the "
             "full-cache row is computed)"},
    {"--profile", NULL, KV_OPT_STR, offsetof(batch_args, profile), "P",
     .help = "device memory and memory bandwidth (2 x copy_d2d) from a profile"},
    {"--hardware", NULL, KV_OPT_STR, offsetof(batch_args, preset), "NAME",
     .help = "published figures: h100-sxm, h200, a100-40g-pcie4, l4"},
    {"--mem-bw", NULL, KV_OPT_QTY, offsetof(batch_args, mem_bw), "BYTES_PER_S", 0, 1e300,
     .help = "memory bandwidth (overrides --profile / --hardware)"},
    {"--dtype-bytes", NULL, KV_OPT_NUM, offsetof(batch_args, dtype_bytes), "p", 1e-3, 64,
     .def = "2", .help = "bytes per K, V and activation element (2: fp16)"},
    {"--weight-bytes", NULL, KV_OPT_NUM, offsetof(batch_args, weight_bytes), "w", 1e-3, 64,
     .help = "bytes per parameter as deployed (default p)"},
    {"--block-size", NULL, KV_OPT_INT, offsetof(batch_args, block_size), "b_s", 1, 1 << 20,
     .help = "tokens per KV block (default: the plan's, else 16)"},
    {"--evict-block", NULL, KV_OPT_INT, offsetof(batch_args, evict_block), "e", 1, 1 << 20,
     .help = "Batch-Max eviction/prefill block (default b_s)"},
    {"--json", NULL, KV_OPT_FLAG, offsetof(batch_args, json),
     .help = "one JSON object on the last line"},
};

const kv_cli_spec kv_spec_batch = {
    "batch",
    "usage: kvplan batch MODEL --device-mem BYTES --prompt-len s --gen-len g\n"
    "                    [--plan PLAN] [--profile P | --hardware NAME] [--mem-bw BYTES_PER_S]\n"
    "                    [--dtype-bytes p] [--weight-bytes w] [--block-size b_s]\n"
    "                    [--evict-block e] [--json]\n",
    "Largest batch that fits in the device memory (weights + workspace + KV cache, every phase):\n"
    "  full            the whole cache, the prompt prefilled at once\n"
    "  decode-only     budgets applied after prefill (the prompt's full cache must fit first)\n"
    "  prefill+decode  Batch-Max Alg. 1: budgets + one eviction block during prefill and decode\n"
    "and the decode tokens/s each predicts when decode is memory-bandwidth bound.\n",
    "Numbers accept suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti (powers of 1024).\n",
    {{NULL, batch_opts, sizeof batch_opts / sizeof batch_opts[0], 0}},
};

static const char *row_label[KV_BATCH_NMODES] = {"full cache", "decode-only", "prefill+decode"};

/* The device memory and bandwidth: a profile's or a preset's, overridden by the options. */
static int get_hw(const batch_args *a, kv_hw *hw, kv_error *err) {
    memset(hw, 0, sizeof *hw);
    snprintf(hw->source, sizeof hw->source, "command line");
    if (a->profile && a->preset)
        return kv_fail(err, KV_EINPUT, "give --profile or --hardware, not both");
    if (a->profile && kv_hw_from_profile(a->profile, hw, err)) return err->code;
    if (a->preset && kv_hw_from_preset(a->preset, hw, err)) return err->code;
    if (!isnan(a->device_mem)) hw->device_mem = a->device_mem;
    if (!isnan(a->mem_bw)) hw->mem_bw = a->mem_bw;
    if (!(hw->device_mem > 0)) {
        if (!isnan(a->device_mem))
            return kv_fail(err, KV_EINPUT, "--device-mem must be positive (got %g)", a->device_mem);
        return kv_fail(err, KV_EINPUT,
                       "need the device memory: --device-mem BYTES, --profile P "
                       "or --hardware NAME");
    }
    return KV_OK;
}

/* The sizing inputs from the model, the plan (may be NULL) and the options. */
static void make_config(const batch_args *a, const kv_model *m, const kv_plan *plan,
                        const kv_hw *hw, kv_batch_config *c) {
    kv_batch_config_from_model(m, a->dtype_bytes, c);
    c->weight_bytes = a->weight_bytes > 0 ? a->weight_bytes : a->dtype_bytes;
    c->device_mem = hw->device_mem;
    c->mem_bw = hw->mem_bw;
    c->prompt_len = a->prompt_len;
    c->gen_len = a->gen_len;
    c->block_size =
        (int)(a->block_size > 0 ? a->block_size
                                : (plan && plan->block_size > 0 ? plan->block_size : 16));
    c->evict_block = (int)(a->evict_block > 0 ? a->evict_block : c->block_size);
    c->budget = plan ? plan->budget : NULL;
    /* a schema v3 plan names the stored type of each head: its K/V bytes are the
     * stored bytes; v1/v2 plans (f32 in the runtime that made them) use --dtype-bytes */
    c->kv_type = plan && plan->schema_version >= 3 ? plan->kv_type : NULL;
}

static void print_rows(const kv_batch_result *res, const kv_hw *hw) {
    printf("%-16s %10s %16s %16s %8s %14s\n", "mode", "max batch", "KV bytes/seq", "workspace/seq",
           "limit", "decode tok/s");
    for (int k = 0; k < KV_BATCH_NMODES; k++) {
        const kv_batch_row *r = &res->row[k];
        if (!r->available) {
            printf("%-16s %10s   (needs --plan PLAN for the budgets)\n", row_label[k], "n/a");
            continue;
        }
        double kvb = r->prefill_limits ? r->kv_prefill : r->kv_decode;
        double wsb = r->prefill_limits ? r->ws_prefill : r->ws_decode;
        char tps[32];
        if (hw->mem_bw > 0)
            snprintf(tps, sizeof tps, "%.4g", r->tokens_per_s);
        else
            snprintf(tps, sizeof tps, "n/a");
        printf("%-16s %10ld %16.0f %16.0f %8s %14s\n", row_label[k], r->max_batch, kvb, wsb,
               r->prefill_limits ? "prefill" : "decode", tps);
        if (r->max_batch == 0)
            printf("  %s: one sequence needs %.0f bytes, %.0f are free\n", row_label[k], r->per_seq,
                   res->free_for_batch);
    }
}

static void print_text(const batch_args *a, const kv_hw *hw, const kv_batch_config *c,
                       const kv_batch_result *res) {
    printf("Batch sizing (Batch-Max §3-4): %s, prompt %ld + %ld generated tokens\n", a->model,
           a->prompt_len, a->gen_len);
    printf("device memory: %.0f bytes (%.3f GiB, %s)\n", hw->device_mem,
           hw->device_mem / 1073741824.0, !isnan(a->device_mem) ? "--device-mem" : hw->source);
    printf("weights: %.0f parameters x %g bytes = %.0f bytes; free for the batch: %.0f bytes\n",
           c->n_params, c->weight_bytes, res->weights, res->free_for_batch);
    if (c->kv_type) /* stored bytes per head (plan schema v3) */
        printf("KV: the plan's stored types (head 0: %s, %zu bytes per token), blocks of %d "
               "tokens, eviction block %d, budgets from %s\n",
               kv_type_name(c->kv_type[0]), kv_type_token_bytes(c->kv_type[0], (int)c->head_dim),
               c->block_size, c->evict_block, a->plan);
    else
        printf("KV: %g bytes per element, blocks of %d tokens, eviction block %d%s%s\n",
               a->dtype_bytes, c->block_size, c->evict_block,
               c->budget ? ", budgets from " : " (no plan)", c->budget ? a->plan : "");
    printf("workspace per sequence: one layer's activations at p bytes for the tokens in "
           "flight, one fp32 score row per query head, fp32 logits (docs/batch-sizing.md)\n");
    print_rows(res, hw);
    if (hw->mem_bw > 0)
        printf("decode tokens/s: b x g / sum of (weights read + b x KV read) / %.4g GB/s\n",
               hw->mem_bw / 1e9);
    else
        printf("decode tokens/s need the memory bandwidth: --mem-bw, --profile or --hardware\n");
}

static void print_json(const kv_hw *hw, const kv_batch_config *c, const kv_batch_result *res) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "device_mem", hw->device_mem);
    cJSON_AddNumberToObject(root, "weights", res->weights);
    cJSON_AddNumberToObject(root, "mem_bw", hw->mem_bw);
    cJSON_AddNumberToObject(root, "prompt_len", (double)c->prompt_len);
    cJSON_AddNumberToObject(root, "gen_len", (double)c->gen_len);
    cJSON_AddNumberToObject(root, "block_size", c->block_size);
    cJSON_AddNumberToObject(root, "evict_block", c->evict_block);
    for (int k = 0; k < KV_BATCH_NMODES; k++) {
        const kv_batch_row *r = &res->row[k];
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

int kv_cmd_batch(int argc, char **argv) {
    batch_args a = {
        .device_mem = NAN, .mem_bw = NAN, .prompt_len = -1, .gen_len = -1, .weight_bytes = -1.0};
    int code = kv_cli_parse(&kv_spec_batch, argc, argv, &a);
    if (code >= 0) return code;
    kv_error err = {0};
    if (!a.model || a.prompt_len < 0 || a.gen_len < 0) {
        kv_fail(&err, KV_EINPUT, "MODEL, --prompt-len s and --gen-len g are required");
        return kv_cli_report("batch", &err);
    }
    /* build: hardware, model, plan, sizing inputs */
    kv_hw hw;
    if (get_hw(&a, &hw, &err)) return kv_cli_report("batch", &err);
    kv_model *m = NULL;
    kv_plan plan;
    memset(&plan, 0, sizeof plan);
    int have_plan = 0;
    int rc = kv_cli_load_model(a.model, &m, &err);
    if (!rc && a.plan) {
        rc = kv_plan_read(a.plan, &plan, &err);
        have_plan = !rc;
        if (!rc) rc = kv_plan_check_model(&plan, m, &err);
        if (!rc) kv_cli_plan_note("batch", &plan);
    }
    /* run: the largest batch in each mode */
    kv_batch_config c;
    kv_batch_result res;
    if (!rc) {
        make_config(&a, m, have_plan ? &plan : NULL, &hw, &c);
        rc = kv_batch_size(&c, &res, &err);
    }
    /* report */
    if (!rc) print_text(&a, &hw, &c, &res);
    if (!rc && a.json) print_json(&hw, &c, &res);
    if (have_plan) kv_plan_free(&plan);
    kv_model_free(m);
    return rc ? kv_cli_report("batch", &err) : 0;
}
