/* kvplan inspect, internal interface (cli/inspect_*.c): a kvplan HDF5 file loaded whole into
 * memory, the summaries derived from it, and its three renderings (text, JSON, PNG).
 * Not a public header: only the cli/ sources include it. */
#ifndef KVPLAN_CLI_INSPECT_H
#define KVPLAN_CLI_INSPECT_H

#include <stdio.h>

#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/h5io.h"

/* One attribute: kind 's' (str set), 'i' or 'f' (num set), '?' (unreadable: both unset). */
typedef struct ki_attr {
    char *obj;  /* owning object path ("/", a group or a dataset), owned */
    char *name; /* owned */
    char kind;
    char *str;  /* owned, for 's' */
    double num; /* for 'i' and 'f' */
} ki_attr;

/* One dataset, converted to float64. v is NULL when it is not numeric (strings, compounds). */
typedef struct ki_dset {
    char *path; /* absolute, owned */
    int rank;
    long dims[KV_H5_MAX_RANK];
    size_t count; /* product of dims */
    double *v;    /* [count] row-major, owned, or NULL */
    int is_int;   /* every value is a whole number */
} ki_dset;

/* The whole file. Every pointer is owned by the ki_file and released by ki_free. */
typedef struct ki_file {
    char path[4096];
    int is_profile; /* has /heads */
    int is_plan;    /* has /budget */
    ki_attr *attrs;
    int n_attrs, cap_attrs;
    ki_dset *dsets; /* in name order (depth-first) */
    int n_dsets, cap_dsets;
    char **groups; /* every group below the root, name order */
    int n_groups, cap_groups;
} ki_file;

/* Load every dataset, group and attribute of `path`. KV_EINPUT for files that are not HDF5, not
 * kvplan's or of a newer schema (kv_h5_open_read's messages). Free with ki_free (also after
 * a failure). */
int ki_load(const char *path, ki_file *out, kv_error *err);
void ki_free(ki_file *f);

/* Lookups; NULL / `dflt` when missing. */
const ki_dset *ki_dset_find(const ki_file *f, const char *path);
const ki_attr *ki_attr_find(const ki_file *f, const char *obj, const char *name);
double ki_attr_num(const ki_file *f, const char *obj, const char *name, double dflt);
const char *ki_attr_str(const ki_file *f, const char *obj, const char *name);
/* The `units` attribute of a dataset or NULL. */
const char *ki_units(const ki_file *f, const char *path);
/* A numeric dataset of rank 2 (shape [*rows, *cols]) or NULL. Rank 1 counts as [1, n] when
 * allow_1d is set. */
const double *ki_matrix(const ki_file *f, const char *path, int allow_1d, int *rows, int *cols);
/* 1 when x is finite, a whole number and in [lo, hi] (then *out = x), else 0 (*out kept):
 * the check before any conversion of a file's number to int (a cast of NaN or 1e300 is
 * undefined behaviour). */
int ki_whole_in(double x, int lo, int hi, int *out);
/* The plan's model_head_dim attribute when it is a whole number in [1, 2^20], else 0. */
int ki_head_dim(const ki_file *f);
/* KV storage type of head i (layer-major) of a plan file: /budget/kv_type (schema v3) or f32
 * for v1/v2 plans (the rule of kv_plan_read); a code out of range or not whole reads as f32. */
kv_cache_type ki_head_type(const ki_file *f, int i);

/* ---- derived summaries (shared by text and JSON) ---- */

/* Head importance [L, H_kv]: /heads/importance, else 1 - /heads/similarity. Caller frees. */
double *ki_head_importance(const ki_file *f, int *L, int *hkv);
/* Indices 0..n-1 sorted by v descending (ties by index), into order[n]. */
void ki_order_desc(const double *v, int n, int *order);
/* Off-diagonal summary of a [P, P] Kendall tau matrix (NaN entries skipped). 0 when P < 2. */
typedef struct ki_tau {
    int prompts, pairs;
    double mean, min, max;
} ki_tau;
int ki_tau_summary(const ki_file *f, ki_tau *out);
/* Per-layer kept fraction of the plan: sum_j B[l][j] / (H_kv * C), into a new [L] array
 * (caller frees). NULL (err set, KV_EINPUT) when the file has no /budget/tokens or no
 * context_length. */
