// The kernels of stepwise's CUDA engine, compiled at run time by NVRTC for the GPU in use, so
// that building stepwise needs no CUDA toolkit. Every activation is laid out row by row over a
// packed batch: the tokens of all sequences end to end, `cu_seqlens` giving where each starts.
//
// HEAD_DIM is set by the compiler options (flash_attention is built for one head size).
// Weights are bf16 (matrices) or f32 (norms, biases); bf16 values travel as 16-bit integers and
// are widened and rounded here, so no CUDA header is needed.

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) { return __uint_as_float(((u32)b) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Two values as one 32-bit register of bf16 pairs (the first in the low half).
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// The sum over the block of every thread's `v`, returned to every thread (`partial`: 32 floats of
// shared memory, used once per kernel).
__device__ float block_sum(float v, float* partial) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// x[row] = table[ids[row]], widened to f32 (the residual stream). One block a row.
extern "C" __global__ void embed_rows(const bf16_t* __restrict__ table, const u32* __restrict__ ids,
                                      float* __restrict__ x, int hidden) {
    const bf16_t* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = x + (size_t)blockIdx.x * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = bf16_to_f32(src[j]);
}

// out[i] = bf16(x[r] / rms(x[r]) * w), r = rows[i] (or i when `rows` is null). One block a row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const int* __restrict__ rows,
                                    const float* __restrict__ w, bf16_t* __restrict__ out, int hidden,
                                    float eps) {
    __shared__ float partial[32];
    int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float* row = x + (size_t)r * hidden;
    float ss = 0.f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        float v = row[j];
        ss += v * v;
    }
    ss = block_sum(ss, partial);
    float inv = rsqrtf(ss / (float)hidden + eps);
    bf16_t* o = out + (size_t)blockIdx.x * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = f32_to_bf16(row[j] * inv * w[j]);
}

// The q|k|v projections' rows `y` (f32, [rows, (heads + 2 kv_heads) d]) plus their bias (may be
// null), q and k rotated to each row's position (half-split rotary layout of Qwen2/Llama), into
// bf16 `qkv`. Tables cos, sin: [max_positions, d / 2]. One block a row.
extern "C" __global__ void bias_rope(const float* __restrict__ y, const float* __restrict__ bias,
                                     const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                     const int* __restrict__ pos, bf16_t* __restrict__ qkv, int heads,
                                     int kv_heads, int d) {
    int half = d >> 1;
    int width = (heads + 2 * kv_heads) * d;
    size_t base = (size_t)blockIdx.x * width;
    const float* c = cos_t + (size_t)pos[blockIdx.x] * half;
    const float* s = sin_t + (size_t)pos[blockIdx.x] * half;
    int pairs = (heads + kv_heads) * half;
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int a = (i / half) * d + i % half, b = a + half, j = i % half;
        float xa = y[base + a], xb = y[base + b];
        if (bias) {
            xa += bias[a];
            xb += bias[b];
        }
        qkv[base + a] = f32_to_bf16(xa * c[j] - xb * s[j]);
        qkv[base + b] = f32_to_bf16(xb * c[j] + xa * s[j]);
    }
    for (int i = (heads + kv_heads) * d + threadIdx.x; i < width; i += blockDim.x)
        qkv[base + i] = f32_to_bf16(y[base + i] + (bias ? bias[i] : 0.f));
}

// act[r, j] = silu(gu[r, j]) * gu[r, inter + j] (gate and up side by side), n = rows * inter.
extern "C" __global__ void swiglu(const bf16_t* __restrict__ gu, bf16_t* __restrict__ act, int inter,
                                  long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i / inter;
    int j = (int)(i % inter);
    float g = bf16_to_f32(gu[r * 2 * inter + j]), u = bf16_to_f32(gu[r * 2 * inter + inter + j]);
    act[i] = f32_to_bf16(g / (1.f + __expf(-g)) * u);
}

// y + bias per column, then ReLU, as bf16 (the first layer of Qwen2.5-Math-PRM's head).
extern "C" __global__ void bias_relu_bf16(const float* __restrict__ y, const float* __restrict__ bias,
                                          bf16_t* __restrict__ out, int width, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = f32_to_bf16(fmaxf(y[i] + bias[i % width], 0.f));
}

// y += bias per column (n = rows * width).
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, int width,
                                    long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] += bias[i % width];
}

// dst[i] = src[idx[i]], rows of `width` bf16 values (an LM head's rows for the tokens read).
extern "C" __global__ void gather_rows_bf16(const bf16_t* __restrict__ src, const int* __restrict__ idx,
                                            bf16_t* __restrict__ dst, int width) {
    const bf16_t* s = src + (size_t)idx[blockIdx.x] * width;
    bf16_t* d = dst + (size_t)blockIdx.x * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) d[j] = s[j];
}

