/* A slow, naive Llama forward pass in double precision, written from the model definition
 * for the tests (independent of runtime/engine/forward.c and the KV cache): token by token, full
 * causal attention, RoPE in either layout, optional q/k/v biases. */
#ifndef KVPLAN_TEST_NAIVE_REF_H
#define KVPLAN_TEST_NAIVE_REF_H

#include "kvplan/model.h"

/* Optional captures, each [L, T, width], caller-allocated (any may not be NULL if cap is
 * given): x_in [dim] residual entering the layer, o [H*d_h] attention output before W_o,
 * v [H_kv*d_h] the token's V, attn_out [dim] W_o o, x_out [dim] residual after the block. */
typedef struct tu_capture {
    double *x_in, *o, *v, *attn_out, *x_out;
} tu_capture;

/* logits: [T, vocab] or NULL. */
void tu_naive_forward(const kv_model *m, const int *tokens, int T, float *logits, tu_capture *cap);

#endif
