/* One-pass kernels over host memory for the probes' hottest element-wise work (host_kernels.py
 * says why and how they are built). C99 with GCC/Clang vector types, compiled without -march or
 * fast-math: every result is the IEEE result NumPy's passes give, on any CPU.
 *
 * The loops work on 16-byte vectors, U of them side by side so that the reductions' chains do
 * not wait on each other. A maximum or minimum is exact, so the order in which lanes meet does
 * not change it; NaN is tracked apart and reported in the return value, where NumPy's and torch's
 * max and min return NaN. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef float f32v __attribute__((vector_size(16)));
typedef int32_t i32v __attribute__((vector_size(16)));
typedef double f64v __attribute__((vector_size(16)));
typedef int64_t i64v __attribute__((vector_size(16)));
typedef float f32x2 __attribute__((vector_size(8)));

enum { U = 4 };

static inline f32v load_f32(const float *p) { f32v v; memcpy(&v, p, sizeof v); return v; }
static inline f64v load_f64(const double *p) { f64v v; memcpy(&v, p, sizeof v); return v; }

/* a > b ? a : b and a < b ? a : b lane by lane (b where either is NaN): x86's MAXPS/MINPS exactly */
#if defined(__SSE2__)
static inline f32v gt_f32(f32v a, f32v b) { return (f32v)_mm_max_ps((__m128)a, (__m128)b); }
static inline f32v lt_f32(f32v a, f32v b) { return (f32v)_mm_min_ps((__m128)a, (__m128)b); }
static inline f64v gt_f64(f64v a, f64v b) { return (f64v)_mm_max_pd((__m128d)a, (__m128d)b); }
static inline f64v lt_f64(f64v a, f64v b) { return (f64v)_mm_min_pd((__m128d)a, (__m128d)b); }
#else
static inline f32v gt_f32(f32v a, f32v b) { i32v m = a > b; return (f32v)(((i32v)a & m) | ((i32v)b & ~m)); }
static inline f32v lt_f32(f32v a, f32v b) { i32v m = a < b; return (f32v)(((i32v)a & m) | ((i32v)b & ~m)); }
static inline f64v gt_f64(f64v a, f64v b) { i64v m = a > b; return (f64v)(((i64v)a & m) | ((i64v)b & ~m)); }
static inline f64v lt_f64(f64v a, f64v b) { i64v m = a < b; return (f64v)(((i64v)a & m) | ((i64v)b & ~m)); }
#endif

/* The free_benchmark ratio rule's figures: out = [max r, min r, min a*b] with
 * r = max(|a|, tol) / max(|b|, tol). Returns bit 0 set when some r is NaN, bit 1 when some a*b is. */
#define RATIO(NAME, T, V, IV, SFX, ABS_MASK)                                                   \
    int NAME(const T *a, const T *b, ptrdiff_t n, T tol, double *out) {                        \
        enum { W = sizeof(V) / sizeof(T) };                                                    \
        V tolv, rmax[U], rmin[U], pmin[U];                                                     \
        IV nan[U], abs_mask;                                                                   \
        for (int j = 0; j < W; j++) {                                                          \
            tolv[j] = tol;                                                                     \
            abs_mask[j] = ABS_MASK;                                                            \
        }                                                                                      \
        for (int k = 0; k < U; k++) {                                                          \
            rmax[k] = -tolv * (T)INFINITY;                                                     \
            rmin[k] = pmin[k] = tolv * (T)INFINITY;                                            \
            nan[k] = abs_mask & 0;                                                             \
        }                                                                                      \
        ptrdiff_t i = 0;                                                                       \
        for (; i + U * W <= n; i += U * W)                                                     \
            for (int k = 0; k < U; k++) {                                                      \
                V x = load_##SFX(a + i + k * W), y = load_##SFX(b + i + k * W);                \
                /* max(|x|, tol) with NaN kept, as np.maximum: MAXPS(tol, NaN) is NaN */       \
                V ax = gt_##SFX(tolv, (V)((IV)x & abs_mask));                                  \
                V ay = gt_##SFX(tolv, (V)((IV)y & abs_mask));                                  \
                V r = ax / ay, p = x * y;                                                      \
                nan[k] |= (r != r) & 1;                                                        \
                nan[k] |= (p != p) & 2;                                                        \
                rmax[k] = gt_##SFX(r, rmax[k]);                                                \
                rmin[k] = lt_##SFX(r, rmin[k]);                                                \
                pmin[k] = lt_##SFX(p, pmin[k]);                                                \
            }                                                                                  \
        T top = -(T)INFINITY, low = (T)INFINITY, prod = (T)INFINITY;                           \
        int flags = 0;                                                                         \
        for (int k = 0; k < U; k++)                                                            \
            for (int j = 0; j < W; j++) {                                                      \
                top = rmax[k][j] > top ? rmax[k][j] : top;                                     \
                low = rmin[k][j] < low ? rmin[k][j] : low;                                     \
                prod = pmin[k][j] < prod ? pmin[k][j] : prod;                                  \
                flags |= (int)nan[k][j];                                                       \
            }                                                                                  \
        for (; i < n; i++) {                                                                   \
            T x = a[i], y = b[i];                                                              \
            T ax = x < 0 ? -x : x, ay = y < 0 ? -y : y;                                        \
            ax = tol > ax ? tol : ax;                                                          \
            ay = tol > ay ? tol : ay;                                                          \
            T r = ax / ay, p = x * y;                                                          \
            flags |= (r != r) | (p != p) << 1;                                                 \
            top = r > top ? r : top;                                                           \
            low = r < low ? r : low;                                                           \
            prod = p < prod ? p : prod;                                                        \
        }                                                                                      \
        out[0] = top;                                                                          \
        out[1] = low;                                                                          \
        out[2] = prod;                                                                         \
        return flags;                                                                          \
    }

