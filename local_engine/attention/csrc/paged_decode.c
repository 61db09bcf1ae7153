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
 * over `nthreads` threads: an OpenMP team when built with -fopenmp (against the runtime
 * torch uses), else pthreads with the caller's thread as one of them. Each task reads its
 * keys once, keeps the scores of its query heads in a scratch buffer, applies an exact
 * softmax (max-subtracted, float32) and reads its values once. Returns 0 on success, 1 when
 * scratch memory could not be allocated, 2 for arguments the kernel does not take (shapes
 * outside its limits, or a block id outside the cache; it then reads nothing).
 *
 * Compiled on first use by local_engine/attention/native.py.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#define MAX_HEADS 256
#define MAX_THREADS 64

typedef uint16_t bf16_t;

typedef struct {
    const void *q;
    int64_t q_row, q_head;
    const void *k, *v;
    const int64_t *tables;
    int64_t table_stride;
    const int64_t *lens;
    void *out;
    int64_t rows, heads, kv_heads, dim, block_size, window, max_len;
    float scale;
    int nthreads, tid, status, bf16;
} job_t;

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
    if (scores == NULL || acc == NULL || (bf16 && qf == NULL)) {
        free(scores);
        free(acc);
        free(qf);
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
        const float *q = (const float *)j->q + q_offset;
        int64_t q_head = j->q_head;
        if (bf16) {
            const bf16_t *qb = (const bf16_t *)j->q + q_offset;
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
            for (; t < stop; t++, key += token_stride * (int64_t)elem)
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
            for (; t < stop; t++, value += token_stride * (int64_t)elem)
                for (int64_t i = 0; i < heads; i++) {
                    const float p = scores[i * n + (t - first)];
                    if (bf16)
                        axpy_bf16(acc + i * dim, p, (const bf16_t *)value + (i / group) * dim, dim);
                    else
                        axpy(acc + i * dim, p, (const float *)value + (i / group) * dim, dim);
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
    return NULL;
}

static int paged_decode(const void *q, int64_t q_row, int64_t q_head, const void *k,
                        const void *v, const int64_t *tables, int64_t table_stride,
                        const int64_t *lens, void *out, int64_t rows, int64_t heads,
                        int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                        int64_t max_len, int64_t num_blocks, float scale, int nthreads, int bf16) {
    if (rows < 1 || heads < 1 || kv_heads < 1 || dim < 1 || block_size < 1 || max_len < 1 ||
        heads % kv_heads != 0 || heads > MAX_HEADS)
        return 2;
    for (int64_t r = 0; r < rows; r++) {
        if (lens[r] < 1 || lens[r] > max_len || (lens[r] - 1) / block_size >= table_stride)
            return 2;
        for (int64_t b = 0; b <= (lens[r] - 1) / block_size; b++) {
            const int64_t id = tables[r * table_stride + b];
            if (id < 0 || id >= num_blocks) return 2; /* never read outside the cache */
        }
    }
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if ((int64_t)nthreads > rows * kv_heads) nthreads = (int)(rows * kv_heads);
    const job_t base = {q, q_row, q_head, k, v, tables, table_stride, lens, out, rows, heads,
                        kv_heads, dim, block_size, window, max_len, scale, nthreads, 0, 0, bf16};
    int status = 0;
#if defined(_OPENMP)
    /* Built against the OpenMP runtime torch already loaded: the work runs on torch's own
       worker threads, which are awake (spinning) right after the projection before it. */
#pragma omp parallel num_threads(nthreads)
    {
        job_t job = base;
        job.tid = omp_get_thread_num();
        job.nthreads = omp_get_num_threads();
        run(&job);
#pragma omp atomic
        status |= job.status;
    }
#else
    job_t jobs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = base;
        jobs[i].tid = i;
    }
    int started = 1; /* jobs[0] runs on the caller's thread */
    while (started < nthreads && pthread_create(&threads[started], NULL, run, &jobs[started]) == 0)
        started++;
    run(&jobs[0]);
    for (int i = started; i < nthreads; i++) run(&jobs[i]); /* threads that did not start */
    for (int i = 1; i < started; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < nthreads; i++) status |= jobs[i].status;
#endif
    return status;
}

int swift_paged_decode_f32(const float *q, int64_t q_row, int64_t q_head, const float *k,
                           const float *v, const int64_t *tables, int64_t table_stride,
                           const int64_t *lens, float *out, int64_t rows, int64_t heads,
                           int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                           int64_t max_len, int64_t num_blocks, float scale, int nthreads) {
    return paged_decode(q, q_row, q_head, k, v, tables, table_stride, lens, out, rows, heads,
                        kv_heads, dim, block_size, window, max_len, num_blocks, scale, nthreads, 0);
}

int swift_paged_decode_bf16(const bf16_t *q, int64_t q_row, int64_t q_head, const bf16_t *k,
                            const bf16_t *v, const int64_t *tables, int64_t table_stride,
                            const int64_t *lens, bf16_t *out, int64_t rows, int64_t heads,
                            int64_t kv_heads, int64_t dim, int64_t block_size, int64_t window,
                            int64_t max_len, int64_t num_blocks, float scale, int nthreads) {
    return paged_decode(q, q_row, q_head, k, v, tables, table_stride, lens, out, rows, heads,
                        kv_heads, dim, block_size, window, max_len, num_blocks, scale, nthreads, 1);
}

/*
 * RMSNorm, in the same library (the model's norms take it where this library loads):
 *   row (o, i) of `cols` values starts at x + o * x_outer + i * x_inner (elements; a row is
 *   contiguous), for o < outer, i < inner; its weight starts at w + i * w_inner (w_inner 0:
 *   one weight for every row); out is contiguous [outer, inner, cols].
 *   out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in float32. bfloat16
 * (swift_rms_norm_bf16) converts on load, rounds the normalized value to bfloat16 before the
 * weight multiply and rounds the product again, as the float32-upcast reference does.
 * Rows are split over an OpenMP team of up to `nthreads` threads when there are enough of
 * them to pay for it. Returns 0, or 2 for sizes it does not take.
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

#define RMS_PARALLEL_MIN 32768 /* elements: below this a parallel region costs more */
#define RMS_MAX_COLS 16384 /* wider rows: the caller uses torch */

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

static int rms_norm(const void *x, int64_t outer, int64_t inner, int64_t x_outer,
                    int64_t x_inner, const void *w, int64_t w_inner, void *out, int64_t cols,
                    float eps, int nthreads, int bf16) {
    if (outer < 0 || inner < 1 || cols < 1 || cols > RMS_MAX_COLS) return 2;
    const int64_t rows = outer * inner;
    if (nthreads < 1 || rows * cols < RMS_PARALLEL_MIN) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r / inner, i = r % inner;
        if (bf16) {
            float scratch[RMS_MAX_COLS]; /* 64 KiB of the thread's stack */
            rms_row_bf16((const bf16_t *)x + o * x_outer + i * x_inner,
                         (const bf16_t *)w + i * w_inner, (bf16_t *)out + r * cols, cols, eps,
                         scratch);
        } else {
            rms_row_f32((const float *)x + o * x_outer + i * x_inner,
                        (const float *)w + i * w_inner, (float *)out + r * cols, cols, eps);
        }
    }
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
