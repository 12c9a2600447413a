// How fast can the SMs pull randomly indexed KV rows (the sparse prefill's gather: d 576 bf16, 1152-byte rows) out
// of an L2-resident cache with nothing consumed? Every kernel that gathers each (token, key) row once is bound by
// this; at h_q 16 / 8 a key row carries a quarter / an eighth of h_q 64's FLOPs (issue #25, done-when 3).
//   nvcc -arch=sm_90a -std=c++20 -O3 -o gather_ceiling benchmarks/gather_ceiling.cu && ./gather_ceiling > ceiling.jsonl
// Forms: `cpasync-S`: one CTA a token, 64-row tiles by cp.async.cg into S shared-memory stages (the kernels' way);
// `ldg-U`: one CTA a token, 16-byte LDG.CG with U in flight a thread, XOR-folded (no shared memory, 8 CTAs an SM);
// `tma-S`: one CTA a token, each row as 9 TMA boxes of 64 x 1 (128-byte swizzle: the wgmma K tile's layout) issued
// by one warp into S stages, checked against the rows; `bulk-S`: each row as one 1152-byte bulk copy (no layout);
// `contiguous`: ldg-8 over consecutive rows (the L2's streaming rate, for reference). Events, median of 20, L2 warm.
#include <cuda.h>
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>
#include <cuda_runtime.h>
constexpr int ROW = 1152, CHUNKS = ROW / 16, TILE = 64, S_KV = 8192, S_Q = 4096;

template <int S>
__global__ void __launch_bounds__(256) gather_cpasync(const char* kv, const int* idx, int topk, unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  const int* rows = idx + (size_t)blockIdx.x * topk;
  for (int t = 0; t < topk / TILE; ++t) {
    uint32_t buf = (uint32_t)__cvta_generic_to_shared(smem + (t % S) * TILE * ROW);
    for (int c = threadIdx.x; c < TILE * CHUNKS; c += blockDim.x) {
      const char* src = kv + (size_t)__ldg(rows + t * TILE + c / CHUNKS) * ROW + (c % CHUNKS) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(buf + (c / CHUNKS) * ROW + (c % CHUNKS) * 16),
                   "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" :: "n"(S - 1) : "memory");
    __syncthreads();
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0 && smem[7] == 99) sink[blockIdx.x] = 1;  // keeps the copies observable, writes nothing
}

__device__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ void expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ void wait(uint32_t bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               :: "r"(bar), "r"(phase) : "memory");
}

// BULK: one 1152-byte cp.async.bulk a row; else 9 boxes of 64 d x 1 row a row, chunk c of row r at c * 8 KB + r * 128
template <int S, bool BULK>
__global__ void __launch_bounds__(32) gather_tma(const __grid_constant__ CUtensorMap map, const char* kv, const int* idx,
                                                 int topk, char* check) {
  extern __shared__ char raw[];
  char* smem = (char*)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
  __shared__ __align__(8) uint64_t full[S];
  const int* rows = idx + (size_t)blockIdx.x * topk;
  const int lane = threadIdx.x, n = topk / TILE;
  if (lane == 0) {
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(full + s)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  for (int t = 0; t < n; ++t) {
    const int s = t % S;
    const uint32_t bar = smem_u32(full + s), buf = smem_u32(smem + s * TILE * ROW);
    if (t >= S) wait(bar, ((t / S) - 1) & 1);  // the stage's previous tile landed (nothing consumes it)
    if (lane == 0) expect(bar, TILE * ROW);
    __syncwarp();
    for (int r = lane; r < TILE; r += 32) {
      const int row = __ldg(rows + t * TILE + r);
      if (BULK) {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(buf + r * ROW), "l"(kv + (size_t)row * ROW), "n"(ROW), "r"(bar) : "memory");
      } else {
#pragma unroll
        for (int c = 0; c < ROW / 128; ++c)
          asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                       " [%0], [%1, {%2, %3}], [%4];"
                       :: "r"(buf + c * TILE * 128 + r * 128), "l"(&map), "r"(c * 64), "r"(row), "r"(bar) : "memory");
      }
    }
  }
  for (int t = (n > S ? n - S : 0); t < n; ++t) wait(smem_u32(full + t % S), (t / S) & 1);
  if (check && blockIdx.x == 0)  // the last tile, as it landed
    for (int i = lane; i < TILE * ROW / 16; i += 32)
      ((int4*)check)[i] = ((const int4*)(smem + ((n - 1) % S) * TILE * ROW))[i];
}

