// Whether the CPU and the bus are two pipes to the host's memory or one (#41).
//
// The hybrid decode splits a layer's misses between the CPU, which reads its experts from host memory to compute
// them, and the upload, which reads other experts from the same memory over PCIe. Its share assumes that the two
// rates add up; where the host's memory bandwidth is about their sum, each slows the other down. This probe reads
// anonymous memory registered with cudaHostRegister (as the MoE cache maps its host copy of the experts):
//   - with 4, 8 and 16 CPU threads alone (each summing its slice, 64 bytes a step);
//   - the copy engine alone (cudaMemcpyAsync to the device, 64 MiB a copy);
//   - both at once, 4 and 8 threads: each one's rate while the other runs.
//
// Not part of the product. On the GPU machine: nvcc -O3 -std=c++17 -arch=sm_90 -Xcompiler -march=native
// -o /tmp/hostbw_probe probes/hostbw_probe.cu && /tmp/hostbw_probe
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_check.cuh"

using clk = std::chrono::steady_clock;

static double seconds_since(clk::time_point t) {
    return std::chrono::duration<double>(clk::now() - t).count();
}

static uint8_t * host_region(size_t size) {
    void * p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, 1, size);  // touched: no page faults in the timed loops
    CHECK(cudaHostRegister(p, size, cudaHostRegisterDefault));
    return (uint8_t *) p;
}

// the CPU's read: n_threads sum their slices of buf until stop, counting the bytes read
static double cpu_read(const uint8_t * buf, size_t size, int n_threads, double secs, const std::atomic<bool> * stop_ext) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> sink{0};
    std::vector<std::thread> th;
    const size_t slice = (size / n_threads) & ~(((size_t) 1 << 20) - 1);
    const clk::time_point t0 = clk::now();
    for (int i = 0; i < n_threads; ++i) {
        th.emplace_back([&, i] {
            // 1 MiB at a time, so that the bytes counted end when the time does
            const size_t chunk = 1u << 20;
            const size_t n = chunk / sizeof(uint64_t);
            uint64_t s = 0;
            uint64_t b = 0;
            for (size_t off = 0; !stop.load(std::memory_order_relaxed); off = (off + chunk) % slice) {
                const uint64_t * p = (const uint64_t *) (buf + i*slice + off);
                for (size_t k = 0; k < n; k += 8) {
                    s += p[k] ^ p[k + 1] ^ p[k + 2] ^ p[k + 3] ^ p[k + 4] ^ p[k + 5] ^ p[k + 6] ^ p[k + 7];
                }
                b += chunk;
            }
            bytes += b;
            sink += s;
        });
    }
    while (seconds_since(t0) < secs && !(stop_ext && stop_ext->load())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop = true;
    for (auto & t : th) {
        t.join();
    }
    const double dt = seconds_since(t0);
    if (sink.load() == 42) {
        printf(" ");
    }
    return bytes.load() / dt / 1e9;
}

// the copy engine: 64 MiB copies from src to the device until secs pass
static double upload(const uint8_t * src, size_t size, uint8_t * dev, cudaStream_t stream, double secs) {
    const size_t chunk = 64u << 20;
    uint64_t bytes = 0;
    size_t off = 0;
    const clk::time_point t0 = clk::now();
    while (seconds_since(t0) < secs) {
        for (int k = 0; k < 8; ++k) {
            CHECK(cudaMemcpyAsync(dev, src + off, chunk, cudaMemcpyHostToDevice, stream));
            bytes += chunk;
            off = (off + chunk) % size;
        }
        CHECK(cudaStreamSynchronize(stream));
    }
    return bytes / seconds_since(t0) / 1e9;
}

int main(int argc, char ** argv) {
    const double secs = argc > 1 ? atof(argv[1]) : 2.0;
    const size_t cpu_size = (size_t) 4 << 30;
    const size_t bus_size = (size_t) 2 << 30;
    uint8_t * cpu_buf = host_region(cpu_size);
    uint8_t * bus_buf = host_region(bus_size);
    uint8_t * dev = nullptr;
    CHECK(cudaMalloc(&dev, 64u << 20));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    upload(bus_buf, bus_size, dev, stream, 0.2);  // warm
    printf("host memory read, GB/s (%.1f s each; registered anonymous memory, %d cores)\n", secs,
           (int) std::thread::hardware_concurrency());
    printf("| reader | alone | beside the other: CPU | beside the other: bus | sum |\n| --- | --- | --- | --- | --- |\n");
    const double bus_alone = upload(bus_buf, bus_size, dev, stream, secs);
    printf("| copy engine | %.1f | | | |\n", bus_alone);
    for (int n : {4, 8, 16}) {
        const double cpu_alone = cpu_read(cpu_buf, cpu_size, n, secs, nullptr);
        if (n == 16) {
            printf("| CPU, %d threads | %.1f | | | |\n", n, cpu_alone);
            continue;
        }
        std::atomic<bool> done{false};
        double cpu_both = 0.0;
        std::thread reader([&] { cpu_both = cpu_read(cpu_buf, cpu_size, n, secs + 1.0, &done); });
        const double bus_both = upload(bus_buf, bus_size, dev, stream, secs);
        done = true;
        reader.join();
        printf("| CPU, %d threads | %.1f | %.1f | %.1f | %.1f |\n", n, cpu_alone, cpu_both, bus_both, cpu_both + bus_both);
    }
    return 0;
}
