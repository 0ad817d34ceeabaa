// The one place strata reads environment variables. They are read once into EnvConfig and
// passed on as configuration; nothing else calls getenv.
#pragma once

#include <string>

namespace strata {

struct EnvConfig {
  int num_threads = 0;    // STRATA_NUM_THREADS (0: OpenMP default)
  std::string log_level;  // STRATA_LOG_LEVEL: debug|info|warn|error|silent
  std::string cache_dir;  // STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata, else ~/.cache/strata
  // MPI launcher rank discovery (OpenMPI, PMI, Slurm), -1 when absent.
  int launcher_rank = -1;
  int launcher_size = -1;
  int launcher_local_rank = -1;  // rank on this host (OpenMPI, MPICH/Hydra, Slurm): its GPU
  // STRATA_CPU_ISA=scalar|avx2|avx512|avx512-vnni: the best CPU kernel variant to use at most
  // (A/B runs of the SIMD variants on one machine); empty: the best the CPU supports.
  std::string cpu_isa;
  // STRATA_CPU_PREFILL=f32|int8: how CPU linear layers of 16 tokens or more (prefill, decode
  // steps of 16+ sequences) meet block-quantized weights: f32 activations through the f32 GEMM,
  // or int8 activations through the int8 GEMM (empty: int8 where the CPU runs the AVX2 or
  // AVX512-VNNI kernels, f32 on AVX-512 without VNNI and scalar; docs/performance.md).
  std::string cpu_prefill;
  // STRATA_CPU_DECODE=int16|int8: how CPU linear layers of fewer than 16 tokens (decode) meet
  // block-quantized weights with f32 activations: x rounded to int16 per 32 values (the default;
  // each element moves by at most max|x_blk| / 65534) or to int8 per 32 values through the
  // int8 kernels (llama.cpp's scheme: vpdpbusd on AVX512-VNNI; 256x coarser).
  std::string cpu_decode;
  // STRATA_CPU_NO_FUSED_PARTS=1: one-token CPU linears over several block-quantized parts
  // (q/k/v, gate/up) run part by part instead of in one OpenMP region, and a decode token's
  // attention and MLP blocks (ops::attention_block, ops::ffn) as their separate ops instead of
  // one region each (A/B of the fused paths).
  bool cpu_no_fused_parts = false;
  // STRATA_CPU_SPIN_POOL=1: a decode token's CPU kernels (the GGUF linears, the fused
  // attention and MLP blocks, attention) run their parallel loops on a spinning thread pool instead
  // of OpenMP regions (backends/cpu/spin_pool.h; an A/B switch, off by default).
  bool cpu_spin_pool = false;
  // STRATA_HUGEPAGES=1: a GGUF file is read into anonymous memory of transparent huge pages
  // (2 MiB, madvise) instead of mapped in place (core/mapped_file.h, MapMode::kHugePageCopy).
  bool hugepages = false;
  // STRATA_CPU_AMX=1: the int8 GEMM of CPU prefill runs its micro-kernel on AMX tiles on CPUs with
  // AMX-INT8 (same output bits as the AVX512-VNNI one). Off by default: slower than the VNNI
  // kernel where measured (docs/performance.md, seventeenth session).
  bool cpu_amx = false;
  // CUDA backend switches (A/B measurements and profiling; see docs/performance.md).
  // STRATA_PROFILE=1 (or its old name STRATA_CUDA_PROFILE=1): a table of the forward pass's
  // sections at exit, timed by CUDA events (eager launches) or the host clock on the CPU.
  bool profile = false;
  bool no_autotune = false;  // STRATA_NO_AUTOTUNE=1: cuBLASLt keeps its heuristic's first pick
  bool no_pdl = false;       // STRATA_NO_PDL=1: no programmatic dependent launch
  int sbi_prefetch = -1;     // STRATA_SBI_PREFETCH=N (0..8): SBI-GeMM L2 prefetch depth; -1 default
  // STRATA_DECODE_CTAS_PER_SM=N (1..16): the split-K decode attention splits each sequence's
  // KV cache until N CTAs per SM run at most (-1: the default, as many as an SM holds).
  int decode_ctas_per_sm = -1;
  // STRATA_NO_I8_GEMM=1: int8 weights above the SBI crossover run SBI-GeMM in 64-token slices
  // (bf16 activations) instead of the int8 x int8 cuBLASLt GEMM with int8 activations (A/B).
  bool no_i8_gemm = false;
  // STRATA_NO_FP8_SCALED_GEMM=1: fp8 GEMMs above the SBI crossover write an f32 scratch and
  // apply the per-token and per-row scales in a separate epilogue kernel instead of inside
  // cuBLASLt (outer-vector scaling; A/B).
  bool no_fp8_scaled_gemm = false;
  // STRATA_GGUF_DEQUANT=1: GGUF block-quantized linear weights are dequantized to bf16 on the
  // host for the device layout (the old path, for A/B) instead of kept in their block format.
  bool gguf_dequant = false;
  // Tensor parallelism on GPUs.
  std::string nccl_library;  // STRATA_NCCL_LIBRARY: path of libnccl.so.2 (default: the loader's)
  // STRATA_ONESHOT_MAX_BYTES: device all-reduces / all-gathers up to this size take the one-shot
  // kernels when ranks can read each other's memory; larger ones NCCL (-1: the default).
  long long oneshot_max_bytes = -1;
  bool tp_one_gpu = false;  // STRATA_TP_ONE_GPU=1: in-process ranks share one GPU (testing)
  // STRATA_PP_STAGE_GATE=0|1: in-process pipeline stages pass through the StageGate
  // (runtime/stage_gate.h) never / always (A/B); -1 (unset): only tensor-parallel stages on GPUs.
  int pp_stage_gate = -1;
  // STRATA_MOE_EP_FIXED_TOKENS=N: expert-parallel steps of at most N tokens take the
  // fixed-capacity exchange (model/moe_ep.h; 0: none, the variable splits and eager steps, for
  // A/B runs); -1: max_num_seqs (every decode step, graph-captured).
  long long moe_ep_fixed_tokens = -1;
  // STRATA_MOE_EP_NO_COUNTED=1: the fixed-capacity exchange moves whole C-row blocks instead of
  // only the rows really routed (EpExchange::counted; A/B of the counted all-to-all).
  bool moe_ep_no_counted = false;
  // STRATA_MOE_EP_NO_FUSED=1: the counted exchange is composed from plans, packs and
  // all_to_all_rows even where the communicator has fused kernels (EpExchange::fused; A/B).
  bool moe_ep_no_fused = false;
  // STRATA_COLLECTIVE_TIMEOUT=S: a forward pass of in-process ranks / stages (or a wait for a
  // peer) that takes longer than S seconds aborts the communicators and fails with an error
  // naming the ranks still running, instead of hanging (default 300).
  int collective_timeout_s = 300;
  // STRATA_NO_FUSED_ALLREDUCE=1: a row-parallel layer's all-reduce, bias, residual add and next
  // norm run as separate kernels (A/B of the fused one-shot kernel).
  bool no_fused_allreduce = false;
  // The Hugging Face Hub (models by hub id, include/strata/hub.h), named as huggingface_hub
  // names them.
  std::string hf_hub_cache;  // HF_HUB_CACHE (or HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else
                             // $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
  std::string hf_home;       // HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface
  std::string hf_endpoint;   // HF_ENDPOINT (default https://huggingface.co)
  std::string hf_token;      // HF_TOKEN (else the token file, read when needed)
  std::string hf_token_path;        // HF_TOKEN_PATH, else $HF_HOME/token
  bool hf_offline = false;          // HF_HUB_OFFLINE=1 (also true, yes, on)
  double hf_download_timeout = 10;  // HF_HUB_DOWNLOAD_TIMEOUT, seconds
};

const EnvConfig& env_config();

}  // namespace strata
