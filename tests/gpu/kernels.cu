/* SPDX-License-Identifier: Apache-2.0 */
// Kernels for tensorbroker's GPU tests. They are compiled to PTX by
// gen-ptx.sh and committed as kernels_ptx.h, so the tests build without
// nvcc and load them with cuModuleLoadData through the driver table.
// All take 32-bit words and an element count; grids use grid-stride loops.

extern "C" __global__ void tb_fill_u32(unsigned *p, unsigned v,
                                       unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = v;
}

__device__ static unsigned long long tb_now_ns(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A slow producer: every thread waits until ns nanoseconds have passed since
// it started, then fills its share. The wait uses the global timer, not
// clock64, so it does not depend on the SM clock rate.
extern "C" __global__ void tb_spin_fill_u32(unsigned *p, unsigned v,
                                            unsigned long long n,
                                            unsigned long long ns) {
  unsigned long long t0 = tb_now_ns();
  while (tb_now_ns() - t0 < ns) {
  }
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = v;
}

// A slow reader: spins ns, then counts mismatches (keeps a consumer's
// kernels running while a test kills the consumer).
extern "C" __global__ void tb_spin_count_u32(const unsigned *p,
                                             unsigned expect,
                                             unsigned long long n,
                                             unsigned long long ns,
                                             unsigned *mismatches) {
  unsigned long long t0 = tb_now_ns();
  while (tb_now_ns() - t0 < ns) {
  }
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    if (p[i] != expect)
      atomicAdd(mismatches, 1u);
}

// Count the elements of p that differ from expect into *mismatches.
extern "C" __global__ void tb_count_u32(const unsigned *p, unsigned expect,
                                        unsigned long long n,
                                        unsigned *mismatches) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    if (p[i] != expect)
      atomicAdd(mismatches, 1u);
}

extern "C" __global__ void tb_copy_u32(unsigned *dst, const unsigned *src,
                                       unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
