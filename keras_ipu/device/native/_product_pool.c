/* A thread pool of C threads for the NumPy engine's split products.

   The Python pool (threads.py) hands each block of a split product to a
   Python thread, which takes the interpreter lock to claim its block and
   again when its BLAS call returns: on a 2-core machine Keras'
   demo_functional (36 products of 17 MFLOP per step) ran on one core, and
   on 16 cores the splits did not scale (issue 16, benchmarks/README.md).
   Here the caller releases the lock once, from handing out the blocks to
   the join, and the blocks run on pthreads that never touch Python.

   Each block is one single-threaded cblas_sgemm call of the OpenBLAS
   NumPy itself calls (threads.py keeps it on one thread), on a row block
   or a column block of the product, with the arguments NumPy's matmul
   passes (row-major, the same transpose flags and leading dimensions):
   the caller (product_pool.py) picks blocks whose results are the bits
   of the whole product. float64 products call cblas_dgemm the same way
   (product_pool.py picks blocks of rows that give its bits there). Where
   the CPU has AVX-512 (set_native_gemm), float32 blocks run keras_ipu's
   own kernel instead (_gemm.h), whose blocks anywhere give the bits of
   its whole call (whole(): the engine's products on one thread).

   Blocks are handed out by an atomic counter and the caller takes blocks
   too, so a helper the OS does not schedule delays only a block it has
   claimed. Idle helpers spin for at most SPIN_NS, then sleep on a
   condition variable: no thread busy-waits while another process wants
   the core (issue 16, item 1).

   One job at a time uses the helpers; a second caller meanwhile (a
   user's own thread, a kernel the run loop launched) runs its blocks
   alone. After fork() the child has no helpers and starts new ones when
   it needs them.

   The pool runs any job of independent tasks (_task_pool.h): besides the
   products here, _elementwise.c's fused chains (element ranges) and row
   sums (column blocks) take the same helpers through the capsule this
   module publishes, so every C kernel of a step splits on one set of
   threads, none of them holding the interpreter lock. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "_buffers.h"
#include "_gemm.h"
#include "_task_pool.h"

/* CBLAS' enumerations (cblas.h). */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

/* OpenBLAS' 64-bit-integer CBLAS (NumPy's wheels: scipy_cblas_sgemm64_). */
typedef void (*sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float,
                         const float *, int64_t, const float *, int64_t, float,
                         float *, int64_t);
static sgemm_fn sgemm;
typedef void (*dgemm_fn)(int, int, int, int64_t, int64_t, int64_t, double,
                         const double *, int64_t, const double *, int64_t, double,
                         double *, int64_t);
static dgemm_fn dgemm;
/* float32 blocks run _gemm.h's kernel, not sgemm (set_native_gemm): its
   bits are the same for any block, of any size and layout. */
static int native_gemm;

/* One gemm call of NumPy's matmul, float32 or float64 by the item size. */
static void gemm(int64_t itemsize, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                 const char *a, int64_t lda, const char *b, int64_t ldb, char *c, int64_t ldc) {
#ifdef KERAS_IPU_GEMM_AVX512
    if (itemsize == 4 && native_gemm)
        native_sgemm_avx512(trans_a == TRANS, trans_b == TRANS, m, n, k, (const float *)a,
                            lda, (const float *)b, ldb, (float *)c, ldc);
    else
#endif
    if (itemsize == 4)
        sgemm(ROW_MAJOR, trans_a, trans_b, m, n, k, 1.0f, (const float *)a, lda,
              (const float *)b, ldb, 0.0f, (float *)c, ldc);
    else
        dgemm(ROW_MAJOR, trans_a, trans_b, m, n, k, 1.0, (const double *)a, lda,
              (const double *)b, ldb, 0.0, (double *)c, ldc);
}

/* A helper's spin before it sleeps, and the caller's before it sleeps
   waiting for the last block: about one thread wake-up on Linux (tens of
   microseconds), so a product that follows within that time finds its
   helper awake, and an idle helper costs its core at most that long. */
#define SPIN_NS 30000
#define MAX_HELPERS 255

