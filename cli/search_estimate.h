/* kvplan search --estimate: the command's side (cli/search_estimate.c): choose the throughput,
 * count the stages (include/kvplan/estimate.h) and print them as a table or JSON. */
#ifndef KVPLAN_CLI_SEARCH_ESTIMATE_H
#define KVPLAN_CLI_SEARCH_ESTIMATE_H

#include "kvplan/estimate.h"
#include "kvplan/search.h"

typedef struct kv_cli_estimate {
    const kv_model *m;             /* the model, or one with only cfg (--shape) */
    const char *model_name;        /* its path, or the --shape string */
    const kv_profile_inputs *prof; /* NULL: no profile */
    const char *profile_path;      /* NULL: none */
    const kv_search_opts *so;      /* the options the search would run with */
    int n_texts, S, HC;            /* texts and their chunks as laid out */
    const int *ids;                /* the laid-out tokens (NULL with --shape) */
    const kv_probes *probes;       /* --retrieval's, or NULL */
    const kv_retrieval_opts *ro;
    int have_heads;     /* the profile holds the heads' retrieval costs */
    const char *preset; /* --device-preset, or NULL */
    int json;
} kv_cli_estimate;

/* Print the estimate of e on stdout: the throughput from the device preset's roofline when
 * e->preset is set, else from the profile's /prompts@profile_tokens_per_s and a calibration
 * forward (one search chunk under the uniform budgets; the projection uses the calibration,
 * which runs the search's own engine). Returns KV_OK or an error (err set). */
int kv_cli_search_estimate(const kv_cli_estimate *e, kv_error *err);

#endif
