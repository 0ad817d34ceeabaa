// Engine: the single-request generation path behind `strata run` / `strata chat` (benchmarks
// have their own entry point over the runtime: src/runtime/bench.cpp).
// Opens the model files (io), parses the config (model), shards and loads the weights for
// this rank, sizes a paged KV cache for one sequence, and runs prefill + decode with the
// sampler. Multi-sequence serving builds on the same Model::forward through the scheduler.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include <omp.h>

#include "chat/chat_template.h"
#include "core/env.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "memory/kv_pool.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/residency.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "strata/engine.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer.h"

namespace strata {

namespace {

namespace fs = std::filesystem;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kPrefillChunk = 512;

class EngineImpl final : public Engine {
 public:
  const ModelInfo& info() const override { return info_; }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }

  Status init(const EngineConfig& cfg) {
    // The CPU pool holds one sequence's blocks (times max_num_seqs when given: batched
    // benchmarks); the CUDA pool fills --gpu-memory-utilization.
    ExecutorOptions eo;
    eo.block_size = kBlockSize;
    eo.cpu_seqs = std::max<int64_t>(1, cfg.max_num_seqs);
    STRATA_ASSIGN_OR_RETURN(LoadedExecutor loaded, load_executor(cfg, eo));
    info_ = std::move(loaded.info);
    max_len_ = loaded.max_len;
    comm_ = std::move(loaded.comm);
    tokenizer_ = std::move(loaded.tokenizer);
    exec_ = std::move(loaded.exec);
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
    const int64_t V = exec_->config().vocab;
    std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
    SequenceKv seq;
    Status st = run_tokens(seq, tokens, /*all_logits=*/true, logits.data());
    seq.release(exec_->cache());
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
        if (t < 0 || t >= exec_->config().vocab) {
          return errorf(StatusCode::kInvalidArgument,
                        "prompt token id {} is outside the vocabulary (0..{})", t,
                        exec_->config().vocab - 1);
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
    const ModelConfig& c = exec_->config();
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
    seq.release(exec_->cache());
    if (!st.ok()) return st;
    return result;
  }

 private:
  Result<std::string> render_chat(const GenerateRequest& req) {
    const std::string& tmpl = tokenizer_->chat_template();
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const ChatMessage& m : req.messages) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    if (!req.prompt.empty()) messages.push_back({{"role", "user"}, {"content", req.prompt}});
    const std::string bos =
        tokenizer_->bos_id() >= 0 ? tokenizer_->id_to_token(tokenizer_->bos_id()) : "";
    if (tmpl.empty()) {
      // Base models (Gemma-3-270M) ship no template: plain text, said once.
      if (!warned_no_template_) {
        log_warn("{}: the model has no chat template; the conversation is sent as plain text",
                 info_.path);
        warned_no_template_ = true;
      }
      return plain_chat_prompt(messages, bos);
    }
    const std::string eos =
        tokenizer_->eos_id() >= 0 ? tokenizer_->id_to_token(tokenizer_->eos_id()) : "";
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
    Executor& ex = *exec_;
    const ForwardFn fn = [&ex](const ForwardBatch& b, float* out) { return ex.forward(b, out); };
    return forward_sequence(fn, max_len_, ex.config().vocab, ex.cache(), seq, tokens, all_logits,
                            logits, kPrefillChunk);
  }

  ModelInfo info_;
  int64_t max_len_ = 0;
  bool warned_no_template_ = false;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Executor> exec_;
};

}  // namespace

Result<ModelInfo> inspect_model(const std::string& model) {
  if (model.rfind("dummy:", 0) == 0) {
    STRATA_ASSIGN_OR_RETURN(ModelConfig config, model_config_preset(model.substr(6)));
    return make_model_info(model, config);
  }
  STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(model, /*with_weights=*/false));
  return std::move(files.info);
}

Result<std::vector<std::string>> describe_weight_residency(const std::string& model,
                                                           const EngineConfig& cfg) {
  ModelConfig config;
  if (model.rfind("dummy:", 0) == 0) {
    STRATA_ASSIGN_OR_RETURN(config, model_config_preset(model.substr(6)));
  } else {
    STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(model, /*with_weights=*/false));
    config = files.config;
  }
  ResidencyOptions o;
  o.gpu_weight_budget = cfg.gpu_weight_budget;
  o.offload = cfg.offload_weights;
  o.prefetch = cfg.weight_prefetch;
  o.fetch_pieces = cfg.fetch_pieces;
  const DType wdt = quantization_dtype(cfg.quantization);
  STRATA_ASSIGN_OR_RETURN(ResidencyPlan plan, plan_residency(config, ParallelConfig{}, wdt, o));
  return plan.describe();
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  auto engine = std::make_unique<EngineImpl>();
  STRATA_RETURN_IF_ERROR(engine->init(config));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace strata
