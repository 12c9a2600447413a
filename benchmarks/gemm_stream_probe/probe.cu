// Decode GEMM probe: y[M,N] = x[M,K] . W[N,K]^T, FP8 e4m3, DSV4 block scales, W loaded by plain LDG into
// mma.sync m16n8k32 fragments (swap-AB: W rows are the MMA's M). Plus bare read streams (LDG, TMA bulk ring).
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda.h>
namespace cg = cooperative_groups;

__device__ __forceinline__ int4 ldg_stream128(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ int4 ldg128(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t w_(const int4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// sa: [K/128][lda] fp32 (MN-major), sw: [ceil(N/128)][K/128] fp32, y: [M][N] bf16.
template <int MT, int RT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gemv_mma(const uint8_t* __restrict__ x, const float* __restrict__ sa, int lda,
    const uint8_t* __restrict__ w, const float* __restrict__ sw, __nv_bfloat16* __restrict__ y, int M, int N, int K, int ks) {
  constexpr int ROWS = RT * 16, TOK = MT * 8;
  extern __shared__ float red[];  // [WARPS][ROWS][TOK]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * ROWS, kblocks = K / 128;
  const int rank = blockIdx.y;  // K slice within the cluster
  // this warp's 128-K blocks: slice (rank, warp) of ks * WARPS
  const int parts = ks * WARPS, part = rank * WARPS + warp;
  const int kb_lo = kblocks * part / parts, kb_hi = kblocks * (part + 1) / parts;
  float acc[RT][MT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][m][i] = 0.f;
  const uint8_t* wrow[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = min(n0 + r * 16 + g + 8 * h, N - 1);
      wrow[r][h] = w + (size_t)row * K + 16 * t;
    }
  int4 wa[2][RT][2][2], xb[2][MT][2];  // [stage][r][row half][k64 half]
  auto load = [&](int s, int kb) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q) wa[s][r][h][q] = ldg_stream128(wrow[r][h] + kb * 128 + q * 64);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      int tok = m * 8 + g;
#pragma unroll
      for (int q = 0; q < 2; ++q)
        xb[s][m][q] = tok < M ? ldg128(x + (size_t)tok * K + kb * 128 + q * 64 + 16 * t) : make_int4(0, 0, 0, 0);
    }
  };
  auto compute = [&](int s, int kb) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      float swv = sw[(size_t)((n0 + r * 16) / 128) * kblocks + kb];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int hk = 0; hk < 2; ++hk)
            mma(c, w_(wa[s][r][0][q], 2 * hk), w_(wa[s][r][1][q], 2 * hk), w_(wa[s][r][0][q], 2 * hk + 1),
                w_(wa[s][r][1][q], 2 * hk + 1), w_(xb[s][m][q], 2 * hk), w_(xb[s][m][q], 2 * hk + 1));
        int tok = m * 8 + 2 * t;
        float s0 = tok < M ? sa[(size_t)kb * lda + tok] * swv : 0.f;
        float s1 = tok + 1 < M ? sa[(size_t)kb * lda + tok + 1] * swv : 0.f;
        acc[r][m][0] += c[0] * s0; acc[r][m][1] += c[1] * s1;
        acc[r][m][2] += c[2] * s0; acc[r][m][3] += c[3] * s1;
      }
    }
  };
  int kb = kb_lo;
  if (kb < kb_hi) load(0, kb);
  for (; kb + 1 < kb_hi; kb += 2) {
    load(1, kb + 1);
    compute(0, kb);
    if (kb + 2 < kb_hi) load(0, kb + 2);
    compute(1, kb + 1);
  }
  if (kb < kb_hi) compute(0, kb);
  // C fragment: rows g, g+8 (W rows), cols 2t, 2t+1 (tokens)
  float* mine = red + warp * ROWS * TOK;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      int row = r * 16 + g, tok = m * 8 + 2 * t;
      mine[row * TOK + tok] = acc[r][m][0];
      mine[row * TOK + tok + 1] = acc[r][m][1];
      mine[(row + 8) * TOK + tok] = acc[r][m][2];
      mine[(row + 8) * TOK + tok + 1] = acc[r][m][3];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * TOK; i += WARPS * 32) {
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) s += red[v * ROWS * TOK + i];
    red[i] = s;
  }
  if (ks > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (rank == 0) {
      for (int i = threadIdx.x; i < ROWS * TOK; i += WARPS * 32) {
        float s = red[i];
        for (int p = 1; p < ks; ++p) s += cluster.map_shared_rank(red, p)[i];
        red[i] = s;
      }
    }
    cluster.sync();
    if (rank != 0) return;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * M; i += WARPS * 32) {
    int tok = i / ROWS, row = i % ROWS;
    if (n0 + row < N) y[(size_t)tok * N + n0 + row] = __float2bfloat16(red[row * TOK + tok]);
  }
}

