/* One-pass kernels over host memory for the probes' hottest element-wise work (host_kernels.py
 * says why and how they are built). Plain C99, compiled without -march or fast-math: every
 * result is the IEEE result NumPy's passes give, on any CPU.
 *
 * The reductions keep LANES independent accumulators so the compiler can vectorise them with
 * the baseline instruction set (a maximum or minimum is exact, so the order does not matter);
 * NaN is tracked apart and reported in the return value, where NumPy's max/min return NaN. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define LANES 16

/* The free_benchmark ratio rule's figures: out = [max r, min r, min a*b] with
 * r = max(|a|, tol) / max(|b|, tol). Returns bit 0 set when some r is NaN, bit 1 when some a*b is. */
#define RATIO_STEP(T, ABS, x, y, j)                                                            \
    {                                                                                          \
        T ax = ABS(x), ay = ABS(y);                                                            \
        ax = tol > ax ? tol : ax; /* NaN stays NaN, as np.maximum */                           \
        ay = tol > ay ? tol : ay;                                                              \
        T r = ax / ay, p = (x) * (y);                                                          \
        rnan[j] |= r != r;                                                                     \
        pnan[j] |= p != p;                                                                     \
        rmax[j] = r > rmax[j] ? r : rmax[j];                                                   \
        rmin[j] = r < rmin[j] ? r : rmin[j];                                                   \
        pmin[j] = p < pmin[j] ? p : pmin[j];                                                   \
    }

#define RATIO(NAME, T, ABS)                                                                    \
    int NAME(const T *a, const T *b, ptrdiff_t n, T tol, double *out) {                        \
        T rmax[LANES], rmin[LANES], pmin[LANES];                                               \
        int rnan[LANES], pnan[LANES], flags = 0;                                               \
        for (int j = 0; j < LANES; j++) {                                                      \
            rmax[j] = -(T)INFINITY;                                                            \
            rmin[j] = pmin[j] = (T)INFINITY;                                                   \
            rnan[j] = pnan[j] = 0;                                                             \
        }                                                                                      \
        ptrdiff_t i = 0;                                                                       \
        for (; i + LANES <= n; i += LANES)                                                     \
            for (int j = 0; j < LANES; j++) RATIO_STEP(T, ABS, a[i + j], b[i + j], j)          \
        for (int j = 0; i < n; i++, j++) RATIO_STEP(T, ABS, a[i], b[i], j)                     \
        for (int j = 1; j < LANES; j++) {                                                      \
            rmax[0] = rmax[j] > rmax[0] ? rmax[j] : rmax[0];                                   \
            rmin[0] = rmin[j] < rmin[0] ? rmin[j] : rmin[0];                                   \
            pmin[0] = pmin[j] < pmin[0] ? pmin[j] : pmin[0];                                   \
        }                                                                                      \
        for (int j = 0; j < LANES; j++) flags |= rnan[j] | pnan[j] << 1;                       \
        out[0] = rmax[0];                                                                      \
        out[1] = rmin[0];                                                                      \
        out[2] = pmin[0];                                                                      \
        return flags;                                                                          \
    }

RATIO(ratio_figures_f32, float, fabsf)
RATIO(ratio_figures_f64, double, fabs)

/* A perturbation's edit of float bit patterns: out = bits OP 1 where above < (bits & mask) <
 * below (the magnitude code of a finite float in a band), else bits. `bits` is T's signed view. */
#define BAND(NAME, T, U, OP)                                                                   \
    void NAME(const T *bits, T *out, ptrdiff_t n, U mask, U above, U below) {                  \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            U m = (U)bits[i] & mask;                                                           \
            out[i] = (T)((U)bits[i] OP(U)(m > above && m < below));                            \
        }                                                                                      \
    }

BAND(band_add_16, int16_t, uint16_t, +)
BAND(band_add_32, int32_t, uint32_t, +)
BAND(band_add_64, int64_t, uint64_t, +)
BAND(band_xor_16, int16_t, uint16_t, ^)
BAND(band_xor_32, int32_t, uint32_t, ^)
BAND(band_xor_64, int64_t, uint64_t, ^)
