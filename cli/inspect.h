/* kvplan inspect, internal interface (cli/inspect_*.c): a kvplan HDF5 file loaded whole into
 * memory, the summaries derived from it, and its three renderings (text, JSON, PNG).
 * Not a public header: only the cli/ sources include it. */
#ifndef KVPLAN_CLI_INSPECT_H
#define KVPLAN_CLI_INSPECT_H

#include <stdio.h>

#include "kvplan/common.h"
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
/* The search grid /search/perplexity [NT, NR] and its best (lowest) and worst (highest)
 * finite cells. Returns 0 when there is no such grid; t / r are NULL when /search/t_values or
 * r_values is missing or of another length; `evaluated` counts the finite cells (best / worst
 * are meaningful only when it is > 0). */
typedef struct ki_grid {
    int nt, nr, evaluated;
    const double *t, *r, *ppl; /* borrowed from the file */
    const double *chunks;      /* /search/chunks [NT, NR] (successive halving) or NULL */
    int max_chunks, n_max;     /* the most chunks any cell saw, and how many cells saw it */
    int best_i, best_j, worst_i, worst_j; /* among the cells evaluated on max_chunks when
                                             chunks is known (comparable figures), else all */
} ki_grid;
int ki_search_grid(const ki_file *f, ki_grid *out);

/* ---- renderings ---- */
/* Human summary on `out`. */
void ki_print_text(FILE *out, const ki_file *f);
/* JSON document (cJSON) printed to `out`; KV_EINTERNAL on allocation failure. */
int ki_print_json(FILE *out, const ki_file *f, kv_error *err);
/* PNG pictures into directory `dir` (created if missing), those the file has data for:
 * head_importance, token_cos, layer_similarity, consistency (profile); search_perplexity,
 * budget_tokens (plan). The paths written are printed, one per line, on `log` (may be NULL)
 * and counted in *n_written. Sizes: KI_PNG_W x KI_PNG_H pixels each.
 * KV_EINPUT when dir cannot be created; KV_EINTERNAL when cairo fails. */
#define KI_PNG_W 1200
#define KI_PNG_H 800
int ki_write_pngs(const ki_file *f, const char *dir, FILE *log, int *n_written, kv_error *err);

#endif
