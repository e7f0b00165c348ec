/* The kvplan commands, their summaries and option specs (cli/opts.h). */
#include "cli.h"

static const kv_cli_command commands[] = {
    {"run", kv_cmd_run, "generate text (optionally batched, under a plan's KV budgets)",
     &kv_spec_run},
    {"eval", kv_cmd_eval, "perplexity of a text, full or budgeted KV cache", &kv_spec_eval},
    {"tokenize", kv_cmd_tokenize, "print the token ids of a text", &kv_spec_tokenize},
    {"probes", kv_cmd_probes, "generate pass-key retrieval probes (TSV) from stories",
     &kv_spec_probes},
    {"profile", kv_cmd_profile, "profile head/layer similarity and hardware -> profile.h5",
     &kv_spec_profile},
    {"search", kv_cmd_search, "search allocation parameters by budgeted perplexity -> plan.h5",
     &kv_spec_search},
    {"plan", kv_cmd_plan, "write a plan for given allocation parameters -> plan.h5", &kv_spec_plan},
    {"kvpr", kv_cmd_kvpr, "KVPR split point: recompute vs transfer an offloaded KV cache",
     &kv_spec_kvpr},
    {"batch", kv_cmd_batch, "largest batch for a memory budget (full / compressed KV cache)",
     &kv_spec_batch},
    {"serve", kv_cmd_serve, "OpenAI-compatible HTTP server, continuous batching under the plan",
     &kv_spec_serve},
    {"inspect", kv_cmd_inspect, "summarise, draw (--png) or export a profile / plan .h5 file",
     &kv_spec_inspect},
};

const kv_cli_command *kv_cli_commands(size_t *n) {
    *n = sizeof commands / sizeof commands[0];
    return commands;
}
