// bench_attention: CUDA-event timings of the varlen paged attention kernels on the GPU.
//
//   prefill: flash_prefill for 1 x 2048 and 8 x 2048 tokens (whole causal prefills), 32 query
//            heads on 8 KV heads, head_dim 128 (Llama-3-8B), block sizes 16 and 64, every tile
//            shape (flash_tiles.h; "auto" is what flash_prefill picks), plus SmolLM2-135M's
//            9 / 3 heads of 64. TFLOP/s counts the causal FLOPs: 4 * n_q * n_kv * d / 2 per
//            head and sequence (QK^T and PV, the masked half not counted).
//   decode:  flash_decode (one query per sequence) for batch 1 / 16 / 64 at kv_len 256 and 4096
//            (--seqs, --kv), same heads, split (with the workspace) and unsplit. GB/s counts
//            the K and V bytes read once: n_seqs * kv_len * n_heads_kv * head_dim * 2 (K, V) *
//            2 bytes. "cold" overwrites a 256 MiB buffer before every repetition, so the cache
//            comes from HBM as in a real decode step (an 8B model's KV of one layer is evicted
//            by the other layers' weights); "hot" repeats on an L2-resident cache when it fits.
// Times are medians of --reps repetitions after --warmup ones, each between two CUDA events.
//
//   bench_attention [--reps 20] [--warmup 3] [--only prefill|decode] [--seqs 1,16,64]
//                   [--kv 256,4096] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/flash_tiles.h"

namespace {

using strata::Status;
using strata::VarlenAttentionParams;
using strata::cuda::FlashPrefillTile;
using strata::cuda::LaunchCtx;

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    const cudaError_t e_ = (call);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

struct Options {
  int reps = 20;
  int warmup = 3;
  std::string only;
  std::string json;
  std::vector<int64_t> seqs = {1, 16, 64};  // decode batches
  std::vector<int64_t> kv = {256, 4096};    // decode KV lengths
};

// "1,16,64" -> {1, 16, 64}; false on anything but positive integers.
bool parse_list(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return false;
    out->push_back(std::stoll(item));
    if (out->back() <= 0) return false;
    i = j + 1;
  }
  return !out->empty();
}

// Device buffers of one benchmark shape: every sequence has n_q queries at the end of kv_len
// cached positions; blocks of the pool are assigned in shuffled order (a fragmented pool).
struct Shape {
  int64_t n_seqs, n_q, kv_len, n_heads, n_heads_kv, head_dim, block_size;
};

class Buffers {
 public:
  explicit Buffers(const Shape& s) : s_(s) {
    const int64_t blocks_per_seq = (s.kv_len + s.block_size - 1) / s.block_size;
    n_blocks_ = s.n_seqs * blocks_per_seq;
    max_blocks_ = blocks_per_seq;
    const size_t cache_elems =
        static_cast<size_t>(n_blocks_ * s.block_size * s.n_heads_kv * s.head_dim);
    const size_t q_elems = static_cast<size_t>(s.n_seqs * s.n_q * s.n_heads * s.head_dim);
    CHECK_CUDA(cudaMalloc(&k_, cache_elems * 2));
    CHECK_CUDA(cudaMalloc(&v_, cache_elems * 2));
    CHECK_CUDA(cudaMalloc(&q_, q_elems * 2));
    CHECK_CUDA(cudaMalloc(&out_, q_elems * 2));
    // Byte 0x3c: every bf16 is 0x3c3c (~0.0115); the timing does not depend on the values.
    CHECK_CUDA(cudaMemset(k_, 0x3c, cache_elems * 2));
    CHECK_CUDA(cudaMemset(v_, 0x3c, cache_elems * 2));
    CHECK_CUDA(cudaMemset(q_, 0x3c, q_elems * 2));
    std::vector<int32_t> ids(static_cast<size_t>(n_blocks_));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(1);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> cu_q(static_cast<size_t>(s.n_seqs + 1));
    for (int64_t i = 0; i <= s.n_seqs; ++i) cu_q[i] = static_cast<int32_t>(i * s.n_q);
    std::vector<int32_t> kv(static_cast<size_t>(s.n_seqs), static_cast<int32_t>(s.kv_len));
    tables_ = upload(ids);
    cu_q_ = upload(cu_q);
    kv_len_ = upload(kv);
  }
  ~Buffers() {
    for (void* p : {static_cast<void*>(k_), static_cast<void*>(v_), static_cast<void*>(q_),
                    static_cast<void*>(out_), static_cast<void*>(tables_),
                    static_cast<void*>(cu_q_), static_cast<void*>(kv_len_), ws_}) {
      cudaFree(p);
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  VarlenAttentionParams params(bool workspace) {
    const int64_t row = s_.n_heads * s_.head_dim;
    VarlenAttentionParams p{.q = q_,
                            .q_stride = row,
                            .out = out_,
                            .out_stride = row,
                            .cu_q = cu_q_,
                            .kv_len = kv_len_,
                            .n_seqs = s_.n_seqs,
                            .n_heads = s_.n_heads,
                            .max_q_len = s_.n_q,
                            .max_kv_len = s_.kv_len,
                            .cache = {.k_cache = k_,
                                      .v_cache = v_,
                                      .block_tables = tables_,
                                      .max_blocks_per_seq = max_blocks_,
                                      .n_seqs = s_.n_seqs,
                                      .n_blocks = n_blocks_,
                                      .block_size = s_.block_size,
                                      .n_heads_kv = s_.n_heads_kv,
                                      .head_dim = s_.head_dim},
                            .scale = 1.0f / std::sqrt(static_cast<float>(s_.head_dim))};
    if (workspace) {
      const size_t bytes = strata::cuda::varlen_attention_workspace_bytes(s_.n_seqs, s_.n_heads,
                                                                          s_.head_dim, s_.kv_len);
      if (ws_ == nullptr && bytes > 0) CHECK_CUDA(cudaMalloc(&ws_, bytes));
      p.workspace = ws_;
      p.workspace_bytes = ws_ ? bytes : 0;
    }
    return p;
  }

 private:
  static int32_t* upload(const std::vector<int32_t>& v) {
    int32_t* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(int32_t)));
    CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
  }

