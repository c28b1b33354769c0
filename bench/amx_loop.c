// The AMX product loop of crates/stepwise-model/src/kernels/sgemm/amx.rs (2 x 2 tiles: two of 16
// weight rows by the two halves of a 32-row panel of activation pairs) over the addresses a
// training product reads: the MLP's gate/up projection of 2,524 tokens, one task's half of its
// 9,728 columns (N, default 4864), weights [N, 896] bf16 read as they lie (rows 1,792 bytes
// apart), the activations packed in panels, chunks of CHUNK weight rows (default 256) run over
// every panel, depth taken DEPTH steps at a time (default 896: all of it). No output is written.
// Run two at once to see the cores together.
//
//   gcc -O2 -mamx-tile -mamx-bf16 bench/amx_loop.c -o /tmp/amx_loop && /tmp/amx_loop [N CHUNK DEPTH]
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
typedef struct { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg_t c; memset(&c,0,sizeof c); c.palette_id=1; for(int i=0;i<8;i++){c.rows[i]=16;c.colsb[i]=64;}
  _tile_loadconfig(&c);
  int m = 2524, n = argc > 1 ? atoi(argv[1]) : 4864, k = 896, PANEL = 32;
  int CH = argc > 2 ? atoi(argv[2]) : 256, KD = argc > 3 ? atoi(argv[3]) : 896;
  int panels=(m+31)/32;
  uint16_t *W = aligned_alloc(64, (size_t)n*k*2); for(size_t i=0;i<(size_t)n*k;i++) W[i]=0x3c00+(i*7919%1009);
  // panels packed per depth chunk: chunk kc holds panels x (KD/2) pairs x 32 rows
  uint32_t *P = aligned_alloc(64, (size_t)panels*PANEL*(k/2)*4); for(size_t i=0;i<(size_t)panels*PANEL*(k/2);i++) P[i]=0x3c003c00+(i%1013);
  static float S[1024] __attribute__((aligned(64)));
  double t=now();
  long steps=0;
  for(int k0=0;k0<k;k0+=KD){
   int kd = KD < k-k0 ? KD : k-k0;
   uint32_t *Pc = P + (size_t)panels*PANEL*(k0/2);
   for(int c0=0;c0<n;c0+=CH){
    for(int p=0;p<panels;p++){
      uint32_t *panel = Pc + (size_t)p*PANEL*(kd/2);
      for(int j0=c0;j0<c0+CH && j0<n;j0+=32){
        uint16_t *w = W + (size_t)j0*k + k0;
        _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
        for(int s=0;s<kd/32;s++){
          uint16_t *w0 = w + s*32, *w1 = w + 16*k + s*32;
          uint32_t *p0 = panel + s*16*PANEL;
          _tile_loadd(4, w0, 2*k); _tile_loadd(6, p0, 128); _tile_dpbf16ps(0,4,6);
          _tile_loadd(7, p0+16, 128); _tile_dpbf16ps(1,4,7);
          _tile_loadd(5, w1, 2*k); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
          steps++;
        }
        _tile_stored(0,S,64);_tile_stored(1,S+256,64);_tile_stored(2,S+512,64);_tile_stored(3,S+768,64);
      }
    }
   }
  }
  double d=now()-t; printf("N=%d CHUNK=%d DEPTH=%d: %.1f ms %.0f GFLOP/s\n", n, CH, KD, d*1e3, steps*4*16384.0/d/1e9);
  return 0;
}
