/*
 * Paged decode attention for CPU: one new query token per sequence, attending over its keys
 * and values where they lie in the paged KV cache, without gathering them first.
 *
 * Layout (row-major; float32 for swift_paged_decode_f32, bfloat16 for swift_paged_decode_bf16,
 * which converts on load and computes in float32, rounding only the output):
 *   q      [rows, heads, dim]            strides q_row, q_head (elements); dim is contiguous
 *   k, v   [num_blocks, block_size, kv_heads, dim]   one layer's key and value halves
 *   tables [rows, table_stride] int64    block ids in [0, num_blocks); position p of row r
 *                                        lives in block tables[r, p / block_size] at offset
 *                                        p % block_size
 *   lens   [rows] int64                  context length of each row (>= 1); the query is the
 *                                        token at position lens[r] - 1
 *   out    [rows, heads, dim]            contiguous
 *
 * Query head h reads KV head h / (heads / kv_heads) (grouped-query attention). With window
 * > 0 a row sees only its last `window` positions (positions > lens - 1 - window).
 *
 * Work is split into tasks, one row each when there are at least two rows per thread (each
 * token's keys and values are then one contiguous read), else one (row, KV head) pair each,
 * over `nthreads` threads: the library's worker pool (below), with the caller's thread as
 * one of them (without the pool: an OpenMP team when built with -fopenmp, against the runtime
 * torch uses, else threads started for the call). Each task reads its
 * keys once, keeps the scores of its query heads in a scratch buffer, applies an exact
 * softmax (max-subtracted, float32) and reads its values once. Returns 0 on success, 1 when
 * scratch memory could not be allocated, 2 for arguments the kernel does not take (shapes
 * outside its limits, or a block id outside the cache; it then reads nothing).
 *
 * swift_rope_decode_f32/_bf16 (below) do the same with the step's rotary embedding and KV
 * write in front; the library also holds the model's RMSNorm, RoPE and SiLU-mul on CPU.
 *
 * Compiled on first use by local_engine/attention/native.py.
 */
#define _GNU_SOURCE /* syscall(), strcasecmp() */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#define MAX_HEADS 256
#define RMS_MAX_COLS 16384 /* wider norm rows and heads: the caller uses torch */
#define MAX_THREADS 64

typedef uint16_t bf16_t;

/*
 * The kernels' own worker pool. Every parallel part of this library runs as
 * parallel_run(fn, ctx, n): fn(ctx, id, team) for id in [0, team), the caller running id 0,
 * with team <= n (a share partitions its rows by (id, team), so the split is the same
 * whatever runs it, and the results are bit-identical to a serial run).
 *
 * Why its own pool: the engine runs torch's OpenMP threads passive (they sleep at once, to
 * stay graceful beside other work), and waking a sleeping thread on a VM costs tens of
 * microseconds, more than a decode step's smaller kernels take. The pool's n - 1 workers
 * (created on first use, one per extra thread ever asked for) wait for their next share by
 * spinning on their own cache line for a bounded time, SWIFT_POOL_SPIN_US microseconds
 * (default 100; $SWIFTCLIENT_NATIVE_POOL_SPIN_US overrides it, read once; 0 sleeps at once),
 * checking the clock and calling sched_yield() every 16 pauses, and then sleep on a futex;
 * the caller waits for the workers' shares the same way. Within a decode step the kernels
 * follow each other closely, so the workers are awake for the next one; beside a busy
 * process a waiting thread gives its core back within the bound, as llama.cpp's threads do.
 * The yield matters where threads outnumber the free cores: a caller spinning for a worker
 * that waits for the caller's own core let it run only after the whole bound (a 2 MiB
 * projection on 2 threads pinned to one core took 251 us a call without it, 55 with it,
 * 48 on one thread). Spinning threads lose their core to a busy neighbour and then start
 * their next share late (GNU OpenMP's short spins cost int8 decode up to 90% that way on the
 * project's VM), so a worker that picks up a share more than POOL_LATE_NS after it was
 * handed out, though it was spinning, turns spinning off for every waiting thread for the
 * next POOL_QUIET_NS: they sleep at once, as torch's passive threads do.
 *
 * One job at a time: a caller that finds the pool busy (another Python thread, another
 * engine) runs every share itself, in order, on its own thread. After fork() the child
 * forgets the parent's workers (they do not exist in it) and starts its own on first use.
 * Workers block signals and are never joined: at exit they are asleep on a futex (or
 * finishing a share) and go with the process.
 *
 * $SWIFTCLIENT_NATIVE_POOL=0 (read once), or a build without Linux futexes, runs the parts
 * as before: an OpenMP team when built with -fopenmp, else threads started per call; the
 * parallel thresholds are then the larger ones measured for woken teams.
 */
#ifndef SWIFT_POOL_SPIN_US
#define SWIFT_POOL_SPIN_US 100
#endif

typedef void (*task_fn)(void *ctx, int id, int team);

#if defined(__linux__) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L &&           \
    !defined(__STDC_NO_ATOMICS__)
#define SWIFT_POOL 1
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

typedef struct {
    _Alignas(64) atomic_uint seq; /* bumped by the caller for each share it hands this worker */
    atomic_int sleeping;          /* the worker is (about to be) in futex_wait on seq */
    int id, team;                 /* the share; read after seq */
    unsigned born;                /* seq when the worker was started */
    char pad[64 - 5 * sizeof(int)];
} worker_t;

static struct {
    pthread_mutex_t lock; /* held by the caller of the running job */
    int started;          /* workers 1..started exist (worker i in slots[i]) */
    int enabled;          /* -1 until read from the environment */
    int64_t spin_ns;
    task_fn fn; /* the running job's, read by workers after their seq */
    void *ctx;
    int64_t posted_ns; /* when the running job was handed out, read by workers after seq */
    _Alignas(64) atomic_int pending; /* workers yet to finish the running job */
    atomic_int caller_sleeping;
    _Alignas(64) _Atomic int64_t quiet_until; /* no spinning before this time (ns) */
    worker_t slots[MAX_THREADS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .enabled = -1};

/* A spinning worker that picks up its share this long after it was handed out lost its core
   to another thread while it spun (no spin loop takes that long to see a change): another
   process wants the cores. Every waiting thread then sleeps at once for POOL_QUIET_NS (the
   engine's passive behaviour, where a futex wake-up preempts the neighbour promptly), and
   spins again after it, which tells within a job or two whether the neighbour is still
   there. */
#define POOL_LATE_NS 200000
#define POOL_QUIET_NS 50000000

static long futex(atomic_uint *addr, int op, unsigned val) {
    return syscall(SYS_futex, (void *)addr, op, val, NULL, NULL, 0);
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* How long a waiting thread spins now: 0 while another process was seen to want the cores. */
static inline int64_t spin_bound(int64_t now) {
    return now < atomic_load_explicit(&pool.quiet_until, memory_order_relaxed) ? 0 : pool.spin_ns;
}

/* Spin until *word differs from old, or the spin bound passes: then sleep on it. Returns 1
   where the change was seen while spinning, 0 after sleeping. */
static int await_change(atomic_uint *word, unsigned old, atomic_int *sleeping) {
    const int64_t start = now_ns(), spin = spin_bound(start);
    if (spin > 0) {
        const int64_t deadline = start + spin;
        for (;;) {
            for (int i = 0; i < 16; i++) {
                if (atomic_load_explicit(word, memory_order_acquire) != old) return 1;
                cpu_relax();
            }
            if (now_ns() >= deadline) break;
            sched_yield(); /* a thread waiting for this core (the pool's own) goes first */
        }
    }
    while (atomic_load(word) == old) {
        atomic_store(sleeping, 1); /* seq_cst, as the waker's store then load: one sees the other */
        if (atomic_load(word) == old) futex((atomic_uint *)word, FUTEX_WAIT_PRIVATE, old);
        atomic_store(sleeping, 0);
    }
    atomic_thread_fence(memory_order_acquire);
    return 0;
}

static void *worker_main(void *arg) {
    worker_t *w = (worker_t *)arg;
    unsigned seen = w->born; /* not seq: the first job may be posted before this runs */
    for (int first = 1;; first = 0) {
        const int spun = await_change(&w->seq, seen, &w->sleeping);
        seen = atomic_load_explicit(&w->seq, memory_order_acquire);
        if (spun && !first) { /* the first share waited for the thread to start */
            const int64_t now = now_ns();
            if (now - pool.posted_ns > POOL_LATE_NS)
                atomic_store_explicit(&pool.quiet_until, now + POOL_QUIET_NS,
                                      memory_order_relaxed);
        }
        pool.fn(pool.ctx, w->id, w->team);
        if (atomic_fetch_sub(&pool.pending, 1) == 1 && /* seq_cst: then reads the flag */
            atomic_load(&pool.caller_sleeping))
            futex((atomic_uint *)&pool.pending, FUTEX_WAKE_PRIVATE, 1);
    }
    return NULL;
}

/* In a forked child only the forking thread exists: forget the parent's workers, and a lock
   another parent thread held. */
static void pool_after_fork_child(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pool.started = 0;
    atomic_store(&pool.pending, 0);
    atomic_store(&pool.caller_sleeping, 0);
    atomic_store(&pool.quiet_until, 0);
    for (int i = 0; i < MAX_THREADS; i++) {
        atomic_store(&pool.slots[i].seq, 0);
        atomic_store(&pool.slots[i].sleeping, 0);
    }
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) {
    const char *on = getenv("SWIFTCLIENT_NATIVE_POOL");
    pool.enabled = !(on && (!strcmp(on, "0") || !strcasecmp(on, "false") ||
                            !strcasecmp(on, "no") || !strcasecmp(on, "off")));
    const char *spin = getenv("SWIFTCLIENT_NATIVE_POOL_SPIN_US");
    long us = SWIFT_POOL_SPIN_US;
    if (spin && *spin) {
        char *end;
        const long v = strtol(spin, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1000000) us = v;
    }
    pool.spin_ns = (int64_t)us * 1000;
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

static int pool_enabled(void) {
    pthread_once(&pool_once, pool_init);
    return pool.enabled;
}

/* Start workers up to `want` - 1 (the caller holds the lock); returns the team it can use. */
static int pool_grow(int want) {
    if (pool.started + 1 >= want) return want;
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)8 << 20); /* kernels keep 64 KiB rows on stack */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* workers inherit it: signals go elsewhere */
    while (pool.started + 1 < want) {
        const int i = pool.started + 1;
        pthread_t thread;
        pool.slots[i].sleeping = 0;
        pool.slots[i].born = atomic_load(&pool.slots[i].seq);
        if (pthread_create(&thread, &attr, worker_main, &pool.slots[i])) break;
        pool.started = i;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return pool.started + 1 < want ? pool.started + 1 : want;
}

/* Run the job on the pool; 0 where it is busy (the caller then runs it itself). */
static int pool_run(task_fn fn, void *ctx, int team) {
    if (pthread_mutex_trylock(&pool.lock)) return 0;
    team = pool_grow(team);
    if (team > 1) {
        pool.fn = fn;
        pool.ctx = ctx;
        pool.posted_ns = now_ns();
        atomic_store_explicit(&pool.pending, team - 1, memory_order_relaxed);
        for (int i = 1; i < team; i++) {
            worker_t *w = &pool.slots[i];
            w->id = i;
            w->team = team;
            atomic_fetch_add(&w->seq, 1); /* seq_cst: publishes the job, then reads sleeping */
            if (atomic_load(&w->sleeping)) futex(&w->seq, FUTEX_WAKE_PRIVATE, 1);
        }
    }
    fn(ctx, 0, team);
    if (team > 1) {
        /* wait for pending to reach 0: spin, then sleep on it */
        atomic_uint *word = (atomic_uint *)&pool.pending;
        const int64_t start = now_ns(), spin = spin_bound(start);
        const int64_t deadline = start + spin;
        for (int i = 0; atomic_load_explicit(&pool.pending, memory_order_acquire) != 0; i++) {
            if (spin > 0 && (i & 15) != 15) {
                cpu_relax();
                continue;
            }
            if (spin > 0 && now_ns() < deadline) {
                sched_yield();
                continue;
            }
            const int left = atomic_load(&pool.pending);
            if (left == 0) break;
            atomic_store(&pool.caller_sleeping, 1);
            if (atomic_load(&pool.pending) == left)
                futex(word, FUTEX_WAIT_PRIVATE, (unsigned)left);
            atomic_store(&pool.caller_sleeping, 0);
        }
        atomic_thread_fence(memory_order_acquire);
    }
    pthread_mutex_unlock(&pool.lock);
    return 1;
}
#else
#define SWIFT_POOL 0
static int pool_enabled(void) { return 0; }
#endif

#if !defined(_OPENMP)
/* Fallback without the pool: threads started for this call (the caller runs share 0). */
struct spawned {
    task_fn fn;
    void *ctx;
    int id, team;
};

static void *spawned_main(void *arg) {
    struct spawned *s = (struct spawned *)arg;
    s->fn(s->ctx, s->id, s->team);
    return NULL;
}
#endif

static void parallel_run(task_fn fn, void *ctx, int team) {
    if (team > MAX_THREADS) team = MAX_THREADS;
    if (team <= 1) {
        fn(ctx, 0, 1);
        return;
    }
#if SWIFT_POOL
    if (pool_enabled()) {
        if (!pool_run(fn, ctx, team))
            for (int id = 0; id < team; id++) fn(ctx, id, team); /* the pool is busy */
        return;
    }
#endif
#if defined(_OPENMP)
#pragma omp parallel num_threads(team)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
#else
    struct spawned jobs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started = 1;
    for (int i = 0; i < team; i++) jobs[i] = (struct spawned){fn, ctx, i, team};
    while (started < team && pthread_create(&threads[started], NULL, spawned_main, &jobs[started]) == 0)
        started++;
    fn(ctx, 0, team);
    for (int i = started; i < team; i++) fn(ctx, i, team); /* threads that did not start */
    for (int i = 1; i < started; i++) pthread_join(threads[i], NULL);
#endif
}

/* The pool's worker threads started in this process (the caller's thread is not one), or -1
   where the parts run without the pool (switched off, or a build without it). */
int swift_pool_workers(void) {
#if SWIFT_POOL
    if (!pool_enabled()) return -1;
    pthread_mutex_lock(&pool.lock);
    const int started = pool.started;
    pthread_mutex_unlock(&pool.lock);
    return started;
#else
    return -1;
#endif
}

/* Rows [*lo, *hi) of `n` for share `id` of `team`: contiguous, ceil(n / team) each (OpenMP's
   static schedule). */
static inline void share_of(int64_t n, int id, int team, int64_t *lo, int64_t *hi) {
    const int64_t per = (n + team - 1) / team, a = (int64_t)id * per;
    *lo = a < n ? a : n;
    *hi = a + per < n ? a + per : n;
}

typedef struct {
    const void *q;
    int64_t q_row, q_head;
    void *k, *v; /* written only with rot (the new tokens' keys and values) */
    const int64_t *tables;
    int64_t table_stride;
    const int64_t *lens;
    void *out;
    int64_t rows, heads, kv_heads, dim, block_size, window, max_len;
    float scale;
    int nthreads, tid, status, bf16;
    const struct rotary *rot; /* NULL: q is rotated already and k/v are in the cache */
} job_t;

/* swift_rope_decode_*: the step's fused projection output x (each row: the query heads, then
   the key heads, then the value heads; head h of row r at x + r * x_row + h * x_head), with
   the q/k norm weights (NULL for none; head h's at w + h * w_head) and the rotary tables. */
struct rotary {
    const void *x;
    int64_t x_row, x_head;
    const void *w;
    int64_t w_head;
    float eps;
    const void *cos, *sin;
    const int64_t *positions;
    int64_t max_pos;
};

static void rope_head(const void *src, const void *w, float eps, const void *cos,
                      const void *sin, int64_t p, void *dst, int64_t dim, int bf16);

static inline float bf16_to_f32(bf16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline bf16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

#if defined(__AVX512F__)
static inline __m512 load_bf16x16(const bf16_t *p) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
#endif

static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    float s = 0.f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; d + 16 <= n; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    s = _mm512_reduce_add_ps(acc);
#else
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[d + l] * b[d + l];
    for (int l = 0; l < 8; l++) s += acc[l];
#endif
    for (; d < n; d++) s += a[d] * b[d];
    return s;
}

/* y += p * x */
static inline void axpy(float *y, float p, const float *x, int64_t n) {
    int64_t d = 0;
#if defined(__AVX512F__)
    const __m512 pv = _mm512_set1_ps(p);
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(y + d, _mm512_fmadd_ps(pv, _mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d)));
#endif
    for (; d < n; d++) y[d] += p * x[d];
}

static inline float dot_bf16(const float *a, const bf16_t *b, int64_t n) {
    int64_t d = 0;
    float s = 0.f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), load_bf16x16(b + d), acc);
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; d < n; d++) s += a[d] * bf16_to_f32(b[d]);
    return s;
}

