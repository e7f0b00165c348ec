/* Tests of runtime/util/tasks.c (the task model of docs/design.md "Past one machine") and of
 * `kvplan search` (grid, sensitivity, held-out) and `kvplan profile` under mpirun: the file of
 * an MPI run equals the one-process run's
 * (every dataset bit for bit; only the attributes command, created and the timings may differ),
 * on the real stories260K model with a profile the profiler measured. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvplan/tasks.h"
#include "testutil.h"

/* A task whose value depends only on its index; task `fail_at` fails. */
typedef struct sq_user {
    long fail_at;
    long calls;
} sq_user;

static int sq_task(void *user, long task, double *out, kv_error *err) {
    sq_user *u = user;
    u->calls++;
    if (task == u->fail_at) return kv_fail(err, KV_EINPUT, "task %ld refused", task);
    out[0] = (double)task * task;
    out[1] = -(double)task;
    return KV_OK;
}

static void test_local(void) {
    kv_error e;
    kv_tasks *t = NULL;
    /* ctest does not start this process through a launcher: one process */
    CU_ASSERT_EQUAL_FATAL(kv_tasks_init(NULL, NULL, &t, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_tasks_rank(t), 0);
    CU_ASSERT_EQUAL(kv_tasks_size(t), 1);
    CU_ASSERT_EQUAL(kv_tasks_rank(NULL), 0);
    CU_ASSERT_EQUAL(kv_tasks_size(NULL), 1);
    double r[2 * 7];
    sq_user u = {.fail_at = -1};
    CU_ASSERT_EQUAL(kv_tasks_run(t, 7, 2, sq_task, &u, r, &e), KV_OK);
    CU_ASSERT_EQUAL(u.calls, 7);
    for (int i = 0; i < 7; i++) {
        CU_ASSERT_DOUBLE_EQUAL(r[2 * i], (double)i * i, 0);
        CU_ASSERT_DOUBLE_EQUAL(r[2 * i + 1], -(double)i, 0);
    }
    /* the first failing task stops the run and its error comes back */
    sq_user f = {.fail_at = 3};
    CU_ASSERT_EQUAL(kv_tasks_run(NULL, 7, 2, sq_task, &f, r, &e), KV_EINPUT);
    CU_ASSERT_EQUAL(f.calls, 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "task 3 refused"));
    CU_ASSERT_EQUAL(kv_tasks_run(t, 0, 2, sq_task, &u, r, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_tasks_run(t, 3, 0, sq_task, &u, r, &e), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_tasks_agree(t, KV_OK, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_tasks_bcast_int(t, 5), 5);
    kv_tasks_finalize(t);
}

/* ------------------------------------------------------------ under mpirun ---- */

/* mpirun as this container needs it: root allowed, more ranks than cores, shared memory,
 * yielding the CPU while waiting (the ranks share 2 cores); --noprefix because Open MPI
 * refuses the prefix "/" it infers from /usr/bin/mpirun. In the sanitizer build LeakSanitizer
 * is off for the ranks: Open MPI's own allocations outlive MPI_Finalize and would be reported
 * (the one-process runs of the same commands keep the leak check). */
#define MPI_ENV                                                                                    \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "           \
    "OMPI_MCA_mpi_yield_when_idle=1 ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 "
static const char *mpirun(int np) {
    static char buf[1024];
    snprintf(buf, sizeof buf, MPI_ENV "'%s' --noprefix --oversubscribe -np %d '%s'", KVPLAN_MPIEXEC,
             np, KVPLAN_BINARY);
    return buf;
}

static int have_mpi(void) {
    return KVPLAN_MPIEXEC[0] != '\0';
}

/* h5diff a b lists only the attributes a run may change: command, created and the timings
 * (seconds, grid_seconds, curve_seconds, the /search/timing group's per-stage wall and CPU
 * seconds; a profile's profile_tokens_per_s). */
static int same_plan_file(const char *a, const char *b) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "h5diff '%s' '%s' 2>&1", a, b);
    int rc = tu_run_sh(cmd, &out);
    int ok = out && (rc == 0 || rc == 1);
    for (char *l = out; ok && l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        if (!strncmp(l, "dataset:", 8) || !strncmp(l, "group:", 6) || strstr(l, "Not comparable"))
            ok = 0;
        if (!strncmp(l, "attribute:", 10) && !strstr(l, "<command of") &&
            !strstr(l, "<created of") && !strstr(l, "seconds of") &&
            !strstr(l, "<profile_tokens_per_s of") && !strstr(l, "of </search/timing>>"))
            ok = 0;
        if (!ok) fprintf(stderr, "h5diff %s %s: %s\n", a, b, l);
        l = nl ? nl + 1 : NULL;
    }
    free(out);
    return ok;
}

