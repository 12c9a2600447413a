// What the MoE decode layer's launch structure costs with the math taken away: bare TMA weight streams (moe v5's
// producer alone: 8 x 16 KB bulk-copy stages, one CTA an SM, nothing consumed) arranged as the layer launches them,
// each arrangement captured in a CUDA graph and timed as the harness times `--timing graph` (events around one
// replay, L2 flushed before it), beside a device copy moving the same bytes (the done-when's floor).
//   nvcc -arch=sm_90a -O3 -o launch_structure benchmarks/launch_structure.cu && ./launch_structure L1_MB L2_MB [dirty]
// Arrangements: one launch of L1 + L2 bytes; L1 then L2 (plain, and PDL: L2's CTAs fill their ring before the wait);
// those with a one-CTA kernel before and after (dispatch and combine stand-ins); one persistent launch whose CTAs
// stream their L1 share, count it done, fill their ring from L2 and spin until every CTA has counted. Read forms of
// one launch: a stage at a time from a shared counter (steal), an L2 evict_first hint, 4 / 12 stages, two CTAs an SM,
// 16-byte loads (ldg: streaming or plain, 4 or 1 CTA an SM), L1's bytes alone (132 / 96 CTAs, ldg, 2D tensor-map
// boxes of 64- or 128-byte rows, with the ring's two 1 KB side copies a stage);
// `stamps` lines give each CTA's entry and exit times in one replay (the tail).
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>
constexpr int STAGE = 16384, STAGES = 8, MAX_STAGES = 12;

__device__ void wait_bar(uint32_t bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               :: "r"(bar), "r"(phase) : "memory");
}
// One 16 KB bulk copy; policy 0: no L2 hint, else a createpolicy value (evict_first / evict_last).
__device__ void load(uint32_t dst, const char* src, uint32_t bar, uint64_t policy = 0) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "n"(STAGE) : "memory");
  if (policy)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "n"(STAGE), "r"(bar), "l"(policy) : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "n"(STAGE), "r"(bar) : "memory");
}
__device__ uint64_t evict_first_policy() {
  uint64_t p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p;
}
__device__ uint64_t now_ns() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

// Streams n stages from src through a ring of nst stages; `gate` runs after the first nst loads are issued (PDL's
// wait, or the persistent kernel's spin), so a ring fills while the dependency is outstanding. Returns the position.
template <class Gate>
__device__ int stream_span(const char* src, int n, int nst, uint64_t policy, uint32_t s0, uint32_t b0, int g, Gate gate) {
  for (int i = 0; i < min(n, nst); ++i)
    load(s0 + ((g + i) % nst) * STAGE, src + (size_t)i * STAGE, b0 + 8 * ((g + i) % nst), policy);
  gate();
  for (int i = 0; i < n; ++i, ++g) {
    int s = g % nst;
    wait_bar(b0 + 8 * s, (g / nst) & 1);
    if (i + nst < n) load(s0 + s * STAGE, src + (size_t)(i + nst) * STAGE, b0 + 8 * s, policy);
  }
  return g;
}

