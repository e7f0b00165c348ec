/* Benchmark: the profiler's collectors against plain prefill on the bundled models.
 * Workload: P prompts of T tokens from the TinyStories text, full-cache prefill, best of
 * several runs each; the ratio (profiling tokens/s) / (plain prefill tokens/s) should be
 * >= 0.75 (issue 4). Prints one table; the machine is described in the header lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvplan/engine.h"
#include "kvplan/profiler.h"
#include "kvplan/tokenizer.h"

static void machine(void) {
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) snprintf(model, sizeof model, "%s", c + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    printf("machine: %s, %ld cores online\n", model, sysconf(_SC_NPROCESSORS_ONLN));
}

static double plain_prefill(const kv_model *m, const int *prompts, int P, int T) {
    kv_error err = {0};
    kv_plan full;
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 1};
    if (kv_plan_full(&m->cfg, T, 16, T < 16 ? T : 16, KV_POLICY_SINK, &full, &err) ||
        kv_engine_new(m, &full, &o, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    double t0 = kv_now();
    for (int i = 0; i < P; i++) {
        int seq = -1;
        if (kv_engine_seq_open(e, NULL, NULL, &seq, &err) ||
            kv_engine_prefill(e, seq, prompts + (size_t)i * T, T, KV_LOGITS_NONE, NULL, NULL,
                              &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(2);
        }
        kv_engine_seq_close(e, seq);
    }
    double s = kv_now() - t0;
    kv_engine_free(e);
    kv_plan_free(&full);
    return (double)P * T / s;
}

int main(void) {
    const char *models[] = {"models/stories260K/stories260K.bin", "models/tinystories-656k"};
    const int P = 8, T = 256, reps = 5;
    machine();
    printf(
        "workload: %d prompts x %d tokens of TinyStories text, full-cache prefill, best of %d\n\n",
        P, T, reps);
    printf("%-36s %14s %14s %8s\n", "model", "prefill tok/s", "profile tok/s", "ratio");
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        char path[4200], text[4200];
        snprintf(path, sizeof path, "%s/%s", kv_shared_dir(), models[k]);
        snprintf(text, sizeof text, "%s/text/tinystories_val_head.txt", kv_shared_dir());
        kv_error err = {0};
        kv_model *m = NULL;
        kv_tokenizer *tok = NULL;
        char *data = NULL;
        size_t len = 0;
        int *ids = NULL, n = 0;
        if (kv_model_load(path, &m, &err) || kv_tokenizer_load(NULL, m, &tok, &err) ||
            kv_read_file(text, &data, &len, &err)) {
            printf("%-36s skipped: %s\n", models[k], err.msg);
            kv_model_free(m);
            continue;
        }
        if (len > 200000) data[len = 200000] = 0;
        int *prompts = malloc((size_t)P * T * sizeof *prompts);
        if (kv_tokenizer_encode(tok, data, len, 1, &ids, &n, &err) ||
            kv_profile_pick_prompts(ids, n, kv_tokenizer_bos(tok), P, T, 0, prompts, &err)) {
            printf("%-36s failed: %s\n", models[k], err.msg);
            return 2;
        }
        double best_plain = 0, best_prof = 0;
        for (int r = 0; r < reps; r++) {
            double a = plain_prefill(m, prompts, P, T);
            kv_profile pr;
            if (kv_profile_run(m, prompts, P, T, KV_DEVICE_CPU, 0, KV_TYPE_DEFAULT, &pr, NULL,
                               &err)) {
                printf("failed: %s\n", err.msg);
                return 2;
            }
            if (a > best_plain) best_plain = a;
            if (pr.tokens_per_s > best_prof) best_prof = pr.tokens_per_s;
            kv_profile_free(&pr);
        }
        printf("%-36s %14.0f %14.0f %8.3f\n", models[k], best_plain, best_prof,
               best_prof / best_plain);
        free(prompts);
        free(ids);
        free(data);
        kv_tokenizer_free(tok);
        kv_model_free(m);
    }
    return 0;
}