static inline void axpy_bf16(float *y, float p, const bf16_t *x, int64_t n) {
    int64_t d = 0;
#if defined(__AVX512F__)
    const __m512 pv = _mm512_set1_ps(p);
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(y + d, _mm512_fmadd_ps(pv, load_bf16x16(x + d), _mm512_loadu_ps(y + d)));
#endif
    for (; d < n; d++) y[d] += p * bf16_to_f32(x[d]);
}

/* Ask for the cache lines of [p, p + bytes) ahead of use: a block's keys or values lie
   wherever the block table put them, so the hardware's stream prefetcher (and the page walk,
   where the next block sits on another page) only starts once a block's first read misses. */
static inline void prefetch_span(const char *p, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

/* Where position t + bs (the same offset in the row's next block, read a block from now)
   lies in `base`, or NULL past the row's last block. */
static inline const char *next_block(const void *base, const int64_t *table, int64_t t,
                                     int64_t len, int64_t bs, int64_t token_stride,
                                     int64_t head_offset, size_t elem) {
    if (t - t % bs + bs >= len) return NULL;
    const int64_t at = (table[t / bs + 1] * bs + t % bs) * token_stride + head_offset;
    return (const char *)base + at * (int64_t)elem;
}

/* The bfloat16 fast path of one task (defined with the AVX-512 kernels below): returns 1 where
   it took the task (dim 32, 64 or 128 on a build with AVX-512 BF16), 0 to use the path in
   run(). */
static int attend_bf16(const bf16_t *q, int64_t q_head, const bf16_t *k, const bf16_t *v,
                       const int64_t *table, int64_t first, int64_t len, int64_t bs,
                       int64_t token_stride, int64_t h0, int64_t span, int64_t group,
                       int64_t dim, float scale, float *scores, bf16_t *out);

static void *run(void *arg) {
    job_t *j = (job_t *)arg;
    const int64_t kvh = j->kv_heads, group = j->heads / kvh, dim = j->dim, bs = j->block_size;
    const int64_t token_stride = kvh * dim;
    /* A task is one row's KV heads [h0, h1): all of them when there are rows enough to keep
       every thread busy (each token's keys are then one contiguous read), else one. */
    const int64_t split = j->rows >= 2 * (int64_t)j->nthreads ? 1 : kvh;
    const int64_t span = kvh / split; /* KV heads per task */
    const int bf16 = j->bf16;
    const size_t elem = bf16 ? sizeof(bf16_t) : sizeof(float);
    float *scores = malloc(sizeof(float) * (size_t)(span * group * j->max_len));
    float *acc = malloc(sizeof(float) * (size_t)(span * group * dim));
    /* bfloat16 queries are converted once per task into qf [heads, dim] */
    float *qf = bf16 ? malloc(sizeof(float) * (size_t)(span * group * dim)) : NULL;
    /* with j->rot, the task's rotated query heads [heads, dim] in the model's dtype */
    void *qr = j->rot ? malloc(elem * (size_t)(span * group * dim)) : NULL;
    if (scores == NULL || acc == NULL || (bf16 && qf == NULL) || (j->rot && qr == NULL)) {
        free(scores);
        free(acc);
        free(qf);
        free(qr);
        j->status = 1;
        return NULL;
    }
    const int64_t tasks = j->rows * split;
    for (int64_t task = j->tid; task < tasks; task += j->nthreads) {
        const int64_t row = task / split, h0 = (task % split) * span;
        const int64_t heads = span * group; /* query heads of this task */
        const int64_t len = j->lens[row];
        const int64_t first = (j->window > 0 && len > j->window) ? len - j->window : 0;
        const int64_t n = len - first;
        const int64_t *table = j->tables + row * j->table_stride;
        const int64_t q_offset = row * j->q_row + h0 * group * j->q_head;
        const char *qsrc = (const char *)j->q + q_offset * (int64_t)elem;
        int64_t q_head = j->q_head;
        if (j->rot) {
            /* The row's new token sits at position len - 1: its keys and values go to that
               slot of the cache before the scores read it, rotated keys as the unfused path
               stores them; the task's query heads are rotated into qr. */
            const struct rotary *rt = j->rot;
            const int64_t p = rt->positions[row], at = len - 1;
            const int64_t slot = table[at / bs] * bs + at % bs;
            const char *x = (const char *)rt->x + row * rt->x_row * (int64_t)elem;
            const char *w = (const char *)rt->w;
            const int64_t w_step = rt->w_head * (int64_t)elem;
            for (int64_t g = h0; g < h0 + span; g++) {
                const int64_t dst = (slot * token_stride + g * dim) * (int64_t)elem;
                const int64_t kh = j->heads + g;
                rope_head(x + kh * rt->x_head * (int64_t)elem, w ? w + kh * w_step : NULL,
                          rt->eps, rt->cos, rt->sin, p, (char *)j->k + dst, dim, bf16);
                memcpy((char *)j->v + dst, x + (kh + kvh) * rt->x_head * (int64_t)elem,
                       (size_t)dim * elem);
            }
            for (int64_t i = 0; i < heads; i++) {
                const int64_t qh = h0 * group + i;
                rope_head(x + qh * rt->x_head * (int64_t)elem, w ? w + qh * w_step : NULL,
                          rt->eps, rt->cos, rt->sin, p, (char *)qr + i * dim * (int64_t)elem,
                          dim, bf16);
            }
            qsrc = (const char *)qr;
            q_head = dim;
        }
        if (bf16 && attend_bf16((const bf16_t *)qsrc, q_head, (const bf16_t *)j->k,
                                (const bf16_t *)j->v, table, first, len, bs, token_stride, h0,
                                span, group, dim, j->scale, scores,
                                (bf16_t *)j->out + (row * j->heads + h0 * group) * dim))
            continue;
        const float *q = (const float *)qsrc;
        if (bf16) {
            const bf16_t *qb = (const bf16_t *)qsrc;
            for (int64_t i = 0; i < heads; i++)
                for (int64_t d = 0; d < dim; d++) qf[i * dim + d] = bf16_to_f32(qb[i * q_head + d]);
            q = qf;
            q_head = dim;
        }
        float top[MAX_HEADS], total[MAX_HEADS];
        for (int64_t i = 0; i < heads; i++) top[i] = -INFINITY;
        /* scores = q . k over the visible positions, block by block */
        for (int64_t t = first; t < len;) {
            const int64_t offset = t % bs;
            const int64_t stop = (t - offset + bs < len) ? t - offset + bs : len;
            const int64_t at = (table[t / bs] * bs + offset) * token_stride + h0 * dim;
            const char *key = (const char *)j->k + at * (int64_t)elem;
            const char *ahead = next_block(j->k, table, t, len, bs, token_stride, h0 * dim, elem);
            for (; t < stop; t++, key += token_stride * (int64_t)elem) {
                if (ahead) {
                    prefetch_span(ahead, span * dim * (int64_t)elem);
                    ahead += token_stride * (int64_t)elem;
                }
                for (int64_t i = 0; i < heads; i++) {
                    const float *qi = q + i * q_head;
                    const float s =
                        (bf16 ? dot_bf16(qi, (const bf16_t *)key + (i / group) * dim, dim)
                              : dot(qi, (const float *)key + (i / group) * dim, dim)) *
                        j->scale;
                    scores[i * n + (t - first)] = s;
                    top[i] = s > top[i] ? s : top[i];
                }
            }
        }
        for (int64_t i = 0; i < heads; i++) {
            float sum = 0.f, *row_scores = scores + i * n;
            for (int64_t t = 0; t < n; t++) {
                row_scores[t] = expf(row_scores[t] - top[i]);
                sum += row_scores[t];
            }
            total[i] = sum;
        }
        memset(acc, 0, sizeof(float) * (size_t)(heads * dim));
        for (int64_t t = first; t < len;) {
            const int64_t offset = t % bs;
            const int64_t stop = (t - offset + bs < len) ? t - offset + bs : len;
            const int64_t at = (table[t / bs] * bs + offset) * token_stride + h0 * dim;
            const char *value = (const char *)j->v + at * (int64_t)elem;
            const char *ahead = next_block(j->v, table, t, len, bs, token_stride, h0 * dim, elem);
            for (; t < stop; t++, value += token_stride * (int64_t)elem) {
                if (ahead) {
                    prefetch_span(ahead, span * dim * (int64_t)elem);
                    ahead += token_stride * (int64_t)elem;
                }
                for (int64_t i = 0; i < heads; i++) {
                    const float p = scores[i * n + (t - first)];
                    if (bf16)
                        axpy_bf16(acc + i * dim, p, (const bf16_t *)value + (i / group) * dim, dim);
                    else
                        axpy(acc + i * dim, p, (const float *)value + (i / group) * dim, dim);
                }
            }
        }
        for (int64_t i = 0; i < heads; i++) {
            const int64_t o = (row * j->heads + h0 * group + i) * dim;
            const float inv = 1.f / total[i];
            if (bf16)
                for (int64_t d = 0; d < dim; d++)
                    ((bf16_t *)j->out)[o + d] = f32_to_bf16(acc[i * dim + d] * inv);
            else
                for (int64_t d = 0; d < dim; d++) ((float *)j->out)[o + d] = acc[i * dim + d] * inv;
        }
    }
    free(scores);
    free(acc);
    free(qf);
    free(qr);
    return NULL;
}

struct decode_ctx {
    job_t base;
    int status;
};

static void decode_share(void *p, int id, int team) {
    struct decode_ctx *c = (struct decode_ctx *)p;
    job_t job = c->base;
    job.tid = id;
    job.nthreads = team;
    run(&job);
    if (job.status) __atomic_fetch_or(&c->status, job.status, __ATOMIC_RELAXED);
}

static int paged_decode(const void *q, int64_t q_row, int64_t q_head, void *k, void *v,
                        const int64_t *tables, int64_t table_stride,
                        const int64_t *lens, void *out, int64_t rows, int64_t heads,
                        int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                        int64_t max_len, int64_t num_blocks, float scale, int nthreads, int bf16,
                        const struct rotary *rot) {
    if (rows < 1 || heads < 1 || kv_heads < 1 || dim < 1 || block_size < 1 || max_len < 1 ||
        heads % kv_heads != 0 || heads > MAX_HEADS)
        return 2;
    if (rot && (dim % 2 || dim > RMS_MAX_COLS || rot->max_pos < 1)) return 2;
    for (int64_t r = 0; r < rows; r++) {
        if (lens[r] < 1 || lens[r] > max_len || (lens[r] - 1) / block_size >= table_stride)
            return 2;
        if (rot && (rot->positions[r] < 0 || rot->positions[r] >= rot->max_pos)) return 2;
        for (int64_t b = 0; b <= (lens[r] - 1) / block_size; b++) {
            const int64_t id = tables[r * table_stride + b];
            if (id < 0 || id >= num_blocks) return 2; /* never read outside the cache */
        }
    }
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if ((int64_t)nthreads > rows * kv_heads) nthreads = (int)(rows * kv_heads);
    const job_t base = {q, q_row, q_head, k, v, tables, table_stride, lens, out, rows, heads,
                        kv_heads, dim, block_size, window, max_len, scale, nthreads, 0, 0, bf16,
                        rot};
    struct decode_ctx ctx = {base, 0};
    parallel_run(decode_share, &ctx, nthreads);
    return ctx.status;
}

int swift_paged_decode_f32(const float *q, int64_t q_row, int64_t q_head, const float *k,
                           const float *v, const int64_t *tables, int64_t table_stride,
                           const int64_t *lens, float *out, int64_t rows, int64_t heads,
                           int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                           int64_t max_len, int64_t num_blocks, float scale, int nthreads) {
    return paged_decode(q, q_row, q_head, (void *)k, (void *)v, tables, table_stride, lens, out,
                        rows, heads, kv_heads, dim, block_size, window, max_len, num_blocks, scale,
                        nthreads, 0,
                        NULL);
}

int swift_paged_decode_bf16(const bf16_t *q, int64_t q_row, int64_t q_head, const bf16_t *k,
                            const bf16_t *v, const int64_t *tables, int64_t table_stride,
                            const int64_t *lens, bf16_t *out, int64_t rows, int64_t heads,
                            int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                            int64_t max_len, int64_t num_blocks, float scale, int nthreads) {
    return paged_decode(q, q_row, q_head, (void *)k, (void *)v, tables, table_stride, lens, out,
                        rows, heads, kv_heads, dim, block_size, window, max_len, num_blocks, scale,
                        nthreads, 1,
                        NULL);
}

/*
 * RMSNorm, in the same library (the model's norms take it where this library loads):
 *   row (o, i) of `cols` values starts at x + o * x_outer + i * x_inner (elements; a row is
 *   contiguous), for o < outer, i < inner; its weight starts at w + i * w_inner (w_inner 0:
 *   one weight for every row); out is contiguous [outer, inner, cols].
 *   out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in float32. bfloat16
 * (swift_rms_norm_bf16) converts on load, rounds the normalized value to bfloat16 before the
 * weight multiply and rounds the product again, as the float32-upcast reference does.
 * Rows are split over up to `nthreads` threads (the pool's) when there are enough of them
 * to pay for it. Returns 0, or 2 for sizes it does not take.
 */
static inline float sum_squares(const float *x, int64_t n) {
    float s = 0.0f;
    int64_t d = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; d + 16 <= n; d += 16) {
        const __m512 v = _mm512_loadu_ps(x + d);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; d < n; d++) s += x[d] * x[d];
    return s;
}

