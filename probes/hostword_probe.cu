// Whether a kernel sees the host's write to a word of mapped host memory that the device wrote before (#69, H1).
//
// The hybrid decode's hand-off had the device read back words it had itself written into host memory (the count
// of host selections, the done flag), and its logits were wrong inside CUDA graphs only. The hypothesis: a load that
// is not "cache volatile" may be served from a line of the device's cache that the device's own store left there and
// that the host's later write does not invalidate. This probe answers it once, for each way a kernel can read the
// word: a plain load, a volatile load, __ldcv (ld.global.cv), __ldcg, and a system-scope atomic.
//
// Every iteration: kernel A stores DEV(i) into the word (as the lookup stored done = 1); the host overwrites it with
// HOST(i) (as the host thread writes its results); kernel B reads it once and records what it saw. Three orders:
//   - stream: A, a host function that writes HOST(i), B, launched eagerly (the stream orders them);
//   - graph: the same three captured once and replayed (the host function is a host node);
//   - spin: A and B launched together, B spinning (up to 20 ms) until it reads HOST(i), the host thread writing it
//     when it sees DEV(i), as the hybrid's poll thread does; B records what it saw last and whether it timed out.
// A row with stale reads > 0 is a read the hand-off cannot use. Not part of the product. On the GPU machine:
//   nvcc -O3 -std=c++20 -arch=sm_90 -o /tmp/hostword_probe probes/hostword_probe.cu && /tmp/hostword_probe
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "probe_check.cuh"

enum load_kind { LOAD_PLAIN, LOAD_VOLATILE, LOAD_CV, LOAD_CG, LOAD_ATOMIC_SYSTEM, LOAD_COUNT };
static const char * LOAD_NAMES[] = { "plain", "volatile", "__ldcv", "__ldcg", "atomic (system)" };

static constexpr int ITERS = 2000;

static int32_t dev_value(int i)  { return 2*i + 1; }
static int32_t host_value(int i) { return 2*i + 2; }

template <load_kind K>
static __device__ __forceinline__ int32_t load_word(int32_t * w) {
    switch (K) {
        case LOAD_PLAIN:    return *w;
        case LOAD_VOLATILE: return *(volatile int32_t *) w;
        case LOAD_CV:       return __ldcv(w);
        case LOAD_CG:       return __ldcg(w);
        default:            return atomicAdd_system(w, 0);
    }
}

// A: the device's store, as the lookup stored its flag
static __global__ void store_word(int32_t * w, int32_t value) {
    *w = value;
    __threadfence_system();
}

// B: one read, or a spin until the host's value (timeout in clock cycles)
template <load_kind K>
static __global__ void read_word(int32_t * w, int32_t want, int32_t * seen, long long timeout) {
    int32_t v = load_word<K>(w);
    if (timeout > 0) {
        const long long t0 = clock64();
        while (v != want && clock64() - t0 < timeout) {
            v = load_word<K>(w);
        }
    }
    *seen = v;
}

struct host_write {
    int32_t * word;
    int32_t   value;
};

static void CUDART_CB write_word(void * p) {
    const host_write * h = (const host_write *) p;
    std::atomic_ref<int32_t>(*h->word).store(h->value, std::memory_order_seq_cst);
}

template <load_kind K>
static void launch_read(cudaStream_t s, int32_t * w, int32_t want, int32_t * seen, long long timeout) {
    read_word<K><<<1, 1, 0, s>>>(w, want, seen, timeout);
}

static void launch_read(load_kind k, cudaStream_t s, int32_t * w, int32_t want, int32_t * seen, long long timeout) {
    switch (k) {
        case LOAD_PLAIN:    launch_read<LOAD_PLAIN>   (s, w, want, seen, timeout); break;
        case LOAD_VOLATILE: launch_read<LOAD_VOLATILE>(s, w, want, seen, timeout); break;
        case LOAD_CV:       launch_read<LOAD_CV>      (s, w, want, seen, timeout); break;
        case LOAD_CG:       launch_read<LOAD_CG>      (s, w, want, seen, timeout); break;
        default:            launch_read<LOAD_ATOMIC_SYSTEM>(s, w, want, seen, timeout); break;
    }
    CHECK(cudaGetLastError());
}