RATIO(ratio_figures_f32, float, f32v, i32v, f32, INT32_MAX)
RATIO(ratio_figures_f64, double, f64v, i64v, f64, INT64_MAX)

/* The scaled rule's bound: out = max |a - b| (the difference rounded to T, as NumPy subtracts).
 * Returns 1 when some difference is NaN. */
#define MAX_ABS_DIFF(NAME, T, V, IV, SFX, ABS_MASK)                                            \
    int NAME(const T *a, const T *b, ptrdiff_t n, double *out) {                               \
        enum { W = sizeof(V) / sizeof(T) };                                                    \
        V top[U];                                                                              \
        IV nan[U], abs_mask;                                                                   \
        for (int j = 0; j < W; j++) abs_mask[j] = ABS_MASK;                                    \
        for (int k = 0; k < U; k++) {                                                          \
            top[k] = (V)(abs_mask & 0);                                                        \
            nan[k] = abs_mask & 0;                                                             \
        }                                                                                      \
        ptrdiff_t i = 0;                                                                       \
        for (; i + U * W <= n; i += U * W)                                                     \
            for (int k = 0; k < U; k++) {                                                      \
                V d = load_##SFX(a + i + k * W) - load_##SFX(b + i + k * W);                   \
                nan[k] |= d != d;                                                              \
                top[k] = gt_##SFX((V)((IV)d & abs_mask), top[k]);                              \
            }                                                                                  \
        T m = 0;                                                                               \
        int flags = 0;                                                                         \
        for (int k = 0; k < U; k++)                                                            \
            for (int j = 0; j < W; j++) {                                                      \
                m = top[k][j] > m ? top[k][j] : m;                                             \
                flags |= nan[k][j] != 0;                                                       \
            }                                                                                  \
        for (; i < n; i++) {                                                                   \
            T d = a[i] - b[i];                                                                 \
            d = d < 0 ? -d : d;                                                                \
            flags |= d != d;                                                                   \
            m = d > m ? d : m;                                                                 \
        }                                                                                      \
        out[0] = m;                                                                            \
        return flags;                                                                          \
    }

MAX_ABS_DIFF(max_abs_diff_f32, float, f32v, i32v, f32, INT32_MAX)
MAX_ABS_DIFF(max_abs_diff_f64, double, f64v, i64v, f64, INT64_MAX)

/* A perturbation's edit of float bit patterns: out = bits OP 1 where above < (bits & mask) <
 * below (the magnitude code of a finite float in a band), else bits. `bits` is T's signed view.
 * (Plain loops: the compiler vectorises integer code of one width by itself.) */