/* Threads for `work` values: one below the threshold (a parallel region would cost more):
   `min_woken` where each part wakes sleeping threads (OpenMP under the engine's passive wait
   policy, or threads started per call), `min_pool` on the pool, whose workers are still
   awake from the kernel before. */
static inline int team_size(int nthreads, int64_t work, int64_t min_woken, int64_t min_pool) {
    if (nthreads < 1 || work < (pool_enabled() ? min_pool : min_woken)) return 1;
    return nthreads > MAX_THREADS ? MAX_THREADS : nthreads;
}

/* Elements below which a parallel region costs more than it saves. Measured right after a
   projection on a 2-vCPU VM under the engine's OMP_WAIT_POLICY=PASSIVE, where waking the
   team's other thread takes tens of microseconds: the norm stayed faster on one thread up to
   524,288 values, RoPE up to about 200,000, SiLU-mul up to 393,216 (and won from 786,432). */
#define RMS_PARALLEL_MIN 1048576
#define ROPE_PARALLEL_MIN 262144
/* On the pool a second thread costs a cache line's round trip (well under a microsecond)
   rather than a wake-up: it pays once a part takes some microseconds on one thread. Chosen
   by that reasoning, not yet measured: 32,768 values of a norm, RoPE or SiLU-mul (tens of
   microseconds on one thread). */
#define POOL_PARALLEL_MIN 32768

static void rms_row_f32(const float *x, const float *w, float *y, int64_t cols, float eps) {
    const float inv = 1.0f / sqrtf(sum_squares(x, cols) / (float)cols + eps);
    for (int64_t d = 0; d < cols; d++) y[d] = x[d] * inv * w[d];
}

static void rms_row_bf16(const bf16_t *x, const bf16_t *w, bf16_t *y, int64_t cols, float eps,
                         float *scratch) {
    for (int64_t d = 0; d < cols; d++) scratch[d] = bf16_to_f32(x[d]);
    const float inv = 1.0f / sqrtf(sum_squares(scratch, cols) / (float)cols + eps);
    for (int64_t d = 0; d < cols; d++) {
        const float normed = bf16_to_f32(f32_to_bf16(scratch[d] * inv));
        y[d] = f32_to_bf16(normed * bf16_to_f32(w[d]));
    }
}

struct rms_ctx {
    const void *x;
    int64_t inner, x_outer, x_inner;
    const void *w;
    int64_t w_inner;
    void *out;
    int64_t cols, rows;
    float eps;
    int bf16;
};

static void rms_share(void *p, int id, int team) {
    const struct rms_ctx *c = (const struct rms_ctx *)p;
    const int64_t inner = c->inner, cols = c->cols;
    int64_t lo, hi;
    share_of(c->rows, id, team, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const int64_t o = r / inner, i = r % inner;
        if (c->bf16) {
            float scratch[RMS_MAX_COLS]; /* 64 KiB of the thread's stack */
            rms_row_bf16((const bf16_t *)c->x + o * c->x_outer + i * c->x_inner,
                         (const bf16_t *)c->w + i * c->w_inner, (bf16_t *)c->out + r * cols,
                         cols, c->eps, scratch);
        } else {
            rms_row_f32((const float *)c->x + o * c->x_outer + i * c->x_inner,
                        (const float *)c->w + i * c->w_inner, (float *)c->out + r * cols, cols,
                        c->eps);
        }
    }
}

static int rms_norm(const void *x, int64_t outer, int64_t inner, int64_t x_outer,
                    int64_t x_inner, const void *w, int64_t w_inner, void *out, int64_t cols,
                    float eps, int nthreads, int bf16) {
    if (outer < 0 || inner < 1 || cols < 1 || cols > RMS_MAX_COLS) return 2;
    const int64_t rows = outer * inner;
    const struct rms_ctx ctx = {x, inner, x_outer, x_inner, w, w_inner, out, cols, rows, eps, bf16};
    parallel_run(rms_share, (void *)&ctx,
                 team_size(nthreads, rows * cols, RMS_PARALLEL_MIN, POOL_PARALLEL_MIN));
    return 0;
}

int swift_rms_norm_f32(const float *x, int64_t outer, int64_t inner, int64_t x_outer,
                       int64_t x_inner, const float *w, int64_t w_inner, float *out,
                       int64_t cols, float eps, int nthreads) {
    return rms_norm(x, outer, inner, x_outer, x_inner, w, w_inner, out, cols, eps, nthreads, 0);
}

int swift_rms_norm_bf16(const bf16_t *x, int64_t outer, int64_t inner, int64_t x_outer,
                        int64_t x_inner, const bf16_t *w, int64_t w_inner, bf16_t *out,
                        int64_t cols, float eps, int nthreads) {
    return rms_norm(x, outer, inner, x_outer, x_inner, w, w_inner, out, cols, eps, nthreads, 1);
}

/*
 * Rotary embedding, with the per-head RMSNorm before it where the model has one (Qwen3's
 * q/k norm), in one pass over the query and key heads of a fused projection's output:
 *   head (r, h) of `dim` values starts at x + r * x_row + h * x_head (elements; contiguous),
 *   for r < rows, h < heads; with w (not NULL) it is first normalized as rms_norm does, with
 *   the weight at w + h * w_head (w_head 0: one weight for every head);
 *   cos, sin [max_pos, dim / 2] hold the rotary tables; row r sits at position positions[r];
 *   out is contiguous [rows, heads, dim]:
 *     out[j]        = x[j] * cos[j] - x[j + half] * sin[j]
 *     out[j + half] = x[j + half] * cos[j] + x[j] * sin[j]          (j < half = dim / 2)
 * Each product is rounded before the sum, as transformers' `q * cos + rotate_half(q) * sin`
 * rounds it (no fused multiply-add; in bfloat16 each product and the sum round to bfloat16).
 * Returns 0, or 2 for sizes it does not take (odd or too wide a head, a position outside the
 * tables; it then writes nothing).
 */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT /* clang contracts only within one expression; each product is its own */
#endif

static NO_CONTRACT void rotate_f32(const float *x, const float *c, const float *s, float *y,
                                   int64_t half) {
    for (int64_t j = 0; j < half; j++) {
        const float a = x[j] * c[j], b = x[j + half] * s[j];
        y[j] = a - b;
    }
    for (int64_t j = 0; j < half; j++) {
        const float a = x[j + half] * c[j], b = x[j] * s[j];
        y[j + half] = a + b;
    }
}

static NO_CONTRACT void rotate_bf16(const float *x, const bf16_t *c, const bf16_t *s, bf16_t *y,
                                    int64_t half) {
    for (int64_t j = 0; j < half; j++) {
        const float cj = bf16_to_f32(c[j]), sj = bf16_to_f32(s[j]);
        const float a1 = bf16_to_f32(f32_to_bf16(x[j] * cj));
        const float b1 = bf16_to_f32(f32_to_bf16(x[j + half] * sj));
        const float a2 = bf16_to_f32(f32_to_bf16(x[j + half] * cj));
        const float b2 = bf16_to_f32(f32_to_bf16(x[j] * sj));
        y[j] = f32_to_bf16(a1 - b1);
        y[j + half] = f32_to_bf16(a2 + b2);
    }
}

struct rope_ctx {
    const void *x;
    int64_t heads, x_row, x_head;
    const void *w;
    int64_t w_head;
    float eps;
    const void *cos, *sin;
    const int64_t *positions;
    void *out;
    int64_t dim, n;
    int bf16;
};

static void rope_share(void *p, int id, int team) {
    const struct rope_ctx *c = (const struct rope_ctx *)p;
    const size_t elem = c->bf16 ? sizeof(bf16_t) : sizeof(float);
    int64_t lo, hi;
    share_of(c->n, id, team, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t r = i / c->heads, h = i % c->heads;
        rope_head((const char *)c->x + (r * c->x_row + h * c->x_head) * (int64_t)elem,
                  c->w ? (const char *)c->w + h * c->w_head * (int64_t)elem : NULL, c->eps,
                  c->cos, c->sin, c->positions[r], (char *)c->out + i * c->dim * (int64_t)elem,
                  c->dim, c->bf16);
    }
}

static int rope(const void *x, int64_t rows, int64_t heads, int64_t x_row, int64_t x_head,
                const void *w, int64_t w_head, float eps, const void *cos, const void *sin,
                const int64_t *positions, int64_t max_pos, void *out, int64_t dim, int nthreads,
                int bf16) {
    if (rows < 0 || heads < 1 || dim < 2 || dim % 2 || dim > RMS_MAX_COLS || max_pos < 1)
        return 2;
    for (int64_t r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] >= max_pos) return 2;
    const int64_t n = rows * heads;
    const struct rope_ctx ctx = {x, heads, x_row, x_head, w, w_head, eps, cos, sin, positions,
                                 out, dim, n, bf16};
    parallel_run(rope_share, (void *)&ctx,
                 team_size(nthreads, n * dim, ROPE_PARALLEL_MIN, POOL_PARALLEL_MIN));
    return 0;
}

/* One head of `dim` values at src, normalized with the weight w where it is not NULL, rotated
   by the angles at position p into dst (which may be where src's norm lands). */
static void rope_head(const void *src, const void *w, float eps, const void *cos,
                      const void *sin, int64_t p, void *dst, int64_t dim, int bf16) {
    const int64_t half = dim / 2;
    float row[RMS_MAX_COLS]; /* the head in float32, normalized where asked */
    if (bf16) {
        const bf16_t *in = (const bf16_t *)src;
        if (w) { /* the norm's bfloat16 output, as the unfused model would see it */
            rms_row_bf16(in, (const bf16_t *)w, (bf16_t *)dst, dim, eps, row);
            in = (const bf16_t *)dst;
        }
        for (int64_t d = 0; d < dim; d++) row[d] = bf16_to_f32(in[d]);
        rotate_bf16(row, (const bf16_t *)cos + p * half, (const bf16_t *)sin + p * half,
                    (bf16_t *)dst, half);
    } else {
        const float *in = (const float *)src;
        if (w) {
            rms_row_f32(in, (const float *)w, row, dim, eps);
            in = row;
        }
        rotate_f32(in, (const float *)cos + p * half, (const float *)sin + p * half,
                   (float *)dst, half);
    }
}

int swift_rope_f32(const float *x, int64_t rows, int64_t heads, int64_t x_row, int64_t x_head,
                   const float *w, int64_t w_head, float eps, const float *cos, const float *sin,
                   const int64_t *positions, int64_t max_pos, float *out, int64_t dim,
                   int nthreads) {
    return rope(x, rows, heads, x_row, x_head, w, w_head, eps, cos, sin, positions, max_pos, out,
                dim, nthreads, 0);
}

int swift_rope_bf16(const bf16_t *x, int64_t rows, int64_t heads, int64_t x_row,
                    int64_t x_head, const bf16_t *w, int64_t w_head, float eps,
                    const bf16_t *cos, const bf16_t *sin, const int64_t *positions,
                    int64_t max_pos, bf16_t *out, int64_t dim, int nthreads) {
    return rope(x, rows, heads, x_row, x_head, w, w_head, eps, cos, sin, positions, max_pos, out,
                dim, nthreads, 1);
}

