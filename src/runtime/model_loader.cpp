#include "runtime/model_loader.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>

#include <omp.h>

#include "core/env.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "hub/hub.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "model/gguf_model.h"
#include "text/gguf_tokenizer.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// Known model aliases: name -> file name inside <cache>/models (fetched by
// scripts/fetch_model.sh, which checks the sha256).
struct ModelAlias {
  const char* name;
  const char* file;
};
constexpr ModelAlias kAliases[] = {
    {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
};

bool is_alias(const std::string& model) {
  for (const ModelAlias& a : kAliases) {
    if (model == a.name) return true;
  }
  return false;
}

Result<std::string> resolve_model_path(const std::string& model) {
  if (!is_alias(model) && is_hub_model_id(model)) {
    std::error_code ec;
    if (!fs::exists(model, ec)) return resolve_model_location(model, hub_options_from_env());
  }
  for (const ModelAlias& a : kAliases) {
    if (model != a.name) continue;
    const fs::path path = fs::path(env_config().cache_dir) / "models" / a.file;
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return errorf(StatusCode::kNotFound,
                    "model '{}' is not downloaded ({} is missing): run scripts/fetch_model.sh {}",
                    model, path.string(), model);
    }
    return path.string();
  }
  return model;
}

bool is_gguf_path(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

}  // namespace

HubOptions hub_options_from_env() {
  const EnvConfig& env = env_config();
  HubOptions o;
  o.cache_dir = env.hf_hub_cache;
  o.endpoint = env.hf_endpoint;
  o.token = env.hf_token;
  if (o.token.empty() && !env.hf_token_path.empty()) {
    std::error_code ec;
    if (fs::is_regular_file(env.hf_token_path, ec) && fs::file_size(env.hf_token_path, ec) < 4096) {
      if (auto text = read_text_file(env.hf_token_path); text.ok()) {
        o.token = *text;
        while (!o.token.empty() && std::isspace(static_cast<unsigned char>(o.token.back())))
          o.token.pop_back();
      }
    }
  }
  o.offline = env.hf_offline;
  o.timeout_s = env.hf_download_timeout;
  return o;
}

bool is_hub_model_id(const std::string& model) {
  return hub::parse_hub_id(model).has_value();
}

Result<std::string> resolve_model_location(const std::string& model, const HubOptions& options) {
  std::error_code ec;
  if (model.empty() || is_alias(model) || fs::exists(model, ec)) return model;
  const std::optional<hub::HubId> id = hub::parse_hub_id(model);
  if (!id) return model;
  auto path = hub::resolve(*id, options);
  const StatusCode code = path.ok() ? StatusCode::kOk : path.status().code();
  // The hub (or the offline cache) does not know the name, or the listing failed: say that no
  // local path has that name either.
  const bool lookup_failed =
      code == StatusCode::kNotFound || code == StatusCode::kFailedPrecondition ||
      ((code == StatusCode::kIoError || code == StatusCode::kDeadlineExceeded) &&
       path.status().message().find("/api/models/") != std::string::npos);
  if (lookup_failed && id->revision.empty() && id->file.empty()) {
    // It may have been meant as a local path.
    return Status(
        code, path.status().message() + " (and there is no local file or folder '" + model + "')");
  }
  return path;
}

ModelInfo make_model_info(const std::string& path, const ModelConfig& c) {
  ModelInfo info;
  info.path = path;
  info.architecture = c.architecture;
  info.dtype = std::string(dtype_name(c.weight_dtype));
  info.n_params = c.parameter_count();
  info.n_layers = c.n_layers;
  info.hidden = c.hidden;
  info.n_heads = c.n_heads;
  info.n_heads_kv = c.n_heads_kv;
  info.head_dim = c.head_dim;
  info.ffn_dim = c.ffn_dim;
  info.n_experts = c.n_experts;
  info.n_experts_used = c.n_experts_used;
  info.expert_ffn_dim = c.expert_ffn_dim;
  info.shared_expert_ffn_dim = c.shared_expert_ffn_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) info.n_moe_layers += c.layer_moe(l) ? 1 : 0;
  info.n_active_params = c.active_parameter_count();
  info.vocab = c.vocab;
  info.context_length = c.max_position_embeddings;
  info.tied_embeddings = c.tie_word_embeddings;
  info.weight_bytes = dtype_bytes(c.weight_dtype, info.n_params);
  info.kv_bytes_per_token = 2 * c.n_layers * c.n_heads_kv * c.head_dim * 4;
  return info;
}

