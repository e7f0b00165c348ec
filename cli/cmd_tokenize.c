/* kvplan tokenize [MODEL] [--tokenizer TOK] --text FILE: print token ids. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

typedef struct tokenize_args {
    const char *model, *tokenizer, *text;
    int no_bos, no_special;
} tokenize_args;

static const kv_opt tokenize_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(tokenize_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory whose tokenizer is used"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(tokenize_args, tokenizer), "TOK",
     .help = "llama2.c tokenizer.bin, tokenizer.json or any GGUF file with a vocabulary, "
             "detected from the content; with it MODEL may be left out"},
    {"--text", NULL, KV_OPT_STR, offsetof(tokenize_args, text), "FILE", .help = "the text"},
    {"--no-bos", NULL, KV_OPT_FLAG, offsetof(tokenize_args, no_bos), .help = "no BOS token"},
    {"--no-special", NULL, KV_OPT_FLAG, offsetof(tokenize_args, no_special),
     .help = "control-token texts in FILE are plain text (llama.cpp parse_special = false); "
             "user-defined tokens are still recognised"},
};

const kv_cli_spec kv_spec_tokenize = {
    "tokenize",
    "usage: kvplan tokenize [MODEL] [--tokenizer TOK] --text FILE [--no-bos] [--no-special]\n",
    "Print the token ids of FILE, space-separated, BOS first (when the vocabulary has one).\n",
    NULL,
    {{NULL, tokenize_opts, sizeof tokenize_opts / sizeof tokenize_opts[0], 0}},
};

int kv_cmd_tokenize(int argc, char **argv) {
    tokenize_args a = {0};
    int code = kv_cli_parse(&kv_spec_tokenize, argc, argv, &a);
    if (code >= 0) return code;
    if ((!a.model && !a.tokenizer) || !a.text) {
        fprintf(stderr, "kvplan tokenize: --text FILE and a MODEL or --tokenizer TOK are "
                        "required\n");
        kv_cli_help(&kv_spec_tokenize, stderr);
        return 1;
    }
    /* build: the model (when given) and its or the named tokenizer */
    kv_error err = {0};
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL, n = 0;
    int rc = a.model ? kv_cli_load_model(a.model, &m, &err) : KV_OK;
    if (!rc) rc = kv_tokenizer_load(a.tokenizer, m, &tok, &err);
    /* run and report: the ids on one line */
    if (!rc) rc = kv_read_file(a.text, &text, &len, &err);
    if (!rc) rc = kv_tokenizer_encode_ex(tok, text, len, !a.no_bos, !a.no_special, &ids, &n, &err);
    if (!rc) {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids);
    free(text);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("tokenize", &err) : 0;
}