/*
 * Decode attention with the rotary step fused in front (swift_rope_decode_f32/_bf16): for
 * each row, the query and key heads of the fused projection's output x are normalized (with
 * w, where not NULL) and rotated exactly as swift_rope_* does; the rotated keys and the values
 * are written to the row's new slot (position lens[r] - 1 of its block table, where
 * AttentionMetadata's slot mapping puts a decode token), and the row then attends as
 * swift_paged_decode_* does, with the rotated queries. The results are bit-identical to
 * swift_rope_*, storing k and v, then swift_paged_decode_*; one parallel region does it all,
 * so each thread rotates the heads it then attends with. k and v are written.
 * Precondition (the caller's, not checked here): no row reads a block another row writes to
 * in the same call, and no two rows write one slot; tasks run in any order, so otherwise a
 * row may read a slot before or after it is written (the Python side checks it per step).
 * Returns as swift_paged_decode_* does (2 also for an odd head size, a head over
 * RMS_MAX_COLS values, or a position outside the tables).
 */
static int rope_decode(const void *x, int64_t x_row, int64_t x_head, const void *w,
                       int64_t w_head, float eps, const void *cos, const void *sin,
                       const int64_t *positions, int64_t max_pos, void *k, void *v,
                       const int64_t *tables, int64_t table_stride, const int64_t *lens,
                       void *out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                       int64_t block_size, int64_t window, int64_t max_len, int64_t num_blocks,
                       float scale, int nthreads, int bf16) {
    const struct rotary rot = {x, x_row, x_head, w, w_head, eps, cos, sin, positions, max_pos};
    return paged_decode(x, x_row, x_head, k, v, tables, table_stride, lens, out, rows, heads,
                        kv_heads, dim, block_size, window, max_len, num_blocks, scale, nthreads,
                        bf16, &rot);
}

int swift_rope_decode_f32(const float *x, int64_t x_row, int64_t x_head, const float *w,
                          int64_t w_head, float eps, const float *cos, const float *sin,
                          const int64_t *positions, int64_t max_pos, float *k, float *v,
                          const int64_t *tables, int64_t table_stride, const int64_t *lens,
                          float *out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                          int64_t block_size, int64_t window, int64_t max_len,
                          int64_t num_blocks, float scale, int nthreads) {
    return rope_decode(x, x_row, x_head, w, w_head, eps, cos, sin, positions, max_pos, k, v,
                       tables, table_stride, lens, out, rows, heads, kv_heads, dim, block_size,
                       window, max_len, num_blocks, scale, nthreads, 0);
}

int swift_rope_decode_bf16(const bf16_t *x, int64_t x_row, int64_t x_head, const bf16_t *w,
                           int64_t w_head, float eps, const bf16_t *cos, const bf16_t *sin,
                           const int64_t *positions, int64_t max_pos, bf16_t *k, bf16_t *v,
                           const int64_t *tables, int64_t table_stride, const int64_t *lens,
                           bf16_t *out, int64_t rows, int64_t heads, int64_t kv_heads,
                           int64_t dim, int64_t block_size, int64_t window, int64_t max_len,
                           int64_t num_blocks, float scale, int nthreads) {
    return rope_decode(x, x_row, x_head, w, w_head, eps, cos, sin, positions, max_pos, k, v,
                       tables, table_stride, lens, out, rows, heads, kv_heads, dim, block_size,
                       window, max_len, num_blocks, scale, nthreads, 1);
}

/*
 * SwiGLU's activation: out[r, j] = silu(g) * u with g = gu[r * gu_row + j] and
 * u = gu[r * gu_row + cols + j] (the gate and up halves of a fused projection's output row),
 * silu(g) = g / (1 + exp(-g)); out is contiguous [rows, cols]. exp is 1 + r + r^2 p(r) with p
 * of degree 5 after range reduction, within 2 ulp of float32's exp, and overflows to inf
 * (silu: a zero of g's sign) where exp does. In bfloat16 silu(g) rounds to bfloat16 before
 * the product, as the unfused `act(gate) * up` does. Written for AVX-512 (F, BW and VL) only:
 * elsewhere it returns 3 and the caller uses torch (swift_kernel_features tells it
 * beforehand). Returns 0, 2 for sizes it does not take, or 3.
 */
#define FEATURE_VECTOR_ACTIVATION 1
/* The masked 16-bit loads and stores of the bfloat16 path need AVX-512 BW and VL too. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SWIFT_VECTOR_ACTIVATION 1
#else
#define SWIFT_VECTOR_ACTIVATION 0
#endif

#define FEATURE_BF16_LINEAR 2
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define SWIFT_BF16_LINEAR 1
#else
#define SWIFT_BF16_LINEAR 0
#endif
#define FEATURE_INT8_LINEAR 4
#if SWIFT_BF16_LINEAR && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SWIFT_INT8_LINEAR 1
#else
#define SWIFT_INT8_LINEAR 0
#endif

/* Which optional kernels this build holds (a bit per feature). */
int swift_kernel_features(void) {
    return (SWIFT_VECTOR_ACTIVATION ? FEATURE_VECTOR_ACTIVATION : 0) |
           (SWIFT_BF16_LINEAR ? FEATURE_BF16_LINEAR : 0) |
           (SWIFT_INT8_LINEAR ? FEATURE_INT8_LINEAR : 0);
}

#if SWIFT_VECTOR_ACTIVATION
static inline __m512 exp16(__m512 x) {
    /* Beyond +-100 the result is inf or 0 anyway; the clamp keeps n finite. scalef
       overflows to inf and underflows through the subnormals as exp does. */
    x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(100.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x); /* ln 2 in two parts */
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n); /* p * 2^n */
}

static inline __m512 silu16(__m512 g) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* Round to bfloat16 (nearest even; NaN stays NaN), kept in float32 lanes with the low half
   zero: the bfloat16 value exactly. */
static inline __m512 round_bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline __m512 load_bf16_masked(const bf16_t *p, __mmask16 m) {
    const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

static inline void store_bf16_masked(bf16_t *p, __mmask16 m, __m512 rounded) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(bits));
}
#endif

/*
 * attend_bf16: one task's query heads (span KV heads x group) against a bfloat16 paged cache,
 * for dim 32, 64 or 128. Each key row is read once for its group's query heads, whose scores
 * are AVX-512 BF16 dot products of the bfloat16 query and key (float32 sums); the softmax's
 * exponentials are exp16's, 16 at a time; the values are read once per position for up to
 * VB(dim) query heads of a group, whose float32 sums stay in registers. The scores of run()'s
 * path (float32 products and exp) differ from these by float32 rounding only.
 */
#if SWIFT_BF16_LINEAR
#define ATTEND_ACC 24 /* float32 accumulators the value pass keeps in registers */

/* Walk positions [first, len) block by block: `body` runs with `row_ptr` at position t's row
   (head h0) of `base`, prefetching the row's next block as run() does. */
#define FOR_POSITIONS(base, row_ptr, body)                                                    \
    for (int64_t t = first; t < len;) {                                                      \
        const int64_t offset_ = t % bs;                                                      \
        const int64_t stop_ = (t - offset_ + bs < len) ? t - offset_ + bs : len;             \
        const bf16_t *row_ptr =                                                              \
            (base) + (table[t / bs] * bs + offset_) * token_stride + h0 * dim;               \
        const char *ahead_ =                                                                 \
            next_block(base, table, t, len, bs, token_stride, h0 * dim, sizeof(bf16_t));     \
        for (; t < stop_; t++, row_ptr += token_stride) {                                    \
            if (ahead_) {                                                                    \
                prefetch_span(ahead_, span * dim * (int64_t)sizeof(bf16_t));                 \
                ahead_ += token_stride * (int64_t)sizeof(bf16_t);                            \
            }                                                                                \
            body                                                                             \
        }                                                                                    \
    }

/* The value pass for heads [i0, i0 + hb) of KV head g, VC vectors of 16 per head, HB heads
   at most: acc[h * VC + c] in registers. */
#define VALUE_PASS(VC, HB)                                                                   \
    do {                                                                                     \
        __m512 acc[(HB) * (VC)];                                                             \
        for (int a = 0; a < (HB) * (VC); a++) acc[a] = _mm512_setzero_ps();                 \
        FOR_POSITIONS(v, row, {                                                              \
            __m512 vv[VC];                                                                   \
            for (int c = 0; c < (VC); c++) vv[c] = load_bf16x16(row + g * dim + 16 * c);    \
            for (int h = 0; h < (HB); h++) {                                                 \
                if (h < hb) {                                                                \
                    const __m512 p = _mm512_set1_ps(scores[(i0 + h) * n + t - first]);      \
                    for (int c = 0; c < (VC); c++)                                           \
                        acc[h * (VC) + c] = _mm512_fmadd_ps(p, vv[c], acc[h * (VC) + c]);   \
                }                                                                            \
            }                                                                                \
        })                                                                                   \
        for (int h = 0; h < hb; h++) {                                                       \
            const __m512 inv = _mm512_set1_ps(1.f / total[i0 + h]);                          \
            for (int c = 0; c < (VC); c++)                                                   \
                store_bf16_masked(out + (i0 + h) * dim + 16 * c, (__mmask16)0xffff,          \
                                  round_bf16x16(_mm512_mul_ps(acc[h * (VC) + c], inv)));     \
        }                                                                                    \
    } while (0)

static int attend_bf16(const bf16_t *q, int64_t q_head, const bf16_t *k, const bf16_t *v,
                       const int64_t *table, int64_t first, int64_t len, int64_t bs,
                       int64_t token_stride, int64_t h0, int64_t span, int64_t group,
                       int64_t dim, float scale, float *scores, bf16_t *out) {
    if (dim != 32 && dim != 64 && dim != 128) return 0;
    const int64_t heads = span * group, n = len - first, chunks = dim / 32;
    float top[MAX_HEADS], total[MAX_HEADS];
    for (int64_t i = 0; i < heads; i++) top[i] = -INFINITY;
    FOR_POSITIONS(k, row, {
        for (int64_t g = 0; g < span; g++) {
            __m512bh kc[4];
            for (int64_t c = 0; c < chunks; c++)
                kc[c] = (__m512bh)_mm512_loadu_si512((const void *)(row + g * dim + 32 * c));
            for (int64_t i = g * group; i < (g + 1) * group; i++) {
                const bf16_t *qi = q + i * q_head;
                __m512 acc = _mm512_setzero_ps();
                for (int64_t c = 0; c < chunks; c++)
                    acc = _mm512_dpbf16_ps(
                        acc, (__m512bh)_mm512_loadu_si512((const void *)(qi + 32 * c)), kc[c]);
                const float sc = _mm512_reduce_add_ps(acc) * scale;
                scores[i * n + t - first] = sc;
                top[i] = sc > top[i] ? sc : top[i];
            }
        }
    })
    for (int64_t i = 0; i < heads; i++) {
        float *srow = scores + i * n;
        const __m512 mx = _mm512_set1_ps(top[i]);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t += 16) {
            const __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, srow + t), mx));
            _mm512_mask_storeu_ps(srow + t, m, e);
            sum = _mm512_mask_add_ps(sum, m, sum, e);
        }
        total[i] = _mm512_reduce_add_ps(sum);
    }
    for (int64_t g = 0; g < span; g++) {
        const int64_t vb = dim == 32 ? ATTEND_ACC / 2 : dim == 64 ? ATTEND_ACC / 4 : 2;
        for (int64_t i0 = g * group; i0 < (g + 1) * group; i0 += vb) {
            const int64_t hb = (g + 1) * group - i0 < vb ? (g + 1) * group - i0 : vb;
            if (dim == 32)
                VALUE_PASS(2, ATTEND_ACC / 2);
            else if (dim == 64)
                VALUE_PASS(4, ATTEND_ACC / 4);
            else
                VALUE_PASS(8, 2);
        }
    }
    return 1;
}
#undef VALUE_PASS
#undef FOR_POSITIONS
#else
static int attend_bf16(const bf16_t *q, int64_t q_head, const bf16_t *k, const bf16_t *v,
                       const int64_t *table, int64_t first, int64_t len, int64_t bs,
                       int64_t token_stride, int64_t h0, int64_t span, int64_t group,
                       int64_t dim, float scale, float *scores, bf16_t *out) {
    (void)q, (void)q_head, (void)k, (void)v, (void)table, (void)first, (void)len, (void)bs;
    (void)token_stride, (void)h0, (void)span, (void)group, (void)dim, (void)scale;
    (void)scores, (void)out;
    return 0;
}
#endif

#define SILU_PARALLEL_MIN 524288 /* elements (see RMS_PARALLEL_MIN) */

#if SWIFT_VECTOR_ACTIVATION
struct silu_ctx {
    const void *gu;
    int64_t gu_row;
    void *out;
    int64_t cols, chunk, per_row, tasks;
    int bf16;
};