  Shape s_;
  int64_t n_blocks_ = 0, max_blocks_ = 0;
  uint16_t *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *out_ = nullptr;
  int32_t *tables_ = nullptr, *cu_q_ = nullptr, *kv_len_ = nullptr;
  void* ws_ = nullptr;
};

// Median milliseconds of run() between two events; flush (if set) runs before each repetition,
// outside the events.
template <class Run>
double median_ms(const LaunchCtx& ctx, const Options& o, void* flush, size_t flush_bytes,
                 Run&& run) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < o.warmup; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < o.reps; ++i) {
    if (flush) CHECK_CUDA(cudaMemsetAsync(flush, i & 0xff, flush_bytes, ctx.stream));
    CHECK_CUDA(cudaEventRecord(a, ctx.stream));
    run();
    CHECK_CUDA(cudaEventRecord(b, ctx.stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

const char* tile_name(FlashPrefillTile t) {
  switch (t) {
    case FlashPrefillTile::kAuto:
      return "auto";
    case FlashPrefillTile::kW4M64N64:
      return "w4m64n64";
    case FlashPrefillTile::kW8M128N64:
      return "w8m128n64";
    case FlashPrefillTile::kW4M128N32:
      return "w4m128n32";
    case FlashPrefillTile::kW4M128N64:
      return "w4m128n64";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string val = argv[i + 1];
    if (flag == "--reps") {
      o.reps = std::max(1, std::stoi(val));
    } else if (flag == "--warmup") {
      o.warmup = std::max(0, std::stoi(val));
    } else if (flag == "--only") {
      o.only = val;
    } else if (flag == "--json") {
      o.json = val;
    } else if (flag == "--seqs" || flag == "--kv") {
      if (!parse_list(val, flag == "--seqs" ? &o.seqs : &o.kv)) {
        std::fprintf(stderr, "%s: expected a list of positive integers, got '%s'\n", flag.c_str(),
                     val.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  auto dev = strata::cuda::CudaDevice::create(0);
  if (!dev.ok()) {
    std::fprintf(stderr, "%s\n", dev.status().to_string().c_str());
    return 1;
  }
  const LaunchCtx& ctx = (*dev)->launch_ctx();
  std::printf("device: %s, %d SMs\n", (*dev)->name().c_str(), ctx.sm_count);
  nlohmann::json results = nlohmann::json::array();

  if (o.only.empty() || o.only == "prefill") {
    std::printf("\nflash_prefill (causal TFLOP/s = 2 n^2 d per head and sequence / time)\n");
    std::printf("%-5s %-6s %-7s %-4s %-3s %-10s %10s %9s\n", "seqs", "tokens", "heads", "d", "bs",
                "tile", "ms", "TFLOP/s");
    const Shape shapes[] = {{1, 2048, 2048, 32, 8, 128, 16}, {8, 2048, 2048, 32, 8, 128, 16},
                            {1, 2048, 2048, 32, 8, 128, 64}, {8, 2048, 2048, 32, 8, 128, 64},
                            {1, 2048, 2048, 9, 3, 64, 16},   {8, 2048, 2048, 9, 3, 64, 16}};
    for (const Shape& s : shapes) {
      Buffers buf(s);
      const VarlenAttentionParams p = buf.params(false);
      const double flops = 4.0 * s.n_seqs * s.n_heads * s.n_q * s.kv_len * s.head_dim / 2.0;
      for (FlashPrefillTile t :
           {FlashPrefillTile::kAuto, FlashPrefillTile::kW4M64N64, FlashPrefillTile::kW8M128N64,
            FlashPrefillTile::kW4M128N32, FlashPrefillTile::kW4M128N64}) {
        const double ms = median_ms(ctx, o, nullptr, 0, [&] {
          check(strata::cuda::flash_prefill_tile(ctx, p, t), "flash_prefill");
        });
        const double tflops = flops / (ms * 1e-3) / 1e12;
        const std::string heads = std::to_string(s.n_heads) + "/" + std::to_string(s.n_heads_kv);
        std::printf("%-5lld %-6lld %-7s %-4lld %-3lld %-10s %10.4f %9.1f\n",
                    static_cast<long long>(s.n_seqs), static_cast<long long>(s.n_q), heads.c_str(),
                    static_cast<long long>(s.head_dim), static_cast<long long>(s.block_size),
                    tile_name(t), ms, tflops);
        results.push_back({{"kernel", "flash_prefill"},
                           {"tile", tile_name(t)},
                           {"n_seqs", s.n_seqs},
                           {"q_len", s.n_q},
                           {"kv_len", s.kv_len},
                           {"n_heads", s.n_heads},
                           {"n_heads_kv", s.n_heads_kv},
                           {"head_dim", s.head_dim},
                           {"block_size", s.block_size},
                           {"median_ms", ms},
                           {"tflops_causal", tflops}});
      }
    }
  }

  if (o.only.empty() || o.only == "decode") {
    const size_t flush_bytes = size_t{256} << 20;
    void* flush = nullptr;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    std::printf("\nflash_decode (GB/s = K and V bytes / time)\n");
    std::printf("%-5s %-6s %-7s %-4s %-3s %-8s %10s %9s %10s %9s\n", "seqs", "kv_len", "heads", "d",
                "bs", "mode", "cold ms", "GB/s", "hot ms", "GB/s");
    for (int64_t n_seqs : o.seqs) {
      for (int64_t kv : o.kv) {
        const Shape s{n_seqs, 1, kv, 32, 8, 128, 16};
        Buffers buf(s);
        const double bytes = 2.0 * 2.0 * n_seqs * kv * s.n_heads_kv * s.head_dim;
        for (bool split : {true, false}) {
          const VarlenAttentionParams p = buf.params(split);
          auto run = [&] { check(strata::cuda::flash_decode(ctx, p), "flash_decode"); };
          const double cold = median_ms(ctx, o, flush, flush_bytes, run);
          const double hot = median_ms(ctx, o, nullptr, 0, run);
          const std::string heads = std::to_string(s.n_heads) + "/" + std::to_string(s.n_heads_kv);
          std::printf("%-5lld %-6lld %-7s %-4lld %-3lld %-8s %10.4f %9.1f %10.4f %9.1f\n",
                      static_cast<long long>(n_seqs), static_cast<long long>(kv), heads.c_str(),
                      static_cast<long long>(s.head_dim), static_cast<long long>(s.block_size),
                      split ? "split" : "unsplit", cold, bytes / (cold * 1e-3) / 1e9, hot,
                      bytes / (hot * 1e-3) / 1e9);
          results.push_back({{"kernel", "flash_decode"},
                             {"mode", split ? "split" : "unsplit"},
                             {"n_seqs", n_seqs},
                             {"kv_len", kv},
                             {"n_heads", s.n_heads},
                             {"n_heads_kv", s.n_heads_kv},
                             {"head_dim", s.head_dim},
                             {"block_size", s.block_size},
                             {"cold_median_ms", cold},
                             {"cold_gbps", bytes / (cold * 1e-3) / 1e9},
                             {"hot_median_ms", hot},
                             {"hot_gbps", bytes / (hot * 1e-3) / 1e9}});
        }
      }
    }
    cudaFree(flush);
  }

  if (!o.json.empty()) {
    const nlohmann::json doc = {{"device", (*dev)->name()},
                                {"sm_count", ctx.sm_count},
                                {"reps", o.reps},
                                {"results", results}};
    std::ofstream f(o.json);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return 0;
}