__device__ void init_bars(uint32_t b0, int nst) {
  for (int s = 0; s < nst; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0 + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

struct Ring { uint32_t s0, b0; };
__device__ Ring ring(char* smem, uint64_t* bars) {
  return {(uint32_t)__cvta_generic_to_shared(smem), (uint32_t)__cvta_generic_to_shared(bars)};
}

// One span per CTA (chunk bytes at blockIdx.x * chunk) through nst stages; evict_first: the L2 hint on every copy;
// pdl_wait: griddepcontrol.wait once the ring is full; stamps (if not null): each CTA's entry and exit time.
__global__ void stream(const char* base, size_t chunk, int nst, int evict_first, int pdl_wait, uint64_t* stamps) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[MAX_STAGES];
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x != 0) return;
  uint64_t t0 = now_ns();
  Ring r = ring(smem, bars);
  init_bars(r.b0, nst);
  stream_span(base + blockIdx.x * chunk, (int)(chunk / STAGE), nst, evict_first ? evict_first_policy() : 0, r.s0, r.b0,
              0, [&] { if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory"); });
  if (stamps) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = now_ns(); }
}

// One span per CTA read through a 2D tensor map (rows of `row_bytes`, one box = one 16 KB stage: the moe ring's codes
// copy is a 256 x 64-byte box with the 64-byte swizzle); side: two more 1 KB bulk copies a stage from a region where
// consecutive stages of a CTA lie grid x 1 KB apart (the ring's shift words and column scales, [KB, N] per expert).
// row_bytes 0: a 16 KB bulk copy from base instead (the side copies' cost alone).
__global__ void stream_box(const __grid_constant__ CUtensorMap map, const char* base, size_t chunk, int row_bytes,
                           const char* side) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  Ring r = ring(smem, bars);
  init_bars(r.b0, STAGES);
  const uint32_t side_bytes = side ? 2048 : 0, side_dst = r.s0 + STAGES * STAGE;
  int n = (int)(chunk / STAGE);
  auto issue = [&](int i) {
    int s = i % STAGES;
    uint32_t bar = r.b0 + 8 * s, dst = r.s0 + s * STAGE;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(STAGE + side_bytes) : "memory");
    size_t at = blockIdx.x * chunk + (size_t)i * STAGE;
    if (row_bytes)
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                   :: "r"(dst), "l"(&map), "r"(0), "r"((int)(at / row_bytes)), "r"(bar) : "memory");
    else
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(dst), "l"(base + at), "n"(STAGE), "r"(bar) : "memory");
    if (side) {
      for (int k = 0; k < 2; ++k) {
        const char* src = side + ((size_t)(2 * i + k) * gridDim.x + blockIdx.x) * 1024;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 1024, [%2];"
                     :: "r"(side_dst + s * 2048 + k * 1024), "l"(src), "r"(bar) : "memory");
      }
    }
  };
  for (int i = 0; i < min(n, STAGES); ++i) issue(i);
  for (int i = 0; i < n; ++i) {
    wait_bar(r.b0 + 8 * (i % STAGES), (i / STAGES) & 1);
    if (i + STAGES < n) issue(i + STAGES);
  }
}

// The same bytes taken a stage at a time from a shared counter: no CTA idles while another still has a chunk left.
__global__ void stream_steal(const char* base, int total, unsigned* next, uint64_t* stamps) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  uint64_t t0 = now_ns();
  Ring r = ring(smem, bars);
  init_bars(r.b0, STAGES);
  int issued = 0;
  for (; issued < STAGES; ++issued) {
    unsigned idx = atomicAdd(next, 1u);
    if (idx >= (unsigned)total) break;
    load(r.s0 + issued * STAGE, base + (size_t)idx * STAGE, r.b0 + 8 * issued);
  }
  for (int g = 0; g < issued; ++g) {
    int s = g % STAGES;
    wait_bar(r.b0 + 8 * s, (g / STAGES) & 1);
    unsigned idx = atomicAdd(next, 1u);
    if (idx < (unsigned)total) { load(r.s0 + s * STAGE, base + (size_t)idx * STAGE, r.b0 + 8 * s); ++issued; }
  }
  if (stamps) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = now_ns(); }
}

// A copy without its write: 16-byte loads (streaming `.cs` or plain), grid-stride, folded so the compiler keeps them.
__global__ void ldg_read(const uint4* src, size_t n, int streaming, unsigned* sink) {
  unsigned acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      size_t j = i + u * stride;
      v[u] = j >= n ? make_uint4(0, 0, 0, 0) : streaming ? __ldcs(src + j) : src[j];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // never in practice (the flush's fill bytes are not this)
}

