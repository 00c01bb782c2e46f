/* kvgraft's fixed-order float32 products (kvstore/backends/transformers/fixed.py says exactly what they compute).
 *
 * dot16: out[b, i, j] = D(x[b, i, :], w[b, j, :]) (+ bias[j], one separately rounded add), where D accumulates in
 *   16 lanes: lane l is an FMA chain over k = l, l + 16, l + 32, ... < K, in increasing k, from +0.0; then the lanes
 *   are summed by a fixed pairwise tree: s8[i] = l[i] + l[i + 8] (i < 8), s4[i] = s8[i] + s8[i + 4] (i < 4),
 *   s2[i] = s4[i] + s4[i + 2] (i < 2), D = s2[0] + s2[1].
 * chain: out[b, i, c, :dv] = for each block c of `blk` positions, an FMA chain over the block's positions t in
 *   increasing order, of p[b, i, t] * v[b, key(t), :], from +0.0, where key(t) = t + t0; positions whose key is
 *   outside [0, kv) and terms with p == 0 are skipped; out[b, i, c, dv] = the plain sum of the same p terms, in the
 *   same order, from +0.0.
 *
 * Every output is computed by the same sequence of roundings whatever the tile it falls in, the row count, the
 * thread count (threads split the outputs, never a sum) or the instruction set (AVX-512: one zmm per 16 lanes;
 * AVX2 + FMA: two ymm; scalar: fmaf), so an output's bits depend only on its own operands. Compile without
 * -ffast-math and with -ffp-contract=off (fixed.py does).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ISA_SCALAR 0
#define ISA_AVX2 1
#define ISA_AVX512 2

int kvg_supported(int isa) {
    __builtin_cpu_init();
    if (isa == ISA_SCALAR) return 1;
    if (isa == ISA_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == ISA_AVX512) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
    return 0;
}

/* ---------------------------------------------------------------- scalar reference */

static float tree16(const float *l) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

static float dot16_scalar(const float *x, const float *w, long K) {
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = 0.0f;
    for (long k = 0; k < K; k++) l[k & 15] = fmaf(x[k], w[k], l[k & 15]);
    return tree16(l);
}

static void dot16_rows_scalar(const float *x, long ldx, const float *w, long ldw, const float *bias, float *out,
                              long ldo, long M, long j0, long j1, long K) {
    for (long i = 0; i < M; i++)
        for (long j = j0; j < j1; j++) {
            float d = dot16_scalar(x + i * ldx, w + j * ldw, K);
            out[i * ldo + j] = bias ? d + bias[j] : d;
        }
}

/* ---------------------------------------------------------------- AVX-512 */

#define T512 __attribute__((target("avx512f,fma"), always_inline)) static inline
#define F512 __attribute__((target("avx512f,fma"))) static

T512 float hsum512(__m512 a) {
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* R rows x C weight rows, one zmm accumulator per output */
T512 void tile512(const int R, const int C, const float *x, long ldx, const float *w, long ldw, const float *bias,
                  float *out, long ldo, long K) {
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 wv = _mm512_loadu_ps(w + c * ldw + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) xv[r] = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, w + c * ldw + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            float d = hsum512(acc[r][c]);
            out[r * ldo + c] = bias ? d + bias[c] : d;
        }
}

#define ROWS512(R, C)                                                                                              \
    F512 void rows512_##R##_##C(const float *x, long ldx, const float *w, long ldw, const float *bias, float *out, \
                                long ldo, long j0, long j1, long K) {                                             \
        long j = j0;                                                                                              \
        for (; j + C <= j1; j += C)                                                                               \
            tile512(R, C, x, ldx, w + j * ldw, ldw, bias ? bias + j : 0, out + j, ldo, K);                        \
        for (; j < j1; j++) tile512(R, 1, x, ldx, w + j * ldw, ldw, bias ? bias + j : 0, out + j, ldo, K);        \
    }
ROWS512(1, 8)
ROWS512(2, 8)
ROWS512(3, 6)
ROWS512(4, 6)

