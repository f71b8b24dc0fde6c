/* Python functions that C calls back, defined with ffi.def_extern() in pyllama_moe/backend.py */
extern "Python" void pyllama_moe_log_callback(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" bool pyllama_moe_progress_callback(float progress, void * user_data);
extern "Python" bool pyllama_moe_abort_callback(void * user_data);
