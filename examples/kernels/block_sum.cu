// One partial sum per block with CUB; BLOCK comes from the manifest's variants.
#include <cub/block/block_reduce.cuh>
#ifndef BLOCK
#define BLOCK 128
#endif
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
    using Reduce = cub::BlockReduce<float, BLOCK>;
    __shared__ typename Reduce::TempStorage tmp;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    float total = Reduce(tmp).Sum(i < n ? x[i] : 0.0f);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