F512 void dot16_rows_512(const float *x, long ldx, const float *w, long ldw, const float *bias, float *out, long ldo,
                         long M, long j0, long j1, long K) {
    /* column blocks whose weights stay in L2 while every row tile passes over them */
    long nb = (192 * 1024) / (K * 4 + 1);
    nb = nb < 24 ? 24 : nb - nb % 24;
    if (M <= 4) nb = j1 - j0;
    for (long jb = j0; jb < j1; jb += nb) {
        long je = jb + nb < j1 ? jb + nb : j1;
        long i = 0;
        for (; i + 4 <= M; i += 4) rows512_4_6(x + i * ldx, ldx, w, ldw, bias, out + i * ldo, ldo, jb, je, K);
        long left = M - i;
        const float *xi = x + i * ldx;
        float *oi = out + i * ldo;
        if (left == 3) rows512_3_6(xi, ldx, w, ldw, bias, oi, ldo, jb, je, K);
        else if (left == 2) rows512_2_8(xi, ldx, w, ldw, bias, oi, ldo, jb, je, K);
        else if (left == 1) rows512_1_8(xi, ldx, w, ldw, bias, oi, ldo, jb, je, K);
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA: lanes 0-7 and 8-15 in two ymm */

#define T256 __attribute__((target("avx2,fma"), always_inline)) static inline
#define F256 __attribute__((target("avx2,fma"))) static

T256 float hsum256x2(__m256 lo, __m256 hi) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

T256 __m256 load8(const float *p, long n) { /* n valid floats (<= 8), zeros after */
    if (n >= 8) return _mm256_loadu_ps(p);
    if (n <= 0) return _mm256_setzero_ps();
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
    return _mm256_maskload_ps(p, m);
}

T256 void tile256(const int R, const int C, const float *x, long ldx, const float *w, long ldw, const float *bias,
                  float *out, long ldo, long K) {
    __m256 lo[2][3], hi[2][3];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 xv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            __m256 wv = _mm256_loadu_ps(w + c * ldw + k);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) lo[r][c] = _mm256_fmadd_ps(xv[r], wv, lo[r][c]);
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k + 8);
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            __m256 wv = _mm256_loadu_ps(w + c * ldw + k + 8);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) hi[r][c] = _mm256_fmadd_ps(xv[r], wv, hi[r][c]);
        }
    }
    if (k < K) {
        long n = K - k;
        __m256 xl[2], xh[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            xl[r] = load8(x + r * ldx + k, n);
            xh[r] = load8(x + r * ldx + k + 8, n - 8);
        }
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            __m256 wl = load8(w + c * ldw + k, n), wh = load8(w + c * ldw + k + 8, n - 8);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                lo[r][c] = _mm256_fmadd_ps(xl[r], wl, lo[r][c]);
                hi[r][c] = _mm256_fmadd_ps(xh[r], wh, hi[r][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            float d = hsum256x2(lo[r][c], hi[r][c]);
            out[r * ldo + c] = bias ? d + bias[c] : d;
        }
}

#define ROWS256(R, C)                                                                                              \
    F256 void rows256_##R##_##C(const float *x, long ldx, const float *w, long ldw, const float *bias, float *out, \
                                long ldo, long j0, long j1, long K) {                                             \
        long j = j0;                                                                                              \
        for (; j + C <= j1; j += C)                                                                               \
            tile256(R, C, x, ldx, w + j * ldw, ldw, bias ? bias + j : 0, out + j, ldo, K);                        \
        for (; j < j1; j++) tile256(R, 1, x, ldx, w + j * ldw, ldw, bias ? bias + j : 0, out + j, ldo, K);        \
    }
ROWS256(1, 3)
ROWS256(2, 3)

F256 void dot16_rows_256(const float *x, long ldx, const float *w, long ldw, const float *bias, float *out, long ldo,
                         long M, long j0, long j1, long K) {
    long nb = (192 * 1024) / (K * 4 + 1);
    nb = nb < 24 ? 24 : nb - nb % 24;
    if (M <= 4) nb = j1 - j0;
    for (long jb = j0; jb < j1; jb += nb) {
        long je = jb + nb < j1 ? jb + nb : j1;
        long i = 0;
        for (; i + 2 <= M; i += 2) rows256_2_3(x + i * ldx, ldx, w, ldw, bias, out + i * ldo, ldo, jb, je, K);
        if (i < M) rows256_1_3(x + i * ldx, ldx, w, ldw, bias, out + i * ldo, ldo, jb, je, K);
    }
}