template <int U>
__global__ void __launch_bounds__(256) gather_ldg(const int4* kv, const int* idx, int topk, unsigned* sink) {
  const int* rows = idx + (size_t)blockIdx.x * topk;
  const int n = topk * CHUNKS;
  unsigned acc = 0;
  for (int base = threadIdx.x; base < n; base += U * blockDim.x) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int it = base + u * blockDim.x;
      v[u] = it < n ? __ldcg(kv + (size_t)__ldg(rows + it / CHUNKS) * CHUNKS + it % CHUNKS) : int4{0, 0, 0, 0};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

template <typename F>
float median_us(F launch) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < 23; ++r) {
    cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float t; cudaEventElapsedTime(&t, a, b); if (r >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3f;
}

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Did the last tile of token 0 land where the wgmma reads it: chunk c of row r at c * 8 KB + r * 128, its 16-byte
// unit u at u ^ (r % 8) (the 128-byte swizzle)?
bool tma_layout_ok(const std::vector<char>& kv, const std::vector<int>& idx, int topk, const std::vector<char>& got) {
  const int t = topk / TILE - 1;
  for (int r = 0; r < TILE; ++r)
    for (int c = 0; c < ROW / 128; ++c)
      for (int u = 0; u < 8; ++u)
        for (int b = 0; b < 16; ++b)
          if (got[c * TILE * 128 + r * 128 + ((u ^ (r % 8)) * 16) + b] != kv[(size_t)idx[t * TILE + r] * ROW + c * 128 + u * 16 + b])
            return false;
  return true;
}

int main() {
  char* kv; int *idx, *seq; unsigned* sink; char* check;
  std::vector<char> hkv((size_t)S_KV * ROW);
  for (size_t i = 0; i < hkv.size(); ++i) hkv[i] = (char)((i * 2654435761u) >> 13);
  cudaMalloc(&kv, hkv.size()); cudaMemcpy(kv, hkv.data(), hkv.size(), cudaMemcpyHostToDevice);
  cudaMalloc(&check, TILE * ROW);
  EncodeTiled encode = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q);
  CUtensorMap map;
  const cuuint64_t dims[2] = {ROW / 2, S_KV}, strides[1] = {ROW};
  const cuuint32_t box[2] = {64, 1}, estr[2] = {1, 1};
  CUresult enc = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv, dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  printf("{\"encode\": %d}\n", (int)enc);
  cudaMalloc(&idx, (size_t)S_Q * 2048 * 4); cudaMalloc(&seq, (size_t)S_Q * 2048 * 4); cudaMalloc(&sink, S_Q * 4);
  std::mt19937 rng(25);
  for (int topk : {640, 2048}) {
    std::vector<int> h(S_Q * topk), s(S_Q * topk), perm(S_KV);
    for (int q = 0; q < S_Q; ++q) {  // distinct keys a token, as the bench's random selection
      std::iota(perm.begin(), perm.end(), 0);
      for (int j = 0; j < topk; ++j) std::swap(perm[j], perm[j + rng() % (S_KV - j)]), h[q * topk + j] = perm[j];
      for (int j = 0; j < topk; ++j) s[q * topk + j] = (q * topk + j) % S_KV;
    }
    cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(seq, s.data(), s.size() * 4, cudaMemcpyHostToDevice);
    const double bytes = (double)S_Q * topk * ROW;
    auto report = [&](const char* form, float us) {
      printf("{\"form\": \"%s\", \"topk\": %d, \"us\": %.1f, \"tbps\": %.2f, \"err\": \"%s\"}\n", form, topk, us,
             bytes / us / 1e6, cudaGetErrorString(cudaGetLastError()));
    };
    cudaFuncSetAttribute(gather_cpasync<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * TILE * ROW);
    cudaFuncSetAttribute(gather_cpasync<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * TILE * ROW);
    report("cpasync-2", median_us([&] { gather_cpasync<2><<<S_Q, 256, 2 * TILE * ROW>>>(kv, idx, topk, sink); }));
    report("cpasync-3", median_us([&] { gather_cpasync<3><<<S_Q, 256, 3 * TILE * ROW>>>(kv, idx, topk, sink); }));
    report("ldg-4", median_us([&] { gather_ldg<4><<<S_Q, 256>>>((const int4*)kv, idx, topk, sink); }));
    report("ldg-8", median_us([&] { gather_ldg<8><<<S_Q, 256>>>((const int4*)kv, idx, topk, sink); }));
    report("ldg-16", median_us([&] { gather_ldg<16><<<S_Q, 256>>>((const int4*)kv, idx, topk, sink); }));
    for (auto [name, fn] : {std::pair{"tma-2", (void*)gather_tma<2, false>}, {"tma-3", (void*)gather_tma<3, false>},
                            {"bulk-2", (void*)gather_tma<2, true>}}) {
      const int stages = name[4] == '3' ? 3 : 2, bytes_smem = stages * TILE * ROW + 1024;
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes_smem);
      auto launch = [&](char* chk) {
        void* args[] = {(void*)&map, (void*)&kv, (void*)&idx, (void*)&topk, (void*)&chk};
        cudaLaunchKernel(fn, S_Q, 32, args, bytes_smem, 0);
      };
      report(name, median_us([&] { launch(nullptr); }));
      if (name[0] == 't') {
        launch(check); std::vector<char> got(TILE * ROW);
        cudaMemcpy(got.data(), check, got.size(), cudaMemcpyDeviceToHost);
        printf("{\"form\": \"%s\", \"topk\": %d, \"layout_ok\": %s}\n", name, topk,
               tma_layout_ok(hkv, h, topk, got) ? "true" : "false");
      }
    }
    report("contiguous", median_us([&] { gather_ldg<8><<<S_Q, 256>>>((const int4*)kv, seq, topk, sink); }));
  }
}