// L1's share, then a grid-wide count, then L2's share whose ring fills before the spin on the count.
__global__ void persistent(const char* l1, size_t c1, const char* l2, size_t c2, unsigned* done, int pdl_wait) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  Ring r = ring(smem, bars);
  init_bars(r.b0, STAGES);
  int g = stream_span(l1 + blockIdx.x * c1, (int)(c1 / STAGE), STAGES, 0, r.s0, r.b0, 0, [&] {
    if (pdl_wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  });
  __threadfence();
  atomicAdd(done, 1u);
  stream_span(l2 + blockIdx.x * c2, (int)(c2 / STAGE), STAGES, 0, r.s0, r.b0, g, [&] {
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

struct Arrangement {
  const char* name;
  std::function<void(cudaStream_t, const char* l1, const char* l2)> capture;
  bool counter = false;  // `done` zeroed before each replay
  bool stamped = false;  // print the CTAs' entry / exit spread of the last replay
};

int main(int argc, char** argv) {
  double l1_mb = argc > 1 ? atof(argv[1]) : 53.5, l2_mb = argc > 2 ? atof(argv[2]) : 26.7;
  bool dirty = argc > 3 && std::string(argv[3]) == "dirty";  // leave the flush's lines dirty (no read sweep)
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
  for (const void* k : {(const void*)stream, (const void*)stream_steal, (const void*)persistent, (const void*)stream_box})
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_STAGES * STAGE + STAGES * 2048);
  cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  // 2D tensor maps over each rotation's L1 bytes: rows of 64 bytes (box 64 x 256, 64-byte swizzle) and of 128 (128 x
  // 128, 128-byte swizzle)
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  void* fn = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  auto make_map = [&](const char* base, int row_bytes) {
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)(c1 * sms / row_bytes)}, strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {(cuuint32_t)row_bytes, (cuuint32_t)(STAGE / row_bytes)}, elem[2] = {1, 1};
    CUresult res = ((Encode)fn)(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void*)base, dims, strides, box, elem,
                                CU_TENSOR_MAP_INTERLEAVE_NONE,
                                row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS) printf("{\"error\": \"cuTensorMapEncodeTiled %d\"}\n", (int)res);
    return m;
  };
  std::vector<CUtensorMap> map64, map128;
  for (int r = 0; r < rotations; ++r) { map64.push_back(make_map(buf + r * region, 64)); map128.push_back(make_map(buf + r * region, 128)); }
  char* side; cudaMalloc(&side, 2 * c1 * sms / STAGE * 1024 + (2 << 20)); cudaMemset(side, 2, 2 * c1 * sms / STAGE * 1024 + (2 << 20));
  auto rot = [&](const char* l1) { return (int)((l1 - buf) / region); };
  const int box_smem = STAGES * STAGE + STAGES * 2048;
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  uint64_t* none = nullptr;
  const size_t both = c1 + c2, all = region;
  auto ring_read = [&](cudaStream_t s, const char* src, int grid, size_t chunk, int nst, int ef, bool pdl, uint64_t* stm) {
    launch(stream, grid, 32, nst * STAGE, pdl, s, src, chunk, nst, ef, (int)pdl, stm);
  };
  auto tiny_k = [&](cudaStream_t s, bool pdl) { launch(tiny, 1, 128, 0, pdl, s, small, (int)pdl); };
  std::vector<Arrangement> arrs = {
    {"copy_same_traffic", [&](cudaStream_t s, const char* l1, const char*) {
       cudaMemcpyAsync(cdst, l1, all / 2, cudaMemcpyDeviceToDevice, s); }},
    {"one_launch", [&](cudaStream_t s, const char* l1, const char*) { ring_read(s, l1, sms, both, STAGES, 0, false, none); }},
    {"l1_l2", [&](cudaStream_t s, const char* l1, const char* l2) {
       ring_read(s, l1, sms, c1, STAGES, 0, false, none); ring_read(s, l2, sms, c2, STAGES, 0, false, none); }},
    {"l1_l2_pdl", [&](cudaStream_t s, const char* l1, const char* l2) {
       ring_read(s, l1, sms, c1, STAGES, 0, false, none); ring_read(s, l2, sms, c2, STAGES, 0, true, none); }},
    {"tiny_l1_l2_tiny", [&](cudaStream_t s, const char* l1, const char* l2) {
       tiny_k(s, false); ring_read(s, l1, sms, c1, STAGES, 0, false, none); ring_read(s, l2, sms, c2, STAGES, 0, false, none);
       tiny_k(s, false); }},
    {"tiny_l1_l2_tiny_pdl", [&](cudaStream_t s, const char* l1, const char* l2) {
       tiny_k(s, false); ring_read(s, l1, sms, c1, STAGES, 0, true, none); ring_read(s, l2, sms, c2, STAGES, 0, true, none);
       tiny_k(s, true); }},
    {"persistent", [&](cudaStream_t s, const char* l1, const char* l2) {
       launch(persistent, sms, 32, STAGES * STAGE, false, s, l1, c1, l2, c2, done, 0); }, true},
    {"tiny_persistent_tiny_pdl", [&](cudaStream_t s, const char* l1, const char* l2) {
       tiny_k(s, false); launch(persistent, sms, 32, STAGES * STAGE, true, s, l1, c1, l2, c2, done, 1); tiny_k(s, true); }, true},
    {"tiny_alone", [&](cudaStream_t s, const char*, const char*) { tiny_k(s, false); }},
    {"one_launch_stamped", [&](cudaStream_t s, const char* l1, const char*) {
       ring_read(s, l1, sms, both, STAGES, 0, false, stamps); }, false, true},
    {"one_launch_steal", [&](cudaStream_t s, const char* l1, const char*) {
       launch(stream_steal, sms, 32, STAGES * STAGE, false, s, l1, (int)(all / STAGE), done, stamps); }, true, true},
    {"one_launch_evict_first", [&](cudaStream_t s, const char* l1, const char*) {
       ring_read(s, l1, sms, both, STAGES, 1, false, none); }},
    {"one_launch_4_stages", [&](cudaStream_t s, const char* l1, const char*) { ring_read(s, l1, sms, both, 4, 0, false, none); }},
    {"one_launch_12_stages", [&](cudaStream_t s, const char* l1, const char*) { ring_read(s, l1, sms, both, 12, 0, false, none); }},
    {"one_launch_2_ctas_an_sm", [&](cudaStream_t s, const char* l1, const char*) {
       ring_read(s, l1, 2 * sms, both / 2, 6, 0, false, none); }},
    {"one_launch_ldg", [&](cudaStream_t s, const char* l1, const char*) {
       launch(ldg_read, sms * 4, 512, 0, false, s, (const uint4*)l1, all / 16, 1, done); }},
    {"one_launch_ldg_plain", [&](cudaStream_t s, const char* l1, const char*) {
       launch(ldg_read, sms * 4, 512, 0, false, s, (const uint4*)l1, all / 16, 0, done); }},
    {"one_launch_ldg_1_cta_an_sm", [&](cudaStream_t s, const char* l1, const char*) {
       launch(ldg_read, sms, 512, 0, false, s, (const uint4*)l1, all / 16, 1, done); }},
    {"l1_alone", [&](cudaStream_t s, const char* l1, const char*) { ring_read(s, l1, sms, c1, STAGES, 0, false, none); }},
    {"l1_alone_96_ctas", [&](cudaStream_t s, const char* l1, const char*) {
       ring_read(s, l1, 96, c1 * sms / 96 / STAGE * STAGE, STAGES, 0, false, none); }},
    {"l1_alone_box_64x256", [&](cudaStream_t s, const char* l1, const char*) {
       launch(stream_box, sms, 32, box_smem, false, s, map64[rot(l1)], l1, c1, 64, (const char*)nullptr); }},
    {"l1_alone_box_128x128", [&](cudaStream_t s, const char* l1, const char*) {
       launch(stream_box, sms, 32, box_smem, false, s, map128[rot(l1)], l1, c1, 128, (const char*)nullptr); }},
    {"l1_alone_box_64x256_side", [&](cudaStream_t s, const char* l1, const char*) {
       launch(stream_box, sms, 32, box_smem, false, s, map64[rot(l1)], l1, c1, 64, (const char*)side); }},
    {"l1_alone_bulk_side", [&](cudaStream_t s, const char* l1, const char*) {
       launch(stream_box, sms, 32, box_smem, false, s, map64[rot(l1)], l1, c1, 0, (const char*)side); }},
    {"l1_alone_ldg", [&](cudaStream_t s, const char* l1, const char*) {
       launch(ldg_read, sms * 4, 512, 0, false, s, (const uint4*)l1, c1 * sms / 16, 1, done); }},
  };
  for (const Arrangement& arr : arrs) {
    std::vector<cudaGraphExec_t> execs(rotations);
    for (int r = 0; r < rotations; ++r) {
      const char* l1 = buf + r * region;
      cudaGraph_t graph;
      cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
      arr.capture(st, l1, l1 + c1 * sms);
      cudaStreamEndCapture(st, &graph);
      cudaGraphInstantiate(&execs[r], graph, 0);
    }
    std::vector<float> us;
    for (int rep = 0; rep < 44; ++rep) {
      cudaMemsetAsync(flush, rep & 0xff, flush_bytes, st);  // the harness's flush: a memset, then a read sweep so
      if (!dirty) launch(ldg_read, sms * 4, 512, 0, false, st, (const uint4*)flush, flush_bytes / 16, 0, done);  // lines are clean
      if (arr.counter) cudaMemsetAsync(done, 0, 4, st);
      cudaEventRecord(a, st); cudaGraphLaunch(execs[rep % rotations], st); cudaEventRecord(b, st);
      cudaEventSynchronize(b); float t; cudaEventElapsedTime(&t, a, b); if (rep >= 4) us.push_back(t * 1e3f);
    }
    std::sort(us.begin(), us.end());
    printf("{\"arrangement\": \"%s\", \"l1_mb\": %.1f, \"l2_mb\": %.1f, \"ctas\": %d, \"us_median\": %.2f, \"us_p10\": %.2f, "
           "\"us_p90\": %.2f, \"err\": \"%s\"}\n", arr.name, c1 * sms / 1e6, c2 * sms / 1e6, sms, us[us.size() / 2],
           us[us.size() / 10], us[us.size() * 9 / 10], cudaGetErrorString(cudaGetLastError()));
    if (arr.stamped) {  // the last replay's CTA entry / exit times, from the earliest entry
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
