// y[i] = max(x[i], 0) in half precision (cuda_fp16.h comes with cuforge)
#include <cuda_fp16.h>
extern "C" __global__ void relu(const __half* x, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hmax(x[i], __float2half(0.0f));
}
