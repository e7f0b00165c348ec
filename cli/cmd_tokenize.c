/* kvplan tokenize MODEL [--tokenizer TOK] --text FILE: print token ids, BOS first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

static const char *help = "usage: kvplan tokenize MODEL [--tokenizer TOK] --text FILE\n"
                          "Print the token ids of FILE, space-separated, BOS first.\n"
                          "MODEL is a llama2.c .bin, a .gguf file or a Hugging Face directory.\n";

int kv_cmd_tokenize(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if ((r = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err))) {
            if (r < 0) return kv_cli_report("tokenize", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err))) {
            if (r < 0) return kv_cli_report("tokenize", &err);
        } else if (kv_cli_take_model("tokenize", argv[i], &model_path)) {
            return 1;
        }
    }
    if (!model_path || !text_path) {
        fprintf(stderr, "kvplan tokenize: MODEL and --text FILE are required\n%s", help);
        return 1;
    }
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL, n = 0;
    int rc = kv_cli_load_model(model_path, &m, &err);
    if (!rc) rc = kv_tokenizer_load(tok_path, m, &tok, &err);
    if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
    if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &ids, &n, &err);
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
