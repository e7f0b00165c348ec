/* kvplan run: text generation, optionally batched and under per-head KV budgets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/engine.h"
#include "kvplan/eval.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kvplan run MODEL [--tokenizer TOK] [--prompt TEXT | --prompts FILE]\n"
            "                  [-n N] [--temperature T] [--top-p P] [--seed S] [--batch B]\n"
            "                  [--quiet] [budget options]\n"
            "Generate up to N new tokens (default 256, capped by the context) after each prompt\n"
            "(BOS first; an empty prompt starts from BOS alone). --temperature 0 is greedy.\n"
            "--prompts FILE takes one prompt per line; --batch B decodes B sequences together\n"
            "sharing one KV block pool (prompts are repeated to fill the batch; sequence i uses\n"
            "seed S + i). One sequence streams to stdout; a batch prints each sequence after it.\n"
            "Timing and KV bytes in use go to stderr.\n%s",
            kv_budget_args_help);
}

typedef struct seq_state {
    int *ids; /* prompt + generated */
    int n, cap, n_prompt;
    int done;
    kv_sampler sampler;
    int seq; /* engine sequence handle */
    char *text;
    size_t text_len, text_cap;
} seq_state;

static int seq_push(seq_state *s, int id) {
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 256;
        int *nw = realloc(s->ids, (size_t)nc * sizeof *nw);
        if (!nw) return -1;
        s->ids = nw;
        s->cap = nc;
    }
    s->ids[s->n++] = id;
    return 0;
}

