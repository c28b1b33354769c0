
// ---- Training (TrainBackend): compiled with the kernels above, whose helpers they use. Each
// computes what packed_engine/reference_train.rs specifies. Gradients shared by many rows (a
// norm's or bias's weights, an embedding's row) are summed with atomicAdd; attention's are not
// (its keys' gradients have a kernel of their own).

// dst[i] = src[i].
extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// dst[i] = bf16(src[i]).
extern "C" __global__ void round_bf16(const float* __restrict__ src, bf16_t* __restrict__ dst, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f32_to_bf16(src[i]);
}

// buf[i] = 0.
extern "C" __global__ void zero_f32(float* __restrict__ buf, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] = 0.f;
}

// db[c] += sum over rows of dy[r, c]. One block a column.
extern "C" __global__ void column_sums(const float* __restrict__ dy, float* __restrict__ db, int rows, int width) {
    __shared__ float partial[32];
    int c = blockIdx.x;
    float s = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) s += dy[(size_t)r * width + c];
    s = block_sum(s, partial);
    if (threadIdx.x == 0) db[c] += s;
}

// Through out[i] = x[r] / rms(x[r]) * w (r = rows[i], or i): dx[r] += d/dx, dw += d/dw, for the
// gradient dy[i] of out[i]. One block a row.
extern "C" __global__ void rms_norm_backward(const float* __restrict__ x, const int* __restrict__ rows,
                                             const float* __restrict__ w, const float* __restrict__ dy,
                                             float* __restrict__ dx, float* __restrict__ dw, int hidden,
                                             float eps) {
    __shared__ float partial[32];
    int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float* row = x + (size_t)r * hidden;
    const float* g = dy + (size_t)blockIdx.x * hidden;
    float ss = 0.f, shared = 0.f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) ss += row[j] * row[j];
    ss = block_sum(ss, partial);
    __syncthreads();
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) shared += g[j] * w[j] * row[j];
    shared = block_sum(shared, partial);
    float inv = rsqrtf(ss / (float)hidden + eps);
    float k = inv * inv * inv * shared / (float)hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        atomicAdd(dw + j, g[j] * row[j] * inv);
        float v = inv * g[j] * w[j] - row[j] * k;
        // Rows read twice (two targets at one position) are added to by two blocks.
        if (rows) atomicAdd(dx + (size_t)r * hidden + j, v);
        else dx[(size_t)r * hidden + j] += v;
    }
}

// Through act = silu(gate) * up: d_gu = bf16([d/dgate | d/dup]) (n = rows * inter).
extern "C" __global__ void swiglu_backward(const bf16_t* __restrict__ gu, const float* __restrict__ d_act,
                                           bf16_t* __restrict__ d_gu, int inter, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i / inter;
    int j = (int)(i % inter);
    size_t gi = r * 2 * inter + j, ui = gi + inter;
    float g = bf16_to_f32(gu[gi]), u = bf16_to_f32(gu[ui]), d = d_act[i];
    float sig = 1.f / (1.f + __expf(-g));
    d_gu[gi] = f32_to_bf16(d * u * sig * (1.f + g * (1.f - sig)));
    d_gu[ui] = f32_to_bf16(d * g * sig);
}

// Through out = bf16(relu(y + b)): d[i] = 0 where out[i] <= 0.
extern "C" __global__ void relu_backward(const bf16_t* __restrict__ out, float* __restrict__ d, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && bf16_to_f32(out[i]) <= 0.f) d[i] = 0.f;
}

// Through bias_rope: dy = bf16(rope^-1(d_qkv)) (q and k turned back, v as it is); d_bias (may
// be null) += it before rounding. One block a row.
extern "C" __global__ void rope_backward(const float* __restrict__ d_qkv, const float* __restrict__ cos_t,
                                         const float* __restrict__ sin_t, const int* __restrict__ pos,
                                         bf16_t* __restrict__ dy, float* __restrict__ d_bias, int heads,
                                         int kv_heads, int d) {
    int half = d >> 1;
    int width = (heads + 2 * kv_heads) * d;
    size_t base = (size_t)blockIdx.x * width;
    const float* c = cos_t + (size_t)pos[blockIdx.x] * half;
    const float* s = sin_t + (size_t)pos[blockIdx.x] * half;
    int pairs = (heads + kv_heads) * half;
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int a = (i / half) * d + i % half, b = a + half, j = i % half;
        float ga = d_qkv[base + a], gb = d_qkv[base + b];
        float xa = ga * c[j] + gb * s[j], xb = gb * c[j] - ga * s[j];
        dy[base + a] = f32_to_bf16(xa);
        dy[base + b] = f32_to_bf16(xb);
        if (d_bias) {
            atomicAdd(d_bias + a, xa);
            atomicAdd(d_bias + b, xb);
        }
    }
    for (int i = (heads + kv_heads) * d + threadIdx.x; i < width; i += blockDim.x) {
        float v = d_qkv[base + i];
        dy[base + i] = f32_to_bf16(v);
        if (d_bias) atomicAdd(d_bias + i, v);
    }
}

