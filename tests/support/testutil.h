/* Helpers shared by the CUnit suites: locating ../shared data, running the kvplan binary,
 * and the main() of every suite binary (fixtures, one test by name, exit status). */
#ifndef KVPLAN_TESTUTIL_H
#define KVPLAN_TESTUTIL_H

#include <CUnit/CUnit.h>
#include <stddef.h>

#include "engine/forward.h"
#include "kvplan/kvcache.h"
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
/* The number after "KEY": in a JSON text (kvplan's --json lines), NAN when json is NULL or the
 * key is absent. */
double tu_json_number(const char *json, const char *key);
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
/* Bytes of the first `lines` lines of the file `path` (newlines included), or -1 when it cannot
 * be read or has fewer lines (a task log's header is its first 2 lines). */
long tu_header_bytes(const char *path, int lines);
/* Run `cmd` under /bin/sh in a child process and kill it (SIGKILL) as soon as the file `log`
 * holds its first `header_lines` lines plus at least `tail_bytes` more bytes (checked every
 * 0.2 ms for at most 120 s): a run killed part-way through writing its task log. Returns 1 when
 * the child was killed part-way, 0 when it ended first or the wait timed out (the child is
 * killed then too), -1 when no child could be started. Reaps the child in every case. */
int tu_kill_when_logged(const char *cmd, const char *log, int header_lines, long tail_bytes);
/* A CPU prefill of the S tokens ids[0..S) (kv_forward; sink policy, f32, block size 16) into
 * a fresh pool and cache, with every layer's input x_in captured: the state the KVPR tests
 * offload (kv_kvpr_layer_offload) and rebuild. Owns everything; tu_prefill_free releases it.
 * A failure fails the current test fatally. */
typedef struct tu_prefill {
    int rows, dim;
    float *x_in; /* [n_layers, rows, dim] */
    kv_pool pool;
    kv_cache cache;
    kv_workspace *ws;
} tu_prefill;
void tu_prefill_capture(const kv_model *m, const int *ids, int S, tu_prefill *f);
void tu_prefill_free(tu_prefill *f);
/* One test: its name (what -t / KVPLAN_TEST match) and its function. */
typedef struct tu_test {
    const char *name;
    void (*fn)(void);
} tu_test;
/* One CUnit suite: name, fixture and tests. init (may be NULL) runs once before the suite's
 * first test and returns 0 when the fixture is ready; when it returns non-zero (after printing
 * why) CUnit runs none of the suite's tests and counts the suite failed. cleanup (may be NULL)
 * runs once after the suite's last test, also when a test failed, and returns 0. */
typedef struct tu_suite {
    const char *name;
    int (*init)(void);
    int (*cleanup)(void);
    const tu_test *tests;
    size_t n_tests;
} tu_suite;
/* The test binary's main: registers the suites, runs them (CUnit basic mode, verbose) and
 * returns 0 when every registered test passed and every suite's init and cleanup succeeded, 1
 * otherwise, 2 on a usage error.
 *
 * Command line (argc, argv of main), also read from the environment:
 *   -t NAME (or KVPLAN_TEST=NAME)  run only the tests named NAME; when no test has exactly that
 *       name, every test whose name contains NAME (or whose suite is named NAME). A suite's
 *       init and cleanup run only when one of its tests is selected. No match: the list of
 *       tests and exit status 2.
 *   -l  list the suites and tests ("suite: test", one a line) and exit 0. */
int tu_main_suites(int argc, char **argv, const tu_suite *suites, size_t n_suites);
/* tu_main_suites with one suite without a fixture. */
int tu_main(int argc, char **argv, const char *suite, const tu_test *tests, size_t n);

#endif