Result<ModelFiles> open_model(const std::string& model, bool with_weights) {
  ModelFiles m;
  STRATA_ASSIGN_OR_RETURN(m.path, resolve_model_path(model));
  std::error_code ec;
  if (!fs::exists(m.path, ec)) {
    // A bare name (no '/', no extension) was probably meant as an alias: list the known ones.
    if (m.path.find('/') == std::string::npos && m.path.find('.') == std::string::npos) {
      std::string known;
      for (const ModelAlias& a : kAliases)
        known += (known.empty() ? "" : ", ") + std::string(a.name);
      return errorf(StatusCode::kNotFound,
                    "{}: no such model directory or file, and not a known model name (known: {})",
                    m.path, known);
    }
    return errorf(StatusCode::kNotFound, "{}: no such model directory or file", m.path);
  }
  if (is_gguf_path(m.path) && fs::is_regular_file(m.path, ec)) {
    STRATA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(m.path));
    auto shared = std::make_shared<const GgufFile>(std::move(file));
    STRATA_ASSIGN_OR_RETURN(m.config, model_config_from_gguf(*shared));
    if (shared->has("tokenizer.ggml.model")) {
      STRATA_ASSIGN_OR_RETURN(TokenizerSpec spec, tokenizer_spec_from_gguf(*shared));
      m.has_chat_template = !spec.chat_template.empty();
      auto tokenizer = Tokenizer::from_spec(std::move(spec));  // errors name the file
      if (!tokenizer.ok()) return tokenizer.status().with_context(shared->name());
      m.tokenizer = std::move(*tokenizer);
    }
    if (with_weights) {
      m.weights = make_gguf_tensor_source(shared, m.config.family);
      m.prefault = [shared](const std::function<void(uint64_t, uint64_t)>& progress) {
        const std::shared_ptr<MappedFile>& map = shared->mapping();
        if (!map) return;
        constexpr uint64_t kPage = 4096, kReport = uint64_t{64} << 20;
        const auto* p = static_cast<const volatile uint8_t*>(map->data());
        const uint64_t total = map->size();
        uint8_t sink = 0;
        for (uint64_t off = 0; off < total; off += kPage) {
          sink ^= p[off];
          if (progress && (off % kReport == 0)) progress(off, total);
        }
        (void)sink;
        if (progress) progress(total, total);
      };
    }
    m.info = make_model_info(m.path, m.config);
    m.info.has_tokenizer = m.tokenizer != nullptr;
    m.info.has_chat_template = m.has_chat_template;
    m.info.weight_bytes = static_cast<int64_t>(shared->file_size() - shared->data_offset());
    return m;
  }
  if (!fs::is_directory(m.path, ec)) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: expected a Hugging Face checkpoint directory (config.json + "
                  "model.safetensors) or a .gguf file",
                  m.path);
  }
  const std::string config_path = (fs::path(m.path) / "config.json").string();
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path));
  STRATA_ASSIGN_OR_RETURN(m.config, parse_hf_config(text, config_path));
  const fs::path tok_path = fs::path(m.path) / "tokenizer.json";
  if (fs::exists(tok_path, ec)) {
    STRATA_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_hf_json(tok_path.string()));
    m.has_chat_template = !m.tokenizer->chat_template().empty();
  }
  if (with_weights) {
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(m.path));
    std::shared_ptr<Checkpoint> shared = std::move(ckpt);
    m.prefault = [shared](const std::function<void(uint64_t, uint64_t)>& progress) {
      shared->prefault(progress);
    };
    m.weights = std::move(shared);
  }
  m.info = make_model_info(m.path, m.config);
  m.info.has_tokenizer = m.tokenizer != nullptr;
  m.info.has_chat_template = m.has_chat_template;
  return m;
}

int max_cpu_threads() {
  return 4 * std::max(1, omp_get_num_procs());
}

Status check_engine_config(const EngineConfig& cfg) {
  // NOTE: more threads than a few per CPU only oversubscribe the cores (--threads 10000 started
  // 10,000 threads and made no progress).
  if (cfg.num_threads < 0 || cfg.num_threads > max_cpu_threads()) {
    return errorf(StatusCode::kInvalidArgument,
                  "--threads {} must be in [0, {}] (0 = all cores; at most 4 per CPU, {} CPUs "
                  "here)",
                  cfg.num_threads, max_cpu_threads(), omp_get_num_procs());
  }
  if (cfg.parallel.tp < 1) {
    return errorf(StatusCode::kInvalidArgument, "--tensor-parallel-size must be >= 1");
  }
  if (cfg.parallel.ep < 1) {
    return errorf(StatusCode::kInvalidArgument, "--expert-parallel-size {} must be >= 1",
                  cfg.parallel.ep);
  }
  if (cfg.max_model_len < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "--max-model-len {} must be >= 0 (0 = the model's own)", cfg.max_model_len);
  }
  if (cfg.gpu_weight_budget < 0) {
    return errorf(StatusCode::kInvalidArgument, "--gpu-weight-budget {} must be >= 0",
                  cfg.gpu_weight_budget);
  }
  return ok_status();
}