#define BAND(NAME, T, UT, OP)                                                                  \
    void NAME(const T *restrict bits, T *restrict out, ptrdiff_t n, UT mask, UT above, UT below) { \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            UT m = (UT)bits[i] & mask;                                                         \
            out[i] = (T)((UT)bits[i] OP(UT)(m > above && m < below));                          \
        }                                                                                      \
    }

BAND(band_add_16, int16_t, uint16_t, +)
BAND(band_add_32, int32_t, uint32_t, +)
BAND(band_add_64, int64_t, uint64_t, +)
BAND(band_xor_16, int16_t, uint16_t, ^)
BAND(band_xor_32, int32_t, uint32_t, ^)
BAND(band_xor_64, int64_t, uint64_t, ^)

/* Whether two float arrays are equal element by element as `a == b` reads them (NaN differs from
 * NaN, -0.0 equals 0.0): free_benchmark's no_change verdict. One pass, no temporary. */
#define ALL_EQUAL(NAME, T, V, IV, SFX)                                                         \
    int NAME(const T *a, const T *b, ptrdiff_t n) {                                            \
        enum { W = sizeof(V) / sizeof(T) };                                                    \
        IV same[U];                                                                            \
        ptrdiff_t i = 0;                                                                       \
        for (int k = 0; k < U; k++) same[k] = (IV){0} == 0;                                    \
        for (; i + U * W <= n; i += U * W)                                                     \
            for (int k = 0; k < U; k++)                                                        \
                same[k] &= load_##SFX(a + i + k * W) == load_##SFX(b + i + k * W);             \
        int all = 1;                                                                           \
        for (int k = 0; k < U; k++)                                                            \
            for (int j = 0; j < W; j++) all &= same[k][j] != 0;                                \
        for (; i < n; i++) all &= a[i] == b[i];                                                \
        return all;                                                                            \
    }

ALL_EQUAL(all_equal_f32, float, f32v, i32v, f32)
ALL_EQUAL(all_equal_f64, double, f64v, i64v, f64)

/* The same for float16 / bfloat16 given as their bit patterns: equal bits that are not a NaN
 * (magnitude code above the infinity's `inf`), or two zeros of either sign. */
int all_equal_h16(const uint16_t *restrict a, const uint16_t *restrict b, ptrdiff_t n, uint16_t inf) {
    int all = 1;
    for (ptrdiff_t i = 0; i < n; i++) {
        uint16_t x = a[i], y = b[i];
        all &= (x == y && (uint16_t)(x & 0x7fff) <= inf) | ((uint16_t)((x | y) & 0x7fff) == 0);
    }
    return all;
}

/* Integer and bool arrays: equal bytes. */
int all_equal_bytes(const void *a, const void *b, size_t nbytes) { return memcmp(a, b, nbytes) == 0; }

/* float32 pairs widened to float64 (exact): CVTPS2PD on x86, which compilers do not find alone */
#if defined(__SSE2__)
static inline f64v low_pair(f32v x) { return (f64v)_mm_cvtps_pd((__m128)x); }
static inline f64v high_pair(f32v x) { return (f64v)_mm_cvtps_pd(_mm_movehl_ps((__m128)x, (__m128)x)); }
static inline f64v wide_f32(const float *p) { return (f64v)_mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)p))); }
#else
static inline f64v low_pair(f32v x) { return (f64v){x[0], x[1]}; }
static inline f64v high_pair(f32v x) { return (f64v){x[2], x[3]}; }
static inline f64v wide_f32(const float *p) { f32x2 v; memcpy(&v, p, sizeof v); return __builtin_convertvector(v, f64v); }
#endif
static inline f64v wide_f64(const double *p) { return load_f64(p); }

/* n partial sums (a power of two) combined pairwise: ((p0 + p1) + (p2 + p3)) + ..., the order
 * host_arrays.ordered_sum gives with NumPy */
static inline double pairwise_sum(double *p, int n) {
    for (int w = 1; w < n; w *= 2)
        for (int j = 0; j < n; j += 2 * w) p[j] += p[j + w];
    return p[0];
}
static inline double bf16_value(uint16_t h) { uint32_t b = (uint32_t)h << 16; float x; memcpy(&x, &b, sizeof x); return x; }
#if defined(__SSE2__)
static inline f64v wide_bf16(const uint16_t *p) { /* each bfloat16 into the upper half of a float32 */
    int32_t two;
    memcpy(&two, p, sizeof two);
    __m128i x = _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_cvtsi32_si128(two));
    return (f64v)_mm_cvtps_pd(_mm_castsi128_ps(x));
}
#else
static inline f64v wide_bf16(const uint16_t *p) { return (f64v){bf16_value(p[0]), bf16_value(p[1])}; }
#endif
static inline double one_f32(const float *p) { return *p; }
static inline double one_f64(const double *p) { return *p; }
static inline double one_bf16(const uint16_t *p) { return bf16_value(*p); }

