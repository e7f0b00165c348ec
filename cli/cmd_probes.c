/* kvplan probes [MODEL] [--tokenizer TOK] --text FILE -o PROBES.tsv: pass-key retrieval probes. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/model.h"
#include "kvplan/retrieval.h"
#include "kvplan/tokenizer.h"

typedef struct probes_args {
    const char *model, *tokenizer, *text, *out;
    long n, seed, context, min_tokens;
    double from, to, depth_lo, depth_hi;
} probes_args;

static const kv_opt probes_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(probes_args, model), "MODEL", .positional = 1,
     .help = "the model whose tokenizer and context the probes must fit"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(probes_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's); with --context, MODEL may be left out"},
    {"--text", NULL, KV_OPT_STR, offsetof(probes_args, text), "FILE",
     .help = "stories separated by blank lines (the filler)"},
    {"--n", NULL, KV_OPT_INT, offsetof(probes_args, n), "N", 1, 1000000, .def = "200",
     .help = "probes"},
    {"--seed", NULL, KV_OPT_INT, offsetof(probes_args, seed), "S", 0, 9223372036854775807.0,
     .def = "1", .help = "seed"},
    {"--from", NULL, KV_OPT_NUM, offsetof(probes_args, from), "F", 0, 1, .def = "0.9",
     .help = "first story used, as a fraction of the stories (0.9: the last 10 %)"},
    {"--to", NULL, KV_OPT_NUM, offsetof(probes_args, to), "F", 0, 1, .def = "1",
     .help = "end of the stories used (fraction)"},
    {"--depth-min", NULL, KV_OPT_NUM, offsetof(probes_args, depth_lo), "D", 0, 1, .def = "0",
     .help = "shallowest relative depth of the key sentence in the filler (0: first)"},
    {"--depth-max", NULL, KV_OPT_NUM, offsetof(probes_args, depth_hi), "D", 0, 1, .def = "0.6",
     .help = "deepest relative depth of the key sentence (1: just before the question; "
             "passkey-tiny answers 93 % of probes at depths 0..1, 99 % at 0..0.6)"},
    {"--context", NULL, KV_OPT_INT, offsetof(probes_args, context), "C", 16, 1 << 22,
     .help = "context the probes must fit (default: the model's)"},
    {"--min-tokens", NULL, KV_OPT_INT, offsetof(probes_args, min_tokens), "T", 8, 1 << 22,
     .def = "96", .help = "shortest probe; lengths are uniform in [T, C - 8] tokens"},
    {"-o", "--output", KV_OPT_STR, offsetof(probes_args, out), "FILE",
     .help = "output TSV (written atomically); prompt, tab, answer per line"},
};

const kv_cli_spec kv_spec_probes = {
    "probes",
    "usage: kvplan probes [MODEL] [--tokenizer TOK] --text FILE [--n N] [--seed S]\n"
    "                     [--from F] [--to F] [--depth-min D] [--depth-max D]\n"
    "                     [--context C] [--min-tokens T] -o PROBES.tsv\n",
    "Pass-key retrieval probes (docs/retrieval.md): consecutive sentences of the stories in\n"
    "[from, to) of FILE with \"The pass key is NNNNN. Remember it.\" at a random sentence\n"
    "boundary and \"What is the pass key? The pass key is\" at the end; the answer is NNNNN.\n"
    "The defaults take the last 10 % of the stories, which passkey-calib.tsv never used.\n",
    NULL,
    {{NULL, probes_opts, sizeof probes_opts / sizeof probes_opts[0], 0}},
};

int kv_cmd_probes(int argc, char **argv) {
    probes_args a = {0};
    int code = kv_cli_parse(&kv_spec_probes, argc, argv, &a);
    if (code >= 0) return code;
    if ((!a.model && !(a.tokenizer && a.context)) || !a.text || !a.out) {
        fprintf(stderr, "kvplan probes: --text FILE, -o FILE and a MODEL (or --tokenizer TOK "
                        "with --context C) are required\n");
        kv_cli_help(&kv_spec_probes, stderr);
        return 1;
    }
    kv_error err = {0};
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char *text = NULL, *tsv = NULL;
    size_t len = 0;
    const char *inputs[3] = {a.model, a.tokenizer, a.text};
    int rc = kv_check_output(a.out, "-o", inputs, 3, &err);
    if (!rc && a.model) rc = kv_cli_load_model(a.model, &m, &err);
    if (!rc) rc = kv_tokenizer_load(a.tokenizer, m, &tok, &err);
    if (!rc) rc = kv_read_file(a.text, &text, &len, &err);
    kv_probe_gen_opts o;
    kv_probe_gen_opts_default(&o, a.context ? (int)a.context : (m ? m->cfg.seq_len : 0));
    o.n = (int)a.n, o.seed = (uint64_t)a.seed, o.from = a.from, o.to = a.to;
    o.depth_lo = a.depth_lo, o.depth_hi = a.depth_hi, o.min_tokens = (int)a.min_tokens;
    if (!rc && m && o.context > m->cfg.seq_len)
        rc = kv_fail(&err, KV_EINPUT, "--context %d exceeds the model's context %d", o.context,
                     m->cfg.seq_len);
    if (!rc) rc = kv_probes_generate(text, len, tok, &o, &tsv, &err);
    if (!rc) rc = kv_write_file_atomic(a.out, tsv, strlen(tsv), &err);
    if (!rc) fprintf(stderr, "kvplan probes: wrote %d probes to %s\n", o.n, a.out);
    free(tsv);
    free(text);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("probes", &err) : 0;
}