/* ---------------------------------------------------------------- dot16 entry */

typedef void (*rows_fn)(const float *, long, const float *, long, const float *, float *, long, long, long, long,
                        long);

/* batch products: x [B, M, K] (batch stride sxb, row stride ldx), w [B, N, K] (swb, ldw), bias [N] or NULL,
 * out [B, M, N] (sob, ldo). Threads split the columns (and batches), never a sum. */
int kvg_dot16(long B, long M, long N, long K, const float *x, long sxb, long ldx, const float *w, long swb, long ldw,
              const float *bias, float *out, long sob, long ldo, int isa, int nthreads) {
    rows_fn fn = isa == ISA_AVX512 ? dot16_rows_512 : isa == ISA_AVX2 ? dot16_rows_256 : dot16_rows_scalar;
    if (!kvg_supported(isa)) return -1;
    double work = (double)B * M * N * K;
    int nt = nthreads < 1 ? 1 : nthreads;
    if (work < 1.5e5 || N < 16 * nt) nt = 1;
    if (nt == 1) {
        for (long b = 0; b < B; b++) fn(x + b * sxb, ldx, w + b * swb, ldw, bias, out + b * sob, ldo, M, 0, N, K);
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
        int t = 0, n = 1;
#endif
        /* each thread a contiguous share of the columns, in multiples of 24 (every tile width divides it) */
        long units = (N + 23) / 24;
        long u0 = units * t / n, u1 = units * (t + 1) / n;
        long j0 = u0 * 24, j1 = u1 * 24 < N ? u1 * 24 : N;
        if (j0 < j1)
            for (long b = 0; b < B; b++) fn(x + b * sxb, ldx, w + b * swb, ldw, bias, out + b * sob, ldo, M, j0, j1, K);
    }
    return 0;
}

/* ---------------------------------------------------------------- chain (attention: probabilities x values) */

/* one row i: for each block c, out[c, :dv] = chain over the block's positions; out[c, dv] = the sum of p */
static void chain_row_scalar(const float *p, const float *v, long ldv, float *out, long ldoc, long nblk, long blk,
                             long t0, long kv, long dv) {
    for (long c = 0; c < nblk; c++) {
        float *o = out + c * ldoc;
        for (long d = 0; d <= dv; d++) o[d] = 0.0f;
        for (long t = c * blk; t < (c + 1) * blk; t++) {
            long key = t + t0;
            float pv = p[t];
            if (key < 0 || key >= kv || pv == 0.0f) continue;
            const float *vr = v + key * ldv;
            for (long d = 0; d < dv; d++) o[d] = fmaf(pv, vr[d], o[d]);
            o[dv] = o[dv] + pv;
        }
    }
}

F512 void chain_row_512(const float *p, const float *v, long ldv, float *out, long ldoc, long nblk, long blk,
                        long t0, long kv, long dv) {
    for (long c = 0; c < nblk; c++) {
        float *o = out + c * ldoc;
        long ta = c * blk, tb = (c + 1) * blk;
        if (ta + t0 < 0) ta = -t0;
        if (tb + t0 > kv) tb = kv - t0;
        float sum = 0.0f;
        for (long d0 = 0; d0 < dv; d0 += 128) { /* 8 zmm of the output row at a time */
            long n = dv - d0 < 128 ? dv - d0 : 128;
            int full = (int)(n / 16), rest = (int)(n % 16);
            __mmask16 m = (__mmask16)((1u << rest) - 1u);
            __m512 acc[8];
#pragma GCC unroll 8
            for (int z = 0; z < 8; z++) acc[z] = _mm512_setzero_ps();
            for (long t = ta; t < tb; t++) {
                float pv = p[t];
                if (pv == 0.0f) continue;
                if (d0 == 0) sum = sum + pv;
                __m512 pb = _mm512_set1_ps(pv);
                const float *vr = v + (t + t0) * ldv + d0;
                if (full == 8) {
#pragma GCC unroll 8
                    for (int z = 0; z < 8; z++) acc[z] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vr + 16 * z), acc[z]);
                } else {
                    for (int z = 0; z < full; z++) acc[z] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vr + 16 * z), acc[z]);
                    if (rest) acc[full] = _mm512_fmadd_ps(pb, _mm512_maskz_loadu_ps(m, vr + 16 * full), acc[full]);
                }
            }
            for (int z = 0; z < full; z++) _mm512_storeu_ps(o + d0 + 16 * z, acc[z]);
            if (rest) _mm512_mask_storeu_ps(o + d0 + 16 * full, m, acc[full]);
        }
        if (dv == 0)
            for (long t = ta; t < tb; t++)
                if (p[t] != 0.0f) sum = sum + p[t];
        o[dv] = sum;
    }
}

