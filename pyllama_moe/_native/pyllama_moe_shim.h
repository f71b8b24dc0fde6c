/* C entry points into llama.cpp's common library (C++), compiled into pyllama_moe._cffi. */
#ifndef PYLLAMA_MOE_SHIM_H
#define PYLLAMA_MOE_SHIM_H

#include "llama.h"
#include "ggml-rpc.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* common_fit_params: fits mparams/cparams to the free device memory. tensor_split holds
 * llama_max_devices() floats, tensor_buft_overrides llama_max_tensor_buft_overrides() entries,
 * margins one size_t per device. Returns 0 (fits), 1 (could not fit) or 2 (error). */
int32_t pyllama_moe_fit_params(
        const char * path_model,
        struct llama_model_params * mparams,
        struct llama_context_params * cparams,
        float * tensor_split,
        struct llama_model_tensor_buft_override * tensor_buft_overrides,
        size_t * margins,
        uint32_t n_ctx_min,
        enum ggml_log_level log_level);

/* common_get_device_memory_data: the memory a model + context would take, measured without
 * allocating. Writes 5 values per device (total, free, model, context, compute bytes) for at most
 * max_devices devices; returns the number of devices, or -1 on error. */
int32_t pyllama_moe_device_memory(
        const char * path_model,
        const struct llama_model_params * mparams,
        const struct llama_context_params * cparams,
        int64_t * out,
        int32_t max_devices);

/* Host-to-device copy bandwidth of backend device dev_index (ggml_backend_dev_get), through
 * ggml_backend_tensor_set as llama's uploads go: reps copies of n_bytes from a buffer of the device's
 * host buffer type (pinned; 0 written if it has none), from plain malloc'ed memory (pageable) and, if
 * mapped_path is not NULL, from that file mapped read-only (its first n_bytes at most: page-cache pages,
 * as llama.cpp's mmap load mode uploads them; 0 written where files cannot be mapped).
 * Writes bytes per second to pinned_bps, pageable_bps and mapped_bps; returns 0, or -1 on error (logged). */
int32_t pyllama_moe_h2d_bandwidth(
        size_t dev_index,
        size_t n_bytes,
        int32_t reps,
        const char * mapped_path,
        double * pinned_bps,
        double * pageable_bps,
        double * mapped_bps);

/* llama_available_memory with /proc and /sys read under root (tests feed fake trees there): llama's internal
 * llama_sys_available_memory, which the public function calls with no root. -1 if unknown. */
int64_t pyllama_moe_available_memory_at(const char * root);

/* llama.h calls that throw C++ exceptions on some inputs, which would end the process (std::terminate): here
 * the exception becomes an error, its message logged through llama's logger. llama_tokenize throws on bytes that
 * are not a code point (e.g. an encoded U+110000); llama_sampler_sample and llama_sampler_accept on a token that
 * a grammar cannot accept (a grammar that no token can continue). *failed is set to false, or true on an
 * exception (the result is then 0). */
int32_t pyllama_moe_tokenize(
        const struct llama_vocab * vocab,
        const char * text,
        int32_t text_len,
        llama_token * tokens,
        int32_t n_tokens_max,
        bool add_special,
        bool parse_special,
        bool * failed);

llama_token pyllama_moe_sampler_sample(struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx, bool * failed);

void pyllama_moe_sampler_accept(struct llama_sampler * smpl, llama_token token, bool * failed);

#ifdef __cplusplus
}
#endif

#endif
