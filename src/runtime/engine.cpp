// Engine: the single-request generation path behind `strata run` / `strata chat`.
// Opens the model files (io), parses the config (model), shards and loads the weights for
// this rank, sizes a paged KV cache for one sequence, and runs prefill + decode with the
// sampler. Multi-sequence serving builds on the same Model::forward through the scheduler.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include <omp.h>

#include "core/env.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "io/chat_template.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "io/gguf_tokenizer.h"
#include "io/tokenizer.h"
#include "memory/kv_cache.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "strata/engine.h"

namespace strata {

namespace {

namespace fs = std::filesystem;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kPrefillChunk = 512;

// Known model aliases: name -> file name inside <cache>/models (fetched by
// scripts/fetch_model.sh, which checks the sha256).
struct ModelAlias {
  const char* name;
  const char* file;
};
constexpr ModelAlias kAliases[] = {
    {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3-270m", "gemma-3-270m-it-Q4_K_M.gguf"},
};

Result<std::string> resolve_model_path(const std::string& model) {
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

// Everything needed to build a model: its config, weights and tokenizer.
struct ModelFiles {
  std::string path;
  ModelConfig config;
  std::shared_ptr<TensorSource> weights;   // null unless with_weights
  std::unique_ptr<Tokenizer> tokenizer;    // null when the model has none
  bool has_chat_template = false;
};

Result<ModelFiles> open_model(const std::string& model, bool with_weights) {
  ModelFiles m;
  STRATA_ASSIGN_OR_RETURN(m.path, resolve_model_path(model));
  std::error_code ec;
  if (!fs::exists(m.path, ec)) {
    return errorf(StatusCode::kNotFound, "{}: no such model directory or file", m.path);
  }
  if (is_gguf_path(m.path) && fs::is_regular_file(m.path, ec)) {
    STRATA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(m.path));
    auto shared = std::make_shared<const GgufFile>(std::move(file));
    STRATA_ASSIGN_OR_RETURN(m.config, model_config_from_gguf(*shared));
    if (shared->has("tokenizer.ggml.model")) {
      STRATA_ASSIGN_OR_RETURN(TokenizerSpec spec, tokenizer_spec_from_gguf(*shared));
      m.has_chat_template = !spec.chat_template.empty();
      STRATA_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_spec(std::move(spec)));
    }
    if (with_weights) m.weights = make_gguf_tensor_source(shared, m.config.family);
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
    m.weights = std::move(ckpt);
  }
  return m;
}

ModelInfo make_info(const std::string& path, const ModelConfig& c) {
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
  info.vocab = c.vocab;
  info.context_length = c.max_position_embeddings;
  info.weight_bytes = dtype_bytes(c.weight_dtype, info.n_params);
  info.kv_bytes_per_token = 2 * c.n_layers * c.n_heads_kv * c.head_dim * 4;
  return info;
}

class EngineImpl final : public Engine {
 public:
  const ModelInfo& info() const override { return info_; }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }

  Status init(const EngineConfig& cfg) {
    if (cfg.num_threads > 0) omp_set_num_threads(cfg.num_threads);
    if (cfg.tensor_parallel_size < 1) {
      return errorf(StatusCode::kInvalidArgument, "--tensor-parallel-size must be >= 1");
    }
    const EnvConfig& env = env_config();
    if (cfg.tensor_parallel_size > 1 && env.launcher_size != cfg.tensor_parallel_size) {
      return errorf(StatusCode::kInvalidArgument,
                    "--tensor-parallel-size {} needs {} ranks: launch with mpirun -np {} (this "
                    "process was started with {})",
                    cfg.tensor_parallel_size, cfg.tensor_parallel_size, cfg.tensor_parallel_size,
                    env.launcher_size > 0 ? env.launcher_size : 1);
    }
    if (cfg.tensor_parallel_size > 1 || env.launcher_size > 1) {
      STRATA_ASSIGN_OR_RETURN(comm_, make_mpi_communicator());
      if (comm_->size() != cfg.tensor_parallel_size) {
        return errorf(StatusCode::kInvalidArgument,
                      "--tensor-parallel-size {} but {} MPI ranks were launched (use mpirun -np "
                      "{})",
                      cfg.tensor_parallel_size, comm_->size(), cfg.tensor_parallel_size);
      }
    } else {
      comm_ = make_single_rank_communicator();
    }
    STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/true));
    const ModelConfig& config = files.config;
    info_ = make_info(files.path, config);
    info_.has_tokenizer = files.tokenizer != nullptr;
    info_.has_chat_template = files.has_chat_template;
    tokenizer_ = std::move(files.tokenizer);
    if (cfg.max_model_len < 0) {
      return errorf(StatusCode::kInvalidArgument, "--max-model-len must be >= 0");
    }
    max_len_ = cfg.max_model_len > 0 ? std::min(cfg.max_model_len, config.max_position_embeddings)
                                     : config.max_position_embeddings;
    ParallelConfig par;
    par.tp_size = comm_->size();
    par.tp_rank = comm_->rank();
    STRATA_ASSIGN_OR_RETURN(model_, Model::load(config, par, files.weights));
    const int64_t n_blocks = (max_len_ + kBlockSize - 1) / kBlockSize;
    STRATA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(model_->kv_config(n_blocks, kBlockSize)));
    cache_ = std::make_unique<KvCache>(std::move(cache));
    return ok_status();
  }

  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) override {
    if (!tokenizer_) {
      return errorf(StatusCode::kFailedPrecondition, "{}: the model has no tokenizer.json",
                    info_.path);
    }
    return tokenizer_->encode(text, add_special);
  }

  Result<std::vector<float>> score(const std::vector<int32_t>& tokens) override {
    const int64_t V = model_->config().vocab;
    std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
    SequenceKv seq;
    Status st = run_tokens(seq, tokens, /*all_logits=*/true, logits.data());
    seq.release(*cache_);
    if (!st.ok()) return st;
    return logits;
  }

  Result<GenerateResult> generate(const GenerateRequest& req,
                                  const std::function<bool(std::string_view)>& on_text) override {
    STRATA_RETURN_IF_ERROR(validate_sampling(req.sampling));
    if (req.max_tokens < 0) {
      return errorf(StatusCode::kInvalidArgument, "max tokens must be >= 0");
    }
    if (!tokenizer_) {
      return errorf(StatusCode::kFailedPrecondition, "{}: the model has no tokenizer.json",
                    info_.path);
    }
    GenerateResult result;
    if (req.chat) {
      STRATA_ASSIGN_OR_RETURN(std::string text, render_chat(req));
      STRATA_ASSIGN_OR_RETURN(result.prompt_tokens, tokenize(text, /*add_special=*/false));
    } else if (!req.prompt_tokens.empty()) {
      for (int32_t t : req.prompt_tokens) {
        if (t < 0 || t >= model_->config().vocab) {
          return errorf(StatusCode::kInvalidArgument, "prompt token id {} is outside the vocabulary (0..{})",
                        t, model_->config().vocab - 1);
        }
      }
      result.prompt_tokens = req.prompt_tokens;
    } else {
      STRATA_ASSIGN_OR_RETURN(result.prompt_tokens, tokenize(req.prompt, /*add_special=*/true));
    }
    const int64_t n_prompt = static_cast<int64_t>(result.prompt_tokens.size());
    if (n_prompt == 0) return errorf(StatusCode::kInvalidArgument, "the prompt is empty");
    if (n_prompt >= max_len_) {
      return errorf(StatusCode::kOutOfRange,
                    "the prompt is {} tokens, but the context length is {} (needs room for at "
                    "least one new token)",
                    n_prompt, max_len_);
    }
    const ModelConfig& c = model_->config();
    const int64_t V = c.vocab;
    std::vector<float> logits(static_cast<size_t>(V));
    SequenceKv seq;
    Sampler sampler(req.sampling);
    StreamingDecoder decoder(*tokenizer_);
    auto t0 = std::chrono::steady_clock::now();
    Status st = run_tokens(seq, result.prompt_tokens, false, logits.data());
    auto t1 = std::chrono::steady_clock::now();
    result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    result.finish_reason = "length";
    while (st.ok() && static_cast<int64_t>(result.tokens.size()) < req.max_tokens) {
      int32_t tok = sampler.sample(logits.data(), V, result.prompt_tokens, result.tokens);
      // All ranks hold identical logits, but broadcast rank 0's choice so they cannot diverge.
      if (comm_->size() > 1) {
        st = comm_->broadcast(&tok, sizeof(tok), 0);
        if (!st.ok()) break;
      }
      const bool is_eos = tokenizer_->is_eot(tok);
      if (is_eos && !req.ignore_eos) {
        result.finish_reason = "stop";
        break;
      }
      result.tokens.push_back(tok);
      const std::string piece = decoder.push(tok);
      result.text += piece;
      if (!piece.empty() && on_text && !on_text(piece)) break;
      if (seq.length >= max_len_ || static_cast<int64_t>(result.tokens.size()) >= req.max_tokens) {
        break;
      }
      const std::vector<int32_t> next{tok};
      st = run_tokens(seq, next, false, logits.data());
    }
    const std::string tail = decoder.flush();
    result.text += tail;
    if (!tail.empty() && on_text) on_text(tail);
    result.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    seq.release(*cache_);
    if (!st.ok()) return st;
    return result;
  }

 private:
  Result<std::string> render_chat(const GenerateRequest& req) {
    const std::string& tmpl = tokenizer_->chat_template();
    if (tmpl.empty()) {
      return errorf(StatusCode::kFailedPrecondition, "{}: the model has no chat template",
                    info_.path);
    }
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const ChatMessage& m : req.messages) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    if (!req.prompt.empty()) messages.push_back({{"role", "user"}, {"content", req.prompt}});
    const std::string bos = tokenizer_->bos_id() >= 0 ? tokenizer_->id_to_token(tokenizer_->bos_id()) : "";
    const std::string eos = tokenizer_->eos_id() >= 0 ? tokenizer_->id_to_token(tokenizer_->eos_id()) : "";
    auto text = apply_chat_template(tmpl, messages, /*add_generation_prompt=*/true, bos, eos);
    if (!text.ok()) return text.status().with_context(info_.path);
    return text;
  }

  Status run_tokens(SequenceKv& seq, const std::vector<int32_t>& tokens, bool all_logits,
                    float* logits) {
    if (seq.length + static_cast<int64_t>(tokens.size()) > max_len_) {
      return errorf(StatusCode::kOutOfRange, "{} tokens exceed the context length {}",
                    seq.length + static_cast<int64_t>(tokens.size()), max_len_);
    }
    return forward_sequence(*model_, *cache_, *comm_, seq, tokens, all_logits, logits,
                            kPrefillChunk);
  }

  ModelInfo info_;
  int64_t max_len_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCache> cache_;
};

}  // namespace

Result<ModelInfo> inspect_model(const std::string& model) {
  STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(model, /*with_weights=*/false));
  ModelInfo info = make_info(files.path, files.config);
  info.has_tokenizer = files.tokenizer != nullptr;
  info.has_chat_template = files.has_chat_template;
  return info;
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  auto engine = std::make_unique<EngineImpl>();
  STRATA_RETURN_IF_ERROR(engine->init(config));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace strata