static const char *model(void) {
    return tu_shared("models/stories260K/stories260K.bin");
}
static const char *tokenizer(void) {
    return tu_shared("models/stories260K/tok512.bin");
}

static int ensure_profile(void) {
    static int done = 0;
    if (done) return 1;
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "profile %s --tokenizer %s --prompts 2 --no-hw --quiet -o %s",
             model(), tokenizer(), tu_tmp("profile.h5"));
    int rc = tu_run_kvplan(args, &out, 1);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    free(out);
    done = rc == 0;
    return done;
}

/* The search arguments of the equality tests (small: 4 search chunks, 1 held-out chunk). The
 * BaKlaVa grid alone (sens = 0): its chunk evaluations are the tasks. With sens = 1 the default
 * `--allocation both`: the grid, then sensitivity planning, whose batched passes and
 * verification chunks are tasks too (C = 128 and few levels keep it to seconds; at R = 1/4 its
 * second round's solution wins the plan, so the held-out stage evaluates both allocations). */
static void search_args(char *buf, size_t cap, int sens, const char *extra, const char *out) {
    snprintf(buf, cap,
             "search --model %s --tokenizer %s --profile %s --text %s %s "
             "--t-grid 0.6:0.9:0.1 --r-grid 0.2,0.5 --quiet %s -o %s",
             model(), tokenizer(), tu_tmp("profile.h5"), tu_shared("text/tinystories_val_head.txt"),
             sens ? "--ratio 0.25 --context 128 --eval-tokens 512 --heldout-tokens 128 "
                    "--calib-chunks 1 --sens-levels 6 --sens-rounds 2 --sens-batch 8"
                  : "--ratio 0.125 --allocation baklava --eval-tokens 2048 --heldout-tokens 512",
             extra, out);
}

static void check_search_equal(int sens, const char *extra, const char *tag) {
    char args[8192], cmd[12288], one[256], many[300], *out = NULL;
    snprintf(one, sizeof one, "%s", tu_tmp(tag));
    snprintf(many, sizeof many, "%s.np3", one);
    search_args(args, sizeof args, sens, extra, one);
    int rc = tu_run_kvplan(args, &out, 1);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    if (sens) /* the case this test is for: the sensitivity solution is the plan */
        CU_ASSERT_PTR_NOT_NULL(out ? strstr(out, "allocation   sensitivity") : NULL);
    free(out);
    search_args(args, sizeof args, sens, extra, many);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", mpirun(3), args);
    rc = tu_run_sh(cmd, &out);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    /* rank 0 alone prints the summary */
    const char *p1 = out ? strstr(out, "plan    ") : NULL;
    CU_ASSERT_PTR_NOT_NULL(p1);
    if (p1) CU_ASSERT_PTR_NULL(strstr(p1 + 1, "plan    "));
    free(out);
    CU_ASSERT_TRUE(same_plan_file(one, many));
}

static void test_mpi_search_exhaustive(void) {
    if (!have_mpi()) {
        fprintf(stderr, "(no MPI in this build: skipped)\n");
        return;
    }
    CU_ASSERT_TRUE_FATAL(ensure_profile());
    check_search_equal(0, "", "exh.h5");
}

static void test_mpi_search_halving(void) {
    if (!have_mpi()) return;
    CU_ASSERT_TRUE_FATAL(ensure_profile());
    check_search_equal(0, "--halving 2", "sh.h5");
}

/* --allocation both: the sensitivity stage (curves, verification, refinement) and the held-out
 * stage split among the ranks give the one-process file */
static void test_mpi_search_sensitivity(void) {
    if (!have_mpi()) return;
    CU_ASSERT_TRUE_FATAL(ensure_profile());
    check_search_equal(1, "", "sens.h5");
}

/* `kvplan profile` under mpirun -np 3 (the prompts split among the ranks) writes the
 * one-process profile: 5 prompts, so ranks get different numbers of them */
