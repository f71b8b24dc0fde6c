// How fast the GPU's SMs read host memory, against the copy engine on the same memory (#40).
//
// The MoE cache's device lookup copies its misses with a kernel (moe_cache_copy_kernel, patch 0008), because the
// experts to copy are only known on the device inside the decode graph. On an H100 those copies moved 22-26 GB/s
// while the copy engine read the same pinned memory at 52-53 GB/s, whatever the prediction's grid (4 to 64 blocks).
// This probe times, on one expert's bytes (2.53 MiB, the 30b-a3b's) and on 8 of them:
//   - the copy engine (cudaMemcpyAsync), the bound;
//   - the cache's kernel as it is (a block per 64 KiB chunk, 256 threads, 4 loads of 16 bytes in flight a thread)
//     and with 1, 8 and 16 loads in flight, over grids of 16 to 528 blocks;
//   - bulk copies (cp.async.bulk through shared memory, several in flight a block): the copy units of the SM move
//     the bytes in large requests instead of the threads' 16-byte loads;
// over three kinds of host memory: cudaHostAlloc, and anonymous memory registered with cudaHostRegister (as the cache
// maps its host copy of the experts), with and without transparent huge pages.
//
// Not part of the product. On the GPU machine: nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/copy_probe probes/copy_probe.cu
// && /tmp/copy_probe
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.cuh"

static constexpr size_t CHUNK   = 64*1024; // bytes a block takes at a time, as the cache's kernel does
static constexpr int    THREADS = 256;

// the cache's copy: blocks take the chunks in turn, each thread UNROLL loads in flight before its stores
template <int UNROLL>
static __global__ void copy_loads(const int4 * __restrict__ src, int4 * __restrict__ dst, size_t n4) {
    const size_t chunk4 = CHUNK/16;
    for (size_t c = blockIdx.x; c*chunk4 < n4; c += gridDim.x) {
        const size_t end = c*chunk4 + chunk4 < n4 ? c*chunk4 + chunk4 : n4;
        size_t i = c*chunk4 + threadIdx.x;
        for (; i + (UNROLL - 1)*THREADS < end; i += UNROLL*THREADS) {
            int4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                v[u] = src[i + u*THREADS];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                dst[i + u*THREADS] = v[u];
            }
        }
        for (; i < end; i += THREADS) {
            dst[i] = src[i];
        }
    }
}

// bulk copies: one thread of each block moves its chunks through NBUF shared buffers of PIECE bytes, a read into a
// buffer (completion counted by its mbarrier) then a write out of it, NBUF reads in flight
static constexpr int PIECE = 16*1024;
static constexpr int NBUF  = 4;

static __device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}

static __global__ void copy_bulk(const char * __restrict__ src, char * __restrict__ dst, size_t n) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) char buf[];
    __shared__ __align__(8) uint64_t bar[NBUF];
    if (threadIdx.x != 0) {
        return;
    }
    for (int b = 0; b < NBUF; ++b) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bar[b])));
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");

    // the pieces of this block's chunks, in order: piece k goes through buffer k % NBUF
    const size_t pieces_per_chunk = CHUNK/PIECE;
    const size_t n_chunks = (n + CHUNK - 1)/CHUNK;
    uint32_t phase[NBUF] = {0};

    auto piece_of = [&](size_t k, size_t & off, uint32_t & len) -> bool {
        const size_t c = blockIdx.x + (k/pieces_per_chunk)*gridDim.x;
        if (c >= n_chunks) {
            return false;
        }
        off = c*CHUNK + (k % pieces_per_chunk)*PIECE;
        if (off >= n) {
            return false;
        }
        len = (uint32_t) (n - off < (size_t) PIECE ? n - off : PIECE);
        return true;
    };
    auto read = [&](size_t k) {
        size_t off; uint32_t len;
        if (!piece_of(k, off, len)) {
            return;
        }
        const int b = (int) (k % NBUF);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(&bar[b])), "r"(len) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(smem_addr(buf + b*PIECE)), "l"(src + off), "r"(len), "r"(smem_addr(&bar[b])) : "memory");
    };

    for (size_t k = 0; k < NBUF; ++k) {
        read(k);
    }
    for (size_t k = 0;; ++k) {
        size_t off; uint32_t len;
        if (!piece_of(k, off, len)) {
            break;
        }
        const int b = (int) (k % NBUF);
        uint32_t done = 0;
        while (!done) {
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done) : "r"(smem_addr(&bar[b])), "r"(phase[b]) : "memory");
        }
        phase[b] ^= 1;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(dst + off), "r"(smem_addr(buf + b*PIECE)), "r"(len) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        // the buffer is read again only once its write has read it out
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        read(k + NBUF);
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

struct host_mem {
    const char * name;
    char       * h   = nullptr; // host address
    char       * d   = nullptr; // the device's address of it
    bool         reg = false;   // registered (else cudaHostAlloc)
    size_t       n   = 0;
};