static void silu_share(void *p, int id, int team) {
    const struct silu_ctx *c = (const struct silu_ctx *)p;
    const void *gu = c->gu;
    void *out = c->out;
    const int64_t gu_row = c->gu_row, cols = c->cols, chunk = c->chunk, per_row = c->per_row;
    const int bf16 = c->bf16;
    int64_t t0, t1;
    share_of(c->tasks, id, team, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t r = t / per_row, lo = (t % per_row) * chunk;
        const int64_t hi = lo + chunk < cols ? lo + chunk : cols;
        for (int64_t j = lo; j < hi; j += 16) {
            /* Plain loads and stores for whole vectors (masked stores are slow on some CPUs
               once the output is not in cache), masked ones for a row's last few values. */
            const int full = hi - j >= 16;
            const __mmask16 m = full ? (__mmask16)0xffff : (__mmask16)((1u << (hi - j)) - 1);
            if (bf16) {
                const bf16_t *g = (const bf16_t *)gu + r * gu_row + j;
                bf16_t *y = (bf16_t *)out + r * cols + j;
                const __m512 act = round_bf16x16(silu16(full ? load_bf16x16(g) : load_bf16_masked(g, m)));
                const __m512 up = full ? load_bf16x16(g + cols) : load_bf16_masked(g + cols, m);
                const __m512 v = round_bf16x16(_mm512_mul_ps(act, up));
                if (full)
                    _mm256_storeu_si256((__m256i *)y, _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                                                          _mm512_castps_si512(v), 16)));
                else
                    store_bf16_masked(y, m, v);
            } else {
                const float *g = (const float *)gu + r * gu_row + j;
                float *y = (float *)out + r * cols + j;
                if (full) {
                    _mm512_storeu_ps(y, _mm512_mul_ps(silu16(_mm512_loadu_ps(g)),
                                                      _mm512_loadu_ps(g + cols)));
                } else {
                    const __m512 v = _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(m, g)),
                                                   _mm512_maskz_loadu_ps(m, g + cols));
                    _mm512_mask_storeu_ps(y, m, v);
                }
            }
        }
    }
}
#endif

static int silu_mul(const void *gu, int64_t rows, int64_t gu_row, void *out, int64_t cols,
                    int nthreads, int bf16) {
#if !SWIFT_VECTOR_ACTIVATION
    (void)gu, (void)rows, (void)gu_row, (void)out, (void)cols, (void)nthreads, (void)bf16;
    return 3;
#else
    if (rows < 0 || cols < 1 || gu_row < 2 * cols) return 2;
    nthreads = team_size(nthreads, rows * cols, SILU_PARALLEL_MIN, POOL_PARALLEL_MIN);
    /* Column chunks of each row, so that a decode step's few rows keep every thread busy. */
    const int64_t chunk = 512, per_row = (cols + chunk - 1) / chunk, tasks = rows * per_row;
    const struct silu_ctx ctx = {gu, gu_row, out, cols, chunk, per_row, tasks, bf16};
    parallel_run(silu_share, (void *)&ctx, nthreads);
    return 0;
#endif
}

int swift_silu_mul_f32(const float *gu, int64_t rows, int64_t gu_row, float *out, int64_t cols,
                       int nthreads) {
    return silu_mul(gu, rows, gu_row, out, cols, nthreads, 0);
}

int swift_silu_mul_bf16(const bf16_t *gu, int64_t rows, int64_t gu_row, bf16_t *out,
                        int64_t cols, int nthreads) {
    return silu_mul(gu, rows, gu_row, out, cols, nthreads, 1);
}

/*
 * Linear layers for a few rows (decode): out[t, n] = x[t, :] . w[n, :] (+ bias[n])
 * (+ residual[t, n]), bfloat16 in and out, float32 sums rounded once to bfloat16.
 *
 *   x        [rows, k]  row stride x_row; values contiguous
 *   w        [n, k]     contiguous (a linear layer's weight, as torch stores it)
 *   bias     [n]        or NULL
 *   residual [rows, n]  row stride res_row, or NULL (the sum rides in the same rounding, as
 *                       torch.addmm(residual, x, w.T) does)
 *   out      [rows, n]  row stride out_row
 *
 * At batch 1 a decode step streams every weight once, so its speed is the memory's: the
 * kernel reads w from start to end, one weight row at a time (one sequential stream, which
 * the hardware prefetcher follows best: reading four rows side by side measured half the
 * bandwidth on the project's 2-vCPU VM), and multiplies each 32-value slice with the same
 * slice of every x row (AVX-512 BF16 dot products, float32 accumulators), so each weight is
 * read once whatever `rows` is. Threads, when more than one is asked for and the weight is
 * large enough, take contiguous ranges of weight rows. Written for AVX-512 BF16 (with F and
 * BW) only: elsewhere it returns 3 and the caller uses torch (swift_kernel_features tells it
 * beforehand). Returns 0, 2 for sizes it does not take, or 3.
 */
/* Weight bytes below which one thread streams a layer faster than a woken team; on the
   pool, below which it streams faster than two awake threads. The pool's bound is reasoned,
   not yet measured: 256 KiB take about 13 us on one thread at 19 GB/s and 7-10 us on two,
   against a dispatch of well under a microsecond. */
#define LINEAR_MAX_ROWS 8
#define LINEAR_PARALLEL_MIN_BYTES (4 << 20)
#define POOL_LINEAR_PARALLEL_MIN_BYTES (256 << 10)

#if SWIFT_BF16_LINEAR
/* A weight row's outputs: scale * sum (+ bias) (+ residual), rounded once to bfloat16. */
static inline __attribute__((always_inline)) void store_row(
    const __m512 *acc, int rows, int64_t n, float scale, const bf16_t *bias, const bf16_t *res,
    int64_t res_row, bf16_t *out, int64_t out_row) {
    const float b = bias ? bf16_to_f32(bias[n]) : 0.0f;
    for (int t = 0; t < rows; t++) {
        float v = scale * _mm512_reduce_add_ps(acc[t]) + b;
        if (res) v += bf16_to_f32(res[t * res_row + n]);
        out[t * out_row + n] = f32_to_bf16(v);
    }
}

/* One specialization of SPAN(R) per row count: the accumulators stay in registers. */
#define FOR_ROWS(rows)                                                                       \
    switch (rows) {                                                                          \
    case 1: SPAN(1); break;                                                                  \
    case 2: SPAN(2); break;                                                                  \
    case 3: SPAN(3); break;                                                                  \
    case 4: SPAN(4); break;                                                                  \
    case 5: SPAN(5); break;                                                                  \
    case 6: SPAN(6); break;                                                                  \
    case 7: SPAN(7); break;                                                                  \
    case 8: SPAN(8); break;                                                                  \
    }
#endif

#if SWIFT_BF16_LINEAR
static inline __attribute__((always_inline)) void linear_span_bf16(
    const bf16_t *x, const int rows, int64_t x_row, const bf16_t *w, int64_t k, int64_t n0,
    int64_t n1, const bf16_t *bias, const bf16_t *res, int64_t res_row, bf16_t *out,
    int64_t out_row) {
    const int64_t full = k & ~(int64_t)31;
    const __mmask32 tail = (__mmask32)((1ull << (k - full)) - 1);
    for (int64_t n = n0; n < n1; n++) {
        const bf16_t *wr = w + n * k;
        __m512 acc[LINEAR_MAX_ROWS];
        for (int t = 0; t < rows; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t j = 0; j < full; j += 32) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(wr + j));
            for (int t = 0; t < rows; t++)
                acc[t] = _mm512_dpbf16_ps(
                    acc[t], wv, (__m512bh)_mm512_loadu_si512((const void *)(x + t * x_row + j)));
        }
        if (tail) {
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, wr + full);
            for (int t = 0; t < rows; t++)
                acc[t] = _mm512_dpbf16_ps(
                    acc[t], wv, (__m512bh)_mm512_maskz_loadu_epi16(tail, x + t * x_row + full));
        }
        store_row(acc, rows, n, 1.0f, bias, res, res_row, out, out_row);
    }
}

static void linear_span(const bf16_t *x, int rows, int64_t x_row, const bf16_t *w, int64_t k,
                        int64_t n0, int64_t n1, const bf16_t *bias, const bf16_t *res,
                        int64_t res_row, bf16_t *out, int64_t out_row) {
#define SPAN(R) linear_span_bf16(x, R, x_row, w, k, n0, n1, bias, res, res_row, out, out_row)
    FOR_ROWS(rows)
#undef SPAN
}

struct linear_ctx {
    const bf16_t *x;
    int rows;
    int64_t x_row;
    const bf16_t *w;
    int64_t k, n;
    const bf16_t *bias, *res;
    int64_t res_row;
    bf16_t *out;
    int64_t out_row;
};

/* Threads take contiguous ranges of weight rows. */
static void linear_share(void *p, int id, int team) {
    const struct linear_ctx *c = (const struct linear_ctx *)p;
    int64_t n0, n1;
    share_of(c->n, id, team, &n0, &n1);
    if (n0 < n1)
        linear_span(c->x, c->rows, c->x_row, c->w, c->k, n0, n1, c->bias, c->res, c->res_row,
                    c->out, c->out_row);
}
#endif

int swift_linear_bf16(const bf16_t *x, int64_t rows, int64_t x_row, const bf16_t *w, int64_t n,
                      int64_t k, const bf16_t *bias, const bf16_t *res, int64_t res_row,
                      bf16_t *out, int64_t out_row, int nthreads) {
#if !SWIFT_BF16_LINEAR
    (void)x, (void)rows, (void)x_row, (void)w, (void)n, (void)k, (void)bias, (void)res;
    (void)res_row, (void)out, (void)out_row, (void)nthreads;
    return 3;
#else
    if (rows < 1 || rows > LINEAR_MAX_ROWS || n < 1 || k < 1 || x_row < k || out_row < n ||
        (res && res_row < n))
        return 2;
    nthreads = team_size(nthreads, n * k * 2, LINEAR_PARALLEL_MIN_BYTES,
                         POOL_LINEAR_PARALLEL_MIN_BYTES);
    if (nthreads > n) nthreads = (int)n;
    const struct linear_ctx ctx = {x, (int)rows, x_row, w, k, n, bias, res, res_row, out, out_row};
    parallel_run(linear_share, (void *)&ctx, nthreads);
    return 0;
#endif
}

/*
 * The same for int8 weights with per-row scales (out[t, n] = scale[n] * x[t, :] . codes[n, :]
 * (+ bias[n]) (+ residual[t, n]), bfloat16 x, scales, bias, residual and out), on AVX-512
 * VNNI integer dot products. Each x row is quantized first, in blocks of 32 values with a
 * float32 scale each (max |x| / 127, round to nearest; the layout llama.cpp's q8_0 uses for
 * its activations), so one instruction multiplies 64 codes with 64 quantized activations.
 * The instruction takes one unsigned operand: the codes are read as unsigned by flipping
 * their sign bit (code + 128), and each dot product starts from -128 * (the sum of the
 * quantized activations it multiplies), computed once per row of x, so the integer sums are
 * exact; they are scaled in float32 and rounded once to bfloat16. Returns 0, 1 when scratch memory could not be allocated, 2 for
 * sizes it does not take, or 3 where the build has no AVX-512 VNNI, BW and VL.
 */

#if SWIFT_INT8_LINEAR
/* Quantize `k` bfloat16 values into `q` (zero padded to `kpad`, a multiple of 64) with one
   scale per 32 values, written as a 16-lane vector per 64 values (8 lanes per block) into
   `scales`; and into `start`, per 64 values, the 16 lanes' -128 * (sum of their 4 codes):
   the dot products' starting values for weight codes read unsigned (code + 128). */
static void quantize_row_q8(const bf16_t *x, int64_t k, int64_t kpad, int8_t *q, float *scales,
                            int32_t *start) {
    for (int64_t b = 0; b < kpad; b += 32) {
        const int64_t left = k - b;
        const __mmask16 m0 = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        const __mmask16 m1 = left >= 32   ? 0xffff
                             : left > 16 ? (__mmask16)((1u << (left - 16)) - 1)
                                         : 0;
        const __m512 v0 = load_bf16_masked(x + b, m0), v1 = load_bf16_masked(x + b + 16, m1);
        const __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        const float amax = _mm512_reduce_max_ps(a);
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        _mm_storeu_si128((__m128i *)(q + b), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + b + 16), _mm512_cvtsepi32_epi8(q1));
        float *lanes = scales + (b / 64) * 16 + ((b / 32) % 2) * 8;
        for (int l = 0; l < 8; l++) lanes[l] = scale;
    }
    const __m512i by = _mm512_set1_epi8((char)0x80); /* unsigned operand: the codes' 128 */
    for (int64_t j = 0; j < kpad; j += 64) {
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), by,
                                                 _mm512_loadu_si512((const void *)(q + j)));
        _mm512_storeu_si512((void *)(start + j / 4), _mm512_sub_epi32(_mm512_setzero_si512(), sums));
    }
}

static inline __attribute__((always_inline)) void linear_span_q8(
    const int8_t *q, const float *xs, const int32_t *start, const int rows, int64_t kpad,
    const int8_t *w, int64_t k, const bf16_t *wscale, int64_t n0, int64_t n1,
    const bf16_t *bias, const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row) {
    const int64_t full = k & ~(int64_t)63;
    const __mmask64 tail = (__mmask64)((k - full) ? (1ull << (k - full)) - 1 : 0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wr = w + n * k;
        __m512 acc[LINEAR_MAX_ROWS];
        for (int t = 0; t < rows; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t j = 0; j < full; j += 64) {
            const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512((const void *)(wr + j)), flip);
            for (int t = 0; t < rows; t++) {
                const __m512i d = _mm512_dpbusd_epi32(
                    _mm512_loadu_si512((const void *)(start + (t * kpad + j) / 4)), wv,
                    _mm512_loadu_si512((const void *)(q + t * kpad + j)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
                                         _mm512_loadu_ps(xs + (t * kpad + j) / 4), acc[t]);
            }
        }
        if (tail) {
            /* Codes past k load as 0 (128 after the flip); their activations are 0. */
            const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(tail, wr + full), flip);
            for (int t = 0; t < rows; t++) {
                const __m512i d = _mm512_dpbusd_epi32(
                    _mm512_loadu_si512((const void *)(start + (t * kpad + full) / 4)), wv,
                    _mm512_loadu_si512((const void *)(q + t * kpad + full)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
                                         _mm512_loadu_ps(xs + (t * kpad + full) / 4), acc[t]);
            }
        }
        store_row(acc, rows, n, bf16_to_f32(wscale[n]), bias, res, res_row, out, out_row);
    }
}

