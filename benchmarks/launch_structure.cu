// What the MoE decode layer's launch structure costs with the math taken away: bare TMA weight streams (moe v5's
// producer alone: 8 x 16 KB bulk-copy stages, one CTA an SM, nothing consumed) arranged as the layer launches them,
// each arrangement captured in a CUDA graph and timed as the harness times `--timing graph` (events around one
// replay, L2 flushed before it), beside a device copy moving the same bytes (the done-when's floor).
//   nvcc -arch=sm_90a -O3 -o launch_structure benchmarks/launch_structure.cu && ./launch_structure L1_MB L2_MB
// Arrangements: one launch of L1 + L2 bytes; L1 then L2 (plain, and PDL: L2's CTAs fill their ring before the wait);
// those with a one-CTA kernel before and after (dispatch and combine stand-ins); one persistent launch whose CTAs
// stream their L1 share, count it done, fill their ring from L2 and spin until every CTA has counted. Read forms of
// one launch: a stage at a time from a shared counter (steal), 16-byte loads (ldg), L1's bytes alone (132 / 96 CTAs);
// `stamps` lines give each CTA's entry and exit times in one replay (the tail).
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

__device__ uint64_t now_ns() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

// One span per CTA (chunk bytes at blockIdx.x * chunk); pdl_wait: griddepcontrol.wait after the ring fills.
// stamps (if not null): each CTA's entry and exit time.
__global__ void stream(const char* base, size_t chunk, int pdl_wait, uint64_t* stamps) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x != 0) return;
  uint64_t t0 = now_ns();
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  init_bars(b0);
  stream_span(base + blockIdx.x * chunk, (int)(chunk / STAGE), s0, b0, 0, [&] {
    if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  });
  if (stamps) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = now_ns(); }
}

// The same bytes taken a stage at a time from a shared counter: no CTA idles while another still has a chunk left.
__global__ void stream_steal(const char* base, int total, unsigned* next, uint64_t* stamps) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  uint64_t t0 = now_ns();
  uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem), b0 = (uint32_t)__cvta_generic_to_shared(bars);
  init_bars(b0);
  int issued = 0;
  for (; issued < STAGES; ++issued) {
    unsigned idx = atomicAdd(next, 1u);
    if (idx >= (unsigned)total) break;
    load(s0 + issued * STAGE, base + (size_t)idx * STAGE, b0 + 8 * issued);
  }
  for (int g = 0; g < issued; ++g) {
    int s = g % STAGES;
    wait_bar(b0 + 8 * s, (g / STAGES) & 1);
    unsigned idx = atomicAdd(next, 1u);
    if (idx < (unsigned)total) { load(s0 + s * STAGE, base + (size_t)idx * STAGE, b0 + 8 * s); ++issued; }
  }
  if (stamps) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = now_ns(); }
}