/* A 2-d product split along rows (axis 0) or columns (axis 1) of the
   result, or into rectangles (axis 2: edges holds rows lo, hi, columns
   lo, hi of each block), or a batched one (batched: operands of (batches, rows, cols),
   split along the batches, each batch one whole sgemm as NumPy's matmul
   loop calls it for that batch: its bits whatever the split). Batches may
   lie on two axes (4-d operands of (outer, inner, rows, cols): attention's
   (batch, heads), whose transposed operands share no one batch stride);
   block edges then count the batches in C order, inner fastest. */
typedef struct {
    int trans_a, trans_b, axis, batched;
    int64_t m, n, k, lda, ldb, ldc;
    int64_t batch_a, batch_b, batch_c; /* bytes from one (outer) batch to the next */
    int64_t inner;                     /* batches on the inner axis (1: one axis) */
    int64_t inner_a, inner_b, inner_c; /* bytes from one inner batch to the next */
    const char *a, *b;
    char *c;
    int64_t itemsize;
    const int64_t *edges; /* count + 1 block edges along axis (or batches);
                             axis 2: count rectangles of 4 */
} product_t;

static void product_block(void *arg, int64_t i) {
    const product_t *p = (const product_t *)arg;
    int64_t lo = p->edges[i], hi = p->edges[i + 1], sz = p->itemsize;
    const char *a = p->a, *b = p->b;
    char *c = p->c;
    int64_t m = p->m, n = p->n;
    if (p->batched) {
        for (int64_t j = lo; j < hi; j++) {
            int64_t o = j / p->inner, i2 = j % p->inner;
            gemm(sz, p->trans_a, p->trans_b, m, n, p->k,
                 a + o * p->batch_a + i2 * p->inner_a, p->lda,
                 b + o * p->batch_b + i2 * p->inner_b, p->ldb,
                 c + o * p->batch_c + i2 * p->inner_c, p->ldc);
        }
        return;
    }
    if (p->axis == 2) { /* rows r0..r1 of A and C, columns c0..c1 of B and C */
        const int64_t *r = p->edges + 4 * i;
        a += (p->trans_a == NO_TRANS ? r[0] * p->lda : r[0]) * sz;
        b += (p->trans_b == NO_TRANS ? r[2] : r[2] * p->ldb) * sz;
        c += (r[0] * p->ldc + r[2]) * sz;
        m = r[1] - r[0];
        n = r[3] - r[2];
    } else if (p->axis == 0) { /* rows lo..hi of A and C */
        a += (p->trans_a == NO_TRANS ? lo * p->lda : lo) * sz;
        c += lo * p->ldc * sz;
        m = hi - lo;
    } else { /* columns lo..hi of B and C */
        b += (p->trans_b == NO_TRANS ? lo : lo * p->ldb) * sz;
        c += lo * sz;
        n = hi - lo;
    }
    gemm(sz, p->trans_a, p->trans_b, m, n, p->k, a, p->lda, b, p->ldb, c, p->ldc);
}

/* -- the pool ------------------------------------------------------------ */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t finished = PTHREAD_COND_INITIALIZER;
static int helpers;         /* started, under mu */
static int sleeping;        /* helpers waiting on `wake`, under mu */
static int caller_sleeping; /* the caller waits on `finished`, under mu */
static atomic_uint_fast64_t published; /* job sequence number */
/* The job's claim word: sequence (high 32 bits) | next block (low 32), so
   a helper that wakes late for a finished job cannot claim a block of the
   next one. */
static atomic_uint_fast64_t claim;
static atomic_int slots;    /* helpers still wanted by the job */
static atomic_int done;     /* blocks finished */
static int64_t job_count;
static task_fn job_fn;
static void *job_arg;
static atomic_flag in_use = ATOMIC_FLAG_INIT;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void pause_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The last split's timing (split_timing; benchmarks/split_timing.py): how
   late its helper came, and which thread its blocks kept waiting, the
   figures the caller's larger first block (product_pool.HELPER_LATE_FLOPS)
   is tuned on. A helper stamps when it claimed its first block of the job
   now published (0: none yet) and which block that was, and when it last
   finished a block; at the end of the job the caller keeps the helper's
   delay since the publication and how much later the thread that ran
   block 1 finished than the one that ran block 0. */