static void linear_span_int8(const int8_t *q, const float *xs, const int32_t *start, int rows,
                             int64_t kpad, const int8_t *w, int64_t k, const bf16_t *wscale,
                             int64_t n0, int64_t n1, const bf16_t *bias, const bf16_t *res,
                             int64_t res_row, bf16_t *out, int64_t out_row) {
#define SPAN(R)                                                                             \
    linear_span_q8(q, xs, start, R, kpad, w, k, wscale, n0, n1, bias, res, res_row, out, out_row)
    FOR_ROWS(rows)
#undef SPAN
}
#endif

#if SWIFT_INT8_LINEAR
/*
 * The int4 layout: 16-row groups. The weight's rows are padded to a multiple of 16 (the
 * padding's bytes 0, its scales 0) and stored a group of 16 rows at a time; a group holds,
 * per block of 32 values along the rows, 256 bytes: four 64-byte slices m = 0..3, each the
 * group's 16 rows' 4 bytes in turn. Byte j of a row's 4 in slice m holds the block's value
 * 4m + j (its code + 8) in its low nibble and value 16 + 4m + j in its high nibble, so a
 * row's 16 bytes of a block, slice after slice, are llama.cpp's q4_0 bytes. The scales:
 * per group and block, the 16 rows' bfloat16 scales in turn ([n_pad / 16, k / 32, 16]).
 *
 * One 64-byte read gives 16 rows x 8 values: its low nibbles multiply 4 activation codes
 * broadcast to every lane (one VNNI instruction for 16 rows x 4 values), its high nibbles 4
 * others, so a block is 8 instructions for 16 rows, the lanes are the rows, and no dot
 * product needs a horizontal sum; the weights are still read as one sequential stream. The
 * activations are quantized per block of 32 (as for int8), with -8 * (the sum of a block's
 * codes) as each block's starting value (the codes are stored + 8).
 */
#define INT4_GROUP 16

static void quantize_row_blocks(const bf16_t *x, int64_t k, int8_t *q, float *bscale,
                                int32_t *bsum) {
    for (int64_t b = 0; b < k; b += 32) {
        const __m512 v0 = load_bf16x16(x + b), v1 = load_bf16x16(x + b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        _mm_storeu_si128((__m128i *)(q + b), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + b + 16), _mm512_cvtsepi32_epi8(q1));
        bscale[b / 32] = amax / 127.0f;
        bsum[b / 32] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* A group's 16 outputs per row of x: sum (+ bias) (+ residual), rounded once to bfloat16;
   the lanes past n are not written. */
static inline __attribute__((always_inline)) void store_group(
    const __m512 *acc, int rows, int64_t n0, int64_t n, const bf16_t *bias, const bf16_t *res,
    int64_t res_row, bf16_t *out, int64_t out_row) {
    const int64_t left = n - n0;
    const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    const __m512 b = bias ? load_bf16_masked(bias + n0, m) : _mm512_setzero_ps();
    for (int t = 0; t < rows; t++) {
        __m512 v = _mm512_add_ps(acc[t], b);
        if (res) v = _mm512_add_ps(v, load_bf16_masked(res + t * res_row + n0, m));
        store_bf16_masked(out + t * out_row + n0, m, round_bf16x16(v));
    }
}

static inline __attribute__((always_inline)) void linear_span_q4(
    const int8_t *q, const float *bscale, const int32_t *bsum, const int rows, int64_t k,
    const uint8_t *w, const bf16_t *wscale, int64_t n, int64_t g0, int64_t g1,
    const bf16_t *bias, const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row) {
    const int64_t kb = k / 32;
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *wg = w + g * kb * 256;
        const bf16_t *sg = wscale + g * kb * INT4_GROUP;
        __m512 acc[LINEAR_MAX_ROWS];
        for (int t = 0; t < rows; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < kb; b++) {
            const uint8_t *wb = wg + b * 256;
            __m512i dot[LINEAR_MAX_ROWS];
            for (int t = 0; t < rows; t++) dot[t] = _mm512_set1_epi32(bsum[t * kb + b]);
            for (int m = 0; m < 4; m++) {
                const __m512i v = _mm512_loadu_si512((const void *)(wb + m * 64));
                const __m512i lo = _mm512_and_si512(v, nibble);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                for (int t = 0; t < rows; t++) {
                    const int8_t *qb = q + t * k + b * 32;
                    int32_t a, c;
                    memcpy(&a, qb + 4 * m, sizeof a);
                    memcpy(&c, qb + 16 + 4 * m, sizeof c);
                    dot[t] = _mm512_dpbusd_epi32(dot[t], lo, _mm512_set1_epi32(a));
                    dot[t] = _mm512_dpbusd_epi32(dot[t], hi, _mm512_set1_epi32(c));
                }
            }
            const __m512 ws = load_bf16x16(sg + b * INT4_GROUP);
            for (int t = 0; t < rows; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]),
                                         _mm512_mul_ps(ws, _mm512_set1_ps(bscale[t * kb + b])),
                                         acc[t]);
        }
        store_group(acc, rows, g * INT4_GROUP, n, bias, res, res_row, out, out_row);
    }
}

static void linear_span_int4(const int8_t *q, const float *bscale, const int32_t *bsum,
                             int rows, int64_t k, const uint8_t *w, const bf16_t *wscale,
                             int64_t n, int64_t g0, int64_t g1, const bf16_t *bias,
                             const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row) {
#define SPAN(R)                                                                             \
    linear_span_q4(q, bscale, bsum, R, k, w, wscale, n, g0, g1, bias, res, res_row, out, out_row)
    FOR_ROWS(rows)
#undef SPAN
}

struct quantized_ctx {
    const int8_t *q;
    const float *xs;
    const int32_t *start;
    int rows;
    int64_t kpad;
    const void *w;
    int64_t k;
    const bf16_t *wscale;
    int64_t n;
    const bf16_t *bias, *res;
    int64_t res_row;
    bf16_t *out;
    int64_t out_row;
    int bits;
};

static void quantized_share(void *p, int id, int team) {
    const struct quantized_ctx *c = (const struct quantized_ctx *)p;
    int64_t n0, n1;
    if (c->bits == 4) { /* threads take contiguous ranges of 16-row groups */
        share_of((c->n + INT4_GROUP - 1) / INT4_GROUP, id, team, &n0, &n1);
        if (n0 < n1)
            linear_span_int4(c->q, c->xs, c->start, c->rows, c->k, (const uint8_t *)c->w,
                             c->wscale, c->n, n0, n1, c->bias, c->res, c->res_row, c->out,
                             c->out_row);
        return;
    }
    share_of(c->n, id, team, &n0, &n1);
    if (n0 < n1)
        linear_span_int8(c->q, c->xs, c->start, c->rows, c->kpad, (const int8_t *)c->w, c->k,
                         c->wscale, n0, n1, c->bias, c->res, c->res_row, c->out, c->out_row);
}

/* The int8 and int4 kernels' shared part: quantize x's rows, then split the weight rows over
   the threads. */
static int linear_quantized(const bf16_t *x, int64_t rows, int64_t x_row, const void *w,
                            const bf16_t *wscale, int64_t n, int64_t k, const bf16_t *bias,
                            const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row,
                            int nthreads, int bits) {
    if (rows < 1 || rows > LINEAR_MAX_ROWS || n < 1 || k < 1 || x_row < k || out_row < n ||
        (res && res_row < n) || (bits == 4 && k % 32))
        return 2;
    const int64_t kpad = (k + 63) & ~(int64_t)63;
    /* Per row of x, int8: its codes, one float scale per 4 codes and one int32 start per 4
       codes (16 lanes per 64 codes each: kpad bytes apiece); int4: its k codes, and one
       float scale and one int32 start per block of 32. */
    char *scratch = aligned_alloc(64, (size_t)(3 * rows * kpad));
    if (!scratch) return 1;
    int8_t *q = (int8_t *)scratch;
    float *xs = (float *)(scratch + rows * kpad);
    int32_t *start = (int32_t *)(scratch + 2 * rows * kpad);
    for (int64_t t = 0; t < rows; t++) {
        if (bits == 4)
            quantize_row_blocks(x + t * x_row, k, q + t * k, xs + t * (k / 32),
                                start + t * (k / 32));
        else
            quantize_row_q8(x + t * x_row, k, kpad, q + t * kpad, xs + t * kpad / 4,
                            start + t * kpad / 4);
    }
    nthreads = team_size(nthreads, n * k * bits / 8, LINEAR_PARALLEL_MIN_BYTES,
                         POOL_LINEAR_PARALLEL_MIN_BYTES);
    if (nthreads > n) nthreads = (int)n;
    const struct quantized_ctx ctx = {q,     xs,     start, (int)rows, kpad, w,       k,
                                      wscale, n,     bias,  res,       res_row, out, out_row,
                                      bits};
    parallel_run(quantized_share, (void *)&ctx, nthreads);
    free(scratch);
    return 0;
}
#endif

int swift_linear_int8(const bf16_t *x, int64_t rows, int64_t x_row, const int8_t *w,
                      const bf16_t *wscale, int64_t n, int64_t k, const bf16_t *bias,
                      const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row,
                      int nthreads) {
#if !SWIFT_INT8_LINEAR
    (void)x, (void)rows, (void)x_row, (void)w, (void)wscale, (void)n, (void)k, (void)bias;
    (void)res, (void)res_row, (void)out, (void)out_row, (void)nthreads;
    return 3;
#else
    return linear_quantized(x, rows, x_row, w, wscale, n, k, bias, res, res_row, out, out_row,
                            nthreads, 8);
#endif
}

/* The same for int4 weights (the layout above linear_span_q4; k a multiple of 32). */
int swift_linear_int4(const bf16_t *x, int64_t rows, int64_t x_row, const uint8_t *w,
                      const bf16_t *wscale, int64_t n, int64_t k, const bf16_t *bias,
                      const bf16_t *res, int64_t res_row, bf16_t *out, int64_t out_row,
                      int nthreads) {
#if !SWIFT_INT8_LINEAR
    (void)x, (void)rows, (void)x_row, (void)w, (void)wscale, (void)n, (void)k, (void)bias;
    (void)res, (void)res_row, (void)out, (void)out_row, (void)nthreads;
    return 3;
#else
    return linear_quantized(x, rows, x_row, w, wscale, n, k, bias, res, res_row, out, out_row,
                            nthreads, 4);
#endif
}

#if SWIFT_INT8_LINEAR
struct dequantize_ctx {
    const uint8_t *w;
    const bf16_t *wscale;
    int64_t n, k;
    bf16_t *out;
};

static void dequantize_share(void *p, int id, int team) {
    const struct dequantize_ctx *ctx = (const struct dequantize_ctx *)p;
    const int64_t k = ctx->k, kb = k / 32;
    const __m128i nibble = _mm_set1_epi8(0x0f);
    int64_t g0, g1;
    share_of((ctx->n + INT4_GROUP - 1) / INT4_GROUP, id, team, &g0, &g1);
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < kb; b++) {
            const uint8_t *wb = ctx->w + (g * kb + b) * 256;
            const bf16_t *sb = ctx->wscale + (g * kb + b) * INT4_GROUP;
            /* Transpose the four slices (16 rows' 4 bytes each) into the rows' 16 bytes:
               row 4L + c ends in 128-bit lane L of u[c]. */
            const __m512i v0 = _mm512_loadu_si512((const void *)wb);
            const __m512i v1 = _mm512_loadu_si512((const void *)(wb + 64));
            const __m512i v2 = _mm512_loadu_si512((const void *)(wb + 128));
            const __m512i v3 = _mm512_loadu_si512((const void *)(wb + 192));
            const __m512i t0 = _mm512_unpacklo_epi32(v0, v1), t1 = _mm512_unpackhi_epi32(v0, v1);
            const __m512i t2 = _mm512_unpacklo_epi32(v2, v3), t3 = _mm512_unpackhi_epi32(v2, v3);
            __m128i rows16[INT4_GROUP];
            const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                                  _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
            for (int c = 0; c < 4; c++) {
                rows16[c] = _mm512_castsi512_si128(u[c]);
                rows16[4 + c] = _mm512_extracti32x4_epi32(u[c], 1);
                rows16[8 + c] = _mm512_extracti32x4_epi32(u[c], 2);
                rows16[12 + c] = _mm512_extracti32x4_epi32(u[c], 3);
            }
            for (int i = 0; i < INT4_GROUP && g * INT4_GROUP + i < ctx->n; i++) {
                const __m512 scale = _mm512_set1_ps(bf16_to_f32(sb[i]));
                bf16_t *o = ctx->out + (g * INT4_GROUP + i) * k + b * 32;
                const __m128i lo = _mm_and_si128(rows16[i], nibble);
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(rows16[i], 4), nibble);
                const __m512 vlo = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)),
                                                 _mm512_set1_ps(8.0f));
                const __m512 vhi = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)),
                                                 _mm512_set1_ps(8.0f));
                _mm256_storeu_si256((__m256i *)o,
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(vlo, scale)));
                _mm256_storeu_si256((__m256i *)(o + 16),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(vhi, scale)));
            }
        }
    }
}
#endif

/* Dequantize int4 codes (the 16-row groups above linear_span_q4, n rows of them) into
   bfloat16 weights [n, k]: (code - 8) * scale, rounded once; for the steps with more rows
   than the linear kernels take. Returns 0, 2 for
   sizes it does not take, 3 where the build has no AVX-512 BF16 kernels. */
