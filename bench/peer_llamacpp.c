/* peer_llamacpp: the llama.cpp side of the peer benchmark (bench/peer_llamacpp.sh, issue 23
 * item 5). Not part of the CMake build or CI: the script compiles it against the prebuilt
 * libllama / libggml / libggml-base of the npm package @node-llama-cpp/linux-x64 and the
 * headers of the llama.cpp source that node-llama-cpp bundles. llama.cpp is called directly
 * (never through Node), with a persistent ggml threadpool attached to the context as
 * llama-bench does, so every decode step reuses the same threads.
 *
 *   peer_llamacpp MODEL.gguf [--threads N] [--prompt T] [--decode D] [--kv f16|f32]
 *                 [--ppl TOKENS]
 *
 * Prints one line, the format bench_quant --peer prints for kvplan:
 *   engine llama.cpp prefill_s S decode_s S prefill_tps X decode_tps Y [nll N scored K]
 * prefill: one llama_decode of the T-token prompt (logits of the last row), after a warm-up of
 * 16 tokens in a cleared cache; decode: D greedy steps of one token after it (seconds for all D).
 * --ppl TOKENS: the mean next-token negative log-likelihood (nats) over chunks of 512 tokens
 * with every row's logits (flash attention off, K/V in --kv), for the perplexity agreement
 * row. Tokens: ids (i * 7919 + 13) mod vocab, the first one BOS (1), as bench_quant --peer. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"
#include "peer_workload.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "peer_llamacpp: %s\n", what);
    exit(1);
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Decode n tokens starting at position pos in sequence 0; logits for every row when all, else
 * for the last. */
static void decode(struct llama_context *ctx, struct llama_batch *b, const int *tok, int n, int pos,
                   int all) {
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = tok[i];
        b->pos[i] = pos + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = (int8_t)(all || i == n - 1);
    }
    if (llama_decode(ctx, *b) != 0) die("llama_decode failed");
    llama_synchronize(ctx);
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: peer_llamacpp MODEL.gguf [--threads N] [--prompt T] [--decode D] "
            "[--kv f16|f32] [--ppl TOKENS]");
    const char *path = argv[1];
    int threads = 2, T = 512, D = 128, kv_f32 = 0;
    long ppl = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc)
            kv_f32 = !strcmp(argv[++i], "f32");
        else if (!strcmp(argv[i], "--ppl") && i + 1 < argc)
            ppl = atol(argv[++i]);
        else
            die("unknown option");
    }
    if (T < 1 || T > 512 || D < 1 || threads < 1)
        die("--prompt 1..512, --decode >= 1, --threads >= 1");
    llama_log_set(quiet_log, NULL);
    const char *dir = getenv("GGML_BACKEND_DIR");
    if (!dir) die("GGML_BACKEND_DIR (the folder of libggml-cpu-*.so) is not set");
    ggml_backend_load_all_from_path(dir);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) die("cannot load the model");
    int V = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = kv_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.type_v = cp.type_k;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot make a context");

    /* a persistent threadpool, as llama-bench: found through the CPU backend's registry */
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) die("no CPU backend: check GGML_BACKEND_DIR");
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    typedef struct ggml_threadpool *(*tp_new_fn)(struct ggml_threadpool_params *);
    typedef void (*tp_free_fn)(struct ggml_threadpool *);
    tp_new_fn tp_new = (tp_new_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    tp_free_fn tp_free = (tp_free_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    if (!tp_new || !tp_free) die("the CPU backend exports no threadpool functions");
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *tp = tp_new(&tpp);
    if (!tp) die("cannot make a threadpool");
    llama_attach_threadpool(ctx, tp, NULL);

    struct llama_batch b = llama_batch_init(512, 0, 1);
    int *tok = malloc(sizeof *tok * (size_t)(T > 512 ? T : 512));
    llama_memory_t mem = llama_get_memory(ctx);

    if (ppl > 0) {
        double nll = 0.0;
        long scored = 0;
        for (long c0 = 0; c0 + PEER_PPL_CHUNK <= ppl; c0 += PEER_PPL_CHUNK) {
            llama_memory_clear(mem, true);
            for (int i = 0; i < PEER_PPL_CHUNK; i++) tok[i] = peer_token(c0 + i, V);
            decode(ctx, &b, tok, PEER_PPL_CHUNK, 0, 1);
            for (int i = 0; i + 1 < PEER_PPL_CHUNK; i++, scored++)
                nll += peer_token_nll(llama_get_logits_ith(ctx, i), V, tok[i + 1]);
        }
        printf("engine llama.cpp nll %.9f scored %ld kv %s\n", scored ? nll / scored : 0.0, scored,
               kv_f32 ? "f32" : "f16");
    } else {
        for (int i = 0; i < T; i++) tok[i] = peer_token(i, V);
        llama_memory_clear(mem, true); /* warm-up: pages, the threadpool, the graph */
        decode(ctx, &b, tok, 16, 0, 0);
        llama_memory_clear(mem, true);
        double t0 = now();
        decode(ctx, &b, tok, T, 0, 0);
        double t_pf = now() - t0;
        int next = argmax(llama_get_logits_ith(ctx, T - 1), V);
        t0 = now();
        for (int d = 0; d < D; d++) {
            decode(ctx, &b, &next, 1, T + d, 0);
            next = argmax(llama_get_logits_ith(ctx, 0), V);
        }
        double t_dec = now() - t0;
        printf("engine llama.cpp prefill_s %.6f decode_s %.6f prefill_tps %.2f decode_tps %.3f "
               "last %d\n",
               t_pf, t_dec, T / t_pf, D / t_dec, next);
    }
    free(tok);
    llama_batch_free(b);
    llama_free(ctx);
    tp_free(tp);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
