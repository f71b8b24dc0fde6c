// The probes' (probes/*_probe.cu) check of a CUDA runtime call: a failure prints the call and ends the probe.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                    \
    do {                                                                                            \
        const cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)
