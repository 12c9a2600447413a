// What the MoE decode layer's launch structure costs with the math taken away: bare TMA weight streams (moe v5's
// producer alone: 8 x 16 KB bulk-copy stages, one CTA an SM, nothing consumed) arranged as the layer launches them,
// each arrangement captured in a CUDA graph and timed as the harness times `--timing graph` (events around one
// replay, L2 flushed before it), beside a device copy moving the same bytes (the done-when's floor).
//   nvcc -arch=sm_90a -O3 -o launch_structure benchmarks/launch_structure.cu && ./launch_structure L1_MB L2_MB
// Arrangements: one launch of L1 + L2 bytes; L1 then L2 (plain, and PDL: L2's CTAs fill their ring before the wait);
// those with a one-CTA kernel before and after (dispatch and combine stand-ins); one persistent launch whose CTAs
// stream their L1 share, count it done, fill their ring from L2 and spin until every CTA has counted.
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
constexpr int STAGE = 16384, STAGES = 8, SMEM = STAGE * STAGES;

__device__ void wait_bar(uint32_t bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               :: "r"(bar), "r"(phase) : "memory");
}
__device__ void load(uint32_t dst, const char* src, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "n"(STAGE) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "n"(STAGE), "r"(bar) : "memory");
}

// Streams n stages from src through the ring; `gate` runs after the first STAGES loads are issued (PDL's wait, or
// the persistent kernel's spin), so a ring fills while the dependency is outstanding. Returns the ring position.
template <class Gate>
__device__ int stream_span(const char* src, int n, uint32_t s0, uint32_t b0, int g, Gate gate) {
  for (int i = 0; i < min(n, STAGES); ++i) load(s0 + ((g + i) % STAGES) * STAGE, src + (size_t)i * STAGE, b0 + 8 * ((g + i) % STAGES));
  gate();
  for (int i = 0; i < n; ++i, ++g) {
    int s = g % STAGES;
    wait_bar(b0 + 8 * s, (g / STAGES) & 1);
    if (i + STAGES < n) load(s0 + s * STAGE, src + (size_t)(i + STAGES) * STAGE, b0 + 8 * s);
  }
  return g;
}

__device__ void init_bars(uint32_t b0) {
  for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One span per CTA (chunk bytes at blockIdx.x * chunk); pdl_wait: griddepcontrol.wait after the ring fills.
__global__ void stream(const char* base, size_t chunk, int pdl_wait) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  init_bars(b0);
  stream_span(base + blockIdx.x * chunk, (int)(chunk / STAGE), s0, b0, 0, [&] {
    if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  });
}

// L1's share, then a grid-wide count, then L2's share whose ring fills before the spin on the count.
__global__ void persistent(const char* l1, size_t c1, const char* l2, size_t c2, unsigned* done, int pdl_wait) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  init_bars(b0);
  int g = stream_span(l1 + blockIdx.x * c1, (int)(c1 / STAGE), s0, b0, 0, [&] {
    if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  });
  __threadfence();
  atomicAdd(done, 1u);
  stream_span(l2 + blockIdx.x * c2, (int)(c2 / STAGE), s0, b0, g, [&] {
    while (atomicAdd(done, 0u) < gridDim.x) __nanosleep(64);
  });
}

__global__ void tiny(float* x, int pdl_wait) {  // a dispatch / combine stand-in: one CTA, a few loads and stores
  asm volatile("griddepcontrol.launch_dependents;");
  if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  x[threadIdx.x] = x[threadIdx.x] * 0.5f + 1.0f;
}

template <class K, class... A>
void launch(K kernel, int grid, int block, int smem, bool pdl, cudaStream_t st, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid; cfg.blockDim = block; cfg.dynamicSmemBytes = smem; cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at; cfg.numAttrs = pdl ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, args...);
}

