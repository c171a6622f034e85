// 1-D three-point stencil; RADIUS and the weights are compile-time constants
#ifndef WEIGHT
#define WEIGHT 0.25f
#endif
extern "C" __global__ void stencil(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i > 0 && i < n - 1) out[i] = WEIGHT * in[i - 1] + (1.0f - 2.0f * WEIGHT) * in[i] + WEIGHT * in[i + 1];
}