F256 void chain_row_256(const float *p, const float *v, long ldv, float *out, long ldoc, long nblk, long blk,
                        long t0, long kv, long dv) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (long c = 0; c < nblk; c++) {
        float *o = out + c * ldoc;
        long ta = c * blk, tb = (c + 1) * blk;
        if (ta + t0 < 0) ta = -t0;
        if (tb + t0 > kv) tb = kv - t0;
        float sum = 0.0f;
        for (long d0 = 0; d0 < dv; d0 += 96) { /* 12 ymm of the output row at a time */
            long n = dv - d0 < 96 ? dv - d0 : 96;
            int full = (int)(n / 8), rest = (int)(n % 8);
            __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(rest), idx);
            __m256 acc[12];
#pragma GCC unroll 12
            for (int z = 0; z < 12; z++) acc[z] = _mm256_setzero_ps();
            for (long t = ta; t < tb; t++) {
                float pv = p[t];
                if (pv == 0.0f) continue;
                if (d0 == 0) sum = sum + pv;
                __m256 pb = _mm256_set1_ps(pv);
                const float *vr = v + (t + t0) * ldv + d0;
                if (full == 12) {
#pragma GCC unroll 12
                    for (int z = 0; z < 12; z++) acc[z] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 8 * z), acc[z]);
                } else {
                    for (int z = 0; z < full; z++) acc[z] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 8 * z), acc[z]);
                    if (rest) acc[full] = _mm256_fmadd_ps(pb, _mm256_maskload_ps(vr + 8 * full, m), acc[full]);
                }
            }
            for (int z = 0; z < full; z++) _mm256_storeu_ps(o + d0 + 8 * z, acc[z]);
            if (rest) _mm256_maskstore_ps(o + d0 + 8 * full, m, acc[full]);
        }
        if (dv == 0)
            for (long t = ta; t < tb; t++)
                if (p[t] != 0.0f) sum = sum + p[t];
        o[dv] = sum;
    }
}

typedef void (*chain_fn)(const float *, const float *, long, float *, long, long, long, long, long, long);

/* p [B, M, nblk * blk] (sp_b, ldp), v [B, kv, dv] (sv_b, ldv), out [B, M, nblk, dv + 1] contiguous per row
 * (so_b, ldo, block stride dv + 1). Threads split the rows (B * M), never a sum. */
int kvg_chain(long B, long M, long nblk, long blk, long t0, long kv, long dv, const float *p, long sp_b, long ldp,
              const float *v, long sv_b, long ldv, float *out, long so_b, long ldo, int isa, int nthreads) {
    chain_fn fn = isa == ISA_AVX512 ? chain_row_512 : isa == ISA_AVX2 ? chain_row_256 : chain_row_scalar;
    if (!kvg_supported(isa)) return -1;
    long rows = B * M;
    int nt = nthreads < 1 ? 1 : nthreads;
    if ((double)rows * nblk * blk * (dv + 1) < 1.5e5 || rows < nt) nt = 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long r = 0; r < rows; r++) {
        long b = r / M, i = r % M;
        fn(p + b * sp_b + i * ldp, v + b * sv_b, ldv, out + b * so_b + i * ldo, dv + 1, nblk, blk, t0, kv, dv);
    }
    return 0;
}