static atomic_llong helper_claim_ns, helper_end_ns, helper_block;
static atomic_llong last_delay_ns = -1, last_imbalance_ns;

/* Claims and runs blocks of job `seq`; returns how many it ran. A helper
   (`helper`) stamps its first claim and its last block's end. */
static int64_t work(uint64_t seq, int helper) {
    int64_t ran = 0;
    for (;;) {
        uint_fast64_t v = atomic_load_explicit(&claim, memory_order_acquire);
        if ((v >> 32) != (seq & 0xffffffffu) || (int64_t)(v & 0xffffffffu) >= job_count)
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&claim, &v, v + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* A claimed block holds the job open: job_fn and job_arg are this
           job's. */
        int64_t count = job_count;
        if (helper && ran == 0) {
            long long none = 0;
            if (atomic_compare_exchange_strong(&helper_claim_ns, &none, now_ns()))
                atomic_store(&helper_block, (long long)(v & 0xffffffffu));
        }
        job_fn(job_arg, (int64_t)(v & 0xffffffffu));
        if (helper) atomic_store(&helper_end_ns, now_ns());
        ran++;
        if (atomic_fetch_add_explicit(&done, 1, memory_order_acq_rel) + 1 == count) {
            pthread_mutex_lock(&mu);
            if (caller_sleeping) pthread_cond_signal(&finished);
            pthread_mutex_unlock(&mu);
        }
    }
}

/* -- launched jobs (_task_pool.h: submit, join) ---------------------------
   A queue under mu; helpers take them in order when no split job wants
   them. */
static launched_job *queue_head, *queue_tail;
static atomic_int queued;   /* jobs in the queue */
static int joiners;         /* callers waiting on `job_done`, under mu */
static int helpers_on_jobs; /* helpers running a launched job, under mu */
static pthread_cond_t job_done = PTHREAD_COND_INITIALIZER;

static int64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_job(launched_job *job) {
    int64_t cpu = thread_cpu_ns();
    job->fn(job->arg, 0);
    job->cpu_ns = thread_cpu_ns() - cpu;
}

/* Takes the first queued job off the queue (under mu), or NULL. */
static launched_job *dequeue(void) {
    launched_job *job = queue_head;
    if (job != NULL) {
        queue_head = job->next;
        if (queue_head == NULL) queue_tail = NULL;
        atomic_fetch_sub(&queued, 1);
        atomic_store(&job->state, JOB_RUNNING);
        helpers_on_jobs++;
    }
    return job;
}

static void run_queued(void) {
    while (atomic_load_explicit(&queued, memory_order_acquire) > 0) {
        pthread_mutex_lock(&mu);
        launched_job *job = dequeue();
        pthread_mutex_unlock(&mu);
        if (job == NULL) return;
        run_job(job);
        pthread_mutex_lock(&mu);
        helpers_on_jobs--;
        atomic_store_explicit(&job->state, JOB_DONE, memory_order_release);
        if (joiners) pthread_cond_broadcast(&job_done);
        pthread_mutex_unlock(&mu);
    }
}

static void *helper(void *unused) {
    (void)unused;
    uint64_t seen = atomic_load(&published);
    for (;;) {
        uint64_t seq = atomic_load_explicit(&published, memory_order_acquire);
        if (seq == seen && !atomic_load(&queued)) {
            int64_t until = now_ns() + SPIN_NS;
            while ((seq = atomic_load_explicit(&published, memory_order_acquire)) == seen
                   && !atomic_load_explicit(&queued, memory_order_acquire) && now_ns() < until)
                for (int i = 0; i < 64; i++) pause_cpu();
        }
        if (seq == seen && !atomic_load(&queued)) {
            pthread_mutex_lock(&mu);
            while ((seq = atomic_load(&published)) == seen && !atomic_load(&queued)) {
                sleeping++;
                pthread_cond_wait(&wake, &mu);
                sleeping--;
            }
            pthread_mutex_unlock(&mu);
        }
        if (seq != seen) {
            seen = seq;
            /* A slot taken late may be the next job's: work on the job now
               published (a stale sequence number would claim nothing). */
            if (atomic_fetch_sub(&slots, 1) > 0)
                work(atomic_load_explicit(&published, memory_order_acquire), 1);
        }
        run_queued();
    }
    return NULL;
}