int main(int argc, char** argv) {
  double l1_mb = argc > 1 ? atof(argv[1]) : 53.7, l2_mb = argc > 2 ? atof(argv[2]) : 26.8;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  size_t c1 = ((size_t)(l1_mb * 1e6) / sms / STAGE) * STAGE, c2 = ((size_t)(l2_mb * 1e6) / sms / STAGE) * STAGE;
  size_t region = (c1 + c2) * sms;
  const int rotations = 4;  // each replay reads a region the last did not (the L2 is flushed as well)
  char* buf; cudaMalloc(&buf, region * rotations); cudaMemset(buf, 1, region * rotations);
  char* flush; size_t flush_bytes = 256 << 20; cudaMalloc(&flush, flush_bytes);
  char* cdst; cudaMalloc(&cdst, region / 2);
  float* small; cudaMalloc(&small, 4096); cudaMemset(small, 0, 4096);
  unsigned* done; cudaMalloc(&done, 4); cudaMemset(done, 0, 4);
  cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  cudaFuncSetAttribute(persistent, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  struct Arr { const char* name; int id; };
  const Arr arrs[] = {{"copy_same_traffic", 0}, {"one_launch", 1}, {"l1_l2", 2}, {"l1_l2_pdl", 3},
                      {"tiny_l1_l2_tiny", 4}, {"tiny_l1_l2_tiny_pdl", 5}, {"persistent", 6},
                      {"tiny_persistent_tiny_pdl", 7}, {"tiny_alone", 8}};
  for (const Arr& arr : arrs) {
    std::vector<cudaGraphExec_t> execs(rotations);
    for (int r = 0; r < rotations; ++r) {
      const char* l1 = buf + r * region; const char* l2 = l1 + c1 * sms;
      cudaGraph_t graph;
      cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
      bool pdl = arr.id == 3 || arr.id == 5 || arr.id == 7;
      if (arr.id == 0) cudaMemcpyAsync(cdst, l1, region / 2, cudaMemcpyDeviceToDevice, st);
      if (arr.id == 1) launch(stream, sms, 32, SMEM, false, st, l1, c1 + c2, 0);
      if (arr.id == 4 || arr.id == 5 || arr.id == 7 || arr.id == 8) launch(tiny, 1, 128, 0, false, st, small, 0);
      if (arr.id >= 2 && arr.id <= 5) {
        launch(stream, sms, 32, SMEM, pdl && arr.id == 5, st, l1, c1, (int)(pdl && arr.id == 5));
        launch(stream, sms, 32, SMEM, pdl, st, l2, c2, (int)pdl);
      }
      if (arr.id == 6 || arr.id == 7) launch(persistent, sms, 32, SMEM, pdl, st, l1, c1, l2, c2, done, (int)pdl);
      if (arr.id == 4 || arr.id == 5 || arr.id == 7) launch(tiny, 1, 128, 0, pdl, st, small, (int)pdl);
      cudaStreamEndCapture(st, &graph);
      cudaGraphInstantiate(&execs[r], graph, 0);
    }
    std::vector<float> us;
    for (int rep = 0; rep < 44; ++rep) {
      cudaMemsetAsync(flush, rep & 0xff, flush_bytes, st);
      if (arr.id == 6 || arr.id == 7) cudaMemsetAsync(done, 0, 4, st);  // each replay counts up from zero
      cudaEventRecord(a, st); cudaGraphLaunch(execs[rep % rotations], st); cudaEventRecord(b, st);
      cudaEventSynchronize(b); float t; cudaEventElapsedTime(&t, a, b); if (rep >= 4) us.push_back(t * 1e3f);
    }
    std::sort(us.begin(), us.end());
    printf("{\"arrangement\": \"%s\", \"l1_mb\": %.1f, \"l2_mb\": %.1f, \"ctas\": %d, \"us_median\": %.2f, \"us_p10\": %.2f, "
           "\"us_p90\": %.2f, \"err\": \"%s\"}\n", arr.name, c1 * sms / 1e6, c2 * sms / 1e6, sms, us[us.size() / 2],
           us[us.size() / 10], us[us.size() * 9 / 10], cudaGetErrorString(cudaGetLastError()));
  }
}
