/* kvplan's public API in one include: models and tokenizers, the paged per-head KV cache, plans
 * (plan.h5), the engine and its backends, the serving scheduler, evaluation, the profiler and
 * the planner.
 *
 * A program that only reads and validates plans needs kvplan/plan.h; this header is for those
 * that want everything. Link with `pkg-config --libs kvplan` or CMake's
 * `find_package(kvplan)` + `target_link_libraries(app kvplan::kvplan)`; examples/ shows both.
 * Each header documents its own shapes, units, ownership and errors. */
#ifndef KVPLAN_KVPLAN_H
#define KVPLAN_KVPLAN_H

#include "kvplan/alloc.h"
#include "kvplan/backend.h"
#include "kvplan/batch.h"
#include "kvplan/chat.h"
#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/estimate.h"
#include "kvplan/eval.h"
#include "kvplan/generate.h"
#include "kvplan/h5io.h"
#include "kvplan/hwprobe.h"
#include "kvplan/kvcache.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/profiler.h"
#include "kvplan/quant.h"
#include "kvplan/retrieval.h"
#include "kvplan/robust.h"
#include "kvplan/sched.h"
#include "kvplan/search.h"
#include "kvplan/sensitivity.h"
#include "kvplan/tasks.h"
#include "kvplan/tokenizer.h"
#include "kvplan/workers.h"

#endif