double *ki_layer_fractions(const ki_file *f, int *L, kv_error *err);
/* The search grid /search/perplexity: [NT, NR] (baklava, one p), [NP, NT, NR] (baklava with
 * several SqueezeAttention p, /search/p_values [NP]) or [NP] (squeeze searches p only). Every
 * grid is seen as [np, nt, nr] row-major with 1 for an axis it does not have. Statistics over
 * a set of cells: how many are finite, the most chunks any of them saw (/search/chunks, same
 * shape; successive halving evaluates most cells on fewer chunks) and how many saw it, and the
 * best (lowest) and worst (highest) finite cell among those evaluated on that many chunks
 * (comparable figures; all finite cells when chunks is unknown). */
typedef struct ki_grid_stats {
    int evaluated;
    int max_chunks, n_max;
    long best, worst; /* flat indices into ppl, -1 when nothing was evaluated */
} ki_grid_stats;
typedef struct ki_grid {
    int rank;                /* of /search/perplexity: 1, 2 or 3 */
    int np, nt, nr;          /* 1 for a missing axis */
    const double *p, *t, *r; /* axis values, borrowed; NULL when the axis is missing or its
                                values dataset is missing or of another length */
    const double *ppl;       /* [np * nt * nr], borrowed */
    const double *chunks;    /* same shape, or NULL */
    ki_grid_stats all;       /* over every cell */
} ki_grid;
/* 0 when the file has no such grid. */
int ki_search_grid(const ki_file *f, ki_grid *out);
/* Statistics of the (t, r) map of p index k. */
void ki_grid_slice(const ki_grid *g, int k, ki_grid_stats *out);
/* Flat index -> (p, t, r) indices. */
void ki_grid_cell(const ki_grid *g, long idx, int *k, int *i, int *j);
/* The chunks of a cell (0 when unknown or not evaluated). */
int ki_grid_chunks(const ki_grid *g, long idx);
/* /search@winner, the allocation that won ("baklava": the grid's best cell; "uniform" or
 * "squeeze": that baseline beat the grid on the same chunks), or NULL. *from_grid says whether
 * the winner is the grid's (the grid's allocation) rather than a baseline. */
const char *ki_search_winner(const ki_file *f, const ki_grid *g, int *from_grid);

/* ---- renderings ---- */
/* The per-text table of a multi-text search (/search/texts: text, tokens, part, chunks, full,
 * uniform, plan perplexity and the guard's decision), nothing when the file has none; and the
 * same as "texts" {objective, decision, reason, lambda, rows [{text, index, tokens, part,
 * chunks, full, uniform, plan}]} in the JSON summary's search object (cli/inspect_texts.c). */
void ki_print_texts(FILE *out, const ki_file *f);
struct cJSON;
void ki_texts_json(struct cJSON *search, const ki_file *f);
/* The retrieval records (cli/inspect_retrieval.c): a profile's /heads/retrieval (the
 * costliest heads) and a plan's /search/retrieval (full, uniform, perplexity plan and plan:
 * accuracy, answer NLL, search perplexity; the candidates and the decision); nothing when
 * the file has neither. The JSON form is "retrieval" {heads_nll_rise [L][H_kv], window,
 * probes, full, uniform, guard, plan {accuracy, answer_nll, search_perplexity}, decision,
 * chosen, tolerance} in `parent`. */
void ki_print_retrieval(FILE *out, const ki_file *f);
void ki_retrieval_json(struct cJSON *parent, const ki_file *f);
/* Human summary on `out`. */
void ki_print_text(FILE *out, const ki_file *f);
/* JSON document (cJSON) printed to `out`; KV_EINTERNAL on allocation failure. */
int ki_print_json(FILE *out, const ki_file *f, kv_error *err);
/* PNG pictures into directory `dir` (created if missing), those the file has data for:
 * head_importance, token_cos, layer_similarity, consistency (profile); search_perplexity
 * (one panel per p: the (t, r) map of each SqueezeAttention p of the grid), budget_tokens
 * (plan), retrieval_heads (a profile's /heads/retrieval or a plan's /search/retrieval/heads). The
 * paths written are printed, one per line, on `log` (may be NULL) and counted in *n_written. Sizes:
 * KI_PNG_W x KI_PNG_H pixels each. KV_EINPUT when dir cannot be created; KV_EINTERNAL when cairo
 * fails. */
#define KI_PNG_W 1200
#define KI_PNG_H 800
int ki_write_pngs(const ki_file *f, const char *dir, FILE *log, int *n_written, kv_error *err);

#endif
