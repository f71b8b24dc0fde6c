// What a layer's wait for the host costs the hybrid decode (#41), by the way it waits.
//
// The hybrid's add waited for a done flag in host memory with stream memory operations (cuStreamWaitValue32, then
// cuStreamWriteValue32 to clear it), inside the decode's CUDA graph; since 2026-12-06 a one-thread kernel polls it,
// and only where the lookup left the host work (the wait could not be skipped, and beside the prediction's copies its
// read of host memory waited behind them). With the CPU given nothing (the lookup raises the
// flag itself) the hybrid still cost an H100 60 us a MoE layer, and CUDA graphs saved it less than the cache alone.
// This probe times 48 "layers" of two small kernels, the first raising a flag in host memory as the lookup does,
// captured in a graph and replayed, and eagerly:
//   - kernels alone (the floor);
//   - with the stream waiting for the flag and clearing it (the hybrid as it is);
//   - with the wait alone (no clear);
//   - with the second kernel polling the flag itself (a value per layer, nothing to clear).
// Not part of the product. On the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/wait_probe probes/wait_probe.cu -lcuda && /tmp/wait_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe_check.cuh"

#define CU_CHECK(x)                                                                                 \
    do {                                                                                            \
        const CUresult e_ = (x);                                                                    \
        if (e_ != CUDA_SUCCESS) {                                                                   \
            const char * s_ = nullptr;                                                              \
            cuGetErrorString(e_, &s_);                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");              \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static constexpr int LAYERS = 48;
static constexpr int N      = 2048; // a layer's activations (the 30b-a3b's n_embd)

// the lookup's part: a little work, then the flag raised in host memory as moe_cache_host_write does
static __global__ void raise_flag(float * x, int32_t * flag, int32_t value) {
    const int i = blockIdx.x*blockDim.x + threadIdx.x;
    if (i < N) {
        x[i] = x[i]*0.5f + 1.0f;
    }
    if (flag != nullptr && i == 0) {
        __threadfence_system();
        *(volatile int32_t *) flag = value;
    }
}

// the add's part; with poll, its first thread waits for the flag to hold the layer's value first
static __global__ void add(float * x, const int32_t * flag, int32_t value) {
    if (flag != nullptr) {
        if (threadIdx.x == 0) {
            while (*(volatile const int32_t *) flag != value) {
            }
        }
        __syncthreads();
    }
    const int i = blockIdx.x*blockDim.x + threadIdx.x;
    if (i < N) {
        x[i] = x[i] + 1.0f;
    }
}

enum mode { KERNELS, WAIT_CLEAR, WAIT, POLL };
static const char * NAMES[] = { "kernels alone", "stream wait + clear (now)", "stream wait alone", "kernel polls" };

static void step(mode m, cudaStream_t s, float * x, int32_t * flag_dev) {
    for (int il = 0; il < LAYERS; ++il) {
        const int32_t v = m == POLL ? il + 1 : 1;
        raise_flag<<<N/256, 256, 0, s>>>(x, m == KERNELS ? nullptr : flag_dev, v);
        if (m == WAIT_CLEAR || m == WAIT) {
            CU_CHECK(cuStreamWaitValue32((CUstream) s, (CUdeviceptr) flag_dev, 1, CU_STREAM_WAIT_VALUE_EQ));
        }
        if (m == WAIT_CLEAR) {
            CU_CHECK(cuStreamWriteValue32((CUstream) s, (CUdeviceptr) flag_dev, 0, CU_STREAM_WRITE_VALUE_DEFAULT));
        }
        add<<<N/256, 256, 0, s>>>(x, m == POLL ? flag_dev : nullptr, v);
    }
    CHECK(cudaGetLastError());
}

int main() {
    CU_CHECK(cuInit(0));
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float * x = nullptr;
    CHECK(cudaMalloc((void **) &x, N*sizeof(float)));
    CHECK(cudaMemset(x, 0, N*sizeof(float)));
    int32_t * flag_host = nullptr;
    int32_t * flag_dev  = nullptr;
    CHECK(cudaHostAlloc((void **) &flag_host, 4096, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **) &flag_dev, flag_host, 0));
    *flag_host = 0;

    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const int reps = 200;
    double floor_graph = 0.0, floor_eager = 0.0;
    printf("%-28s %16s %16s\n", "48 layers of", "graph us/layer", "eager us/layer");
    for (const mode m : { KERNELS, WAIT_CLEAR, WAIT, POLL }) {
        // in a graph, replayed
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        step(m, s, x, flag_dev);
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaEventRecord(a, s));
        for (int r = 0; r < reps; ++r) {
            CHECK(cudaGraphLaunch(exec, s));
        }
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms_graph = 0.0f;
        CHECK(cudaEventElapsedTime(&ms_graph, a, b));
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));

        // eagerly
        step(m, s, x, flag_dev);
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaEventRecord(a, s));
        for (int r = 0; r < reps; ++r) {
            step(m, s, x, flag_dev);
        }
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms_eager = 0.0f;
        CHECK(cudaEventElapsedTime(&ms_eager, a, b));

        const double g = 1e3*ms_graph/(reps*LAYERS), e = 1e3*ms_eager/(reps*LAYERS);
        if (m == KERNELS) {
            floor_graph = g;
            floor_eager = e;
            printf("%-28s %16.2f %16.2f\n", NAMES[m], g, e);
        } else {
            printf("%-28s %9.2f (+%.2f) %9.2f (+%.2f)\n", NAMES[m], g, g - floor_graph, e, e - floor_eager);
        }
        fflush(stdout);
    }
    CHECK(cudaFreeHost(flag_host));
    CHECK(cudaFree(x));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
