// Peak bf16 dot-product throughput of this CPU (avx512_bf16's vdpbf16ps), per core and for all
// cores: the ceiling any CPU engine's bf16 products (stepwise's, vLLM's) run under. Each
// vdpbf16ps on zmm registers does 16 lanes x 2 bf16 pairs x (multiply + add) = 64 FLOPs.
//
//   gcc -O2 -mavx512f -mavx512bf16 -fopenmp bench/bf16_peak.c -o /tmp/bf16_peak && /tmp/bf16_peak
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

#define ACC 16

static double run(long iters) {
    double t0 = omp_get_wtime();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        __m512 acc[ACC];
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)i);
        __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
        __m512bh b = (__m512bh)_mm512_set1_epi16(0x3c00);  // 2^-7
        // Independent accumulators, enough to hide the instruction's latency; they stay in
        // registers (the compiler keeps the loop as ACC back-to-back vdpbf16ps).
        for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
            for (int i = 0; i < ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        for (int i = 0; i < ACC; i++) sink += _mm512_reduce_add_ps(acc[i]);
    }
    double dt = omp_get_wtime() - t0;
    if (sink == 1234.5f) printf("!");
    return dt;
}

int main(void) {
    long iters = 200000000 / ACC;
    int max = omp_get_max_threads();
    for (int threads = 1; threads <= max; threads *= 2) {
        omp_set_num_threads(threads);
        run(iters / 10);
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            double dt = run(iters);
            if (dt < best) best = dt;
        }
        double flops = (double)iters * ACC * 64 * threads;
        printf("%d thread(s): %.0f GFLOP/s (%.0f per core)\n", threads, flops / best / 1e9, flops / best / 1e9 / threads);
        if (threads * 2 > max && threads != max) threads = max / 2;
    }
    return 0;
}
