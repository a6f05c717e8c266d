/* The C pool's task interface (_product_pool.c runs it), for the other C
   kernels (_elementwise.c's chains and row sums): a kernel splits its work
   into `count` tasks, each a call fn(arg, i) that touches only its own part
   of the result, and the pool runs them on the caller and its helper
   threads without the interpreter lock (the caller releases it around
   run). One job uses the helpers at a time; a job that finds them busy
   (another Python thread's kernel) runs its tasks on the caller alone, in
   order, with the same results.

   A job may also be launched (submit) and joined later: one task a helper
   runs while the caller goes on with Python, as a training step's weight
   gradient and its optimizer update run beside the next layer's products
   (compiler/concurrent_steps.py). The caller runs it at the join where no
   helper took it. No Python and no interpreter lock in it: a job launched
   on a Python thread took the lock back after each of its kernels, and
   beside a busy run loop waited for it (issue 16, eleventh pass).

   _product_pool publishes a task_pool_api in the capsule TASK_POOL_CAPSULE
   (PyCapsule_Import); the version guards a stale build of one module
   beside a new build of the other (an editable install not rebuilt). */

#ifndef KERAS_IPU_TASK_POOL_H
#define KERAS_IPU_TASK_POOL_H

#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>

#define TASK_POOL_CAPSULE "keras_ipu.device.native._product_pool._task_pool"
#define TASK_POOL_VERSION 3

typedef void (*task_fn)(void *arg, int64_t task);

/* A launched job: fn(arg, 0) once, on a helper or at the join on the
   caller. The caller owns it (and keeps it alive) from submit to join. */
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };
typedef struct launched_job {
    task_fn fn;
    void *arg;
    atomic_int state;
    int64_t cpu_ns; /* the thread CPU time fn took */
    struct launched_job *next; /* the pool's queue */
} launched_job;

typedef struct {
    int version;
    /* Runs fn(arg, 0) .. fn(arg, count - 1) on the caller and up to
       threads - 1 helpers; returns when all are done. Sets *caller_ran
       (tasks the caller ran), *own_ns (the caller's time on them) and
       *wait_ns (its wait for the helpers' last tasks): the Python side's
       back-off reads them (threads.py). Call it without the GIL. */
    void (*run)(task_fn fn, void *arg, int64_t count, int threads, int64_t *caller_ran,
                int64_t *own_ns, int64_t *wait_ns);
    /* Queues the job for a helper (starting one if none is) and returns at
       once. Without the GIL or with it. */
    void (*submit)(launched_job *job);
    /* Returns when the job is done: the caller runs it if no helper has
       taken it (*caller_ran 1; 2 where the helpers were on this caller's
       earlier launched jobs meanwhile, busy rather than late), else waits
       for it (*wait_ns). Call it without the GIL. */
    void (*join)(launched_job *job, int64_t *caller_ran, int64_t *wait_ns);
    /* A whole product out = x @ y as NumPy's matmul computes it (one
       single-threaded gemm call: its bits), bound to the buffers it holds:
       NULL where the C pool cannot take the operands (no error set), as
       _product_pool.product() returns None. With the GIL. */
    void *(*bind_product)(PyObject *x, PyObject *y, PyObject *out);
    void (*run_product)(void *bound);     /* without the GIL */
    void (*release_product)(void *bound); /* with the GIL */
    /* run_product writing into c (bytes for the whole result, C order) in
       place of the bound out: a weight gradient read only by the update
       launched with it (_elementwise.c pair_task). Without the GIL. */
    void (*run_product_into)(void *bound, char *c);
} task_pool_api;

/* For the pool's users (_elementwise.c, _pooling.c): the pool, looked up
   at the first split call; NULL where _product_pool is missing or another
   build (then a split call runs its tasks in order on the caller: the same
   results). Each module that includes this has its own copy. */
static inline const task_pool_api *task_pool(void) {
    static const task_pool_api *pool;
    static int looked_up;
    if (!looked_up) {
        looked_up = 1;
        const task_pool_api *api = (const task_pool_api *)PyCapsule_Import(TASK_POOL_CAPSULE, 0);
        if (api == NULL) PyErr_Clear();
        else if (api->version == TASK_POOL_VERSION) pool = api;
    }
    return pool;
}


/* Runs fn(arg, 0) .. fn(arg, count - 1) without the GIL (call it with the
   GIL): on the pool where there is one and threads > 1 and count > 1,
   else in order on the caller alone (*ran = count). Stats as run's. */
static inline void run_tasks(task_fn fn, void *arg, int64_t count, int threads, int64_t *ran,
                             int64_t *own, int64_t *wait) {
    const task_pool_api *api = threads > 1 && count > 1 ? task_pool() : NULL;
    Py_BEGIN_ALLOW_THREADS
    if (api != NULL) {
        api->run(fn, arg, count, threads, ran, own, wait);
    } else {
        for (int64_t i = 0; i < count; i++) fn(arg, i);
        *ran = count;
        *own = *wait = 0;
    }
    Py_END_ALLOW_THREADS
}

/* A split call's result: a tuple of `lead` items, for the caller to set,
   then (caller tasks, its own seconds, its wait), as
   threads.note_pool_split reads its last three; NULL with the error set.
   Built item by item: Py_BuildValue parses its format string on every
   call, a cost of every split kernel call (benchmarks/README.md, issue 16
   seventeenth pass). */
static inline PyObject *split_stats_after(Py_ssize_t lead, int64_t ran, int64_t own_ns,
                                          int64_t wait_ns) {
    PyObject *stats = PyTuple_New(lead + 3), *item;
    if (stats == NULL) return NULL;
    if ((item = PyLong_FromLongLong((long long)ran)) == NULL) goto fail;
    PyTuple_SET_ITEM(stats, lead, item);
    if ((item = PyFloat_FromDouble(own_ns * 1e-9)) == NULL) goto fail;
    PyTuple_SET_ITEM(stats, lead + 1, item);
    if ((item = PyFloat_FromDouble(wait_ns * 1e-9)) == NULL) goto fail;
    PyTuple_SET_ITEM(stats, lead + 2, item);
    return stats;
fail:
    Py_DECREF(stats); /* its unset items are NULL: the tuple skips them */
    return NULL;
}

/* (caller tasks, its own seconds, its wait): split_stats_after's alone. */
static inline PyObject *split_stats(int64_t ran, int64_t own_ns, int64_t wait_ns) {
    return split_stats_after(0, ran, own_ns, wait_ns);
}

/* A kernel's result where `threads` says whether it split: True (one
   thread), or the split's stats. */
static inline PyObject *split_result(int threads, int64_t ran, int64_t own_ns, int64_t wait_ns) {
    if (threads <= 1) Py_RETURN_TRUE;
    return split_stats(ran, own_ns, wait_ns);
}

/* A split call's rows (columns, elements) per task: at least 1 where it
   splits (threads > 1); else a ValueError `message`. */
static inline int split_size_ok(int threads, Py_ssize_t per_task, const char *message) {
    if (threads > 1 && per_task < 1) {
        PyErr_SetString(PyExc_ValueError, message);
        return 0;
    }
    return 1;
}

#endif
