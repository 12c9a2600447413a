// Max co-resident clusters of S CTAs (S = 1..16; one CTA an SM: 200 KB dynamic smem, 384 threads) on this GPU,
// as cudaOccupancyMaxActiveClusters reports them: the H100 figures are kernels/gemm/config.py CLUSTERS_RESIDENT.
//   nvcc -arch=sm_90a -o occ benchmarks/cluster_occupancy.cu && ./occ
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(float* p) { extern __shared__ float s[]; if (p) p[threadIdx.x] = s[threadIdx.x]; }
int main() {
  int smem = 200 * 1024;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int s = 1; s <= 16; ++s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(s * 64, 1, 1); cfg.blockDim = dim3(384, 1, 1); cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = s; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    cfg.attrs = &a; cfg.numAttrs = 1;
    int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k, &cfg);
    printf("{\"cluster\": %d, \"max_active_clusters\": %d, \"ctas\": %d, \"err\": \"%s\"}\n", s, n, n * s, cudaGetErrorString(e));
  }
}