/* Starts helpers up to `wanted`; returns how many there are. */
static int ensure_helpers(int wanted) {
    if (wanted > MAX_HELPERS) wanted = MAX_HELPERS;
    pthread_mutex_lock(&mu);
    while (helpers < wanted) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, helper, NULL);
        pthread_attr_destroy(&attr);
        if (failed) break;
        helpers++;
    }
    int have = helpers;
    pthread_mutex_unlock(&mu);
    return have;
}

static void after_fork_in_child(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    mu = m;
    wake = c;
    finished = c;
    job_done = c;
    helpers = sleeping = caller_sleeping = joiners = helpers_on_jobs = 0;
    /* The parent's queued jobs are its own: the child never joins them. */
    queue_head = queue_tail = NULL;
    atomic_store(&queued, 0);
    atomic_flag_clear(&in_use);
}

/* Runs fn(arg, 0 .. count - 1) on the caller and up to `threads` - 1
   helpers (task_pool_api.run: _task_pool.h). Sets *caller_ran and *own_ns
   (the caller's time on its tasks) and *wait_ns (its wait for the
   helpers' last tasks). */
static void pool_run(task_fn fn, void *arg, int64_t count, int threads,
                     int64_t *caller_ran, int64_t *own_ns, int64_t *wait_ns) {
    int64_t start = now_ns();
    int wanted = threads - 1;
    if (wanted > count - 1) wanted = (int)(count - 1);
    if (wanted > 0 && !atomic_flag_test_and_set(&in_use)) {
        int have = ensure_helpers(wanted);
        if (have < wanted) wanted = have;
        pthread_mutex_lock(&mu);
        uint64_t seq = atomic_load(&published) + 1;
        job_fn = fn;
        job_arg = arg;
        job_count = count;
        atomic_store(&done, 0);
        atomic_store(&slots, wanted);
        atomic_store(&helper_claim_ns, 0);
        int64_t published_at = now_ns();
        atomic_store_explicit(&claim, (uint_fast64_t)(seq & 0xffffffffu) << 32,
                              memory_order_release);
        atomic_store_explicit(&published, seq, memory_order_release);
        int asleep = sleeping;
        pthread_mutex_unlock(&mu);
        if (asleep >= wanted) {
            for (int i = 0; i < wanted; i++) pthread_cond_signal(&wake);
        } else if (asleep) {
            pthread_cond_broadcast(&wake);
        }
        *caller_ran = work(seq, 0);
        int64_t own = now_ns();
        *own_ns = own - start;
        int64_t until = own + SPIN_NS;
        while (atomic_load_explicit(&done, memory_order_acquire) < count && now_ns() < until)
            for (int i = 0; i < 64; i++) pause_cpu();
        if (atomic_load(&done) < count) {
            pthread_mutex_lock(&mu);
            caller_sleeping = 1;
            while (atomic_load(&done) < count) pthread_cond_wait(&finished, &mu);
            caller_sleeping = 0;
            pthread_mutex_unlock(&mu);
        }
        /* No helper claims a block of this job any more: the claim word
           says every block was taken. */
        atomic_store(&slots, 0);
        long long claimed = atomic_load(&helper_claim_ns);
        atomic_store(&last_delay_ns, claimed ? claimed - published_at : -1);
        if (claimed) {
            long long later = atomic_load(&helper_end_ns) - own;
            atomic_store(&last_imbalance_ns, atomic_load(&helper_block) ? later : -later);
        }
        atomic_flag_clear(&in_use);
        *wait_ns = now_ns() - own;
        return;
    }
    for (int64_t i = 0; i < count; i++) fn(arg, i);
    *caller_ran = count;
    *own_ns = now_ns() - start;
    *wait_ns = 0;
}