int swift_dequantize_int4(const uint8_t *w, const bf16_t *wscale, int64_t n, int64_t k,
                          bf16_t *out, int nthreads) {
#if !SWIFT_INT8_LINEAR
    (void)w, (void)wscale, (void)n, (void)k, (void)out, (void)nthreads;
    return 3;
#else
    if (n < 1 || k < 32 || k % 32) return 2;
    const struct dequantize_ctx ctx = {w, wscale, n, k, out};
    parallel_run(dequantize_share, (void *)&ctx,
                 team_size(nthreads, n * k, LINEAR_PARALLEL_MIN_BYTES,
                           POOL_LINEAR_PARALLEL_MIN_BYTES));
    return 0;
#endif
}

/*
 * The same product for a bfloat16 weight kept packed (swift_pack_bf16 below writes it), for
 * any number of rows: out[t, n] = x[t, :] . w[n, :] (+ bias[n]) (+ residual[t, n]), bfloat16
 * x, bias, residual and out, float32 sums rounded once. The packed weight holds 16 rows a
 * group and the groups 4 together (n rounded up to 64, the padding rows zero); within a
 * group, per pair of input columns (2p, 2p + 1), the 16 rows' two values side by side (64
 * bytes): wp[((g * k / 2 + p) * 16 + lane) * 2 + j] = w[16 g + lane, 2 p + j], k even. One
 * AVX-512 BF16 instruction multiplies 16 rows by a pair of an x row's values (broadcast), so
 * the lanes are output rows: no horizontal sums, and a register block of PK_MR x rows by 4
 * groups (64 weight rows) reuses each weight load PK_MR times and each broadcast 4 times.
 * Batch-1 decode streams the weight once, as the row-major kernel does; 9 to 64 rows run
 * 1.2-1.7x torch's bfloat16 GEMM on the development machine, whole prompts 1.04-1.07x.
 * Threads take contiguous runs of 64-row blocks. Returns 0, 2 for sizes it does not take,
 * 3 where the build has no AVX-512 BF16.
 */
#define PK_MR 6
#define PK_NR 4 /* groups of 16 rows per register block */

#if SWIFT_BF16_LINEAR && SWIFT_VECTOR_ACTIVATION
static inline __attribute__((always_inline)) void packed_block(
    const int MR, const bf16_t *x, int64_t x_row, const bf16_t *w0, int64_t pairs, int64_t n0,
    int64_t n, const bf16_t *bias, const bf16_t *res, int64_t res_row, bf16_t *out,
    int64_t out_row) {
    __m512 acc[PK_MR][PK_NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < PK_NR; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh wv[PK_NR];
        for (int j = 0; j < PK_NR; j++)
            wv[j] = (__m512bh)_mm512_loadu_si512((const void *)(w0 + (j * pairs + p) * 32));
        for (int i = 0; i < MR; i++) {
            uint32_t word;
            memcpy(&word, x + i * x_row + 2 * p, sizeof word);
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)word);
            for (int j = 0; j < PK_NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], b);
        }
    }
    for (int j = 0; j < PK_NR; j++) {
        const int64_t at = n0 + 16 * j;
        if (at >= n) break;
        const __mmask16 m = n - at >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - at)) - 1);
        const __m512 b = bias ? load_bf16_masked(bias + at, m) : _mm512_setzero_ps();
        for (int i = 0; i < MR; i++) {
            __m512 v = _mm512_add_ps(acc[i][j], b);
            if (res) v = _mm512_add_ps(v, load_bf16_masked(res + i * res_row + at, m));
            store_bf16_masked(out + i * out_row + at, m, round_bf16x16(v));
        }
    }
}

struct packed_ctx {
    const bf16_t *x;
    int64_t rows, x_row;
    const bf16_t *w;
    int64_t n, k;
    const bf16_t *bias, *res;
    int64_t res_row;
    bf16_t *out;
    int64_t out_row;
};

static void packed_share(void *p, int id, int team) {
    const struct packed_ctx *c = (const struct packed_ctx *)p;
    const int64_t pairs = c->k / 2, blocks = (c->n + 16 * PK_NR - 1) / (16 * PK_NR);
    int64_t b0, b1;
    share_of(blocks, id, team, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        const bf16_t *w0 = c->w + b * PK_NR * pairs * 32;
        const int64_t n0 = b * PK_NR * 16;
        for (int64_t t = 0; t < c->rows; t += PK_MR) {
            const bf16_t *x = c->x + t * c->x_row;
            const bf16_t *res = c->res ? c->res + t * c->res_row : NULL;
            bf16_t *out = c->out + t * c->out_row;
#define PK_ARGS x, c->x_row, w0, pairs, n0, c->n, c->bias, res, c->res_row, out, c->out_row
            switch (c->rows - t < PK_MR ? c->rows - t : PK_MR) {
            case 1: packed_block(1, PK_ARGS); break;
            case 2: packed_block(2, PK_ARGS); break;
            case 3: packed_block(3, PK_ARGS); break;
            case 4: packed_block(4, PK_ARGS); break;
            case 5: packed_block(5, PK_ARGS); break;
            default: packed_block(6, PK_ARGS); break;
            }
#undef PK_ARGS
        }
    }
}
#endif

int swift_linear_packed_bf16(const bf16_t *x, int64_t rows, int64_t x_row, const bf16_t *w,
                             int64_t n, int64_t k, const bf16_t *bias, const bf16_t *res,
                             int64_t res_row, bf16_t *out, int64_t out_row, int nthreads) {
#if !(SWIFT_BF16_LINEAR && SWIFT_VECTOR_ACTIVATION)
    (void)x, (void)rows, (void)x_row, (void)w, (void)n, (void)k, (void)bias, (void)res;
    (void)res_row, (void)out, (void)out_row, (void)nthreads;
    return 3;
#else
    if (rows < 1 || n < 1 || k < 2 || k % 2 || x_row < k || out_row < n || (res && res_row < n))
        return 2;
    nthreads = team_size(nthreads, n * k * 2 * (rows < PK_MR ? rows : PK_MR),
                         LINEAR_PARALLEL_MIN_BYTES, POOL_LINEAR_PARALLEL_MIN_BYTES);
    const int64_t blocks = (n + 16 * PK_NR - 1) / (16 * PK_NR);
    if (nthreads > blocks) nthreads = (int)blocks;
    const struct packed_ctx ctx = {x, rows, x_row, w, n, k, bias, res, res_row, out, out_row};
    parallel_run(packed_share, (void *)&ctx, nthreads);
    return 0;
#endif
}

/* Pack a contiguous row-major bfloat16 weight [n, k] (k even) into the layout above (`wp`
   holds n rounded up to 64 rows; the padding rows keep what they hold). Returns 0 or 2 for
   sizes it does not take. */
int swift_pack_bf16(const bf16_t *w, int64_t n, int64_t k, bf16_t *wp) {
    if (n < 1 || k < 2 || k % 2) return 2;
    const int64_t pairs = k / 2;
    for (int64_t r = 0; r < n; r++) {
        const uint32_t *src = (const uint32_t *)(const void *)(w + r * k);
        uint32_t *dst = (uint32_t *)(void *)(wp + (r / 16) * pairs * 32) + r % 16;
        for (int64_t p = 0; p < pairs; p++) dst[p * 16] = src[p];
    }
    return 0;
}

/*
 * A whole decoder layer for a decode step of bfloat16 rows (every row one new token), in one
 * call: RMSNorm, the fused q/k/v projection (+ bias), q/k norm + RoPE + KV write + attention
 * (swift_rope_decode_bf16), the output projection added to the residual, RMSNorm, the fused
 * gate/up projection, SiLU-mul and the down projection added to the residual. Each part is
 * the library's own function called with the arguments the model's Python path gives it, so
 * the result is bit-identical to that path; the call saves its per-operation Python, tensor
 * allocations and foreign calls (about ten a layer). `x` [rows, hidden] (contiguous) is
 * updated in place; `scratch` holds rows * (hidden + qkv + heads * head_dim + 3 *
 * intermediate) bfloat16 values. Weights are bfloat16 values (kind 0), int8 codes with
 * per-row scales (1) or int4 codes with block scales (2). Returns the first failing part's
 * status (2 for sizes no part takes, 3 where the build lacks a kernel a weight needs).
 */
typedef struct {
    const bf16_t *input_norm, *post_norm;
    const void *weights[4]; /* q/k/v, o, gate/up, down */
    const bf16_t *scales[4];
    int64_t kinds[4];
    const bf16_t *qkv_bias, *qk_norm;
    int64_t qk_norm_stride, hidden, heads, kv_heads, head_dim, intermediate, window;
    double eps, scale;
} swift_layer_t;

typedef struct {
    const bf16_t *cos, *sin;
    const int64_t *positions, *tables, *lens;
    int64_t max_pos, table_stride, rows, block_size, max_len, num_blocks, nthreads;
} swift_step_t;

static int linear_kind(int64_t kind, const bf16_t *x, int64_t rows, const void *w,
                       const bf16_t *s, int64_t n, int64_t k, const bf16_t *bias,
                       const bf16_t *res, bf16_t *out, int nthreads) {
    switch (kind) {
    case 0: return swift_linear_bf16(x, rows, k, w, n, k, bias, res, n, out, n, nthreads);
    case 1: return swift_linear_int8(x, rows, k, w, s, n, k, bias, res, n, out, n, nthreads);
    case 2: return swift_linear_int4(x, rows, k, w, s, n, k, bias, res, n, out, n, nthreads);
    case 3: return swift_linear_packed_bf16(x, rows, k, w, n, k, bias, res, n, out, n, nthreads);
    default: return 2;
    }
}

int swift_decode_layer_bf16(const swift_layer_t *L, const swift_step_t *S, bf16_t *k_cache,
                            bf16_t *v_cache, bf16_t *x, bf16_t *scratch) {
    const int64_t rows = S->rows, hidden = L->hidden, hd = L->head_dim;
    const int64_t qkv_n = (L->heads + 2 * L->kv_heads) * hd, inter = L->intermediate;
    const int threads = (int)S->nthreads;
    const float eps = (float)L->eps;
    bf16_t *h = scratch, *qkv = h + rows * hidden, *attn = qkv + rows * qkv_n;
    bf16_t *gate_up = attn + rows * L->heads * hd, *act = gate_up + rows * 2 * inter;
    int status;
    if ((status = rms_norm(x, rows, 1, hidden, 0, L->input_norm, 0, h, hidden, eps, threads, 1)))
        return status;
    if ((status = linear_kind(L->kinds[0], h, rows, L->weights[0], L->scales[0], qkv_n, hidden,
                              L->qkv_bias, NULL, qkv, threads)))
        return status;
    if ((status = swift_rope_decode_bf16(qkv, qkv_n, hd, L->qk_norm, L->qk_norm_stride, eps,
                                         S->cos, S->sin, S->positions, S->max_pos, k_cache,
                                         v_cache, S->tables, S->table_stride, S->lens, attn,
                                         rows, L->heads, L->kv_heads, hd, S->block_size,
                                         L->window, S->max_len, S->num_blocks, (float)L->scale,
                                         threads)))
        return status;
    /* The residual is read just before its own output value is written: in place is safe. */
    if ((status = linear_kind(L->kinds[1], attn, rows, L->weights[1], L->scales[1], hidden,
                              L->heads * hd, NULL, x, x, threads)))
        return status;
    if ((status = rms_norm(x, rows, 1, hidden, 0, L->post_norm, 0, h, hidden, eps, threads, 1)))
        return status;
    if ((status = linear_kind(L->kinds[2], h, rows, L->weights[2], L->scales[2], 2 * inter,
                              hidden, NULL, NULL, gate_up, threads)))
        return status;
    if ((status = silu_mul(gate_up, rows, 2 * inter, act, inter, threads, 1)))
        return status;
    return linear_kind(L->kinds[3], act, rows, L->weights[3], L->scales[3], hidden, inter, NULL,
                       x, x, threads);
}

/*
 * Prefill attention, bfloat16, on AVX-512 BF16: the new query tokens of one or more
 * sequences attend causally over their context where it lies in the paged cache (the chunk's
 * own keys and values written there already), a flash-attention loop without gathering:
 *   q      [T, heads, dim] rotated queries, strides q_row, q_head (dim contiguous)
 *   seqs   [num_seqs, 4] int64: the sequence's first row of q and out, its query count n,
 *          its context length c (n <= c; query i is position c - n + i) and its row of
 *          `tables`
 *   out    [T, heads, dim] contiguous (T = rows); rows no sequence names are not written
 * k, v, tables, block_size, window (0: none; else position p sees positions > p - window),
 * num_blocks and scale as in swift_paged_decode_bf16; dim 32, 64 or 128.
 *
 * The work is split into tasks of (sequence, KV head, PF_QB query positions), heaviest first,
 * taken in turn by the pool's threads. A task copies the keys and values its queries see
 * into pair-interleaved tiles (two bfloat16 values a 32-bit lane, as AVX-512 BF16's dot
 * product reads them: keys 16 to a vector with their dimensions paired, values with pairs of
 * positions), then runs its rows (query head x position, PF_R at a time) over the keys in
 * blocks of PF_KB: scores as float32 sums of bfloat16 products in registers, the softmax
 * online (float32; exp as exp16), the probabilities rounded to bfloat16 for the value
 * products, the output sums in float32, rounded once. The results differ from SDPA's by
 * float32 summation order and that rounding. Returns 0, 1 when scratch memory could not be
 * allocated, 2 for arguments it does not take (it then reads nothing), 3 where the build
 * lacks AVX-512 BF16.
 */
#define PF_QB 32 /* query positions per task */
#define PF_KB 64 /* keys per score block: PF_KB / 16 vectors */
#define PF_R 6   /* rows per register block */

#if SWIFT_BF16_LINEAR && SWIFT_VECTOR_ACTIVATION
struct prefill_task {
    int64_t seq, g, qa, cost;
};