static host_mem alloc_host(const char * name, size_t n, int kind) {
    host_mem m;
    m.name = name;
    m.n    = n;
    if (kind == 0) {
        CHECK(cudaHostAlloc((void **) &m.h, n, cudaHostAllocMapped));
    } else {
        void * p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
        madvise(p, n, kind == 1 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        m.h = (char *) p;
        memset(m.h, 1, n); // fault the pages in (huge ones where given)
        // as the cache maps its host copy (ggml_backend_host_map): read-only where the device allows it
        const unsigned int flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
        if (cudaHostRegister(m.h, n, flags | cudaHostRegisterReadOnly) != cudaSuccess) {
            (void) cudaGetLastError();
            CHECK(cudaHostRegister(m.h, n, flags));
        }
        m.reg = true;
        // whether the pages are huge ones is the kernel's choice: say what it gave
        if (FILE * f = fopen("/proc/meminfo", "r")) {
            char line[256];
            while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, "AnonHugePages:", 14) == 0) {
                    printf("%s: %s", name, line);
                }
            }
            fclose(f);
        }
    }
    for (size_t i = 0; i < n; i += 4096) {
        m.h[i] = (char) (i/4096);
    }
    CHECK(cudaHostGetDevicePointer((void **) &m.d, m.h, 0));
    return m;
}

static void free_host(host_mem & m) {
    if (m.reg) {
        CHECK(cudaHostUnregister(m.h));
        munmap(m.h, m.n);
    } else {
        CHECK(cudaFreeHost(m.h));
    }
}

// GB/s of fn over reps runs, each copying `bytes` from a different place in the host buffer (so that no run reads
// what the one before it left in a cache)
template <typename F>
static double rate(F fn, size_t bytes, size_t span, cudaStream_t s) {
    const int reps = 20;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    fn((size_t) 0); // warm
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; ++r) {
        fn(((size_t) r*bytes) % (span - bytes) / 4096 * 4096);
    }
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return (double) bytes*reps/(ms*1e-3)/1e9;
}

// each kernel copies what the copy engine does: a probe of a copy that is fast and wrong would be no guide
static void verify(const host_mem & m, char * dev, size_t bytes, cudaStream_t s) {
    std::vector<char> got(bytes);
    const size_t off = 4096*7;
    for (int k = 0; k < 2; ++k) {
        CHECK(cudaMemsetAsync(dev, 0, bytes, s));
        if (k == 0) {
            copy_loads<4><<<66, THREADS, 0, s>>>((const int4 *) (m.d + off), (int4 *) dev, bytes/16);
        } else {
            copy_bulk<<<66, 32, NBUF*PIECE, s>>>(m.d + off, dev, bytes);
        }
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(got.data(), dev, bytes, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        if (memcmp(got.data(), m.h + off, bytes) != 0) {
            fprintf(stderr, "%s: the %s copy differs from the host's bytes\n", m.name, k == 0 ? "loads" : "bulk");
            exit(2);
        }
    }
}

int main(int argc, char ** argv) {
    const size_t expert = (size_t) (2.53*1024*1024) / 16 * 16;
    const size_t span   = (size_t) (argc > 1 ? atoi(argv[1]) : 1024) << 20; // host bytes read from, MiB
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char * dev = nullptr;
    CHECK(cudaMalloc((void **) &dev, 8*expert));
    CHECK(cudaFuncSetAttribute(copy_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, NBUF*PIECE));

    if (FILE * f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
        char line[256] = {0};
        if (fgets(line, sizeof(line), f)) {
            printf("transparent huge pages: %s", line);
        }
        fclose(f);
    }
    const int grids[] = { 16, 32, 66, 132, 264, 528 };
    for (int kind = 0; kind < 3; ++kind) {
        host_mem m = alloc_host(kind == 0 ? "cudaHostAlloc" : kind == 1 ? "registered, huge pages" : "registered, 4 KiB pages",
                                span, kind);
        verify(m, dev, 8*expert, s);
        for (const size_t bytes : { expert, 8*expert }) {
            printf("== %s, %.2f MiB a copy\n", m.name, bytes/1048576.0);
            printf("copy engine: %.1f GB/s\n", rate([&](size_t off) {
                CHECK(cudaMemcpyAsync(dev, m.h + off, bytes, cudaMemcpyHostToDevice, s)); }, bytes, span, s));
            printf("%-18s", "grid");
            for (const int g : grids) {
                printf(" %7d", g);
            }
            printf("\n");
            const size_t n4 = bytes/16;
            auto row = [&](const char * name, auto launch) {
                printf("%-18s", name);
                for (const int g : grids) {
                    printf(" %7.1f", rate([&](size_t off) { launch(g, off); }, bytes, span, s));
                }
                printf("\n");
                fflush(stdout);
            };
            row("loads x1", [&](int g, size_t off) { copy_loads<1><<<g, THREADS, 0, s>>>((const int4 *) (m.d + off), (int4 *) dev, n4); });
            row("loads x4 (now)", [&](int g, size_t off) { copy_loads<4><<<g, THREADS, 0, s>>>((const int4 *) (m.d + off), (int4 *) dev, n4); });
            row("loads x8", [&](int g, size_t off) { copy_loads<8><<<g, THREADS, 0, s>>>((const int4 *) (m.d + off), (int4 *) dev, n4); });
            row("loads x16", [&](int g, size_t off) { copy_loads<16><<<g, THREADS, 0, s>>>((const int4 *) (m.d + off), (int4 *) dev, n4); });
            row("bulk 4x16 KiB", [&](int g, size_t off) { copy_bulk<<<g, 32, NBUF*PIECE, s>>>(m.d + off, dev, bytes); });
        }
        free_host(m);
    }
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