static void pool_submit(launched_job *job) {
    atomic_store(&job->state, JOB_QUEUED);
    job->cpu_ns = 0;
    job->next = NULL;
    ensure_helpers(1);
    pthread_mutex_lock(&mu);
    if (queue_tail != NULL) queue_tail->next = job;
    else queue_head = job;
    queue_tail = job;
    atomic_fetch_add_explicit(&queued, 1, memory_order_release);
    if (sleeping) pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
}

static void pool_join(launched_job *job, int64_t *caller_ran, int64_t *wait_ns) {
    int64_t start = now_ns();
    *caller_ran = 0;
    if (atomic_load_explicit(&job->state, memory_order_acquire) == JOB_QUEUED) {
        /* No helper took it: off the queue, and the caller runs it. Where
           the helpers were still on this caller's earlier launched jobs
           (one ahead in the queue, or one running) they were busy, not
           descheduled: *caller_ran 2, which threads.py does not count as a
           late helper (a step's backward launches more than one helper
           gets through, and the run loop joins the last launched first). */
        pthread_mutex_lock(&mu);
        int mine = atomic_load(&job->state) == JOB_QUEUED;
        int behind = mine && (queue_head != job || helpers_on_jobs > 0);
        if (mine) {
            launched_job **at = &queue_head, *prev = NULL;
            while (*at != job) {
                prev = *at;
                at = &(*at)->next;
            }
            *at = job->next;
            if (queue_tail == job) queue_tail = prev;
            atomic_fetch_sub(&queued, 1);
            atomic_store(&job->state, JOB_RUNNING);
        }
        pthread_mutex_unlock(&mu);
        if (mine) {
            run_job(job);
            atomic_store(&job->state, JOB_DONE);
            *caller_ran = behind ? 2 : 1;
            *wait_ns = 0;
            return;
        }
    }
    int64_t until = start + SPIN_NS;
    while (atomic_load_explicit(&job->state, memory_order_acquire) != JOB_DONE
           && now_ns() < until)
        for (int i = 0; i < 64; i++) pause_cpu();
    if (atomic_load_explicit(&job->state, memory_order_acquire) != JOB_DONE) {
        pthread_mutex_lock(&mu);
        joiners++;
        while (atomic_load(&job->state) != JOB_DONE) pthread_cond_wait(&job_done, &mu);
        joiners--;
        pthread_mutex_unlock(&mu);
    }
    *wait_ns = now_ns() - start;
}

/* -- Python ---------------------------------------------------------------- */

/* NumPy matmul's choice for an operand of rows x cols with these strides
   (numpy/_core/src/umath/matmul.c.src, is_blasable2d and
   matmul_matrixmatrix): untransposed where its rows are contiguous,
   transposed where its columns are; 0 when BLAS cannot take it. */
static int blas_layout(const Py_buffer *v, int64_t rows, int64_t cols, int *trans,
                       int64_t *ld) {
    /* The last two axes: a batched operand's matrices. */
    int64_t sz = v->itemsize, s0 = v->strides[v->ndim - 2], s1 = v->strides[v->ndim - 1];
    if (s1 == sz && s0 > 0 && s0 % sz == 0 && s0 / sz >= cols) {
        *trans = NO_TRANS;
        *ld = s0 / sz;
        return 1;
    }
    if (s0 == sz && s1 > 0 && s1 % sz == 0 && s1 / sz >= rows) {
        *trans = TRANS;
        *ld = s1 / sz;
        return 1;
    }
    return 0;
}

static PyObject *set_blas(PyObject *self, PyObject *args) {
    unsigned long long s, d = 0;
    if (!PyArg_ParseTuple(args, "K|K", &s, &d)) return NULL;
    sgemm = (sgemm_fn)(uintptr_t)s;
    dgemm = (dgemm_fn)(uintptr_t)d;
    Py_RETURN_NONE;
}

