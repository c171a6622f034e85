// x[i] *= SCALE (from scale.h, beside this file): a kernel that reads a header, to
// show header tracking (README, docs/cli.md). cuforge tracks scale.h: editing it
// makes the next compile a miss, and `cuforge cache explain` names it.
#include "scale.h"

extern "C" __global__ void scale(float* x, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= SCALE;
    }
}