// Causal attention of every row of a packed batch over the rows of its own sequence, one warp a
// (row, head), online softmax in f32: the plain reference the fast kernel is checked against,
// and the path for head sizes it is not built for (d <= 256).
extern "C" __global__ void attention_simple(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out,
                                            const int* __restrict__ seq_of_row,
                                            const int* __restrict__ cu_seqlens, int rows, int heads,
                                            int kv_heads, int d, float scale) {
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (item >= rows * heads) return;
    int row = item / heads, h = item % heads;
    int g = h / (heads / kv_heads);
    int width = (heads + 2 * kv_heads) * d;
    int start = cu_seqlens[seq_of_row[row]];
    float q[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        q[i] = j < d ? bf16_to_f32(qkv[(size_t)row * width + h * d + j]) * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int key = start; key <= row; ++key) {
        const bf16_t* k = qkv + (size_t)key * width + (heads + g) * d;
        const bf16_t* v = qkv + (size_t)key * width + (heads + kv_heads + g) * d;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int j = lane + 32 * i;
            if (j < d) dot += q[i] * bf16_to_f32(k[j]);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float m_new = fmaxf(m, dot);
        float corr = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int j = lane + 32 * i;
            if (j < d) acc[i] = acc[i] * corr + p * bf16_to_f32(v[j]);
        }
        m = m_new;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        if (j < d) out[(size_t)row * heads * d + h * d + j] = f32_to_bf16(acc[i] / l);
    }
}

// The k and v parts of each q|k|v row into the paged cache at the row's slot (rows of
// kv_heads · d values). One block a row.
extern "C" __global__ void cache_write(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ k_cache,
                                       bf16_t* __restrict__ v_cache, const int* __restrict__ slots,
                                       int heads, int kv_heads, int d) {
    int width = (heads + 2 * kv_heads) * d, kvw = kv_heads * d;
    const bf16_t* row = qkv + (size_t)blockIdx.x * width;
    size_t at = (size_t)slots[blockIdx.x] * kvw;
    for (int i = threadIdx.x; i < kvw; i += blockDim.x) {
        k_cache[at + i] = row[heads * d + i];
        v_cache[at + i] = row[(heads + kv_heads) * d + i];
    }
}

// Causal attention of each row's query over its sequence's cached keys and values (positions
// 0..=its own), found through the block table (blocks of 64 positions), one warp a (row, head),
// online softmax in f32: decoding steps and prompt chunks alike (d <= 256).
extern "C" __global__ void paged_attention(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ k_cache,
                                           const bf16_t* __restrict__ v_cache, bf16_t* __restrict__ out,
                                           const int* __restrict__ seq_of_row, const int* __restrict__ positions,
                                           const int* __restrict__ block_table, int max_blocks, int rows,
                                           int heads, int kv_heads, int d, float scale) {
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (item >= rows * heads) return;
    int row = item / heads, h = item % heads;
    int g = h / (heads / kv_heads);
    int width = (heads + 2 * kv_heads) * d, kvw = kv_heads * d;
    const int* blocks = block_table + (size_t)seq_of_row[row] * max_blocks;
    int pos = positions[row];
    float q[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        q[i] = j < d ? bf16_to_f32(qkv[(size_t)row * width + h * d + j]) * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int key = 0; key <= pos; ++key) {
        size_t slot = (size_t)blocks[key >> 6] * 64 + (key & 63);
        const bf16_t* k = k_cache + slot * kvw + g * d;
        const bf16_t* v = v_cache + slot * kvw + g * d;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int j = lane + 32 * i;
            if (j < d) dot += q[i] * bf16_to_f32(k[j]);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float m_new = fmaxf(m, dot);
        float corr = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int j = lane + 32 * i;
            if (j < d) acc[i] = acc[i] * corr + p * bf16_to_f32(v[j]);
        }
        m = m_new;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        if (j < d) out[(size_t)row * heads * d + h * d + j] = f32_to_bf16(acc[i] / l);
    }
}

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#define FA_ROWS 64   // queries a block: 4 warps of 16
#define FA_KEYS 64   // keys a tile
#define FA_PAD 8     // bf16 padding of a shared-memory row (16 bytes: rows fall in other banks)