static PyObject *set_native_gemm(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    native_gemm = on && native_sgemm_available();
    return PyBool_FromLong(native_gemm);
}

/* Whether the pool can run out = x @ y in the blocks `edges` (edges_len
   bytes) along `axis` with NumPy's matmul's bits; fills *p and *count. */
static int check_product(const Py_buffer *x, const Py_buffer *y, const Py_buffer *out,
                         int axis, const int64_t *edges, int64_t edges_len, product_t *p,
                         int64_t *count) {
    int nd = x->ndim; /* 2, or 3 or 4: batched, split along the batches (axis 0) */
    char kind = format_code(x) == 'f' ? 'f' : 'd';
    int ours = kind == 'f' && native_gemm;
    int ok = (kind == 'f' ? sgemm != NULL || ours : dgemm != NULL)
             && (nd == 2 || nd == 3 || (nd == 4 && axis == 0)) && y->ndim == nd
             && out->ndim == nd
             && format_code(x) == kind && format_code(y) == kind
             && format_code(out) == kind
             && edges_len >= 16
             && (axis == 0 || ((axis == 1 || axis == 2) && nd == 2));
    if (!ok) return 0;
    int64_t batches = 1;
    for (int d = 0; d < nd - 2; d++) batches *= x->shape[d];
    p->batched = nd > 2;
    p->inner = nd == 4 ? x->shape[1] : 1;
    p->itemsize = x->itemsize;
    p->m = x->shape[nd - 2];
    p->k = x->shape[nd - 1];
    p->n = y->shape[nd - 1];
    p->a = x->buf;
    p->b = y->buf;
    p->c = out->buf;
    p->axis = axis;
    p->edges = edges;
    if (p->batched) {
        p->batch_a = x->strides[0];
        p->batch_b = y->strides[0];
        p->batch_c = out->strides[0];
        p->inner_a = nd == 4 ? x->strides[1] : 0;
        p->inner_b = nd == 4 ? y->strides[1] : 0;
        p->inner_c = nd == 4 ? out->strides[1] : 0;
    }
    *count = axis == 2 ? edges_len / 32 : edges_len / 8 - 1;
    int64_t extent = p->batched ? batches : axis ? p->n : p->m;
    ok = y->shape[nd - 2] == p->k && out->shape[nd - 2] == p->m && out->shape[nd - 1] == p->n
         && (!p->batched || (y->shape[0] == x->shape[0] && out->shape[0] == x->shape[0]))
         && (nd != 4 || (y->shape[1] == p->inner && out->shape[1] == p->inner && p->inner > 0))
         /* m, n or k of 1: NumPy's matmul calls gemv or dot, not gemm
            (our kernel: any size) */
         && (ours ? p->m > 0 && p->n > 0 && p->k > 0 : p->m > 1 && p->n > 1 && p->k > 1)
         && blas_layout(x, p->m, p->k, &p->trans_a, &p->lda)
         && blas_layout(y, p->k, p->n, &p->trans_b, &p->ldb)
         && out->strides[nd - 1] == p->itemsize && out->strides[nd - 2] % p->itemsize == 0
         && out->strides[nd - 2] / p->itemsize >= p->n
         /* x @ x.T: NumPy calls syrk, whose bits these blocks do not give */
         && (ours || x->buf != y->buf)
         && (axis == 2 ? edges_len % 32 == 0
                       : edges[0] == 0 && edges[*count] == extent);
    if (axis == 2) { /* rectangles inside the result that tile its area */
        int64_t area = 0;
        for (int64_t i = 0; ok && i < *count; i++) {
            const int64_t *r = edges + 4 * i;
            ok = 0 <= r[0] && r[0] < r[1] && r[1] <= p->m && 0 <= r[2] && r[2] < r[3]
                 && r[3] <= p->n && r[1] - r[0] > 1 && r[3] - r[2] > 1;
            area += (r[1] - r[0]) * (r[3] - r[2]);
            for (int64_t j = 0; ok && j < i; j++) { /* no two overlap */
                const int64_t *q = edges + 4 * j;
                ok = r[1] <= q[0] || q[1] <= r[0] || r[3] <= q[2] || q[3] <= r[2];
            }
        }
        ok = ok && area == p->m * p->n;
    } else {
        for (int64_t i = 0; ok && i < *count; i++) ok = edges[i] < edges[i + 1];
    }
    if (ok) p->ldc = out->strides[nd - 2] / p->itemsize;
    return ok;
}

