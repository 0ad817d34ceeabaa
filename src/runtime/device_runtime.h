// DeviceRuntime: what the model runner needs from the device it runs on, behind one interface
// (llama.cpp's backend habit): the ops context (stream, handles), device memory, host staging
// memory (pinned on a GPU), memory numbers, and the step runner — on CUDA a cache of captured
// graphs keyed by the step's shape, replayed over fixed buffers; on the CPU the step just runs.
// The CUDA implementation (device_runtime_cuda.cpp) is compiled only with CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "memory/kv_pool.h"
#include "ops/ops.h"
#include "strata/status.h"

namespace strata {

class Communicator;

// Weight streaming's copies (runtime/weight_streamer.h): host memory into device slots on a
// copy stream of its own, ordered against the compute stream with events. On the CPU a copy
// thread plays the copy stream (the compute is synchronous), so the same streaming logic runs
// with copies that overlap the compute.
class WeightCopier {
 public:
  virtual ~WeightCopier() = default;
  // After the compute that mark_free(slot) last recorded: dst <- src (bytes) on the copy stream;
  // then the slot is ready, and (staging >= 0) the staging buffer `staging` free again.
  virtual Status copy(int slot, void* dst, const void* src, size_t bytes, int staging) = 0;
  // Partitioned fetch (data-parallel replicas): after the copies issued so far, the in-place
  // all-gather over `comm` of `part` bytes per rank at dst (rank r's part at dst + r * part),
  // on a gather stream of its own (CUDA: copies issued later overlap it; the CPU's copy thread
  // runs it in order); then the slot is ready. A layer fetched in pieces issues copy, gather,
  // copy, gather, ...: the slot is ready after its last gather. Every rank of comm must issue
  // the same gathers in the same order.
  virtual Status gather(int slot, void* dst, size_t part, Communicator& comm) = 0;
  // The compute stream waits for the last copy into `slot`.
  virtual Status wait_ready(int slot) = 0;
  // The compute stream's work so far is the last to read `slot`.
  virtual Status mark_free(int slot) = 0;
  // Blocks the calling host thread (any thread) until the last copy out of `staging` is done.
  virtual Status wait_staging(int staging) = 0;
  // Blocks until every copy issued so far is done.
  virtual Status synchronize() = 0;
};

// KV offload's copies (--kv-offload, serving/kv_offload.h): KV blocks between the device pool and
// a host pool, on two copy streams, one per direction, so that both PCIe directions carry data
// at once. Events order the streams against each other and against the compute stream. On the
// CPU one thread per direction plays its stream, with the same ordering rules, so the offload
// logic runs with copies that really overlap the compute (a missing wait races there too); the
// CPU compute is synchronous, so an event recorded on it is complete at once.
enum class KvStream { kCompute, kToHost, kToDevice };

class KvCopier {
 public:
  using Copy = KvCopy;
  virtual ~KvCopier() = default;
  // The copies, on the stream of their direction (kToHost or kToDevice), after the work queued
  // there before. The pointed-to memory must stay valid until they are done.
  virtual Status copy(KvStream dir, std::span<const Copy> copies) = 0;
  // Event `event` (< the count the copier was made with) now marks the work queued on `s` so far.
  virtual Status record(KvStream s, int event) = 0;
  // Work queued on `s` from now on waits for `event` as last recorded.
  virtual Status wait(KvStream s, int event) = 0;
  // Blocks the calling thread until every copy queued so far is done.
  virtual Status synchronize() = 0;
};

class DeviceRuntime {
 public:
  // The CPU, or CUDA device N (kNotFound without a GPU; kUnimplemented in a build without CUDA).
  // `profile`: time the named sections of eager launches (CUDA events) and print a table at exit.
  static Result<std::unique_ptr<DeviceRuntime>> create(Device device, bool profile);
  virtual ~DeviceRuntime() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual ops::Context& ctx() = 0;
  virtual Allocator& allocator() = 0;                         // memory on the device
  virtual Result<Buffer> allocate_staging(size_t bytes) = 0;  // host memory for transfers
  virtual Result<DeviceMemoryInfo> memory_info() const = 0;
  virtual Status make_current() = 0;  // before launching from a new host thread
  // CUDA: grows the GEMM library's workspace to at least `bytes` (no-op elsewhere, and once a
  // graph was captured: graphs hold the workspace's address).
  virtual Status reserve_linear_workspace(size_t bytes) {
    (void)bytes;
    return ok_status();
  }
  // CUDA: cuda::LaunchCtx::first_use_barrier for this runtime's device (no-op elsewhere).
  virtual void set_plan_barrier(std::function<bool()>) {}
  // The copier for weight streaming with `slots` device slots and `staging` staging buffers.
  virtual Result<std::unique_ptr<WeightCopier>> make_weight_copier(int slots, int staging) = 0;
  // The copier for KV offload, with `events` events.
  virtual Result<std::unique_ptr<KvCopier>> make_kv_copier(int events) = 0;
  // Split-K attention scratch the device's attention kernels can use at these sizes (0: none).
  virtual size_t attention_workspace_bytes(int64_t max_seqs, int64_t n_heads, int64_t head_dim,
                                           int64_t max_kv_len) const = 0;

  // Runs `body` (device work on ctx()'s stream). With graphs, the first call of a key runs body
  // once eagerly (module loads, library tuning), then captures it as a graph, and every call
  // replays that graph; body must then read only the fixed buffers it captured.
  virtual Status run(bool graph, std::pair<int64_t, int64_t> key,
                     const std::function<Status()>& body) = 0;
  virtual bool supports_graphs() const = 0;
  virtual int64_t graph_captures() const = 0;
  virtual int64_t graph_replays() const = 0;
  // Median milliseconds of `fn` (device work on ctx()'s stream) over `iters` runs after `warmup`
  // runs, timed with device events on a GPU and the host clock on the CPU (benchmarks only).
  virtual Result<double> time_ms(const std::function<Status()>& fn, int warmup, int iters) = 0;
  // Labels the profiled sections of the next step (decode steps and other passes apart).
  virtual void begin_step(bool decode) { (void)decode; }
  // After a synchronize: folds finished profiled sections into the totals.
  virtual void collect_profile() {}
};

// The table the runtimes' section profiles print to stderr at exit: each section in `order`
// with its calls, total milliseconds, microseconds per call and share of the total.
void print_profile_table(const char* title, const std::vector<std::string>& order,
                         const std::map<std::string, std::pair<int64_t, double>>& totals);

// The CUDA implementation (device_runtime_cuda.cpp; kUnimplemented without CUDA).
Result<std::unique_ptr<DeviceRuntime>> make_cuda_runtime(int index, bool profile);
// CUDA devices visible to this process (0 without CUDA or without a driver).
int cuda_device_count();
// Whether CUDA loads kernels on first launch (CUDA_MODULE_LOADING=LAZY, the default) in this
// process; false without CUDA. Tensor-parallel ranks that share one GPU need eager loading: a
// lazy load waits for the whole context, where a peer's collective kernel may be spinning.
bool cuda_lazy_module_loading();

}  // namespace strata