__global__ void ldg_stream(const int4* __restrict__ p, size_t n16, int* out) {
  constexpr int U = 8;
  int acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = i + u * stride < n16 ? ldg_stream128(p + i + u * stride) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fedcba9) out[0] = acc;
}

constexpr int STAGE = 8192, STAGES = 8;
__device__ void bwait(uint32_t bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               :: "r"(bar), "r"(phase) : "memory");
}
__device__ void bload(uint32_t dst, const char* src, uint32_t bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__global__ void tma_stream(const char* base, size_t nbytes) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  size_t pieces = (nbytes + STAGE - 1) / STAGE;
  int mine = (int)((pieces - blockIdx.x + gridDim.x - 1) / gridDim.x);
  auto piece = [&](int i) { return (size_t)blockIdx.x + (size_t)i * gridDim.x; };
  auto bytes = [&](int i) { size_t o = piece(i) * STAGE; return (uint32_t)min((size_t)STAGE, nbytes - o); };
  for (int i = 0; i < min(mine, STAGES); ++i) bload(s0 + i * STAGE, base + piece(i) * STAGE, bytes(i), b0 + 8 * i);
  for (int i = 0; i < mine; ++i) {
    int s = i % STAGES;
    bwait(b0 + 8 * s, (i / STAGES) & 1);
    if (i + STAGES < mine) bload(s0 + s * STAGE, base + piece(i + STAGES) * STAGE, bytes(i + STAGES), b0 + 8 * s);
  }
}


// W [N, K] bytes as a 2-D tensor map; CTA (x, y) streams rows [x*bn, +bn) over K slice y of gridDim.y in boxes of
// bn x box_k bytes, `stages` deep; `extra` more 128-byte bulk copies a stage (stand-ins for the x / sa / sw boxes).
__global__ void tma2d_stream(const __grid_constant__ CUtensorMap tm, int K, int bn, int box_k, int stages, int extra,
                             const char* small) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[16];
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  asm volatile("prefetch.tensormap [%0];" :: "l"(&tm) : "memory");
  for (int s = 0; s < stages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const int nk = K / box_k, lo = nk * blockIdx.y / gridDim.y, n = nk * (blockIdx.y + 1) / gridDim.y - lo;
  const uint32_t stage_bytes = bn * box_k, tx = stage_bytes + 128 * extra;
  const uint32_t extra_base = s0 + stages * stage_bytes;
  auto issue = [&](int i, int s) {
    uint32_t bar = b0 + 8 * s;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(tx) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(s0 + s * stage_bytes), "l"(&tm), "r"((lo + i) * box_k), "r"((int)blockIdx.x * bn), "r"(bar)
                 : "memory");
    for (int e = 0; e < extra; ++e)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];"
                   :: "r"(extra_base + (s * 4 + e) * 128), "l"(small + (((lo + i) * 4 + e) * 128) % 65536), "r"(bar)
                   : "memory");
  };
  for (int i = 0; i < min(n, stages); ++i) issue(i, i);
  for (int i = 0; i < n; ++i) {
    int s = i % stages;
    bwait(b0 + 8 * s, (i / stages) & 1);
    if (i + stages < n) issue(i + stages, s);
  }
}


__global__ void tma3d_stream(const __grid_constant__ CUtensorMap tm, int K, int bn, int kk, int stages) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[16];
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  asm volatile("prefetch.tensormap [%0];" :: "l"(&tm) : "memory");
  for (int s = 0; s < stages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const int nk = K / (128 * kk), lo = nk * blockIdx.y / gridDim.y, n = nk * (blockIdx.y + 1) / gridDim.y - lo;
  const uint32_t stage_bytes = bn * 128 * kk;
  auto issue = [&](int i, int s) {
    uint32_t bar = b0 + 8 * s;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(stage_bytes) : "memory");
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(s0 + s * stage_bytes), "l"(&tm), "r"(0), "r"((int)blockIdx.x * bn), "r"((lo + i) * kk), "r"(bar)
                 : "memory");
  };
  for (int i = 0; i < min(n, stages); ++i) issue(i, i);
  for (int i = 0; i < n; ++i) {
    int s = i % stages;
    bwait(b0 + 8 * s, (i / stages) & 1);
    if (i + stages < n) issue(i + stages, s);
  }
}

