/* kvplan profile: head/layer similarity, prompt consistency and hardware speeds -> profile.h5 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/h5io.h"
#include "kvplan/profiler.h"
#include "kvplan/tasks.h"
#include "kvplan/tokenizer.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kvplan profile MODEL [--tokenizer TOK] [--text FILE] [--prompts N]\n"
            "                      [--prompt-len T] [--seed S] [--no-hw] [--quick-hw] [--quiet]\n"
            "                      [--device auto|cpu|cuda]\n"
            "                      [-o profile.h5]\n"
            "Runs N prompts of T tokens (defaults 8 and 256, picked deterministically from FILE,\n"
            "default ../shared/text/tinystories_val_head.txt) through the full-cache forward pass\n"
            "and records per-head cos(V, softmax(QK^T)V) (BaKlaVa Alg. 1), layer similarity\n"
            "(SqueezeAttention), Kendall tau / Spearman rho between prompts, and host (and CUDA)\n"
            "copy and GEMM speeds (skipped by --no-hw; --quick-hw measures small sizes only).\n"
            "The file is written atomically (default: profile.h5).\n"
            "Under `mpirun -np N` or `srun` the prompts are shared among the ranks (rank 0\n"
            "probes the hardware and writes the file, identical to a one-process run's).\n");
}

int kv_cmd_profile(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL, *out = "profile.h5",
               *device_name = NULL;
    const char *v = NULL;
    long n_prompts = 8, prompt_len = 256, seed = 0;
    int no_hw = 0, quick_hw = 0, quiet = 0;
    char default_text[4200];
    snprintf(default_text, sizeof default_text, "%s/text/tinystories_val_head.txt",
             kv_shared_dir());
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--no-hw"))
            no_hw = 1;
        else if (!strcmp(argv[i], "--quick-hw"))
            quick_hw = 1;
        else if (!strcmp(argv[i], "--quiet"))
            quiet = 1;
        else if ((r = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "-o", &out, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--device", &device_name, &err))) {
            if (r < 0) return kv_cli_report("profile", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--prompts", &v, &err))) {
            if (r < 0 || kv_parse_int(v, "--prompts", 1, 100000, &n_prompts, &err))
                return kv_cli_report("profile", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--prompt-len", &v, &err))) {
            if (r < 0 || kv_parse_int(v, "--prompt-len", 2, 1 << 22, &prompt_len, &err))
                return kv_cli_report("profile", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--seed", &v, &err))) {
            if (r < 0 || kv_parse_int(v, "--seed", 0, 0x7fffffffffffffffL, &seed, &err))
                return kv_cli_report("profile", &err);
        } else if (kv_cli_take_model("profile", argv[i], &model_path)) {
            return 1;
        }
    }
    if (!model_path) {
        fprintf(stderr, "kvplan profile: MODEL is required\n");
        help(stderr);
        return 1;
    }
    if (!text_path) text_path = default_text;
    char cmdline[8192];
    kv_cli_command_line(argc, argv, cmdline, sizeof cmdline);
    char full_cmd[8300];
    snprintf(full_cmd, sizeof full_cmd, "kvplan %s", cmdline);
    kv_tasks *tasks = NULL; /* MPI ranks when started by mpirun / srun */
    if (kv_tasks_init(NULL, NULL, &tasks, &err)) return kv_cli_report("profile", &err);
    const int rank = kv_tasks_rank(tasks);
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int *stream = NULL, n = 0, *prompts = NULL;
    kv_profile pr = {0};
    kv_h5 *f = NULL;
    kv_progress prog;
    kv_progress_init(&prog, quiet || rank != 0); /* progress from rank 0 only */
    const char *inputs[] = {model_path, text_path, tok_path};
    int rc = kv_check_output(out, "-o", inputs, 3, &err);
    if (!rc) rc = kv_check_regular(text_path, "text", &err);
    if (!rc && tok_path) rc = kv_check_regular(tok_path, "tokenizer", &err);
    if (!rc) rc = kv_cli_load_model(model_path, &m, &err);
    if (!rc && prompt_len > m->cfg.seq_len)
        rc = kv_fail(&err, KV_EINPUT,
                     "--prompt-len %ld exceeds the context length %d of %s; choose T <= %d",
                     prompt_len, m->cfg.seq_len, model_path, m->cfg.seq_len);
    if (!rc) rc = kv_tokenizer_load(tok_path, m, &tok, &err);
    if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
    if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &stream, &n, &err);
    if (!rc) {
        prompts = malloc((size_t)n_prompts * (size_t)prompt_len * sizeof *prompts);
        if (!prompts) rc = kv_fail(&err, KV_EINTERNAL, "out of memory");
    }
    if (!rc) {
        rc =
            kv_profile_pick_prompts(stream, n, kv_tokenizer_bos(tok) >= 0 ? kv_tokenizer_bos(tok) : stream[0],
                                    (int)n_prompts, (int)prompt_len, (uint64_t)seed, prompts, &err);
        if (rc) kv_fail_context(&err, "%s", text_path);
    }
    kv_device device = KV_DEVICE_AUTO;
    if (!rc) rc = kv_cli_device(device_name, &device, &err);
    rc = kv_tasks_agree(tasks, rc, &err); /* no rank enters the prompts alone */
    if (!rc)
        rc = kv_profile_run_tasks(m, prompts, (int)n_prompts, (int)prompt_len, device, tasks, &pr,
                                  &prog, &err);
    kv_progress_done(&prog);
    /* only rank 0 writes the file and probes the hardware (the other ranks wait, idle) */
    if (!rc && rank == 0) rc = kv_h5_create(out, &f, &err);
    if (!rc && f) rc = kv_h5_write_provenance(f, full_cmd, m, &err);
    if (!rc && f) rc = kv_h5_attr_str(f, "/", "file_kind", "profile", &err);
    if (!rc && f) rc = kv_h5_attr_str(f, "/", "text", text_path, &err);
    if (!rc && f) rc = kv_h5_attr_i64(f, "/", "seed", seed, &err);
    if (!rc && f) rc = kv_profile_write(f, &pr, &err);
    if (!rc && rank == 0 && !no_hw) {
        kv_hw_opts ho;
        kv_hw_opts_default(&ho, quick_hw);
        rc = kv_hw_probe_and_write(f, &m->cfg, &ho, &prog, &err);
        kv_progress_done(&prog);
    }
    if (!rc && rank == 0) {
        rc = kv_h5_commit(f, &err);
        f = NULL;
    }
    if (f) kv_h5_abort(f);
    if (!rc && !quiet && rank == 0) {
        fprintf(stderr, "kvplan profile: wrote %s (%ld prompts x %ld tokens, %.0f tokens/s)\n", out,
                n_prompts, prompt_len, pr.tokens_per_s);
        int L = pr.L, K = pr.H_kv, best = 0, worst = 0;
        for (int i = 1; i < L * K; i++) {
            if (pr.importance[i] > pr.importance[best]) best = i;
            if (pr.importance[i] < pr.importance[worst]) worst = i;
        }
        double tau = 0;
        int cnt = 0;
        for (int a = 0; a < pr.P; a++)
            for (int b = a + 1; b < pr.P; b++, cnt++) tau += pr.kendall_tau[a * pr.P + b];
        fprintf(stderr,
                "kvplan profile: most important KV head: layer %d head %d (%.4f); least: layer %d "
                "head %d (%.4f); mean Kendall tau between prompts %.3f\n",
                best / K, best % K, pr.importance[best], worst / K, worst % K, pr.importance[worst],
                cnt ? tau / cnt : 1.0);
    }
    kv_profile_free(&pr);
    free(prompts);
    free(stream);
    free(text);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return kv_cli_finish_tasks("profile", tasks, rc, &err);
}