Status apply_ffn_layout(const ParallelSizes& sizes, ParallelConfig* par) {
  if (!parse_ffn_layout(sizes.ffn_layout, &par->ffn_layout)) {
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-layout '{}': expected 1d, 2d or weight-gathered", sizes.ffn_layout);
  }
  if (sizes.ffn_2d_x < 0 || (sizes.ffn_2d_x > 0 && par->ffn_layout != FfnLayout::k2D)) {
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-2d-x {} goes with --ffn-layout 2d (and must be >= 2)", sizes.ffn_2d_x);
  }
  par->ws2d_x = sizes.ffn_2d_x;
  if (sizes.ffn_gather_min_tokens < 0 ||
      (sizes.ffn_gather_min_tokens > 0 && par->ffn_layout != FfnLayout::k1D)) {
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-gather-min-tokens {} goes with --ffn-layout 1d (and must be >= 1)",
                  sizes.ffn_gather_min_tokens);
  }
  if (sizes.ffn_gather_min_tokens > 0 && sizes.tp < 2) {
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-gather-min-tokens {} needs --tensor-parallel-size > 1",
                  sizes.ffn_gather_min_tokens);
  }
  par->ffn_gather_min_tokens = sizes.ffn_gather_min_tokens;
  return ok_status();
}

Status apply_attn_layout(const ParallelSizes& sizes, ParallelConfig* par) {
  if (!parse_attn_layout(sizes.attn_layout, &par->attn_layout)) {
    return errorf(StatusCode::kInvalidArgument,
                  "--attn-layout '{}': expected head-sharded or batch-sharded", sizes.attn_layout);
  }
  return ok_status();
}

Result<LoadedModel> load_model(const EngineConfig& cfg) {
  STRATA_RETURN_IF_ERROR(check_engine_config(cfg));
  if (cfg.num_threads > 0) omp_set_num_threads(cfg.num_threads);
  if (cfg.parallel.tp < 1) {
    return errorf(StatusCode::kInvalidArgument, "--tensor-parallel-size must be >= 1");
  }
  LoadedModel out;
  const EnvConfig& env = env_config();
  // On the CPU, tensor- and expert-parallel ranks are processes; under mpirun the world is
  // tp x pp x ep ranks (pipeline stages without mpirun are threads of this process).
  const int pp = std::max(1, cfg.parallel.pp);
  const int ep = std::max(1, cfg.parallel.ep);
  const bool launched = env.launcher_size > 1;
  const int world = cfg.parallel.tp * pp * ep;
  std::string want = fmt::format("--tensor-parallel-size {}", cfg.parallel.tp);
  if (pp > 1) want += fmt::format(" x --pipeline-parallel-size {}", pp);
  if (ep > 1) want += fmt::format(" x --expert-parallel-size {}", ep);
  const bool processes = cfg.parallel.tp > 1 || ep > 1;
  if (processes && env.launcher_size != world) {
    return errorf(StatusCode::kInvalidArgument,
                  "{} needs {} ranks: launch with mpirun -np {} (this process was started with {})",
                  want, world, world, env.launcher_size > 0 ? env.launcher_size : 1);
  }
  if (processes || launched) {
    STRATA_ASSIGN_OR_RETURN(out.comm, make_mpi_communicator());
    if (out.comm->size() != world) {
      return errorf(StatusCode::kInvalidArgument,
                    "{} but {} MPI ranks were launched (use mpirun -np {})", want, out.comm->size(),
                    world);
    }
  } else {
    out.comm = make_single_rank_communicator();
  }
  STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/true));
  const ModelConfig& config = files.config;
  out.info = std::move(files.info);
  if (cfg.max_model_len < 0) {
    return errorf(StatusCode::kInvalidArgument, "--max-model-len must be >= 0");
  }
  out.max_len = cfg.max_model_len > 0 ? std::min(cfg.max_model_len, config.max_position_embeddings)
                                      : config.max_position_embeddings;
  // A progress line while reading large checkpoints (the pages are read here, once).
  constexpr uint64_t kProgressBytes = uint64_t{256} << 20;
  if (cfg.show_progress && files.prefault &&
      static_cast<uint64_t>(out.info.weight_bytes) >= kProgressBytes) {
    int last = -1;
    files.prefault([&](uint64_t done, uint64_t total) {
      const int pct = total ? static_cast<int>(100 * done / total) : 100;
      if (pct == last) return;
      last = pct;
      std::fprintf(stderr, "\rstrata: loading %s: %3d%% (%.2f / %.2f GiB)", files.path.c_str(), pct,
                   static_cast<double>(done) / (1 << 30), static_cast<double>(total) / (1 << 30));
      if (done >= total) std::fputc('\n', stderr);
      std::fflush(stderr);
    });
  }
  ParallelConfig par;
  par.tp_size = cfg.parallel.tp;
  par.tp_rank = out.comm->rank() % cfg.parallel.tp;
  par.ep_size = cfg.parallel.ep;
  par.ep_rank = out.comm->rank() / cfg.parallel.tp;
  STRATA_RETURN_IF_ERROR(apply_ffn_layout(cfg.parallel, &par));
  STRATA_RETURN_IF_ERROR(apply_attn_layout(cfg.parallel, &par));
  if (cfg.parallel.pp <= 1) {
    STRATA_ASSIGN_OR_RETURN(out.model, Model::load(config, par, files.weights));
  }
  out.config = config;
  out.weights = files.weights;
  out.tokenizer = std::move(files.tokenizer);
  return out;
}

}  // namespace strata