template <int MT, int RT, int WARPS>
static int launch_t(const void* x, const void* sa, int lda, const void* w, const void* sw, void* y, int M, int N, int K,
                    int ks, cudaStream_t st) {
  constexpr int ROWS = RT * 16, TOK = MT * 8;
  size_t smem = (size_t)WARPS * ROWS * TOK * 4;
  auto k = gemv_mma<MT, RT, WARPS>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + ROWS - 1) / ROWS, ks, 1);
  cfg.blockDim = dim3(WARPS * 32, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1; attr[0].val.clusterDim.y = ks; attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr; cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, (const uint8_t*)x, (const float*)sa, lda, (const uint8_t*)w,
                                     (const float*)sw, (__nv_bfloat16*)y, M, N, K, ks);
  return (int)e;
}

#define CASE(MT_, RT_, W_) if (mt == MT_ && rt == RT_ && warps == W_) return launch_t<MT_, RT_, W_>(x, sa, lda, w, sw, y, M, N, K, ks, st);
extern "C" int launch_gemv(const void* x, const void* sa, int lda, const void* w, const void* sw, void* y, int M, int N,
                           int K, int ks, int rt, int warps, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  int mt = (M + 7) / 8;
  CASE(1, 1, 4) CASE(1, 1, 8) CASE(1, 1, 16) CASE(1, 2, 4) CASE(1, 2, 8) CASE(1, 4, 4) CASE(1, 4, 8)
  CASE(8, 1, 4) CASE(8, 1, 8)
  return -1;
}
extern "C" int launch_ldg(const void* p, size_t nbytes, void* out, int ctas, int threads, void* stream) {
  ldg_stream<<<ctas, threads, 0, (cudaStream_t)stream>>>((const int4*)p, nbytes / 16, (int*)out);
  return (int)cudaGetLastError();
}
extern "C" int launch_tma(const void* p, size_t nbytes, int ctas, void* stream) {
  static bool set = false;
  if (!set) { cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGE * STAGES); set = true; }
  tma_stream<<<ctas, 32, STAGE * STAGES, (cudaStream_t)stream>>>((const char*)p, nbytes);
  return (int)cudaGetLastError();
}

extern "C" int launch_tma2d(const void* w, int N, int K, int bn, int box_k, int stages, int extra, int ksplit,
                            const void* small, int promo, void* stream) {
  CUtensorMap tm;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N}, strides[1] = {(cuuint64_t)K};
  cuuint32_t box[2] = {(cuuint32_t)box_k, (cuuint32_t)bn}, es[2] = {1, 1};
  typedef CUresult (*Encode)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode enc = nullptr;
  if (!enc) {
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&enc, cudaEnableDefault, &q) != cudaSuccess || !enc)
      return 999;
  }
  CUresult r = enc(&tm, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(w), dims, strides, box, es,
      CU_TENSOR_MAP_INTERLEAVE_NONE, box_k == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      (CUtensorMapL2promotion)promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return 1000 + (int)r;
  int smem = stages * bn * box_k + stages * 4 * 128;
  cudaFuncSetAttribute(tma2d_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  tma2d_stream<<<dim3(N / bn, ksplit), 32, smem, (cudaStream_t)stream>>>(tm, K, bn, box_k, stages, extra,
                                                                           (const char*)small);
  return (int)cudaGetLastError();
}

extern "C" int launch_tma3d(const void* w, int N, int K, int bn, int kk, int stages, int ksplit, int promo, void* stream) {
  typedef CUresult (*Encode)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode enc = nullptr;
  if (!enc) {
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&enc, cudaEnableDefault, &q) != cudaSuccess || !enc)
      return 999;
  }
  CUtensorMap tm;
  cuuint64_t dims[3] = {128, (cuuint64_t)N, (cuuint64_t)(K / 128)}, strides[2] = {(cuuint64_t)K, 128};
  cuuint32_t box[3] = {128, (cuuint32_t)bn, (cuuint32_t)kk}, es[3] = {1, 1, 1};
  CUresult r = enc(&tm, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(w), dims, strides, box, es,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, (CUtensorMapL2promotion)promo,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return 1000 + (int)r;
  int smem = stages * bn * 128 * kk;
  cudaFuncSetAttribute(tma3d_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  tma3d_stream<<<dim3(N / bn, ksplit), 32, smem, (cudaStream_t)stream>>>(tm, K, bn, kk, stages);
  return (int)cudaGetLastError();
}
