/* The workload both sides of the peer benchmark (issue 23 item 5) run, in one place so that
 * kvplan (bench_quant --peer) and llama.cpp (bench/peer_llamacpp.c, compiled by
 * bench/peer_llamacpp.sh outside CMake) see the same tokens and score them the same way.
 * Header-only C11 with no kvplan or llama.cpp dependency. */
#ifndef KVPLAN_BENCH_PEER_WORKLOAD_H
#define KVPLAN_BENCH_PEER_WORKLOAD_H

#include <math.h>

/* Tokens of a perplexity chunk (--ppl): every row's logits are scored. */
#define PEER_PPL_CHUNK 512

/* Token i of the synthetic stream over a vocabulary of `vocab` ids: BOS (1) first, then
 * (i * 7919 + 13) mod vocab (a stride prime to any vocabulary size the benchmark writes). */
static inline int peer_token(long i, int vocab) {
    return i == 0 ? 1 : (int)((i * 7919L + 13L) % vocab);
}

/* The negative log-likelihood (nats) of token `next` under logits lg [vocab]:
 * max + log(sum exp(lg - max)) - lg[next], accumulated in double. */
static inline double peer_token_nll(const float *lg, int vocab, int next) {
    double mx = lg[0], s = 0.0;
    for (int v = 1; v < vocab; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < vocab; v++) s += exp((double)lg[v] - mx);
    return mx + log(s) - (double)lg[next];
}

#endif