struct prefill_ctx {
    const bf16_t *q;
    int64_t q_row, q_head;
    const bf16_t *k, *v;
    const int64_t *tables, *seqs;
    int64_t table_stride;
    bf16_t *out;
    int64_t heads, kv_heads, dim, bs, window, max_keys;
    float scale;
    const struct prefill_task *tasks;
    int64_t num_tasks, next; /* next: the first task no thread took yet (atomic) */
    int status;
};

static inline uint32_t pair_bf16(bf16_t lo, bf16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

/* The first position that position p sees under `window` (0: no window). */
static inline int64_t window_first(int64_t p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* o[r] = o[r] * alpha[r] + p[r] . values for RN rows (VECS vectors of 16 a row: the sums stay
   in registers), over one block's PF_KB / 2 position pairs; rows from `keep` on are computed
   and not stored. */
static inline __attribute__((always_inline)) void prefill_values(
    const int VECS, const int RN, const uint32_t *vt, const bf16_t *pb, const float *alpha,
    float *o, int keep) {
    __m512 ov[24]; /* RN * VECS <= 24 */
    for (int r = 0; r < RN; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int v = 0; v < VECS; v++)
            ov[r * VECS + v] = _mm512_mul_ps(_mm512_loadu_ps(o + r * VECS * 16 + 16 * v), a);
    }
    for (int p = 0; p < PF_KB / 2; p++) {
        __m512bh vz[8];
        for (int v = 0; v < VECS; v++)
            vz[v] = (__m512bh)_mm512_loadu_si512((const void *)(vt + (p * VECS + v) * 16));
        for (int r = 0; r < RN; r++) {
            uint32_t word;
            memcpy(&word, pb + r * PF_KB + 2 * p, sizeof word);
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)word);
            for (int v = 0; v < VECS; v++) ov[r * VECS + v] = _mm512_dpbf16_ps(ov[r * VECS + v], vz[v], b);
        }
    }
    for (int r = 0; r < RN && r < keep; r++)
        for (int v = 0; v < VECS; v++) _mm512_storeu_ps(o + r * VECS * 16 + 16 * v, ov[r * VECS + v]);
}

/* One register block: rows r < nr of the task (PF_R slots; slots past nr repeat row 0 and are
   not kept), against key tiles [t0, t0 + PF_KB / 16) of kp/vp. */
static inline __attribute__((always_inline)) void prefill_block(
    const struct prefill_ctx *c, const bf16_t *const *qp, const int64_t *pos, const int64_t *first,
    int nr, int64_t kfirst, int64_t t0, const uint32_t *kp, const uint32_t *vp, float *m,
    float *l, float *o, bf16_t *pb) {
    const int64_t dim = c->dim, pairs = dim / 2;
    __m512 acc[PF_R][PF_KB / 16];
    for (int r = 0; r < PF_R; r++)
        for (int j = 0; j < PF_KB / 16; j++) acc[r][j] = _mm512_setzero_ps();
    const uint32_t *kt = kp + t0 * pairs * 16;
    for (int64_t d2 = 0; d2 < pairs; d2++) {
        __m512bh kv[PF_KB / 16];
        for (int j = 0; j < PF_KB / 16; j++)
            kv[j] = (__m512bh)_mm512_loadu_si512((const void *)(kt + (j * pairs + d2) * 16));
        for (int r = 0; r < PF_R; r++) {
            uint32_t word;
            memcpy(&word, qp[r] + 2 * d2, sizeof word);
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)word);
            for (int j = 0; j < PF_KB / 16; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], kv[j], b);
        }
    }
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 sc = _mm512_set1_ps(c->scale);
    float alpha[PF_R];
    for (int r = 0; r < nr; r++) {
        __mmask16 valid[PF_KB / 16];
        __m512 s[PF_KB / 16];
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < PF_KB / 16; j++) {
            const int64_t key0 = kfirst + (t0 + j) * 16;
            const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32((int)key0), iota);
            valid[j] = _mm512_cmple_epi32_mask(keys, _mm512_set1_epi32((int)pos[r])) &
                       _mm512_cmpge_epi32_mask(keys, _mm512_set1_epi32((int)first[r]));
            s[j] = _mm512_mul_ps(acc[r][j], sc);
            top = _mm512_mask_max_ps(top, valid[j], top, s[j]);
        }
        const float block_max = _mm512_reduce_max_ps(top);
        bf16_t *prow = pb + r * PF_KB;
        if (block_max == -INFINITY) { /* no key of this block is visible to the row */
            memset(prow, 0, sizeof(bf16_t) * PF_KB);
            alpha[r] = 1.0f;
            continue;
        }
        const float mnew = m[r] > block_max ? m[r] : block_max;
        alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
        m[r] = mnew;
        const __m512 mv = _mm512_set1_ps(mnew);
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < PF_KB / 16; j++) {
            const __m512 p = _mm512_maskz_mov_ps(valid[j], exp16(_mm512_sub_ps(s[j], mv)));
            sum = _mm512_add_ps(sum, p);
            _mm256_storeu_si256((__m256i *)(prow + 16 * j), (__m256i)_mm512_cvtneps_pbh(p));
        }
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
    }
    for (int r = nr; r < PF_R; r++) alpha[r] = 0.0f; /* slots past nr: computed, not kept */
    const uint32_t *vt = vp + t0 * 8 * dim; /* 8 position pairs a tile */
    if (dim == 32) {
        prefill_values(2, 6, vt, pb, alpha, o, nr);
    } else if (dim == 64) {
        prefill_values(4, 6, vt, pb, alpha, o, nr);
    } else {
        prefill_values(8, 3, vt, pb, alpha, o, nr);
        prefill_values(8, 3, vt, pb + 3 * PF_KB, alpha + 3, o + 3 * 128, nr - 3);
    }
}

static void prefill_run(const struct prefill_ctx *c, const struct prefill_task *t, uint32_t *kp,
                        uint32_t *vp, float *o, bf16_t *pb) {
    const int64_t dim = c->dim, pairs = dim / 2, bs = c->bs, group = c->heads / c->kv_heads;
    const int64_t *sq = c->seqs + 4 * t->seq;
    const int64_t q0 = sq[0], n = sq[1], ctx = sq[2], base = ctx - n;
    const int64_t *table = c->tables + sq[3] * c->table_stride;
    const int64_t qa = t->qa, qb = qa + PF_QB < n ? qa + PF_QB : n;
    const int64_t g = t->g, token_stride = c->kv_heads * dim;
    const int64_t kfirst = window_first(base + qa, c->window);
    const int64_t nkeys = base + qb - kfirst;
    const int64_t tiles = (nkeys + 15) / 16, padded = (tiles + PF_KB / 16) * 16;
    /* keys: tile t, pair d2, lane i = position kfirst + 16 t + i; values: pair of positions
       (kfirst + 2 p, + 1), dimension d at vp[p * dim + d]; zeros past the last position */
    for (int64_t key = 0; key < padded; key++) {
        uint32_t *kdst = kp + (key / 16) * pairs * 16 + key % 16;
        if (key < nkeys) {
            const int64_t at = kfirst + key;
            const int64_t row = (table[at / bs] * bs + at % bs) * token_stride + g * dim;
            const bf16_t *ks = c->k + row, *vs = c->v + row;
            for (int64_t d2 = 0; d2 < pairs; d2++) kdst[d2 * 16] = pair_bf16(ks[2 * d2], ks[2 * d2 + 1]);
            bf16_t *vdst = (bf16_t *)(vp + (key / 2) * dim) + key % 2;
            for (int64_t d = 0; d < dim; d++) vdst[2 * d] = vs[d];
        } else {
            for (int64_t d2 = 0; d2 < pairs; d2++) kdst[d2 * 16] = 0;
            bf16_t *vdst = (bf16_t *)(vp + (key / 2) * dim) + key % 2;
            for (int64_t d = 0; d < dim; d++) vdst[2 * d] = 0;
        }
    }
    const int64_t rows = (qb - qa) * group;
    for (int64_t r0 = 0; r0 < rows; r0 += PF_R) {
        const int nr = rows - r0 < PF_R ? (int)(rows - r0) : PF_R;
        const bf16_t *qp[PF_R];
        int64_t pos[PF_R], first[PF_R];
        float m[PF_R], l[PF_R];
        for (int r = 0; r < PF_R; r++) {
            const int64_t row = r0 + (r < nr ? r : 0), i = qa + row / group;
            const int64_t h = g * group + row % group;
            qp[r] = c->q + (q0 + i) * c->q_row + h * c->q_head;
            pos[r] = base + i;
            first[r] = window_first(pos[r], c->window);
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(o, 0, sizeof(float) * (size_t)(PF_R * dim));
        /* key blocks from the first one a row sees to the last row's position */
        const int64_t t_lo = (first[0] - kfirst) / 16, t_hi = (pos[nr - 1] - kfirst) / 16;
        for (int64_t t0 = t_lo; t0 <= t_hi; t0 += PF_KB / 16)
            prefill_block(c, qp, pos, first, nr, kfirst, t0, kp, vp, m, l, o, pb);
        for (int r = 0; r < nr; r++) {
            const int64_t row = r0 + r, i = qa + row / group, h = g * group + row % group;
            bf16_t *dst = c->out + ((q0 + i) * c->heads + h) * dim;
            const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
            for (int64_t v = 0; v < dim / 16; v++)
                store_bf16_masked(dst + 16 * v, (__mmask16)0xffff,
                                  round_bf16x16(_mm512_mul_ps(_mm512_loadu_ps(o + r * dim + 16 * v), inv)));
        }
    }
}

static void prefill_share(void *p, int id, int team) {
    (void)id, (void)team;
    struct prefill_ctx *c = (struct prefill_ctx *)p;
    const int64_t dim = c->dim, padded = ((c->max_keys + 15) / 16 + PF_KB / 16) * 16;
    uint32_t *kp = aligned_alloc(64, sizeof(uint32_t) * (size_t)(padded * dim / 2));
    uint32_t *vp = aligned_alloc(64, sizeof(uint32_t) * (size_t)(padded / 2 * dim));
    float *o = malloc(sizeof(float) * (size_t)(PF_R * dim));
    bf16_t *pb = malloc(sizeof(bf16_t) * PF_R * PF_KB);
    if (kp == NULL || vp == NULL || o == NULL || pb == NULL) {
        __atomic_fetch_or(&c->status, 1, __ATOMIC_RELAXED);
    } else {
        for (;;) {
            const int64_t i = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
            if (i >= c->num_tasks) break;
            prefill_run(c, &c->tasks[i], kp, vp, o, pb);
        }
    }
    free(kp);
    free(vp);
    free(o);
    free(pb);
}

static int heavier_first(const void *a, const void *b) {
    const int64_t ca = ((const struct prefill_task *)a)->cost, cb = ((const struct prefill_task *)b)->cost;
    return (ca < cb) - (ca > cb);
}
#endif

int swift_prefill_attention_bf16(const bf16_t *q, int64_t q_row, int64_t q_head, const bf16_t *k,
                                 const bf16_t *v, const int64_t *tables, int64_t table_stride,
                                 const int64_t *seqs, int64_t num_seqs, bf16_t *out,
                                 int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                                 int64_t window, int64_t num_blocks, float scale, int nthreads) {
#if !(SWIFT_BF16_LINEAR && SWIFT_VECTOR_ACTIVATION)
    (void)q, (void)q_row, (void)q_head, (void)k, (void)v, (void)tables, (void)table_stride;
    (void)seqs, (void)num_seqs, (void)out, (void)rows, (void)heads, (void)kv_heads, (void)dim;
    (void)block_size, (void)window, (void)num_blocks, (void)scale, (void)nthreads;
    return 3;
#else
    if (num_seqs < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || block_size < 1 ||
        (dim != 32 && dim != 64 && dim != 128) || q_head < dim || q_row < heads * q_head ||
        window < 0 || num_blocks < 1 || table_stride < 1)
        return 2;
    int64_t num_tasks = 0, max_keys = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t *sq = seqs + 4 * s;
        const int64_t n = sq[1], ctx = sq[2];
        if (sq[0] < 0 || n < 1 || sq[0] + n > rows || ctx < n || ctx > INT32_MAX - 2 * PF_KB || sq[3] < 0 ||
            (ctx - 1) / block_size >= table_stride)
            return 2;
        for (int64_t b = 0; b <= (ctx - 1) / block_size; b++) {
            const int64_t id = tables[sq[3] * table_stride + b];
            if (id < 0 || id >= num_blocks) return 2; /* never read outside the cache */
        }
        num_tasks += (n + PF_QB - 1) / PF_QB * kv_heads;
        const int64_t keys = window > 0 && window + PF_QB < ctx ? window + PF_QB : ctx;
        max_keys = keys > max_keys ? keys : max_keys;
    }
    struct prefill_task *tasks = malloc(sizeof(struct prefill_task) * (size_t)num_tasks);
    if (tasks == NULL) return 1;
    int64_t at = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t n = seqs[4 * s + 1], base = seqs[4 * s + 2] - n;
        for (int64_t qa = 0; qa < n; qa += PF_QB) {
            const int64_t last = base + (qa + PF_QB < n ? qa + PF_QB : n);
            const int64_t from = window_first(base + qa, window);
            for (int64_t g = 0; g < kv_heads; g++)
                tasks[at++] = (struct prefill_task){s, g, qa, last - from};
        }
    }
    qsort(tasks, (size_t)num_tasks, sizeof *tasks, heavier_first);
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if ((int64_t)nthreads > num_tasks) nthreads = (int)num_tasks;
    struct prefill_ctx ctx = {q, q_row, q_head, k, v, tables, seqs, table_stride, out, heads,
                              kv_heads, dim, block_size, window, max_keys, scale, tasks,
                              num_tasks, 0, 0};
    parallel_run(prefill_share, &ctx, nthreads);
    free(tasks);
    return ctx.status;
#endif
}