// Two dot products over a warp, each lane holding components lane + 32 i (i < 8, below d) of `a`
// and `b` in registers: *dot = a . x and *dp = b . y (x, y bf16 in memory), on every lane.
__device__ __forceinline__ void warp_dots(const float* a, const bf16_t* __restrict__ x, const float* b,
                                          const bf16_t* __restrict__ y, int lane, int d, float* dot, float* dp) {
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        if (j < d) {
            s1 += a[i] * bf16_to_f32(x[j]);
            s2 += b[i] * bf16_to_f32(y[j]);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    *dot = s1;
    *dp = s2;
}

// Through attention_simple, in two kernels with no atomics. This one, one warp a (row, head):
// the softmax recomputed (its max m and sum l), D = sum_j p_j (dO . v_j), and
// dq = scale sum_j p_j (dO . v_j - D) k_j written into d_qkv's q part; (m, l, D) kept in `stats`
// ([rows * heads][3]) for the keys' kernel. d <= 256.
extern "C" __global__ void attention_backward_dq(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ d_out,
                                                 float* __restrict__ d_qkv, float* __restrict__ stats,
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
    float q[8], o[8], dq[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        q[i] = j < d ? bf16_to_f32(qkv[(size_t)row * width + h * d + j]) : 0.f;
        o[i] = j < d ? bf16_to_f32(d_out[(size_t)row * heads * d + h * d + j]) : 0.f;
        dq[i] = 0.f;
    }
    // Pass 1: the softmax's max m and sum l, and D = sum_j p_j (dO . v_j), online (rescaled as
    // the max grows).
    float m = NEG_INF, l = 0.f, acc = 0.f;
    for (int key = start; key <= row; ++key) {
        const bf16_t* k = qkv + (size_t)key * width + (heads + g) * d;
        const bf16_t* v = qkv + (size_t)key * width + (heads + kv_heads + g) * d;
        float dot, dp;
        warp_dots(q, k, o, v, lane, d, &dot, &dp);
        dot *= scale;
        float m_new = fmaxf(m, dot);
        float corr = __expf(m - m_new), e = __expf(dot - m_new);
        l = l * corr + e;
        acc = acc * corr + e * dp;
        m = m_new;
    }
    float big_d = acc / l;
    // Pass 2: dq = scale sum_j p_j (dO . v_j - D) k_j.
    for (int key = start; key <= row; ++key) {
        const bf16_t* k = qkv + (size_t)key * width + (heads + g) * d;
        const bf16_t* v = qkv + (size_t)key * width + (heads + kv_heads + g) * d;
        float dot, dp;
        warp_dots(q, k, o, v, lane, d, &dot, &dp);
        float ds = __expf(dot * scale - m) / l * (dp - big_d) * scale;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int j = lane + 32 * i;
            if (j < d) dq[i] += ds * bf16_to_f32(k[j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        if (j < d) d_qkv[(size_t)row * width + h * d + j] = dq[i];
    }
    if (lane == 0) {
        stats[(size_t)item * 3] = m;
        stats[(size_t)item * 3 + 1] = l;
        stats[(size_t)item * 3 + 2] = big_d;
    }
}

// The keys' part, one warp a (key row, kv head): over the queries of its sequence at or after it
// and the query heads it serves, dk = scale sum p (dO . v - D) q and dv = sum p dO (p from the
// queries' `stats`), written into d_qkv's k and v parts. d <= 256.
extern "C" __global__ void attention_backward_dkv(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ d_out,
                                                  float* __restrict__ d_qkv, const float* __restrict__ stats,
                                                  const int* __restrict__ seq_of_row,
                                                  const int* __restrict__ cu_seqlens, int rows, int heads,
                                                  int kv_heads, int d, float scale) {
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (item >= rows * kv_heads) return;
    int key = item / kv_heads, g = item % kv_heads;
    int group = heads / kv_heads;
    int width = (heads + 2 * kv_heads) * d;
    int end = cu_seqlens[seq_of_row[key] + 1];
    float k[8], v[8], dk[8], dv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        k[i] = j < d ? bf16_to_f32(qkv[(size_t)key * width + (heads + g) * d + j]) : 0.f;
        v[i] = j < d ? bf16_to_f32(qkv[(size_t)key * width + (heads + kv_heads + g) * d + j]) : 0.f;
        dk[i] = 0.f;
        dv[i] = 0.f;
    }
    for (int row = key; row < end; ++row) {
        for (int h = g * group; h < (g + 1) * group; ++h) {
            const bf16_t* q = qkv + (size_t)row * width + h * d;
            const bf16_t* o = d_out + (size_t)row * heads * d + h * d;
            float dot, dp;
            warp_dots(k, q, v, o, lane, d, &dot, &dp);
            const float* st = stats + ((size_t)row * heads + h) * 3;
            float p = __expf(dot * scale - st[0]) / st[1];
            float ds = p * (dp - st[2]) * scale;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                int j = lane + 32 * i;
                if (j < d) {
                    dk[i] += ds * bf16_to_f32(q[j]);
                    dv[i] += p * bf16_to_f32(o[j]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int j = lane + 32 * i;
        if (j < d) {
            d_qkv[(size_t)key * width + (heads + g) * d + j] = dk[i];
            d_qkv[(size_t)key * width + (heads + kv_heads + g) * d + j] = dv[i];
        }
    }
}

// Through embed_rows: d_table[ids[r]] += dx[r]. One block a row.
extern "C" __global__ void embed_backward(const int* __restrict__ ids, const float* __restrict__ dx,
                                          float* __restrict__ d_table, int hidden) {
    float* dst = d_table + (size_t)ids[blockIdx.x] * hidden;
    const float* src = dx + (size_t)blockIdx.x * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) atomicAdd(dst + j, src[j]);
}

// The largest v over the block (every thread gets it), as block_sum.
__device__ float block_max(float v, float* partial) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? partial[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Per row r of logits [rows, vocab]: lse[r] = log sum_j exp(logits[r, j]) and logp[r] =
// logits[r, targets[r]] - lse[r]. One block a row.
extern "C" __global__ void token_logprobs(const float* __restrict__ logits, const int* __restrict__ targets,
                                          float* __restrict__ logp, float* __restrict__ lse, int vocab) {
    __shared__ float partial[32];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, partial);
    __syncthreads();
    float s = 0.f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s, partial);
    if (threadIdx.x == 0) {
        float l = m + logf(s);
        lse[blockIdx.x] = l;
        logp[blockIdx.x] = row[targets[blockIdx.x]] - l;
    }
}

// Through token_logprobs for d loss / d logp[r] = coef[r]: d[r, j] = bf16(coef[r] * ([j ==
// targets[r]] - exp(logits[r, j] - lse[r]))). One block a row.
extern "C" __global__ void token_logprobs_backward(const float* __restrict__ logits, const int* __restrict__ targets,
                                                   const float* __restrict__ lse, const float* __restrict__ coef,
                                                   bf16_t* __restrict__ d, int vocab) {
    size_t base = (size_t)blockIdx.x * vocab;
    float l = lse[blockIdx.x], c = coef[blockIdx.x];
    int target = targets[blockIdx.x];
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        d[base + j] = f32_to_bf16(c * ((j == target ? 1.f : 0.f) - expf(logits[base + j] - l)));
}

// partial[block] = the block's share of sum g^2 (grid-strided over n).
extern "C" __global__ void sum_squares(const float* __restrict__ g, float* __restrict__ partial_out, long long n) {
    __shared__ float partial[32];
    float s = 0.f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        s += g[i] * g[i];
    s = block_sum(s, partial);
    if (threadIdx.x == 0) partial_out[blockIdx.x] = s;
}

// One AdamW update (decoupled weight decay; c1, c2: the bias corrections 1 - beta^step).
extern "C" __global__ void adamw(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, long long n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, float c1, float c2, float grad_scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + (1.f - beta1) * gi;
    float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * (1.f - lr * weight_decay) - lr * (mi / c1) / (sqrtf(vi / c2) + eps);
}