static void test_mpi_profile(void) {
    if (!have_mpi()) return;
    char args[4096], cmd[8192], *out = NULL;
    const char *one = tu_tmp("prof1.h5");
    char many[300];
    snprintf(many, sizeof many, "%s.np3", one);
    snprintf(args, sizeof args, "profile %s --tokenizer %s --prompts 5 --prompt-len 96 --no-hw",
             model(), tokenizer());
    snprintf(cmd, sizeof cmd, "%s --quiet -o %s", args, one);
    int rc = tu_run_kvplan(cmd, &out, 1);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s %s -o %s 2>&1", mpirun(3), args, many);
    rc = tu_run_sh(cmd, &out);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    /* rank 0 alone reports */
    const char *w = out ? strstr(out, "kvplan profile: wrote") : NULL;
    CU_ASSERT_PTR_NOT_NULL(w);
    if (w) CU_ASSERT_PTR_NULL(strstr(w + 1, "kvplan profile: wrote"));
    free(out);
    CU_ASSERT_TRUE(same_plan_file(one, many));
}

/* An input error on every rank: one message (rank 0's), exit 1, no output file, and an old
 * output file stays as it was. */
static void test_mpi_error(void) {
    if (!have_mpi()) return;
    char args[8192], cmd[12288], *out = NULL;
    const char *keep = tu_tmp("keep.h5");
    FILE *f = fopen(keep, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("old", f);
    fclose(f);
    snprintf(args, sizeof args,
             "search --model %s --tokenizer %s --profile %s --text %s --ratio 0.125 --allocation "
             "baklava "
             "--eval-tokens 2048 --heldout-tokens 512 --quiet -o %s",
             model(), tokenizer(), tu_tmp("no-such-profile.h5"),
             tu_shared("text/tinystories_val_head.txt"), keep);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", mpirun(3), args);
    int rc = tu_run_sh(cmd, &out);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    const char *m1 = out ? strstr(out, "kvplan search:") : NULL;
    CU_ASSERT_PTR_NOT_NULL(m1);
    if (m1) CU_ASSERT_PTR_NULL(strstr(m1 + 1, "kvplan search:"));
    if (m1) CU_ASSERT_PTR_NOT_NULL(strstr(m1, "no-such-profile.h5"));
    free(out);
    char got[8] = {0};
    f = fopen(keep, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(fread(got, 1, sizeof got - 1, f), 3);
    fclose(f);
    CU_ASSERT_STRING_EQUAL(got, "old");
}

/* Resume: a run killed (SIGKILL) after some tasks were logged leaves no plan file and its
 * task log; the same command with --resume (under mpirun -np 3 when there is MPI) takes the
 * logged tasks, writes the same file as an uninterrupted run and removes the log. */
static void test_resume(void) {
    CU_ASSERT_TRUE_FATAL(ensure_profile());
    char args[8192], cmd[12288], full[256], part[256], log[300], *out = NULL;
    snprintf(full, sizeof full, "%s", tu_tmp("resume-full.h5"));
    snprintf(part, sizeof part, "%s", tu_tmp("resume-part.h5"));
    snprintf(log, sizeof log, "%s.tasks", part);
    search_args(args, sizeof args, 0, "", full);
    int rc = tu_run_kvplan(args, &out, 1);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    free(out);
    struct stat st;
    CU_ASSERT_NOT_EQUAL(stat(tu_tmp("resume-full.h5.tasks"), &st), 0); /* none left behind */
    unlink(part);
    unlink(log);
    search_args(args, sizeof args, 0, "", part);
    snprintf(cmd, sizeof cmd, "exec '%s' %s >/dev/null 2>&1", KVPLAN_BINARY, args);
    /* kill it once 8 tasks are logged (a record: 16-byte header, one double, a CRC-32) */
    CU_ASSERT_EQUAL_FATAL(tu_kill_when_logged(cmd, log, 2, 8 * 28), 1); /* killed part-way */
    CU_ASSERT_NOT_EQUAL(stat(part, &st), 0);                            /* no partial plan file */
    CU_ASSERT_EQUAL_FATAL(stat(log, &st), 0);
    /* resume (not --quiet: it reports the tasks it took from the log) */
    search_args(args, sizeof args, 0, "--resume", part);
    char *q = strstr(args, "--quiet");
    if (q) memset(q, ' ', 7);
    if (have_mpi())
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", mpirun(3), args);
    else
        snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVPLAN_BINARY, args);
    rc = tu_run_sh(cmd, &out);
    CU_ASSERT_EQUAL(rc, 0);
    const char *taken = out ? strstr(out, "chunk evaluations taken from") : NULL;
    CU_ASSERT_PTR_NOT_NULL(taken);
    if (rc || !taken) fprintf(stderr, "%s\n", out ? out : "");
    if (taken) { /* at least the 8 tasks the kill waited for */
        const char *p = taken;
        while (p > out && p[-1] != ' ') p--;
        while (p > out && p[-1] == ' ') p--;
        while (p > out && p[-1] >= '0' && p[-1] <= '9') p--;
        CU_ASSERT_TRUE(atol(p) >= 8);
    }
    free(out);
    CU_ASSERT_TRUE(same_plan_file(full, part));
    CU_ASSERT_NOT_EQUAL(stat(log, &st), 0); /* the finished run removed its log */
    /* a log of another run is refused by name */
    FILE *f = fopen(log, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("kvplan task log 3\nformat=search-1 command=other\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVPLAN_BINARY, args);
    rc = tu_run_sh(cmd, &out);
    CU_ASSERT_EQUAL(rc, 1);
    CU_ASSERT_PTR_NOT_NULL(out ? strstr(out, "belongs to another run") : NULL);
    free(out);
    unlink(log);
}

/* ---- faults: this binary under mpirun (argv "--mpi-fault fail|die") ---- */

typedef struct fault_user {
    int rank;
    const char *mode;
} fault_user;

/* Rank 2 refuses (fail) or dies in (die) every task it gets; the others compute squares. */
static int fault_task(void *user, long task, double *out, kv_error *err) {
    fault_user *u = user;
    if (u->rank == 2 && !strcmp(u->mode, "die")) _exit(3);
    if (u->rank == 2) return kv_fail(err, KV_EINPUT, "refused on purpose");
    struct timespec ts = {0, 20000000}; /* 20 ms: every rank gets tasks */
    nanosleep(&ts, NULL);
    out[0] = (double)task * task;
    return KV_OK;
}

static int fault_main(const char *mode) {
    kv_error e;
    kv_tasks *t = NULL;
    if (kv_tasks_init(NULL, NULL, &t, &e)) return 2;
    fault_user u = {kv_tasks_rank(t), mode};
    double r[64];
    int rc = kv_tasks_run(t, 64, 1, fault_task, &u, r, &e);
    if (rc && kv_tasks_rank(t) == 0) fprintf(stderr, "fault run: %s\n", e.msg);
    kv_tasks_finalize(t);
    return rc ? 1 : 0;
}

static const char *self_path;

static void test_mpi_faults(void) {
    if (!have_mpi()) return;
    char cmd[4096], *out = NULL;
    /* a worker's error fails the run on every rank, naming rank and task, without a hang */
    snprintf(cmd, sizeof cmd,
             MPI_ENV "timeout 300 '%s' --noprefix --oversubscribe -np 3 '%s' --mpi-fault fail 2>&1",
             KVPLAN_MPIEXEC, self_path);
    int rc = tu_run_sh(cmd, &out);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    CU_ASSERT_NOT_EQUAL(rc, 124); /* not the timeout */
    CU_ASSERT_PTR_NOT_NULL(out ? strstr(out, "fault run: rank 2, task ") : NULL);
    CU_ASSERT_PTR_NOT_NULL(out ? strstr(out, "refused on purpose") : NULL);
    free(out);
    /* a worker that dies: mpirun ends the job with an error, no hang */
    snprintf(cmd, sizeof cmd,
             MPI_ENV "timeout 300 '%s' --noprefix --oversubscribe -np 3 '%s' --mpi-fault die 2>&1",
             KVPLAN_MPIEXEC, self_path);
    rc = tu_run_sh(cmd, &out);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    CU_ASSERT_NOT_EQUAL(rc, 124);
    if (rc == 0 || rc == 124) fprintf(stderr, "%s\n", out ? out : "");
    free(out);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--mpi-fault")) return fault_main(argv[2]);
    self_path = argv[0];
    static const tu_test tests[] = {
        {"local task loop", test_local},
        {"mpirun -np 3 search = one process (exhaustive)", test_mpi_search_exhaustive},
        {"mpirun -np 3 search = one process (successive halving)", test_mpi_search_halving},
        {"mpirun -np 3 search = one process (grid + sensitivity)", test_mpi_search_sensitivity},
        {"mpirun -np 3 profile = one process", test_mpi_profile},
        {"mpirun -np 3 input error: one message, old output intact", test_mpi_error},
        {"killed run, --resume: same file, log removed", test_resume},
        {"mpirun -np 3: a failing or dying worker fails the run", test_mpi_faults},
    };
    return tu_main(argc, argv, "tasks", tests, sizeof tests / sizeof tests[0]);
}