// c += a · b on the tensor cores: a 16×16 (row-major fragment), b 16×8 (column-major), c 16×8 f32.
__device__ __forceinline__ void mma_bf16(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Columns `col`, `col + 1` of query row `q` of a sequence starting at row `start` (0 past its end).
__device__ __forceinline__ u32 query_pair(const bf16_t* qkv, int start, int q, int len, int width,
                                          int col) {
    return q < len ? *(const u32*)(qkv + (size_t)(start + q) * width + col) : 0u;
}

// Causal attention over a packed batch, flash-style: a block takes FA_ROWS queries of one
// sequence and one head (its tile, given by tile_seq / tile_start), walks the keys up to its
// last query FA_KEYS at a time through shared memory with an online softmax, and never writes
// the scores out. Products on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulators).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): for lane = 4·gid + tig,
// - A (16×16): regs 0..3 hold (row gid, cols 2tig..+1), (gid+8, 2tig..), (gid, 2tig+8..),
//   (gid+8, 2tig+8..);
// - B (16×8): regs 0, 1 hold (rows 2tig..+1, col gid), (rows 2tig+8..+9, col gid);
// - C (16×8 f32): c0, c1 at (gid, 2tig..+1), c2, c3 at (gid+8, 2tig..+1).
// Two C tiles of scores side by side are, rounded to bf16, the A fragment of P for 16 keys.
extern "C" __global__ void __launch_bounds__(128) flash_attention(
    const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ cu_seqlens,
    const int* __restrict__ tile_seq, const int* __restrict__ tile_start, int heads, int kv_heads,
    float scale_log2) {
    const int D = HEAD_DIM;
    __shared__ __align__(16) bf16_t ks[FA_KEYS][D + FA_PAD];
    __shared__ __align__(16) bf16_t vt[D][FA_KEYS + FA_PAD];
    int seq = tile_seq[blockIdx.x], q0 = tile_start[blockIdx.x], h = blockIdx.y;
    int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
    int g = h / (heads / kv_heads);
    int width = (heads + 2 * kv_heads) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int gid = lane >> 2, tig = lane & 3;
    int qa = q0 + warp * 16 + gid, qb = qa + 8;

    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        int col = h * D + kk * 16 + 2 * tig;
        qf[kk][0] = query_pair(qkv, start, qa, len, width, col);
        qf[kk][1] = query_pair(qkv, start, qb, len, width, col);
        qf[kk][2] = query_pair(qkv, start, qa, len, width, col + 8);
        qf[kk][3] = query_pair(qkv, start, qb, len, width, col + 8);
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    int keys_needed = min(q0 + FA_ROWS, len);
    for (int k0 = 0; k0 < keys_needed; k0 += FA_KEYS) {
        __syncthreads();  // the last tile's readers are done with shared memory
        for (int c = threadIdx.x; c < FA_KEYS * D / 8; c += blockDim.x) {
            int r = c / (D / 8), col = (c % (D / 8)) * 8, key = k0 + r;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = make_uint4(0u, 0u, 0u, 0u);
            if (key < len) {
                const bf16_t* src = qkv + (size_t)(start + key) * width;
                kv = *(const uint4*)(src + (heads + g) * D + col);
                vv = *(const uint4*)(src + (heads + kv_heads + g) * D + col);
            }
            *(uint4*)&ks[r][col] = kv;
            const bf16_t* vs = (const bf16_t*)&vv;
#pragma unroll
            for (int i = 0; i < 8; ++i) vt[col + i][r] = vs[i];
        }
        __syncthreads();

        float s[FA_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 b[2];
                b[0] = *(const u32*)&ks[j * 8 + gid][kk * 16 + 2 * tig];
                b[1] = *(const u32*)&ks[j * 8 + gid][kk * 16 + 8 + 2 * tig];
                mma_bf16(s[j], qf[kk], b);
            }
        }
        // Scale into log2 units, mask (causal, past the sequence), running maxima per row.
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = k0 + j * 8 + 2 * tig + (e & 1);
                int q = e < 2 ? qa : qb;
                float v = (key > q || key >= len) ? NEG_INF : s[j][e] * scale_log2;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            // A row that has seen no key yet keeps a finite base, so no inf − inf arises.
            base[r] = mx[r] == NEG_INF ? 0.f : mx[r];
            float corr = exp2f(m[r] - base[r]);
            l[r] *= corr;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                o[j][2 * r] *= corr;
                o[j][2 * r + 1] *= corr;
            }
            m[r] = mx[r];
        }
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = exp2f(s[j][e] - base[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
        }
        // O += P · V, 16 keys a step.
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            u32 a[4];
            a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                u32 b[2];
                b[0] = *(const u32*)&vt[j * 8 + gid][kk * 16 + 2 * tig];
                b[1] = *(const u32*)&vt[j * 8 + gid][kk * 16 + 8 + 2 * tig];
                mma_bf16(o[j], a, b);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    size_t out_width = (size_t)heads * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        int col = h * D + j * 8 + 2 * tig;
        if (qa < len)
            *(u32*)(out + (size_t)(start + qa) * out_width + col) = pack_bf16(o[j][0] / l[0], o[j][1] / l[0]);
        if (qb < len)
            *(u32*)(out + (size_t)(start + qb) * out_width + col) = pack_bf16(o[j][2] / l[1], o[j][3] / l[1]);
    }
}