/* online_dispatch's figures of a device leaf and its float64 reference, in one pass and without a
 * float64 copy of the difference: out = [r.r, r.d, d.d, max d, min d] with d = (double)dev - ref.
 * The sums are kept in 4 partial sums, element i added to partial i % 4 in index order, combined
 * as (p0 + p1) + (p2 + p3): a fixed order (host_arrays.dispatch_parts gives it without a compiler).
 * Returns 1 when some d is NaN (the max and min are then NaN, as torch's). */
enum { DU = 2, DP = 2 * DU };
#define DISPATCH_PARTS(NAME, T, SFX)                                                           \
    int NAME(const T *dev, const double *ref, ptrdiff_t n, double *out) {                      \
        f64v rr[DU], rd[DU], dd[DU], top[DU], low[DU];                                         \
        i64v nan[DU];                                                                          \
        for (int k = 0; k < DU; k++) {                                                         \
            rr[k] = rd[k] = dd[k] = (f64v){0.0, 0.0};                                          \
            top[k] = (f64v){-INFINITY, -INFINITY};                                             \
            low[k] = (f64v){INFINITY, INFINITY};                                               \
            nan[k] = (i64v){0, 0};                                                             \
        }                                                                                      \
        ptrdiff_t i = 0;                                                                       \
        for (; i + DP <= n; i += DP)                                                           \
            for (int k = 0; k < DU; k++) {                                                     \
                f64v r = load_f64(ref + i + 2 * k), d = wide_##SFX(dev + i + 2 * k) - r;       \
                nan[k] |= d != d;                                                              \
                rr[k] += r * r;                                                                \
                rd[k] += r * d;                                                                \
                dd[k] += d * d;                                                                \
                top[k] = gt_f64(d, top[k]);                                                    \
                low[k] = lt_f64(d, low[k]);                                                    \
            }                                                                                  \
        double sums[3][DP], t = -INFINITY, l = INFINITY;                                       \
        int flags = 0;                                                                         \
        for (int k = 0; k < DU; k++)                                                           \
            for (int j = 0; j < 2; j++) {                                                      \
                sums[0][2 * k + j] = rr[k][j];                                                 \
                sums[1][2 * k + j] = rd[k][j];                                                 \
                sums[2][2 * k + j] = dd[k][j];                                                 \
                t = top[k][j] > t ? top[k][j] : t;                                             \
                l = low[k][j] < l ? low[k][j] : l;                                             \
                flags |= nan[k][j] != 0;                                                       \
            }                                                                                  \
        for (int j = 0; i < n; i++, j++) {                                                     \
            double r = ref[i], d = one_##SFX(dev + i) - r;                                     \
            flags |= d != d;                                                                   \
            sums[0][j] += r * r;                                                               \
            sums[1][j] += r * d;                                                               \
            sums[2][j] += d * d;                                                               \
            t = d > t ? d : t;                                                                 \
            l = d < l ? d : l;                                                                 \
        }                                                                                      \
        for (int f = 0; f < 3; f++) out[f] = pairwise_sum(sums[f], DP);                        \
        out[3] = t;                                                                            \
        out[4] = l;                                                                            \
        return flags;                                                                          \
    }

DISPATCH_PARTS(dispatch_parts_f32, float, f32)
DISPATCH_PARTS(dispatch_parts_f64, double, f64)
DISPATCH_PARTS(dispatch_parts_bf16, uint16_t, bf16)

/* grad_probe's figures of a gradient and its direction file in one pass: out = [max, min, sum of
 * squares] (each square in float64, kept in 8 partial sums, element i added to partial i % 8 in
 * index order, combined as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7));
 * host_figures.one_pass_figures gives that order without a compiler), and signs[i] = g[i] > 0.
 * Returns 1 when some element is NaN (the max and min are then NaN). */
enum { GU = 4, GP = 2 * GU };