// A copy without its write: 16-byte loads, grid-stride, folded so the compiler keeps them.
__global__ void ldg_read(const uint4* src, size_t n, unsigned* sink) {
  unsigned acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * stride < n ? __ldcs(src + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
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
  uint64_t* stamps; cudaMalloc(&stamps, 16 * sms);
  cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  cudaFuncSetAttribute(stream_steal, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  cudaFuncSetAttribute(persistent, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  struct Arr { const char* name; int id; };
  const Arr arrs[] = {{"copy_same_traffic", 0}, {"one_launch", 1}, {"l1_l2", 2}, {"l1_l2_pdl", 3},
                      {"tiny_l1_l2_tiny", 4}, {"tiny_l1_l2_tiny_pdl", 5}, {"persistent", 6},
                      {"tiny_persistent_tiny_pdl", 7}, {"tiny_alone", 8},
                      {"one_launch_stamped", 9}, {"one_launch_steal", 10}, {"one_launch_ldg", 11}, {"l1_alone", 12},
                      {"l1_alone_steal", 13}, {"l1_alone_96_ctas", 14}};
  for (const Arr& arr : arrs) {
    std::vector<cudaGraphExec_t> execs(rotations);
    for (int r = 0; r < rotations; ++r) {
      const char* l1 = buf + r * region; const char* l2 = l1 + c1 * sms;
      cudaGraph_t graph;
      cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
      bool pdl = arr.id == 3 || arr.id == 5 || arr.id == 7;
      if (arr.id == 0) cudaMemcpyAsync(cdst, l1, region / 2, cudaMemcpyDeviceToDevice, st);
      if (arr.id == 1 || arr.id == 9) launch(stream, sms, 32, SMEM, false, st, l1, c1 + c2, 0, arr.id == 9 ? stamps : nullptr);
      if (arr.id == 4 || arr.id == 5 || arr.id == 7 || arr.id == 8) launch(tiny, 1, 128, 0, false, st, small, 0);
      if (arr.id >= 2 && arr.id <= 5) {
        launch(stream, sms, 32, SMEM, pdl && arr.id == 5, st, l1, c1, (int)(pdl && arr.id == 5), (uint64_t*)nullptr);
        launch(stream, sms, 32, SMEM, pdl, st, l2, c2, (int)pdl, (uint64_t*)nullptr);
      }
      if (arr.id == 10) launch(stream_steal, sms, 32, SMEM, false, st, l1, (int)((c1 + c2) * sms / STAGE), done, stamps);
      if (arr.id == 11) launch(ldg_read, sms * 4, 512, 0, false, st, (const uint4*)l1, (c1 + c2) * sms / 16, done);
      if (arr.id == 12) launch(stream, sms, 32, SMEM, false, st, l1, c1, 0, (uint64_t*)nullptr);
      if (arr.id == 13) launch(stream_steal, sms, 32, SMEM, false, st, l1, (int)(c1 * sms / STAGE), done, (uint64_t*)nullptr);
      if (arr.id == 14) launch(stream, 96, 32, SMEM, false, st, l1, c1 * sms / 96 / STAGE * STAGE, 0, (uint64_t*)nullptr);
      if (arr.id == 6 || arr.id == 7) launch(persistent, sms, 32, SMEM, pdl, st, l1, c1, l2, c2, done, (int)pdl);
      if (arr.id == 4 || arr.id == 5 || arr.id == 7) launch(tiny, 1, 128, 0, pdl, st, small, (int)pdl);
      cudaStreamEndCapture(st, &graph);
      cudaGraphInstantiate(&execs[r], graph, 0);
    }
    std::vector<float> us;
    for (int rep = 0; rep < 44; ++rep) {
      cudaMemsetAsync(flush, rep & 0xff, flush_bytes, st);
      if (arr.id == 6 || arr.id == 7 || arr.id == 10 || arr.id == 13) cudaMemsetAsync(done, 0, 4, st);  // counters start at zero
      cudaEventRecord(a, st); cudaGraphLaunch(execs[rep % rotations], st); cudaEventRecord(b, st);
      cudaEventSynchronize(b); float t; cudaEventElapsedTime(&t, a, b); if (rep >= 4) us.push_back(t * 1e3f);
    }
    std::sort(us.begin(), us.end());
    printf("{\"arrangement\": \"%s\", \"l1_mb\": %.1f, \"l2_mb\": %.1f, \"ctas\": %d, \"us_median\": %.2f, \"us_p10\": %.2f, "
           "\"us_p90\": %.2f, \"err\": \"%s\"}\n", arr.name, c1 * sms / 1e6, c2 * sms / 1e6, sms, us[us.size() / 2],
           us[us.size() / 10], us[us.size() * 9 / 10], cudaGetErrorString(cudaGetLastError()));
    if (arr.id == 9 || arr.id == 10) {  // the last replay's CTA entry / exit times, from the earliest entry
      std::vector<uint64_t> h(2 * sms); cudaMemcpy(h.data(), stamps, 16 * sms, cudaMemcpyDeviceToHost);
      uint64_t t0 = h[0]; for (int i = 0; i < sms; ++i) t0 = std::min(t0, h[2 * i]);
      std::vector<double> in, out;
      for (int i = 0; i < sms; ++i) { in.push_back((h[2 * i] - t0) * 1e-3); out.push_back((h[2 * i + 1] - t0) * 1e-3); }
      std::sort(in.begin(), in.end()); std::sort(out.begin(), out.end());
      printf("{\"stamps\": \"%s\", \"entry_us_max\": %.2f, \"exit_us_min\": %.2f, \"exit_us_p10\": %.2f, "
             "\"exit_us_median\": %.2f, \"exit_us_p90\": %.2f, \"exit_us_max\": %.2f}\n", arr.name, in.back(), out[0],
             out[sms / 10], out[sms / 2], out[sms * 9 / 10], out.back());
    }
  }
}
