/* kvplan tasks: one task model for independent work (docs/design.md "Past one machine").
 *
 * A task list is n independent tasks 0..n-1, each producing n_out doubles (e.g. the NLL sum of
 * one (budget set, chunk) pair of a search). kv_tasks_run computes all of them and fills
 * results[task * n_out ...] by task index, so the caller sees the same array whether the work
 * ran in this process one task after another or was farmed out over MPI ranks.
 *
 * Under MPI (built with KVPLAN_HAVE_MPI and started by mpirun / srun) every rank runs the same
 * command up to each kv_tasks_run call (a collective: every rank calls it with the same task
 * list). Rank 0 hands tasks out on demand (MPI_ANY_SOURCE: a slow rank receives fewer; each
 * worker holds one task in reserve so it never waits while rank 0 computes a task of its own),
 * gathers the results by index and broadcasts them, so every rank leaves the call with the
 * same results and the same return code and the command goes on identically on every rank.
 * Only rank 0 writes files and prints progress. A rank that waits (for a task, for results, at
 * the end of a call) tests and sleeps 0.2 ms in turn instead of spinning in a blocking MPI
 * call, so idle ranks leave the cores to those with work on a shared machine. A task that fails on
 * any rank fails the call on every rank with a message naming the rank and the task. A rank that
 * dies makes mpirun abort the job (Open MPI's default error handler), before rank 0 wrote any
 * output.
 *
 * Without MPI, or in a process not started by mpirun / srun, kv_tasks_run is a plain loop over
 * the tasks in order, and the results are bit-identical to the MPI run's as long as a task's
 * result depends only on the task (the engine scores a chunk from a fresh cache).
 */
#ifndef KVPLAN_TASKS_H
#define KVPLAN_TASKS_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef struct kv_tasks kv_tasks;

/* The longest task-log key (characters) and the most results one task may log. */
#define KV_TASKS_KEY_MAX 4000
#define KV_TASKS_MAX_OUT (1 << 20)

/* Compute task `task` (0..n-1): write n_out doubles to out. Return KV_OK or an error code with
 * err filled (the whole run then fails). */
typedef int (*kv_task_fn)(void *user, long task, double *out, kv_error *err);

/* The task context of this process: MPI_Init (and MPI_COMM_WORLD duplicated) when built with
 * MPI and the process was started by a launcher (environment OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * PMIX_RANK or SLURM_PROCID set and the world has more than one rank); otherwise a
 * one-process context. argc/argv may be NULL. Caller owns *out (kv_tasks_finalize, which calls
 * MPI_Finalize when this call initialised MPI). Errors: KV_EINTERNAL (memory, MPI_Init). */
int kv_tasks_init(int *argc, char ***argv, kv_tasks **out, kv_error *err);
void kv_tasks_finalize(kv_tasks *t);

/* This process's rank (0 without MPI) and the number of ranks (1 without MPI); t may be NULL. */
int kv_tasks_rank(const kv_tasks *t);
int kv_tasks_size(const kv_tasks *t);

/* Run tasks 0..n_tasks-1 (see above) and fill results [n_tasks * n_out]. t may be NULL (one
 * process). Collective under MPI. Errors: the first failing task's code and message, prefixed
 * with "rank R, task T: " when it ran on another rank; KV_EINPUT for n_out < 1, and for a
 * resumed log whose records of this call do not fit it (see kv_tasks_run_range). */
int kv_tasks_run(kv_tasks *t, long n_tasks, int n_out, kv_task_fn fn, void *user, double *results,
                 kv_error *err);

/* kv_tasks_run whose every result lies in [lo, hi] (e.g. a chunk's NLL sum: (0, inf), given
 * as lo = DBL_MIN, hi = DBL_MAX): a result taken from a resumed log is checked against it, and
 * a logged record of this call with another result count, a task index beyond n_tasks, a
 * repeated task or a value outside [lo, hi] refuses the log (KV_EINPUT naming the log, the
 * task and the value; under MPI every rank returns it). kv_tasks_run is
 * [-DBL_MAX, DBL_MAX]. */
int kv_tasks_run_range(kv_tasks *t, long n_tasks, int n_out, double lo, double hi, kv_task_fn fn,
                       void *user, double *results, kv_error *err);

