// C entry points into llama.cpp's common library: exceptions never cross into C or Python.

#include "pyllama_moe_shim.h"

#include "fit.h"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

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
