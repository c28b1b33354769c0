// Peak bf16 product throughput of one core on AMX tiles (tdpbf16ps), the twin of bench/bf16_peak.c
// (AVX512_BF16's vdpbf16ps): four independent 16 x 16 f32 tiles of sums, each tdpbf16ps a
// 16 x 32 by 32 x 16 bf16 product = 16 x 16 x 32 x 2 = 16,384 FLOPs. Linux lends a process the
// tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM), as stepwise's kernels ask.
//
//   gcc -O2 -mamx-tile -mamx-bf16 bench/amx_peak.c -o /tmp/amx_peak && /tmp/amx_peak
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        printf("the kernel does not lend AMX tiles here\n");
        return 1;
    }
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
    static uint16_t a[16 * 32], b[16 * 32];
    static float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++) a[i] = b[i] = 0x3f80;  // 1.0
    _tile_zero(0);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    const long iters = 20000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 1, 2);
        _tile_dpbf16ps(3, 1, 2);
        _tile_dpbf16ps(4, 1, 2);
        _tile_dpbf16ps(5, 1, 2);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    _tile_stored(0, out, 64);
    _tile_release();
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("1 core: %.0f GFLOP/s (sum %.0f)\n", 4.0 * iters * 16 * 16 * 32 * 2 / s / 1e9, out[0]);
    return 0;
}
