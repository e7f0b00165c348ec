/* kvplan tokenize [MODEL] [--tokenizer TOK] --text FILE: print token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

static const char *help =
    "usage: kvplan tokenize [MODEL] [--tokenizer TOK] --text FILE [--no-bos] [--no-special]\n"
    "Print the token ids of FILE, space-separated, BOS first (when the vocabulary has one).\n"
    "MODEL is a llama2.c .bin, a .gguf file or a Hugging Face directory; its own tokenizer is\n"
    "used unless --tokenizer names one. TOK is a llama2.c tokenizer.bin, a tokenizer.json or\n"
    "any GGUF file with a vocabulary (a vocabulary-only GGUF included), detected from the\n"
    "content; with --tokenizer, MODEL may be left out.\n"
    "  --no-bos       no BOS token\n"
    "  --no-special   control-token texts in FILE are plain text (llama.cpp parse_special =\n"
    "                 false); user-defined tokens are still recognised\n";

int kv_cmd_tokenize(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL;
    int add_bos = 1, parse_special = 1;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--no-bos")) {
            add_bos = 0;
        } else if (!strcmp(argv[i], "--no-special")) {
            parse_special = 0;
        } else if ((r = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err))) {
            if (r < 0) return kv_cli_report("tokenize", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err))) {
            if (r < 0) return kv_cli_report("tokenize", &err);
        } else if (kv_cli_take_model("tokenize", argv[i], &model_path)) {
            return 1;
        }
    }
    if ((!model_path && !tok_path) || !text_path) {
        fprintf(stderr,
                "kvplan tokenize: --text FILE and a MODEL or --tokenizer TOK are "
                "required\n%s",
                help);
        return 1;
    }
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL, n = 0;
    int rc = model_path ? kv_cli_load_model(model_path, &m, &err) : KV_OK;
    if (!rc) rc = kv_tokenizer_load(tok_path, m, &tok, &err);
    if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
    if (!rc) rc = kv_tokenizer_encode_ex(tok, text, len, add_bos, parse_special, &ids, &n, &err);
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
