#include "runtime/model_loader.h"

#include <algorithm>
#include <filesystem>

#include <omp.h>

#include "core/env.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "io/checkpoint.h"

namespace strata {

namespace fs = std::filesystem;

Result<ModelConfig> read_model_config(const std::string& model) {
  std::error_code ec;
  if (!fs::exists(model, ec)) {
    return errorf(StatusCode::kNotFound, "{}: no such model directory or file", model);
  }
  if (!fs::is_directory(model, ec)) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: expected a Hugging Face checkpoint directory (config.json + "
                  "model.safetensors)",
                  model);
  }
  const std::string path = (fs::path(model) / "config.json").string();
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_hf_config(text, path);
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
  info.vocab = c.vocab;
  info.context_length = c.max_position_embeddings;
  info.weight_bytes = dtype_bytes(c.weight_dtype, info.n_params);
  info.kv_bytes_per_token = 2 * c.n_layers * c.n_heads_kv * c.head_dim * 4;
  std::error_code ec;
  info.has_tokenizer = fs::exists(fs::path(path) / "tokenizer.json", ec);
  return info;
}

Result<LoadedModel> load_model(const EngineConfig& cfg) {
  if (cfg.num_threads > 0) omp_set_num_threads(cfg.num_threads);
  if (cfg.tensor_parallel_size < 1) {
    return errorf(StatusCode::kInvalidArgument, "--tensor-parallel-size must be >= 1");
  }
  LoadedModel out;
  const EnvConfig& env = env_config();
  if (cfg.tensor_parallel_size > 1 && env.launcher_size != cfg.tensor_parallel_size) {
    return errorf(StatusCode::kInvalidArgument,
                  "--tensor-parallel-size {} needs {} ranks: launch with mpirun -np {} (this "
                  "process was started with {})",
                  cfg.tensor_parallel_size, cfg.tensor_parallel_size, cfg.tensor_parallel_size,
                  env.launcher_size > 0 ? env.launcher_size : 1);
  }
  if (cfg.tensor_parallel_size > 1 || env.launcher_size > 1) {
    STRATA_ASSIGN_OR_RETURN(out.comm, make_mpi_communicator());
    if (out.comm->size() != cfg.tensor_parallel_size) {
      return errorf(StatusCode::kInvalidArgument,
                    "--tensor-parallel-size {} but {} MPI ranks were launched (use mpirun -np "
                    "{})",
                    cfg.tensor_parallel_size, out.comm->size(), cfg.tensor_parallel_size);
    }
  } else {
    out.comm = make_single_rank_communicator();
  }
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, read_model_config(cfg.model));
  out.info = make_model_info(cfg.model, config);
  if (cfg.max_model_len < 0) {
    return errorf(StatusCode::kInvalidArgument, "--max-model-len must be >= 0");
  }
  out.max_len = cfg.max_model_len > 0 ? std::min(cfg.max_model_len, config.max_position_embeddings)
                                      : config.max_position_embeddings;
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(cfg.model));
  ParallelConfig par;
  par.tp_size = out.comm->size();
  par.tp_rank = out.comm->rank();
  STRATA_ASSIGN_OR_RETURN(out.model, Model::load(config, par, ckpt));
  if (out.info.has_tokenizer) {
    const std::string tok_path = (fs::path(cfg.model) / "tokenizer.json").string();
    STRATA_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::from_hf_json(tok_path));
    out.info.has_chat_template = !out.tokenizer->chat_template().empty();
  }
  return out;
}

}  // namespace strata