int main() {
    CHECK(cudaSetDevice(0));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const long long timeout = 20LL*clock_khz; // 20 ms

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int32_t * word_host = nullptr;
    int32_t * word_dev  = nullptr;
    CHECK(cudaHostAlloc((void **) &word_host, 4096, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **) &word_dev, word_host, 0));
    int32_t * seen = nullptr;
    CHECK(cudaMalloc((void **) &seen, sizeof(int32_t)));

    printf("%-16s %-8s %12s %12s\n", "load", "order", "stale reads", "timeouts");
    for (int k = 0; k < LOAD_COUNT; ++k) {
        const load_kind kind = (load_kind) k;

        // stream and graph: A, the host's write, B in one stream's order
        for (const bool graph : { false, true }) {
            host_write hw = { word_host, 0 };
            cudaGraphExec_t exec = nullptr;
            if (graph) {
                cudaGraph_t g;
                CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
                // A stores -1 at every replay; the host node reads hw, whose value each iteration sets
                store_word<<<1, 1, 0, s>>>(word_dev, -1);
                CHECK(cudaLaunchHostFunc(s, write_word, &hw));
                launch_read(kind, s, word_dev, 0, seen, 0);
                CHECK(cudaStreamEndCapture(s, &g));
                CHECK(cudaGraphInstantiate(&exec, g, 0));
                CHECK(cudaGraphDestroy(g));
            }
            int n_stale = 0;
            for (int i = 0; i < ITERS; ++i) {
                hw.value = host_value(i);
                if (graph) {
                    CHECK(cudaGraphLaunch(exec, s));
                } else {
                    store_word<<<1, 1, 0, s>>>(word_dev, dev_value(i));
                    CHECK(cudaLaunchHostFunc(s, write_word, &hw));
                    launch_read(kind, s, word_dev, 0, seen, 0);
                }
                CHECK(cudaStreamSynchronize(s));
                int32_t v = 0;
                CHECK(cudaMemcpy(&v, seen, sizeof(v), cudaMemcpyDeviceToHost));
                n_stale += v != hw.value;
            }
            if (exec != nullptr) {
                CHECK(cudaGraphExecDestroy(exec));
            }
            printf("%-16s %-8s %12d %12s\n", LOAD_NAMES[k], graph ? "graph" : "stream", n_stale, "-");
            fflush(stdout);
        }

        // spin: B waits on the device while the host thread answers A's store
        {
            int n_stale = 0, n_timeout = 0;
            for (int i = 0; i < ITERS; ++i) {
                std::atomic_ref<int32_t>(*word_host).store(0, std::memory_order_seq_cst);
                std::thread host([&] {
                    const auto t0 = std::chrono::steady_clock::now();
                    while (std::atomic_ref<int32_t>(*word_host).load(std::memory_order_seq_cst) != dev_value(i)) {
                        if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(100)) {
                            return;
                        }
                    }
                    std::atomic_ref<int32_t>(*word_host).store(host_value(i), std::memory_order_seq_cst);
                });
                store_word<<<1, 1, 0, s>>>(word_dev, dev_value(i));
                launch_read(kind, s, word_dev, host_value(i), seen, timeout);
                CHECK(cudaStreamSynchronize(s));
                host.join();
                int32_t v = 0;
                CHECK(cudaMemcpy(&v, seen, sizeof(v), cudaMemcpyDeviceToHost));
                n_stale   += v != host_value(i);
                n_timeout += v == dev_value(i);
            }
            printf("%-16s %-8s %12d %12d\n", LOAD_NAMES[k], "spin", n_stale, n_timeout);
            fflush(stdout);
        }
    }

    CHECK(cudaFree(seen));
    CHECK(cudaFreeHost(word_host));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