/* kv_tasks_run_range with a range per result: result k of every task lies in [lo[k], hi[k]]
 * (lo, hi [n_out]; e.g. a batch of NLL sums followed by KL sums, each with its plausible
 * range). */
int kv_tasks_run_ranges(kv_tasks *t, long n_tasks, int n_out, const double *lo, const double *hi,
                        kv_task_fn fn, void *user, double *results, kv_error *err);

/* The task log's name for the output `out` into path[cap]: "OUT.tasks", or, when that base
 * name would exceed NAME_MAX (255 bytes), OUT's directory, the first 232 bytes of its base
 * name, "." and 16 hex digits of the SHA-256 of the whole base name, ".tasks". Errors:
 * KV_EINPUT (no name, path longer than cap). */
int kv_tasks_log_path(const char *out, char *path, size_t cap, kv_error *err);

/* Resume (docs/design.md "Past one machine"): a task log at `path` (rank 0 writes it; other ranks
 * ignore these calls). From now on every finished task of every kv_tasks_run call is appended
 * to the log as (call number, task index, results) and fsync'd, so a killed run loses at most
 * the tasks that were running.
 *
 * `key` (one line, at most KV_TASKS_KEY_MAX characters) names the run: fields "name=value"
 * separated by spaces, which should cover everything the results depend on (the CLI's: the
 * log format, the build's schema, a hash of the command line, the SHA-256 of the model, the
 * profile, the text and the token ids). With resume = 1 and a log whose key equals `key`, the
 * logged results are taken instead of running their tasks again (a torn last record is cut
 * off); the calls must come in the same order with the same task lists, which a deterministic
 * command guarantees. A log with another key is refused naming the fields that differ; a
 * complete record that is invalid (header out of range, a non-finite value, a step number
 * going back, a repeated task, a record whose CRC-32 does not match) refuses the log. Without
 * resume, or without a log, a new log is made: its header written to a fresh temporary file
 * (kv_temp_create: O_EXCL | O_NOFOLLOW) and renamed over `path`, so an old log is replaced
 * (kv_tasks_log_discarded says so) and nothing planted there is written; where there was no
 * log it is linked (link(2)) instead, so a log another run made meanwhile is refused, not
 * replaced.
 *
 * The open log is locked (flock, exclusive) until it is closed: a second run on the same
 * output, with or without resume, is refused while the first holds it (KV_EINPUT).
 *
 * The name must be free or a regular file (never followed when a symbolic link, never opened
 * when a FIFO or device: refused) and not one of inputs[n_inputs] (same st_dev / st_ino; NULL
 * entries skipped): the log is never an input.
 *
 * Errors: KV_EINPUT (the name is refused, the log cannot be read or belongs to another run,
 * or is damaged: the message names the file and what to do); KV_EINTERNAL (the header cannot
 * be written, e.g. a full disk: no log is left). A failed append fails the kv_tasks_run call
 * with KV_EINTERNAL. */
int kv_tasks_log_open(kv_tasks *t, const char *path, const char *key, int resume,
                      const char *const *inputs, int n_inputs, kv_error *err);
/* Close the log; remove = 1 deletes it (the run finished and its output is written) when the
 * name still holds the file this run wrote (same st_dev / st_ino), never another run's. */
void kv_tasks_log_close(kv_tasks *t, int remove);
/* After kv_tasks_log_open without resume: the size in bytes (>= 1) of an earlier run's log
 * that was replaced (an interrupted run's finished tasks, discarded), else 0. */
long kv_tasks_log_discarded(const kv_tasks *t);
/* Tasks of the kv_tasks_run calls so far taken from the log instead of being run. */
long kv_tasks_resumed(const kv_tasks *t);

/* An integer agreed by all ranks: rank 0's value of v is returned on every rank (v itself
 * without MPI). Used to make every rank exit with rank 0's code. The other ranks wait for it
 * quietly (see below), so rank 0 has the cores to itself meanwhile (e.g. for the hardware
 * probes of `kvplan profile`). Collective under MPI. */
int kv_tasks_bcast_int(const kv_tasks *t, int v);

/* Agree on success before a collective step: returns KV_OK on every rank when rc is KV_OK on
 * every rank; else the code of the lowest failing rank, and err (on every rank) gets that
 * rank's message, prefixed with "rank R: " when R is not this rank. rc itself without MPI.
 * Collective under MPI. */
int kv_tasks_agree(const kv_tasks *t, int rc, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