static int read_prompts(const char *path, char ***out, int *n, kv_error *err) {
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    int cnt = 0, cap = 16;
    char **v = malloc((size_t)cap * sizeof *v);
    for (char *line = strtok(data, "\n"); v && line; line = strtok(NULL, "\n")) {
        if (!*line) continue;
        if (cnt == cap) {
            char **nv = realloc(v, (size_t)cap * 2 * sizeof *nv);
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        v[cnt++] = strdup(line);
    }
    free(data);
    if (!v) return kv_fail(err, KV_EINTERNAL, "out of memory");
    if (cnt == 0) {
        free(v);
        return kv_fail(err, KV_EINPUT, "%s: no prompts (one per line expected)", path);
    }
    *out = v;
    *n = cnt;
    return KV_OK;
}

int kv_cmd_run(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *tok_path = NULL, *prompt = "", *prompts_path = NULL;
    long n_new = 256, batch = 0, seed = 0;
    double temperature = 1.0, top_p = 0.9;
    int quiet = 0;
    kv_budget_args ba = {0};
    const kv_cli_numopt nums[] = {
        {"-n", .lval = &n_new, .llo = 0, .lhi = 1 << 24},
        {"--batch", .lval = &batch, .llo = 1, .lhi = 4096},
        {"--seed", .lval = &seed, .llo = 0, .lhi = 0x7fffffffffffffffL},
        {"--temperature", .dval = &temperature, .dlo = 0.0, .dhi = 100.0},
        {"--top-p", .dval = &top_p, .dlo = 0.0, .dhi = 1.0},
    };
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--quiet"))
            quiet = 1;
        else if ((r = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--prompt", &prompt, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--prompts", &prompts_path, &err))) {
            if (r < 0) return kv_cli_report("run", &err);
        } else if ((r = kv_cli_num_table(argc, argv, &i, nums, sizeof nums / sizeof nums[0],
                                         &err))) {
            if (r < 0) return kv_cli_report("run", &err);
        } else if ((r = kv_budget_args_take(&ba, argc, argv, &i, &err))) {
            if (r < 0) return kv_cli_report("run", &err);
        } else if (kv_cli_take_model("run", argv[i], &model_path)) {
            return 1;
        }
    }
    if (!model_path) {
        fprintf(stderr, "kvplan run: MODEL is required\n");
        help(stderr);
        return 1;
    }
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char **prompts = NULL;
    int n_prompts = 0;
    kv_plan plan = {0};
    kv_engine *eng = NULL;
    kv_device device = KV_DEVICE_AUTO;
    seq_state *seqs = NULL;
    int *step_seqs = NULL, *step_tokens = NULL, *act_idx = NULL;
    float *logits = NULL;
    void *scratch = NULL;
    int B = 0;
    int rc = kv_cli_load_model(model_path, &m, &err);
    if (!rc) rc = kv_tokenizer_load(tok_path, m, &tok, &err);
    if (!rc && prompts_path) rc = read_prompts(prompts_path, &prompts, &n_prompts, &err);
    int C = m ? m->cfg.seq_len : 0;
    if (!rc) rc = kv_budget_args_plan(&ba, m, C, &plan, &device, &err);
    if (!rc) {
        B = batch ? (int)batch : (n_prompts ? n_prompts : 1);
        seqs = calloc((size_t)B, sizeof *seqs);
        step_seqs = calloc((size_t)B, sizeof *step_seqs);
        act_idx = calloc((size_t)B, sizeof *act_idx);
        step_tokens = calloc((size_t)B, sizeof *step_tokens);
        logits = malloc((size_t)B * (size_t)m->cfg.vocab_size * sizeof *logits);
        scratch = malloc((size_t)m->cfg.vocab_size * 2 * sizeof(float) * 2);
        if (!seqs || !step_seqs || !act_idx || !step_tokens || !logits || !scratch)
            rc = kv_fail(&err, KV_EINTERNAL, "out of memory");
    }
    if (!rc) {
        kv_engine_opts eo = {.device = device, .max_seqs = B};
        rc = kv_engine_new(m, &plan, &eo, &eng, &err);
    }
    int max_rows = 0;
    for (int s = 0; !rc && s < B; s++) {
        seq_state *q = &seqs[s];
        q->seq = -1;
        const char *p = prompts ? prompts[s % n_prompts] : prompt;
        int *ids = NULL, n = 0;
        rc = kv_tokenizer_encode(tok, p, strlen(p), 1, &ids, &n, &err);
        if (rc) break;
        q->ids = ids;
        q->n = q->cap = q->n_prompt = n;
        if (n >= C)
            rc = kv_fail(&err, KV_EINPUT, "prompt %d has %d tokens, the context is %d", s, n, C);
        if (n > max_rows) max_rows = n;
        kv_sampler_init(&q->sampler, (float)temperature, (float)top_p,
                        (uint64_t)seed + (uint64_t)s + 1);
        if (!rc) rc = kv_engine_seq_open(eng, NULL, NULL, &q->seq, &err);
    }
    /* prefill each sequence (Batch-Max Alg. 1 blocks of p when a head can be over budget) */
    double t0 = kv_now();
    long prefill_tokens = 0;
    for (int s = 0; !rc && s < B; s++) {
        seq_state *q = &seqs[s];
        rc = kv_engine_prefill(eng, q->seq, q->ids, q->n_prompt, KV_LOGITS_LAST,
                               logits + (size_t)s * m->cfg.vocab_size, NULL, &err);
        prefill_tokens += q->n_prompt;
    }
    double t1 = kv_now();
    /* decode all sequences together */
    long decoded = 0;
    if (n_new > C - max_rows) n_new = C - max_rows;
    char piece[512];
    int stream = B == 1, streamed = 0;
    if (!rc && stream) {
        int k = kv_tokenizer_piece(tok, -1, seqs[0].ids[0], piece, sizeof piece);
        fwrite(piece, 1, (size_t)k, stdout);
        for (int i = 1; i < seqs[0].n_prompt; i++) {
            k = kv_tokenizer_piece(tok, seqs[0].ids[i - 1], seqs[0].ids[i], piece, sizeof piece);
            fwrite(piece, 1, (size_t)k, stdout);
        }
        fflush(stdout);
        streamed = 1;
    }
    size_t kv_peak = 0;
    for (long step = 0; !rc && step < n_new; step++) {
        int na = 0;
        for (int s = 0; s < B; s++) {
            seq_state *q = &seqs[s];
            if (q->done) continue;
            int next = kv_sample(&q->sampler, logits + (size_t)s * m->cfg.vocab_size,
                                 m->cfg.vocab_size, scratch);
            if (next == kv_tokenizer_eos(tok) || next == kv_tokenizer_bos(tok) || seq_push(q, next) != 0) {
                q->done = 1;
                continue;
            }
            if (stream) {
                int k = kv_tokenizer_piece(tok, q->ids[q->n - 2], next, piece, sizeof piece);
                fwrite(piece, 1, (size_t)k, stdout);
                fflush(stdout);
            }
            if (step + 1 == n_new) continue;
            step_seqs[na] = q->seq;
            act_idx[na] = s;
            step_tokens[na] = next;
            na++;
        }
        if (na == 0) break;
        rc = kv_engine_decode(eng, step_seqs, na, step_tokens, logits, &err);
        /* scatter logits back to their sequences (in place, descending is safe: act_idx >= i) */
        for (int i = na - 1; !rc && i >= 0; i--)
            if (act_idx[i] != i)
                memmove(logits + (size_t)act_idx[i] * m->cfg.vocab_size,
                        logits + (size_t)i * m->cfg.vocab_size,
                        (size_t)m->cfg.vocab_size * sizeof(float));
        decoded += na;
        if (kv_engine_bytes_in_use(eng) > kv_peak) kv_peak = kv_engine_bytes_in_use(eng);
    }
    double t2 = kv_now();
    /* the generated text always ends its line, also when an error stopped it */
    if (streamed) {
        printf("\n");
        fflush(stdout);
    }
    if (!rc && !stream) {
        for (int s = 0; s < B && !rc; s++) {
            char *text = NULL;
            rc = kv_tokenizer_decode(tok, seqs[s].ids, seqs[s].n, &text, &err);
            if (!rc) printf("--- sequence %d ---\n%s\n", s, text);
            free(text);
        }
    }
    if (!rc && !quiet) {
        size_t full = (size_t)B * kv_engine_bytes_full(eng, C);
        fprintf(stderr,
                "kvplan run: batch %d on %s, prefill %ld tokens in %.3f s (%.0f tokens/s), "
                "decode %ld tokens in %.3f s (%.1f tokens/s)\n"
                "kvplan run: KV cache %s: %zu bytes in use now, %zu peak (pool peak %zu), full "
                "cache at context %d would take %zu\n",
                B, kv_device_name(kv_engine_device(eng)), prefill_tokens, t1 - t0,
                (double)prefill_tokens / (t1 - t0 > 0 ? t1 - t0 : 1e-9), decoded, t2 - t1,
                (double)decoded / (t2 - t1 > 0 ? t2 - t1 : 1e-9),
                plan.full ? "full" : kv_policy_name(plan.policy), kv_engine_bytes_in_use(eng),
                kv_peak, kv_engine_bytes_peak(eng), C, full);
    }
    for (int s = 0; seqs && s < B; s++) free(seqs[s].ids);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(seqs);
    free(step_seqs);
    free(act_idx);
    free(step_tokens);
    free(logits);
    free(scratch);
    kv_engine_free(eng);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("run", &err) : 0;
}