/* the elements from i on, one by one, into the partials and extrema a vector loop left */
#define GRAD_TAIL(T, SFX)                                                                      \
    for (int j = 0; i < n; i++, j++) {                                                         \
        double x = one_##SFX(g + i);                                                           \
        flags |= x != x;                                                                       \
        sums[j] += x * x;                                                                      \
        t = x > t ? x : t;                                                                     \
        l = x < l ? x : l;                                                                     \
        signs[i] = x > 0;                                                                      \
    }                                                                                          \
    out[0] = t;                                                                                \
    out[1] = l;                                                                                \
    out[2] = pairwise_sum(sums, GP);                                                           \
    return flags;

int grad_figures_f64(const double *g, ptrdiff_t n, uint8_t *signs, double *out) {
    f64v sq[GU], top[GU], low[GU];
    i64v nan[GU];
    for (int k = 0; k < GU; k++) {
        sq[k] = (f64v){0.0, 0.0};
        top[k] = (f64v){-INFINITY, -INFINITY};
        low[k] = (f64v){INFINITY, INFINITY};
        nan[k] = (i64v){0, 0};
    }
    ptrdiff_t i = 0;
    for (; i + GP <= n; i += GP)
        for (int k = 0; k < GU; k++) {
            f64v x = load_f64(g + i + 2 * k);
            nan[k] |= x != x;
            sq[k] += x * x;
            top[k] = gt_f64(x, top[k]);
            low[k] = lt_f64(x, low[k]);
            signs[i + 2 * k] = x[0] > 0;
            signs[i + 2 * k + 1] = x[1] > 0;
        }
    double sums[GP], t = -INFINITY, l = INFINITY;
    int flags = 0;
    for (int k = 0; k < GU; k++)
        for (int j = 0; j < 2; j++) {
            sums[2 * k + j] = sq[k][j];
            t = top[k][j] > t ? top[k][j] : t;
            l = low[k][j] < l ? low[k][j] : l;
            flags |= nan[k][j] != 0;
        }
    GRAD_TAIL(double, f64)
}

/* float32: the extrema, NaN test and signs on 4-lane float32 vectors, two per step of 8 elements;
 * the squares widened to float64 pairs, pair k of the step into accumulator k (partials 2k, 2k+1) */
int grad_figures_f32(const float *g, ptrdiff_t n, uint8_t *signs, double *out) {
    f64v sq[GU];
    f32v top[2], low[2];
    i32v nan[2];
    for (int k = 0; k < GU; k++) sq[k] = (f64v){0.0, 0.0};
    for (int k = 0; k < 2; k++) {
        top[k] = (f32v){-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        low[k] = -top[k];
        nan[k] = (i32v){0, 0, 0, 0};
    }
    const f32v zero = {0, 0, 0, 0};
    ptrdiff_t i = 0;
    for (; i + GP <= n; i += GP) {
        f32v x[2] = {load_f32(g + i), load_f32(g + i + 4)};
        i32v pos[2];
        for (int k = 0; k < 2; k++) {
            nan[k] |= x[k] != x[k];
            top[k] = gt_f32(x[k], top[k]);
            low[k] = lt_f32(x[k], low[k]);
            pos[k] = x[k] > zero;
            f64v a = low_pair(x[k]), b = high_pair(x[k]);
            sq[2 * k] += a * a;
            sq[2 * k + 1] += b * b;
        }
#if defined(__SSE2__)
        __m128i m = _mm_packs_epi32((__m128i)pos[0], (__m128i)pos[1]);
        m = _mm_and_si128(_mm_packs_epi16(m, m), _mm_set1_epi8(1));
        _mm_storel_epi64((__m128i *)(signs + i), m);
#else
        for (int j = 0; j < 4; j++) {
            signs[i + j] = pos[0][j] != 0;
            signs[i + 4 + j] = pos[1][j] != 0;
        }
#endif
    }
    double sums[GP], t = -INFINITY, l = INFINITY;
    int flags = 0;
    for (int k = 0; k < GU; k++)
        for (int j = 0; j < 2; j++) sums[2 * k + j] = sq[k][j];
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) {
            t = top[k][j] > t ? top[k][j] : t;
            l = low[k][j] < l ? low[k][j] : l;
            flags |= nan[k][j] != 0;
        }
    GRAD_TAIL(float, f32)
}
