/* The C pool's task interface (_product_pool.c runs it), for the other C
   kernels (_elementwise.c's chains and row sums): a kernel splits its work
   into `count` tasks, each a call fn(arg, i) that touches only its own part
   of the result, and the pool runs them on the caller and its helper
   threads without the interpreter lock (the caller releases it around
   run). One job uses the helpers at a time; a job that finds them busy
   (another Python thread's kernel) runs its tasks on the caller alone, in
   order, with the same results.

   _product_pool publishes a task_pool_api in the capsule TASK_POOL_CAPSULE
   (PyCapsule_Import); the version guards a stale build of one module
   beside a new build of the other (an editable install not rebuilt). */

#ifndef KERAS_IPU_TASK_POOL_H
#define KERAS_IPU_TASK_POOL_H

#include <stdint.h>

#define TASK_POOL_CAPSULE "keras_ipu.device.native._product_pool._task_pool"
#define TASK_POOL_VERSION 1

typedef void (*task_fn)(void *arg, int64_t task);

typedef struct {
    int version;
    /* Runs fn(arg, 0) .. fn(arg, count - 1) on the caller and up to
       threads - 1 helpers; returns when all are done. Sets *caller_ran
       (tasks the caller ran), *own_ns (the caller's time on them) and
       *wait_ns (its wait for the helpers' last tasks): the Python side's
       back-off reads them (threads.py). Call it without the GIL. */
    void (*run)(task_fn fn, void *arg, int64_t count, int threads, int64_t *caller_ran,
                int64_t *own_ns, int64_t *wait_ns);
} task_pool_api;

#endif
