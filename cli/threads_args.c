/* --threads: one option group for every command that computes (cli/cli.h). */
#include <stddef.h>

#include "cli.h"
#include "kvplan/workers.h"

const kv_opt kv_threads_opts[KV_THREADS_OPTS_N] = {
    {"--threads", NULL, KV_OPT_INT, offsetof(kv_threads_args, threads), "N", 1, KV_WORKERS_MAX,
     .help = "CPU threads for the matmuls and attention (one persistent pool; OpenBLAS runs on "
             "the pool's threads, one each). Default: the CPUs this process may run on "
             "(sched_getaffinity). The results are the same bits for every N"},
};

int kv_threads_args_count(const kv_threads_args *a) {
    return a->threads > 0 ? (int)a->threads : kv_cpus_available();
}
