// C entry points into llama.cpp's common library: exceptions never cross into C or Python.

#include "pyllama_moe_shim.h"

#include "fit.h"
#include "llama-sys-memory.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef _WIN32
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

// through llama's logger, so the message reaches Python's logging like llama.cpp's own
static void log_error(const char * func, const char * what) {
    ggml_log_callback cb = nullptr;
    void * ud = nullptr;
    llama_log_get(&cb, &ud);
    if (cb != nullptr) {
        const std::string msg = std::string(func) + ": " + what + "\n";
        cb(GGML_LOG_LEVEL_ERROR, msg.c_str(), ud);
    }
}

int32_t pyllama_moe_fit_params(
        const char * path_model,
        llama_model_params * mparams,
        llama_context_params * cparams,
        float * tensor_split,
        llama_model_tensor_buft_override * tensor_buft_overrides,
        size_t * margins,
        uint32_t n_ctx_min,
        ggml_log_level log_level) {
    try {
        return (int32_t) common_fit_params(path_model, mparams, cparams, tensor_split, tensor_buft_overrides,
                                           margins, n_ctx_min, /*extra =*/ nullptr, log_level);
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        return (int32_t) COMMON_PARAMS_FIT_STATUS_ERROR;
    }
}

int32_t pyllama_moe_device_memory(
        const char * path_model,
        const llama_model_params * mparams,
        const llama_context_params * cparams,
        int64_t * out,
        int32_t max_devices) {
    try {
        std::vector<ggml_backend_dev_t> devs;
        uint32_t hp_ngl = 0, hp_n_ctx_train = 0, hp_n_expert = 0;
        const auto data = common_get_device_memory_data(path_model, mparams, cparams, devs,
                                                        hp_ngl, hp_n_ctx_train, hp_n_expert, GGML_LOG_LEVEL_ERROR);
        const int32_t n = (int32_t) data.size();
        for (int32_t i = 0; i < std::min(n, max_devices); i++) {
            out[5*i + 0] = data[i].total;
            out[5*i + 1] = data[i].free;
            out[5*i + 2] = (int64_t) data[i].model;
            out[5*i + 3] = (int64_t) data[i].context;
            out[5*i + 4] = (int64_t) data[i].compute;
        }
        return n;
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        return -1;
    }
}

// bytes per second of reps synchronous copies of src into t (after one untimed copy)
static double h2d_rate(ggml_tensor * t, const void * src, size_t n_bytes, int32_t reps) {
    ggml_backend_tensor_set(t, src, 0, n_bytes);
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < reps; ++i) {
        ggml_backend_tensor_set(t, src, 0, n_bytes);
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    return (double) n_bytes*reps/dt.count();
}

// bytes per second from the page cache: the first n_bytes (at most) of a file mapped read-only, as llama.cpp
// maps model files (load mode mmap); 0 where files cannot be mapped
static double h2d_mapped_rate(ggml_tensor * t, const char * path, size_t n_bytes, int32_t reps) {
#ifdef _WIN32
    GGML_UNUSED(t); GGML_UNUSED(path); GGML_UNUSED(n_bytes); GGML_UNUSED(reps);
    return 0.0;
#else
    const int fd = open(path, O_RDONLY);
    if (fd < 0) {
        throw std::runtime_error(std::string("cannot open ") + path + ": " + std::strerror(errno));
    }
    struct stat st = {};
    const size_t n = fstat(fd, &st) == 0 ? std::min(n_bytes, (size_t) st.st_size) : 0;
    void * addr = n > 0 ? mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    const int err = errno;
    close(fd);
    if (addr == MAP_FAILED) {
        throw std::runtime_error(std::string("cannot map ") + path + ": " + (n > 0 ? std::strerror(err) : "empty"));
    }
    const std::unique_ptr<void, std::function<void(void *)>> mapping(addr, [n](void * p) { munmap(p, n); });
    return h2d_rate(t, mapping.get(), n, reps);
#endif
}

int32_t pyllama_moe_h2d_bandwidth(size_t dev_index, size_t n_bytes, int32_t reps, const char * mapped_path,
                                  double * pinned_bps, double * pageable_bps, double * mapped_bps) {
    try {
        if (dev_index >= ggml_backend_dev_count() || n_bytes == 0 || reps < 1) {
            throw std::invalid_argument("no such device, or nothing to copy");
        }
        ggml_backend_dev_t dev = ggml_backend_dev_get(dev_index);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            throw std::invalid_argument(std::string(ggml_backend_dev_name(dev)) + " is the host");
        }
        ggml_backend_buffer_ptr dst(ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), n_bytes));
        if (!dst) {
            throw std::runtime_error("cannot allocate the device buffer");
        }
        ggml_init_params params = { ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
        ggml_context_ptr ctx(ggml_init(params));
        ggml_tensor * t = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I8, (int64_t) n_bytes);
        if (ggml_backend_tensor_alloc(dst.get(), t, ggml_backend_buffer_get_base(dst.get())) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("cannot place the tensor in the device buffer");
        }

        *pinned_bps = 0.0;
        if (ggml_backend_buffer_type_t host = ggml_backend_dev_host_buffer_type(dev)) {
            ggml_backend_buffer_ptr src(ggml_backend_buft_alloc_buffer(host, n_bytes));
            if (!src) {
                throw std::runtime_error("cannot allocate the pinned host buffer");
            }
            ggml_backend_buffer_clear(src.get(), 1); // touched, and never zeros
            *pinned_bps = h2d_rate(t, ggml_backend_buffer_get_base(src.get()), n_bytes, reps);
        }
        std::vector<uint8_t> pageable(n_bytes, 1);
        *pageable_bps = h2d_rate(t, pageable.data(), n_bytes, reps);
        *mapped_bps = mapped_path != nullptr ? h2d_mapped_rate(t, mapped_path, n_bytes, reps) : 0.0;
        return 0;
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        return -1;
    }
}

int32_t pyllama_moe_tokenize(
        const llama_vocab * vocab,
        const char * text,
        int32_t text_len,
        llama_token * tokens,
        int32_t n_tokens_max,
        bool add_special,
        bool parse_special,
        bool * failed) {
    *failed = false;
    try {
        return llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special);
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        *failed = true;
        return 0;
    }
}

llama_token pyllama_moe_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx, bool * failed) {
    *failed = false;
    try {
        return llama_sampler_sample(smpl, ctx, idx);
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        *failed = true;
        return 0;
    }
}

void pyllama_moe_sampler_accept(llama_sampler * smpl, llama_token token, bool * failed) {
    *failed = false;
    try {
        llama_sampler_accept(smpl, token);
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        *failed = true;
    }
}

int64_t pyllama_moe_available_memory_at(const char * root) {
    try {
        return llama_sys_available_memory(root != nullptr ? root : "");
    } catch (const std::exception & e) {
        log_error(__func__, e.what());
        return -1;
    }
}
