// How fast n SMs stream a read-only weight region through a TMA ring (the moe v5 producer alone: 8 stages of
// 16 KB bulk copies, one CTA an SM, nothing consumed): aggregate GB/s for n CTAs x `chunk` bytes each, cold L2.
//   nvcc -arch=sm_90a -O3 -o sm_stream benchmarks/sm_stream.cu && ./sm_stream
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
constexpr int STAGE = 16384, STAGES = 8;

__device__ void wait(uint32_t bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               :: "r"(bar), "r"(phase) : "memory");
}
__device__ void load(uint32_t dst, const char* src, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "n"(STAGE) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "n"(STAGE), "r"(bar) : "memory");
}
__global__ void stream(const char* base, size_t chunk) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const char* src = base + blockIdx.x * chunk;
  int n = (int)(chunk / STAGE);
  for (int i = 0; i < min(n, STAGES); ++i) load(s0 + i * STAGE, src + (size_t)i * STAGE, b0 + 8 * i);
  for (int i = 0; i < n; ++i) {
    int s = i % STAGES;
    wait(b0 + 8 * s, (i / STAGES) & 1);
    if (i + STAGES < n) load(s0 + s * STAGE, src + (size_t)(i + STAGES) * STAGE, b0 + 8 * s);
  }
}

int main() {
  const size_t chunks[] = {384 << 10, 512 << 10, 2 << 20};
  const int ctas[] = {24, 48, 96, 132};
  const size_t region = 132ull * (2 << 20), rotations = 8;  // rotated so no rep reads what the L2 holds
  char* buf; cudaMalloc(&buf, region * rotations); cudaMemset(buf, 1, region * rotations);
  cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (size_t chunk : chunks) for (int n : ctas) {
    std::vector<float> ms;
    for (int r = 0; r < 24; ++r) {  // 200 KB dynamic smem: one CTA an SM
      cudaEventRecord(a); stream<<<n, 32, 200 * 1024>>>(buf + (r % rotations) * region, chunk); cudaEventRecord(b);
      cudaEventSynchronize(b); float t; cudaEventElapsedTime(&t, a, b); if (r >= 4) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end()); float med = ms[ms.size() / 2];
    printf("{\"ctas\": %d, \"chunk_kb\": %zu, \"us\": %.2f, \"gbps\": %.0f, \"gbps_per_sm\": %.1f, \"err\": \"%s\"}\n", n,
           chunk >> 10, med * 1e3, n * chunk / (med * 1e6), chunk / (med * 1e6), cudaGetErrorString(cudaGetLastError()));
  }
}
