/* kvplan generation: sampled continuations of prompts, several sequences decoded together on
 * one engine (kvplan/engine.h), each under the engine's plan (its per-head KV budgets and
 * eviction policies).
 *
 * Each prompt is tokenized with BOS first and prefilled on its own sequence (in blocks of the
 * plan's eviction block p when a head can be over budget: Batch-Max Alg. 1); then every
 * sequence that is not finished samples its next token (kv_sample: temperature, top-p) and
 * all of them are decoded in one batched step, until max_new tokens or EOS/BOS. The sequences
 * share the engine's block pool, so a batch's KV bytes are what its sequences really hold.
 */
#ifndef KVPLAN_GENERATE_H
#define KVPLAN_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Called for each token as it becomes known: first the prompt tokens of every sequence once
 * all prompts are prefilled (prev = -1 for a sequence's first token, else the token before),
 * then each sampled token (prev = the sequence's previous token). `seq` is the sequence's
 * index 0..n_seqs-1. For streaming text: kv_tokenizer_piece(tok, prev, token, ...). */
typedef void (*kv_gen_token_fn)(void *user, int seq, int prev, int token);

typedef struct kv_gen_opts {
    const char *const *prompts; /* n_prompts texts (UTF-8); "" starts from BOS alone */
    int n_prompts;              /* >= 1 */
    int n_seqs;                 /* sequences decoded together (>= 1; at most the engine's
                                 * max_seqs); sequence i continues prompt i % n_prompts */
    long max_new;               /* new tokens per sequence, capped by C - the longest prompt
                                 * (C = the model's context seq_len) */
    float temperature;          /* 0 = greedy (argmax) */
    float top_p;                /* nucleus threshold in (0, 1]; 1 = off */
    uint64_t seed;              /* sequence i samples with seed + i + 1 (kv_sampler_init) */
    kv_gen_token_fn on_token;   /* may be NULL */
    void *user;                 /* passed to on_token */
} kv_gen_opts;

/* One sequence's tokens: the prompt's n_prompt ids (BOS first), then the generated ones. */
typedef struct kv_gen_seq {
    int *ids;
    int n, n_prompt;
} kv_gen_seq;

typedef struct kv_gen_result {
    kv_gen_seq *seqs; /* [n_seqs], owned (kv_gen_result_free) */
    int n_seqs;
    long prefill_tokens; /* sum of the prompts' lengths */
    long decoded;        /* tokens run through decode steps (sampled tokens that were fed
                          * back; the last sampled token of a sequence is not) */
    double prefill_s;    /* wall seconds of the prefills */
    double decode_s;     /* wall seconds from the end of prefill to the last decode step */
    size_t kv_peak;      /* most K/V bytes in use after a decode step (kv_engine_bytes_in_use) */
} kv_gen_result;

/* Generate from the prompts on engine e (built for model m, with max_seqs >= o->n_seqs and
 * no sequence open), tokenizing with tok (which must match m's vocabulary). Opens o->n_seqs
 * sequences on e and leaves them open (the engine frees them). Fills *res (caller frees with
 * kv_gen_result_free; on error *res holds nothing). Errors: KV_EINPUT for a prompt of C or
 * more tokens ("prompt i has n tokens, the context is C") and as kv_engine_prefill /
 * kv_engine_decode; KV_EINTERNAL for memory. */
int kv_generate(kv_engine *e, const kv_model *m, const kv_tokenizer *tok, const kv_gen_opts *o,
                kv_gen_result *res, kv_error *err);

/* Free a result's sequences; safe on a zeroed or already freed result. */
void kv_gen_result_free(kv_gen_result *res);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
