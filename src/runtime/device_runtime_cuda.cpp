// The CUDA DeviceRuntime: a CudaDevice (stream, cuBLASLt handle and plans), cudaMalloc'd device
// memory, pinned staging, the CUDA-graph cache of decode steps, and the event profiler
// (STRATA_CUDA_PROFILE=1). Compiled only in CUDA builds.
#if STRATA_HAS_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_allocator.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/status.h"
#include "parallel/comm.h"
#include "runtime/device_runtime.h"

namespace strata {

namespace {

// Events around each named section of eager launches; a table at exit. Sections of decode steps
// (one token per sequence) and of other passes are kept apart by the runner's prefix.
class EventProfiler final : public ops::Profiler {
 public:
  explicit EventProfiler(cudaStream_t stream) : stream_(stream) {}
  ~EventProfiler() override {
    report();
    for (Pending& ev : pending_) pool_.push_back(ev.begin);
    for (cudaEvent_t e : pool_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
  void set_prefix(const char* prefix) { prefix_ = prefix; }

  void section(const char* name) override {
    if (!pending_.empty() && pending_.back().end == nullptr) {
      cudaEvent_t e = event();
      (void)cudaEventRecord(e, stream_);
      pending_.back().end = e;
    }
    if (name != nullptr) {
      const std::string key = std::string(prefix_) + name;
      const char* stable = names_.try_emplace(key, key).first->second.c_str();
      cudaEvent_t b = event();
      (void)cudaEventRecord(b, stream_);
      pending_.push_back({stable, b, nullptr});
    }
  }

  void collect() {
    for (Pending& ev : pending_) {
      float ms = 0.0f;
      if (ev.end != nullptr && cudaEventElapsedTime(&ms, ev.begin, ev.end) == cudaSuccess) {
        auto [it, fresh] = totals_.try_emplace(ev.name, 0, 0.0);
        if (fresh) order_.push_back(ev.name);
        it->second.first++;
        it->second.second += ms;
      }
      pool_.push_back(ev.begin);
      if (ev.end != nullptr) pool_.push_back(ev.end);
    }
    pending_.clear();
  }

 private:
  struct Pending {
    const char* name;
    cudaEvent_t begin, end;
  };
  cudaEvent_t event() {
    if (!pool_.empty()) {
      cudaEvent_t e = pool_.back();
      pool_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    (void)cudaEventCreate(&e);
    return e;
  }
  void report() {
    print_profile_table("CUDA profile (eager launches, event-timed sections)", order_, totals_);
  }

  cudaStream_t stream_;
  const char* prefix_ = "";
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, std::string> names_;
  std::map<std::string, std::pair<int64_t, double>> totals_;
  std::vector<std::string> order_;
};

// Weight streaming's copies on a non-blocking stream of their own: a slot's copy waits for the
// compute that last read it (free event), the compute waits for the copy (ready event).
// Partitioned fetch's all-gathers run on a second non-blocking stream (gather_), each after the
// copies issued before it (copied_ event), so the host link keeps copying the next piece while
// the peer links gather the last one; the slot's ready event is then recorded there.
// STRATA_FETCH_ONE_STREAM=1 puts the all-gathers on the copy stream instead (the schedule before
// the gather stream, for A/B).
class CudaCopier final : public WeightCopier {
 public:
  static Result<std::unique_ptr<WeightCopier>> create(int device, cudaStream_t compute, int slots,
                                                      int staging) {
    std::unique_ptr<CudaCopier> c(new CudaCopier());
    c->device_ = device;
    c->compute_ = compute;
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->copy_, cudaStreamNonBlocking));
    const char* one = std::getenv("STRATA_FETCH_ONE_STREAM");
    if (one != nullptr && std::string(one) == "1") {
      c->gather_ = c->copy_;
    } else {
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->gather_, cudaStreamNonBlocking));
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&c->copied_, cudaEventDisableTiming));
    }
    auto make = [](std::vector<cudaEvent_t>& v, int n) -> Status {
      for (int i = 0; i < n; ++i) {
        cudaEvent_t e = nullptr;
        STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        v.push_back(e);
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(make(c->ready_, slots));
    STRATA_RETURN_IF_ERROR(make(c->free_, slots));
    STRATA_RETURN_IF_ERROR(make(c->staging_, staging));
    return std::unique_ptr<WeightCopier>(std::move(c));
  }
  ~CudaCopier() override {
    (void)cudaSetDevice(device_);
    if (copy_ != nullptr) (void)cudaStreamSynchronize(copy_);
    const bool own_gather = gather_ != nullptr && gather_ != copy_;
    if (own_gather) (void)cudaStreamSynchronize(gather_);
    for (auto* v : {&ready_, &free_, &staging_}) {
      for (cudaEvent_t e : *v) (void)cudaEventDestroy(e);
    }
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
    if (part_ready_ != nullptr) (void)cudaEventDestroy(part_ready_);
    if (read_done_ != nullptr) (void)cudaEventDestroy(read_done_);
    if (own_gather) (void)cudaStreamDestroy(gather_);
    if (copy_ != nullptr) (void)cudaStreamDestroy(copy_);
  }
  Status copy(int slot, void* dst, const void* src, size_t bytes, int staging) override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, free_[static_cast<size_t>(slot)], 0));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_));
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[static_cast<size_t>(slot)], copy_));
    if (staging >= 0) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_[static_cast<size_t>(staging)], copy_));
    }
    return ok_status();
  }
  Status gather(int slot, void* dst, size_t part, Communicator& comm) override {
    if (std::strcmp(comm.name(), "in-process") == 0) return gather_shared(slot, dst, part, comm);
    // On the gather stream after this rank's part arrived (the copies issued so far): NCCL fills
    // the peers' parts in place while the copy stream goes on with the next piece; the compute
    // stream waits for it via ready_. The wait takes copied_ as recorded now, so one event
    // serves every piece.
    if (gather_ != copy_) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_, copy_));
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gather_, copied_, 0));
    }
    CommStream s;
    s.device = Device::cuda(device_);
    s.cuda_stream = gather_;
    // Moved as bf16 elements (parts are multiples of 256 bytes): the one-shot kernels take f32
    // and bf16 only, and an all-gather only copies.
    const auto n = static_cast<int64_t>(part / 2);
    STRATA_RETURN_IF_ERROR(
        comm.all_gather(static_cast<uint8_t*>(dst) + part * static_cast<size_t>(comm.rank()), n,
                        DType::kBF16, dst, s));
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[static_cast<size_t>(slot)], gather_));
    return ok_status();
  }
  // Replicas of one process on one GPU (the in-process group; how the tests run partitioned
  // fetch). No kernel may spin for a peer here: a host thread that waits for the whole device
  // (cuBLASLt loading a kernel library, cudaFree) would wait for that kernel while the peer it
  // spins for is that thread (PartitionedFetchCuda.FixturesEqualResident stopped after the
  // one-shot kernels' ~10 s on an H100). So the ranks meet on the host instead, and every wait
  // on the device is for work already queued:
  //   1. each rank records part_ready_ after its copies and exchanges it with its slot address;
  //   2. each copies the peers' parts device to device on the gather stream, after their events,
  //      then records read_done_ and the slot's ready event;
  //   3. the ranks exchange read_done_, and each copy stream waits for the peers' before it
  //      writes this rank's part again (the peers read it in step 2).
  // An event is re-recorded only after the next exchange, which every peer reaches after its
  // waits on the previous record.
  Status gather_shared(int slot, void* dst, size_t part, Communicator& comm) {
    if (part_ready_ == nullptr) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&part_ready_, cudaEventDisableTiming));
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&read_done_, cudaEventDisableTiming));
    }
    const int n = comm.size();
    const int me = comm.rank();
    CommStream host;  // the exchanges are host memory
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(part_ready_, copy_));
    const int64_t mine[3] = {static_cast<int64_t>(reinterpret_cast<intptr_t>(dst)), device_,
                             static_cast<int64_t>(reinterpret_cast<intptr_t>(part_ready_))};
    std::vector<int64_t> all(static_cast<size_t>(3 * n));
    STRATA_RETURN_IF_ERROR(comm.all_gather(mine, 3, DType::kI64, all.data(), host));
    for (int p = 0; p < n; ++p) {
      if (all[static_cast<size_t>(3 * p + 1)] != device_) {
        return errorf(StatusCode::kFailedPrecondition,
                      "partitioned fetch: replica {} is on GPU {} and replica {} on GPU {}; "
                      "replicas on several GPUs gather through NCCL",
                      me, device_, p, all[static_cast<size_t>(3 * p + 1)]);
      }
    }
    auto* out = static_cast<uint8_t*>(dst);
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gather_, part_ready_, 0));  // this rank's
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto* peer =
          reinterpret_cast<const uint8_t*>(static_cast<intptr_t>(all[static_cast<size_t>(3 * p)]));
      auto* ev =
          reinterpret_cast<cudaEvent_t>(static_cast<intptr_t>(all[static_cast<size_t>(3 * p + 2)]));
      const size_t at = part * static_cast<size_t>(p);
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gather_, ev, 0));
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(out + at, peer + at, part, cudaMemcpyDeviceToDevice, gather_));
    }
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(read_done_, gather_));
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[static_cast<size_t>(slot)], gather_));
    const int64_t done = static_cast<int64_t>(reinterpret_cast<intptr_t>(read_done_));
    std::vector<int64_t> dones(static_cast<size_t>(n));
    STRATA_RETURN_IF_ERROR(comm.all_gather(&done, 1, DType::kI64, dones.data(), host));
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(
          copy_,
          reinterpret_cast<cudaEvent_t>(static_cast<intptr_t>(dones[static_cast<size_t>(p)])), 0));
    }
    return ok_status();
  }
  Status wait_ready(int slot) override {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(compute_, ready_[static_cast<size_t>(slot)], 0));
    return ok_status();
  }
  Status mark_free(int slot) override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[static_cast<size_t>(slot)], compute_));
    return ok_status();
  }
  Status wait_staging(int staging) override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // any host thread
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_[static_cast<size_t>(staging)]));
    return ok_status();
  }
  Status synchronize() override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
    if (gather_ != copy_) STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(gather_));
    return ok_status();
  }

 private:
  CudaCopier() = default;
  int device_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cudaStream_t gather_ = nullptr;  // partitioned fetch's all-gathers (copy_ with ONE_STREAM)
  cudaEvent_t copied_ = nullptr;   // the copy stream's work before the next all-gather
  // gather_shared: this rank's part is in; the peers' parts are read out of their slots.
  cudaEvent_t part_ready_ = nullptr, read_done_ = nullptr;
  std::vector<cudaEvent_t> ready_, free_, staging_;
};

