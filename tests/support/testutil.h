/* Helpers shared by the CUnit suites: locating ../shared data, running the kvplan binary,
 * and a main() that runs one suite and exits non-zero on any failure. */
#ifndef KVPLAN_TESTUTIL_H
#define KVPLAN_TESTUTIL_H

#include <CUnit/CUnit.h>
#include <stddef.h>

#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

/* Path under the shared data directory (KVPLAN_SHARED or ../shared), in a static buffer
 * rotated among 8 slots. */
const char *tu_shared(const char *rel);
/* A fresh temporary directory for this test process (created once). */
const char *tu_tmpdir(void);
/* Path inside tu_tmpdir(), rotated static buffers. */
const char *tu_tmp(const char *name);
/* Run `kvplan <args>` through the shell; stdout (and stderr when merge_stderr) captured into a
 * malloc'ed string (*out, may be NULL). Returns the exit code. */
int tu_run_kvplan(const char *args, char **out, int merge_stderr);
/* Load the model at `path` (a file or a Hugging Face directory; tu_shared() for shared data)
 * for a test: the caller owns it (kv_model_free). On failure the loader's message is printed
 * ("load PATH: ...") and the current test fails fatally (CU_ASSERT_FATAL). */
kv_model *tu_load_model(const char *path);
/* tu_load_model(tu_shared(rel)). */
kv_model *tu_load_shared(const char *rel);
/* Token ids (BOS first) of the first max_bytes bytes (0: all) of the shared TinyStories text
 * (text/tinystories_val_head.txt), encoded by the tokenizer at tok_path (NULL: m's own; see
 * kv_tokenizer_load). Count in *n; the caller frees the ids. A failure prints the message and
 * fails the current test fatally. */
int *tu_text_tokens(const kv_model *m, const char *tok_path, size_t max_bytes, int *n);
/* Encode `text` with t (no BOS), decode the ids and assert the bytes come back unchanged (a
 * lossless tokenizer); returns the ids (count in *n; the caller frees them). */
int *tu_roundtrip(const kv_tokenizer *t, const char *text, int *n);
/* A model config of stories260K's shape (dim 64, H 8, H_kv 4, d_h 8, vocab 512, C 512) with
 * n_layers layers, no weights, path "models/stories260K.bin" and the given model_sha256: for
 * file-format tests that never run the model. */
void tu_fake_model(kv_model *m, int n_layers, const char *sha);
/* Run a shell command; its stdout (what the command redirects there) into *out (malloc'ed,
 * may be NULL). Returns the exit code, 128 + the signal when killed, -1 when it cannot run. */
int tu_run_sh(const char *cmd, char **out);
/* Run a whole suite: registers the tests, runs them, returns 0 when all passed. */
typedef struct tu_test {
    const char *name;
    void (*fn)(void);
} tu_test;
int tu_main(const char *suite, const tu_test *tests, size_t n);

#endif
