#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace strata {

namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int get_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    if (const char* v = get(n)) {
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (end && *end == '\0' && x >= 0 && x < (1 << 20)) return static_cast<int>(x);
    }
  }
  return fallback;
}

EnvConfig read_env() {
  EnvConfig c;
  c.num_threads = get_int({"STRATA_NUM_THREADS"}, 0);
  if (const char* v = get("STRATA_LOG_LEVEL")) c.log_level = v;
  if (const char* v = get("STRATA_CACHE_DIR")) {
    c.cache_dir = v;
  } else if (const char* x = get("XDG_CACHE_HOME")) {
    c.cache_dir = std::string(x) + "/strata";
  } else if (const char* h = get("HOME")) {
    c.cache_dir = std::string(h) + "/.cache/strata";
  } else {
    c.cache_dir = "/tmp/strata-cache";
  }
  c.launcher_rank = get_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, -1);
  c.launcher_size = get_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, -1);
  c.launcher_local_rank =
      get_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, -1);
  auto flag = [](const char* name) {
    const char* v = get(name);
    return v != nullptr && v[0] == '1';
  };
  if (const char* v = get("STRATA_CPU_ISA")) c.cpu_isa = v;
  if (const char* v = get("STRATA_CPU_PREFILL")) c.cpu_prefill = v;
  if (const char* v = get("STRATA_CPU_DECODE")) c.cpu_decode = v;
  c.profile = flag("STRATA_PROFILE") || flag("STRATA_CUDA_PROFILE");
  c.no_autotune = flag("STRATA_NO_AUTOTUNE");
  c.no_pdl = flag("STRATA_NO_PDL");
  c.no_i8_gemm = flag("STRATA_NO_I8_GEMM");
  c.no_fp8_scaled_gemm = flag("STRATA_NO_FP8_SCALED_GEMM");
  c.gguf_dequant = flag("STRATA_GGUF_DEQUANT");
  if (get("STRATA_SBI_PREFETCH") != nullptr) {
    c.sbi_prefetch = std::min(8, get_int({"STRATA_SBI_PREFETCH"}, 0));
  }
  if (get("STRATA_DECODE_CTAS_PER_SM") != nullptr) {
    c.decode_ctas_per_sm = std::clamp(get_int({"STRATA_DECODE_CTAS_PER_SM"}, 2), 1, 16);
  }
  if (const char* v = get("STRATA_NCCL_LIBRARY")) c.nccl_library = v;
  if (get("STRATA_ONESHOT_MAX_BYTES") != nullptr) {
    c.oneshot_max_bytes = std::max(0, get_int({"STRATA_ONESHOT_MAX_BYTES"}, 0));
  }
  c.tp_one_gpu = flag("STRATA_TP_ONE_GPU");
  if (const char* v = get("STRATA_PP_STAGE_GATE")) c.pp_stage_gate = v[0] == '0' ? 0 : 1;
  if (get("STRATA_MOE_EP_FIXED_TOKENS") != nullptr) {
    c.moe_ep_fixed_tokens = std::max(0, get_int({"STRATA_MOE_EP_FIXED_TOKENS"}, 0));
  }
  if (get("STRATA_COLLECTIVE_TIMEOUT") != nullptr) {
    c.collective_timeout_s = std::max(1, get_int({"STRATA_COLLECTIVE_TIMEOUT"}, 300));
  }
  c.no_fused_allreduce = flag("STRATA_NO_FUSED_ALLREDUCE");
  c.cpu_no_fused_parts = flag("STRATA_CPU_NO_FUSED_PARTS");
  c.cpu_spin_pool = flag("STRATA_CPU_SPIN_POOL");
  c.hugepages = flag("STRATA_HUGEPAGES");
  c.cpu_amx = flag("STRATA_CPU_AMX");
  c.moe_ep_no_counted = flag("STRATA_MOE_EP_NO_COUNTED");
  c.moe_ep_no_fused = flag("STRATA_MOE_EP_NO_FUSED");
  // The Hugging Face Hub, as huggingface_hub reads its variables.
  const std::string home = get("HOME") ? get("HOME") : "/tmp";
  const std::string xdg = get("XDG_CACHE_HOME") ? get("XDG_CACHE_HOME") : home + "/.cache";
  c.hf_home = get("HF_HOME") ? get("HF_HOME") : xdg + "/huggingface";
  if (const char* v = get("HF_HUB_CACHE")) {
    c.hf_hub_cache = v;
  } else if (const char* legacy = get("HUGGINGFACE_HUB_CACHE")) {
    c.hf_hub_cache = legacy;
  } else {
    c.hf_hub_cache = c.hf_home + "/hub";
  }
  c.hf_endpoint = get("HF_ENDPOINT") ? get("HF_ENDPOINT") : "https://huggingface.co";
  if (const char* v = get("HF_TOKEN")) c.hf_token = v;
  c.hf_token_path = get("HF_TOKEN_PATH") ? get("HF_TOKEN_PATH") : c.hf_home + "/token";
  if (const char* v = get("HF_HUB_OFFLINE")) {
    std::string s = v;
    for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    c.hf_offline = s == "1" || s == "ON" || s == "YES" || s == "TRUE";
  }
  if (const char* v = get("HF_HUB_DOWNLOAD_TIMEOUT")) {
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    if (end && *end == '\0' && t > 0 && t < 86400) c.hf_download_timeout = t;
  }
  return c;
}

}  // namespace

const EnvConfig& env_config() {
  static const EnvConfig config = read_env();
  return config;
}

}  // namespace strata
