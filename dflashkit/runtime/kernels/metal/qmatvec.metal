// Fused dequant + matrix-vector for Apple GPUs (compiled at run time by torch.mps.compile_shader).
//
// Mirrors the Triton kernel (_triton_qmm.py): one weight row walked 256 values at a time (one K-quant
// super-block, or eight Q8_0 blocks), each step expanded to float32 from the raw ggml bytes and multiplied by
// the activations, float32 accumulation. Here a threadgroup is one simdgroup (32 lanes) per output element
// out[m, n]; lane L expands values [8L, 8L + 8) of each step (they share one scale), then simd_sum reduces.
//
// Buffers: out float[M * N], w uchar[N * row_bytes] (raw ggml rows), x float[M * K], dims int[4] =
// {M, N, K, row_bytes}. Dispatch: threads = [32 * N, M, 1], group_size = [32, 1, 1].

#include <metal_stdlib>
using namespace metal;

// ggml's fp16 fields sit at even byte offsets, so a half load is aligned.
inline float f16_at(device const uchar* p) { return float(*(device const half*)p); }

// block_q8_0 (34 bytes): d fp16 | qs int8[32]; x = qs * d. K is only a multiple of 32: values past K are 0.
inline void tile_q8_0(device const uchar* row, int it, uint lane, int K, thread float* w) {
    int v0 = it * 256 + int(lane) * 8;
    if (v0 >= K) { for (int i = 0; i < 8; ++i) w[i] = 0.0f; return; }
    device const uchar* blk = row + (v0 / 32) * 34;
    device const char* qs = (device const char*)(blk + 2 + v0 % 32);
    float d = f16_at(blk);
    for (int i = 0; i < 8; ++i) w[i] = float(qs[i]) * d;
}

// block_q4_K (144 bytes): d, dmin fp16 | scales[12] (get_scale_min_k4) | qs[128];
// sub-block s: x = (d * sc[s]) * q - (dmin * m[s]), q = low (s even) / high (s odd) nibbles of qs[32 (s/2) + j].
inline void tile_q4_k(device const uchar* row, int it, uint lane, int K, thread float* w) {
    device const uchar* sb = row + it * 144;
    int v0 = int(lane) * 8, s = v0 / 32;
    device const uchar* sc = sb + 4;
    int scale, mn;
    if (s < 4) { scale = sc[s] & 63; mn = sc[s + 4] & 63; }
    else { scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4); mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4); }
    float ds = f16_at(sb) * float(scale), dm = f16_at(sb + 2) * float(mn);
    device const uchar* qs = sb + 16 + (s / 2) * 32 + v0 % 32;
    int shift = (s % 2) * 4;
    for (int i = 0; i < 8; ++i) w[i] = ds * float((qs[i] >> shift) & 15) - dm;
}

// block_q6_K (210 bytes): ql[128] | qh[64] | int8 scales[16] | d fp16; x = (d * sc[v / 16]) * (q - 32) with
// v = 128 h + 32 t + l: low 4 bits from ql[64 h + 32 (t % 2) + l] (nibble t / 2), high 2 from qh[32 h + l].
inline void tile_q6_k(device const uchar* row, int it, uint lane, int K, thread float* w) {
    device const uchar* sb = row + it * 210;
    int v0 = int(lane) * 8, h = v0 / 128, t = (v0 % 128) / 32, l0 = v0 % 32;
    float ds = f16_at(sb + 208) * float(((device const char*)sb)[192 + v0 / 16]);
    device const uchar* ql = sb + h * 64 + 32 * (t % 2) + l0;
    device const uchar* qh = sb + 128 + h * 32 + l0;
    for (int i = 0; i < 8; ++i) {
        int q = ((ql[i] >> (4 * (t / 2))) & 15) | (((qh[i] >> (2 * t)) & 3) << 4);
        w[i] = ds * float(q - 32);
    }
}

#define QMV_KERNEL(NAME, TILE)                                                                          \
kernel void NAME(device float* out [[buffer(0)]], device const uchar* w [[buffer(1)]],                 \
                 device const float* x [[buffer(2)]], device const int* dims [[buffer(3)]],             \
                 uint2 tg [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) { \
    int N = dims[1], K = dims[2], rb = dims[3];                                                         \
    uint n = tg.x, m = tg.y;                                                                            \
    device const uchar* row = w + ulong(n) * ulong(rb);                                                 \
    device const float* xr = x + ulong(m) * ulong(K);                                                   \
    float acc = 0.0f, wv[8];                                                                            \
    for (int it = 0; it * 256 < K; ++it) {                                                              \
        TILE(row, it, lane, K, wv);                                                                     \
        int k0 = it * 256 + int(lane) * 8;                                                              \
        for (int i = 0; i < 8; ++i) acc += (k0 + i < K) ? wv[i] * xr[k0 + i] : 0.0f;                    \
    }                                                                                                   \
    acc = simd_sum(acc);                                                                                \
    if (lane == 0) out[ulong(m) * ulong(N) + n] = acc;                                                  \
}

QMV_KERNEL(qmv_q8_0, tile_q8_0)
QMV_KERNEL(qmv_q4_k, tile_q4_k)
QMV_KERNEL(qmv_q6_k, tile_q6_k)
