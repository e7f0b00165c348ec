/* A Llama-shaped model with seeded pseudo-random weights, built in memory: the one synthetic
 * model of the tests (whole-model quantisation checks, GGUF round trips) and the benchmarks
 * (bench_engine, bench_cuda: throughput at a realistic shape without a large file). Compiled
 * into every test and bench executable (CMakeLists.txt). */
#ifndef KVPLAN_TESTS_SYNTHETIC_H
#define KVPLAN_TESTS_SYNTHETIC_H

#include <stdint.h>

#include "kvplan/model.h"

/* The shape: width, layers, query and KV heads (head_dim = dim / heads), FFN width,
 * vocabulary, context (seq_len). */
typedef struct synth_shape {
    int dim, layers, heads, kv_heads, hidden, vocab, seq_len;
} synth_shape;

/* The next value of splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014) with state *s (the caller's; no global state). The generator of the
 * synthetic weights, and of the benchmarks' random token ids. */
uint64_t synth_next(uint64_t *s);

/* The model of `shape`: every weight the mean of three uniforms on [-a, a], a = sqrt(3 / in)
 * (in = the matrix's input width, so rows have unit-scale outputs), from splitmix64 seeded with
 * `seed`; the embedding uniform on [-1, 1); unit norms; RoPE on adjacent pairs; fp32. `tied`:
 * the classifier is the embedding (else its own matrix, drawn after the embedding). bos/eos
 * are unknown (-1). All buffers are owned by the model; caller frees with kv_model_free. NULL
 * with err set when the shape fails kv_config_check or memory runs out. */
kv_model *synth_model(synth_shape shape, int tied, uint64_t seed, kv_error *err);

#endif