static PyObject *product(PyObject *self, PyObject *args) {
    PyObject *x_obj, *y_obj, *out_obj, *edges_obj;
    int axis, threads;
    if (!PyArg_ParseTuple(args, "OOOiOi", &x_obj, &y_obj, &out_obj, &axis, &edges_obj,
                          &threads))
        return NULL;
    Py_buffer x, y, out, edges;
    int flags = PyBUF_STRIDES | PyBUF_FORMAT;
    if (PyObject_GetBuffer(x_obj, &x, flags) != 0) goto none_clear;
    if (PyObject_GetBuffer(y_obj, &y, flags) != 0) goto none_x;
    if (PyObject_GetBuffer(out_obj, &out, flags | PyBUF_WRITABLE) != 0) goto none_y;
    if (PyObject_GetBuffer(edges_obj, &edges, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        goto none_out;
    product_t p = {0};
    int64_t count = 0;
    if (edges.itemsize == 8
        && check_product(&x, &y, &out, axis, edges.buf, edges.len, &p, &count)) {
        int64_t ran = 0, own = 0, wait = 0;
        Py_BEGIN_ALLOW_THREADS
        pool_run(product_block, &p, count, threads, &ran, &own, &wait);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&edges);
        PyBuffer_Release(&out);
        PyBuffer_Release(&y);
        PyBuffer_Release(&x);
        return split_stats(ran, own, wait);
    }
    PyBuffer_Release(&edges);
none_out:
    PyBuffer_Release(&out);
none_y:
    PyBuffer_Release(&y);
none_x:
    PyBuffer_Release(&x);
none_clear:
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* A whole product bound to its buffers (task_pool_api.bind_product): one
   block of all rows, the one gemm call NumPy's matmul makes. */
typedef struct {
    product_t p;
    int64_t edges[2];
    Py_buffer x, y, out;
} bound_product;

/* The operands' buffers held with their whole product (one block of all
   rows; with `batches`, a 3-d or 4-d product's one block of all batches),
   or NULL (nothing held) where check_product refuses them. */
static bound_product *bind_whole(PyObject *x_obj, PyObject *y_obj, PyObject *out_obj,
                                 int batches) {
    bound_product *b = (bound_product *)calloc(1, sizeof(bound_product));
    if (b == NULL) return NULL;
    int flags = PyBUF_STRIDES | PyBUF_FORMAT;
    if (PyObject_GetBuffer(x_obj, &b->x, flags) != 0) goto none_clear;
    if (PyObject_GetBuffer(y_obj, &b->y, flags) != 0) goto none_x;
    if (PyObject_GetBuffer(out_obj, &b->out, flags | PyBUF_WRITABLE) != 0) goto none_y;
    int64_t count = 0;
    int nd = b->x.ndim;
    b->edges[0] = 0;
    b->edges[1] = nd == 2 ? b->x.shape[0] : -1;
    if (batches && nd > 2) {
        b->edges[1] = 1;
        for (int d = 0; d < nd - 2; d++) b->edges[1] *= b->x.shape[d];
    }
    if (b->edges[1] >= 0
        && check_product(&b->x, &b->y, &b->out, 0, b->edges, sizeof(b->edges), &b->p, &count)
        && count == 1)
        return b;
    PyBuffer_Release(&b->out);
none_y:
    PyBuffer_Release(&b->y);
none_x:
    PyBuffer_Release(&b->x);
none_clear:
    PyErr_Clear();
    free(b);
    return NULL;
}

static void *bind_product(PyObject *x_obj, PyObject *y_obj, PyObject *out_obj) {
    return bind_whole(x_obj, y_obj, out_obj, 0);
}

static void run_product(void *bound) { product_block(&((bound_product *)bound)->p, 0); }

/* The same gemm call writing into c, contiguous (ldc n), in place of the
   bound out: the same bits at another address. */
static void run_product_into(void *bound, char *c) {
    product_t p = ((bound_product *)bound)->p;
    p.c = c;
    p.ldc = p.n;
    product_block(&p, 0);
}

static void release_product(void *bound) {
    bound_product *b = (bound_product *)bound;
    PyBuffer_Release(&b->out);
    PyBuffer_Release(&b->y);
    PyBuffer_Release(&b->x);
    free(b);
}

/* out = x @ y whole on the caller, without the interpreter lock: the
   engine's products too small to split, with the bits of any split of
   them where float32 runs our kernel. */
static PyObject *whole(PyObject *self, PyObject *args) {
    PyObject *x_obj, *y_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO", &x_obj, &y_obj, &out_obj)) return NULL;
    bound_product *b = bind_whole(x_obj, y_obj, out_obj, 1);
    if (b == NULL) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    product_block(&b->p, 0);
    Py_END_ALLOW_THREADS
    release_product(b);
    Py_RETURN_TRUE;
}

static PyObject *helper_count(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&mu);
    int n = helpers;
    pthread_mutex_unlock(&mu);
    return PyLong_FromLong(n);
}

static PyObject *split_timing(PyObject *self, PyObject *unused) {
    return Py_BuildValue("dd", atomic_load(&last_delay_ns) * 1e-9,
                         atomic_load(&last_imbalance_ns) * 1e-9);
}

static PyMethodDef methods[] = {
    {"split_timing", split_timing, METH_NOARGS,
     "split_timing() -> (delay_s, imbalance_s) of the last split the pool "
     "ran on helpers: seconds from its publication to its first helper's "
     "first block (negative: no helper claimed one), and how much later "
     "the thread that ran block 1 finished than the one that ran block 0 "
     "(meaningful for two blocks, one each)."},
    {"set_blas", set_blas, METH_VARARGS,
     "set_blas(sgemm_address[, dgemm_address]): OpenBLAS' 64-bit-integer "
     "cblas_sgemm and cblas_dgemm (0: "
     "none) the blocks call."},
    {"product", product, METH_VARARGS,
     "product(x, y, out, axis, edges, threads) -> (caller_blocks, own_s, wait_s) "
     "or None: out = x @ y (2-d float32 or float64) as blocks along axis "
     "(0 rows, 1 columns) between the int64 edges, or (axis 2) as the "
     "rectangles edges lists (rows lo, hi, columns lo, hi each; they must "
     "tile the result) (3-d or 4-d, batched: axis 0, "
     "blocks of whole batches, counted in C order over both batch axes), on the caller and up to "
     "threads - 1 helpers, without the interpreter lock. None (nothing "
     "written) where BLAS or these blocks cannot take the operands."},
    {"set_native_gemm", set_native_gemm, METH_VARARGS,
     "set_native_gemm(on) -> whether float32 blocks now run keras_ipu's own "
     "AVX-512 kernel (_gemm.h) instead of sgemm: on and this CPU has "
     "AVX-512."},
    {"whole", whole, METH_VARARGS,
     "whole(x, y, out) -> True or None: out = x @ y (2-d, 3-d or 4-d as "
     "product takes them) in one block on the caller, without the "
     "interpreter lock; None (nothing written) where product would not take "
     "the operands."},
    {"helper_count", helper_count, METH_NOARGS, "Helper threads started."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_product_pool",
    "Split products on C threads, without the interpreter lock "
    "(see device/native/product_pool.py).", -1, methods,
};

static task_pool_api api = {TASK_POOL_VERSION, pool_run, pool_submit, pool_join,
                           bind_product, run_product, release_product, run_product_into};

PyMODINIT_FUNC PyInit__product_pool(void) {
    static int registered = 0;
    if (!registered) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        registered = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(&api, TASK_POOL_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_task_pool", capsule) != 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