// KV offload's copies: one non-blocking stream per direction (an H100's copy engines run a
// host-to-device and a device-to-host copy at once), events between them and the compute stream.
// A batch of block copies goes out as one cudaMemcpyBatchAsync (one call for thousands of
// block-sized pieces); a driver without it gets one cudaMemcpyAsync per piece.
class CudaKvCopier final : public KvCopier {
 public:
  static Result<std::unique_ptr<KvCopier>> create(int device, cudaStream_t compute, int events) {
    std::unique_ptr<CudaKvCopier> c(new CudaKvCopier());
    c->device_ = device;
    c->compute_ = compute;
    for (cudaStream_t* s : {&c->to_host_, &c->to_device_}) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    for (int i = 0; i < events; ++i) {
      cudaEvent_t e = nullptr;
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      c->events_.push_back(e);
      // Recorded once, so a wait before the first real record waits for nothing.
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, compute));
    }
    return std::unique_ptr<KvCopier>(std::move(c));
  }
  ~CudaKvCopier() override {
    (void)cudaSetDevice(device_);
    for (cudaStream_t s : {to_host_, to_device_}) {
      if (s != nullptr) (void)cudaStreamSynchronize(s);
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    for (cudaStream_t s : {to_host_, to_device_}) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
    }
  }
  Status copy(KvStream dir, std::span<const Copy> copies) override {
    if (dir == KvStream::kCompute) {
      return Status(StatusCode::kInvalidArgument, "KvCopier::copy: not a copy stream");
    }
    if (copies.empty()) return ok_status();
    const cudaStream_t s = stream(dir);
    if (batch_ok_) {
      dsts_.clear();
      srcs_.clear();
      sizes_.clear();
      for (const Copy& c : copies) {
        dsts_.push_back(c.dst);
        srcs_.push_back(c.src);
        sizes_.push_back(c.bytes);
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
      const cudaError_t e = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(),
                                                 copies.size(), &attr, &attr_idx, 1, s);
      if (e == cudaSuccess) return ok_status();
      (void)cudaGetLastError();
      batch_ok_ = false;  // an older driver: one call per copy from now on
    }
    const cudaMemcpyKind kind =
        dir == KvStream::kToHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    for (const Copy& c : copies) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c.dst, c.src, c.bytes, kind, s));
    }
    return ok_status();
  }
  Status record(KvStream s, int event) override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_.at(static_cast<size_t>(event)), stream(s)));
    return ok_status();
  }
  Status wait(KvStream s, int event) override {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream(s), events_.at(static_cast<size_t>(event)), 0));
    return ok_status();
  }
  Status synchronize() override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(to_host_));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(to_device_));
    return ok_status();
  }

 private:
  CudaKvCopier() = default;
  cudaStream_t stream(KvStream s) const {
    switch (s) {
      case KvStream::kCompute:
        return compute_;
      case KvStream::kToHost:
        return to_host_;
      case KvStream::kToDevice:
        return to_device_;
    }
    return compute_;
  }
  int device_ = 0;
  cudaStream_t compute_ = nullptr, to_host_ = nullptr, to_device_ = nullptr;
  std::vector<cudaEvent_t> events_;
  bool batch_ok_ = true;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  static Result<std::unique_ptr<DeviceRuntime>> create(int index, bool profile) {
    std::unique_ptr<CudaRuntime> r(new CudaRuntime());
    STRATA_ASSIGN_OR_RETURN(r->dev_, cuda::CudaDevice::create(index));
    r->alloc_ = std::make_unique<cuda::CudaMallocAllocator>(index);
    r->ctx_.device = Device::cuda(index);
    r->ctx_.cuda = &r->dev_->launch_ctx();
    if (profile) {
      r->profiler_ = std::make_unique<EventProfiler>(r->dev_->launch_ctx().stream);
      r->ctx_.profiler = r->profiler_.get();
    }
    return std::unique_ptr<DeviceRuntime>(std::move(r));
  }
  void set_plan_barrier(std::function<bool()> f) override {
    barrier_ = f;
    dev_->set_first_use_barrier(std::move(f));
  }
  Status reserve_linear_workspace(size_t bytes) override {
    if (graph_captures() > 0) return ok_status();
    return dev_->reserve_workspace(bytes);
  }
  ~CudaRuntime() override {
    if (dev_) (void)dev_->make_current();
    profiler_.reset();
    for (auto& [k, g] : graphs_) (void)cudaGraphExecDestroy(g);
  }

  Device device() const override { return Device::cuda(dev_->index()); }
  std::string name() const override { return dev_->name(); }
  ops::Context& ctx() override { return ctx_; }
  Allocator& allocator() override { return *alloc_; }
  Result<Buffer> allocate_staging(size_t bytes) override {
    return cuda::allocate_pinned_host(bytes);
  }
  Result<DeviceMemoryInfo> memory_info() const override { return dev_->memory_info(); }
  Status make_current() override { return dev_->make_current(); }
  Result<std::unique_ptr<WeightCopier>> make_weight_copier(int slots, int staging) override {
    STRATA_RETURN_IF_ERROR(dev_->make_current());
    return CudaCopier::create(dev_->index(), dev_->launch_ctx().stream, slots, staging);
  }
  Result<std::unique_ptr<KvCopier>> make_kv_copier(int events) override {
    STRATA_RETURN_IF_ERROR(dev_->make_current());
    return CudaKvCopier::create(dev_->index(), dev_->launch_ctx().stream, events);
  }
  size_t attention_workspace_bytes(int64_t max_seqs, int64_t n_heads, int64_t head_dim,
                                   int64_t max_kv_len) const override {
    return cuda::varlen_attention_workspace_bytes(max_seqs, n_heads, head_dim, max_kv_len);
  }

  Status run(bool graph, std::pair<int64_t, int64_t> key,
             const std::function<Status()>& body) override {
    if (!graph) return body();
    const cudaStream_t stream = dev_->launch_ctx().stream;
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      // One eager pass first: it loads the kernels' modules and lets cuBLASLt time its
      // algorithms for these shapes (neither can happen during capture). It writes the same K/V
      // values the replay will write, so running it is harmless.
      STRATA_RETURN_IF_ERROR(body());
      // Ranks that meet at first uses (set_plan_barrier) meet around the capture too: every
      // rank's eager pass drained before any rank instantiates, every graph instantiated before
      // any is launched. cudaGraphInstantiate can wait for the GPU, which on a shared GPU does not
      // go idle while a peer's one-shot all-reduce spins for this rank (Llama-3-8B at in-process
      // TP = 2 on one H100 stopped at its first batch-64 step: one rank in cudaGraphInstantiate,
      // the other's graph spinning in the all-reduce).
      STRATA_RETURN_IF_ERROR(meet(stream, "before capturing"));
      cudaGraph_t g = nullptr;
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      Status s = body();
      const cudaError_t end = cudaStreamEndCapture(stream, &g);
      if (!s.ok()) {
        if (g != nullptr) (void)cudaGraphDestroy(g);
        return s.with_context("cuda graph capture");
      }
      STRATA_CUDA_RETURN_IF_ERROR(end);
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
      (void)cudaGraphDestroy(g);
      STRATA_CUDA_RETURN_IF_ERROR(inst);
      it = graphs_.emplace(key, exec).first;
      ++captures_;
      STRATA_CUDA_RETURN_IF_ERROR(cudaGraphUpload(exec, stream));
      STRATA_RETURN_IF_ERROR(meet(stream, "after instantiating"));
    }
    STRATA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream));
    ++replays_;
    return ok_status();
  }
  bool supports_graphs() const override { return profiler_ == nullptr; }
  // Drains this rank's stream, then waits for the ranks of set_plan_barrier (none: returns).
  Status meet(cudaStream_t stream, const char* when) {
    if (!barrier_) return ok_status();
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (!barrier_()) {
      return errorf(StatusCode::kCancelled,
                    "cuda graph: the process's ranks were aborted {} (a rank failed)", when);
    }
    return ok_status();
  }
  Result<double> time_ms(const std::function<Status()>& fn, int warmup, int iters) override {
    const cudaStream_t stream = dev_->launch_ctx().stream;
    for (int i = 0; i < warmup; ++i) STRATA_RETURN_IF_ERROR(fn());
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
    const cudaError_t c1 = cudaEventCreate(&e1);
    if (c1 != cudaSuccess) {
      (void)cudaEventDestroy(e0);
      STRATA_CUDA_RETURN_IF_ERROR(c1);
    }
    std::vector<double> ms;
    Status st = ok_status();
    for (int i = 0; i < iters && st.ok(); ++i) {
      (void)cudaEventRecord(e0, stream);
      st = fn();
      (void)cudaEventRecord(e1, stream);
      float t = 0.0f;
      if (st.ok() && cudaEventSynchronize(e1) == cudaSuccess &&
          cudaEventElapsedTime(&t, e0, e1) == cudaSuccess) {
        ms.push_back(t);
      }
    }
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
    STRATA_RETURN_IF_ERROR(st);
    if (ms.empty()) return 0.0;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  int64_t graph_captures() const override { return captures_; }
  int64_t graph_replays() const override { return replays_; }
  void begin_step(bool decode) override {
    if (profiler_) profiler_->set_prefix(decode ? "decode/" : "prefill/");
  }
  void collect_profile() override {
    if (profiler_) profiler_->collect();
  }

 private:
  CudaRuntime() = default;
  std::unique_ptr<cuda::CudaDevice> dev_;
  std::unique_ptr<cuda::CudaMallocAllocator> alloc_;
  std::unique_ptr<EventProfiler> profiler_;
  std::function<bool()> barrier_;  // set_plan_barrier: the ranks that meet around first uses
  ops::Context ctx_;
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace

int cuda_device_count() {
  return cuda::cuda_device_count();
}

bool cuda_lazy_module_loading() {
  // cuModuleGetLoadingMode through the runtime's driver entry points (no link to libcuda).
  using Fn = int (*)(int*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    return true;  // unknown: assume the default
  }
  int mode = 0;
  if (reinterpret_cast<Fn>(fn)(&mode) != 0) return true;
  return mode == 0x2;  // CU_MODULE_LAZY_LOADING
}

Result<std::unique_ptr<DeviceRuntime>> make_cuda_runtime(int index, bool profile) {
  return CudaRuntime::create(index, profile);
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
