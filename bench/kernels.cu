/* SPDX-License-Identifier: Apache-2.0 */
// Kernels for tb-bench's GPU scenarios, compiled to PTX by gen_kernels.sh and
// loaded at run time with cuModuleLoadData (the project never links CUDA).

// Read n16 16-byte words with a grid-stride loop and fold them into one
// value. The result is stored only when it equals a value the data cannot
// produce, so the loads cannot be optimised away and nothing is written.
extern "C" __global__ void tb_bench_read(const uint4 *p, unsigned long long n16,
                                         unsigned long long *out) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned acc = 0;
  for (; i < n16; i += stride) {
    uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u)
    *out = acc;
}
