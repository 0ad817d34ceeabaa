// WeightStore: the owner of a model's weight memory. It keeps alive what the typed weight views
// (model/weights.h) point into: the memory-mapped checkpoint (TensorSource), host copies made
// where the file's layout differs from ours, and device buffers of an uploaded layout. Each
// buffer carries its residency (core/buffer.h); the store says where the weights live and how
// many bytes they take, and is where weight streaming hooks its prefetch slots.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "io/tensor_source.h"

namespace strata {

struct StreamedWeights;

class WeightStore {
 public:
  WeightStore() = default;
  explicit WeightStore(std::shared_ptr<TensorSource> source) : source_(std::move(source)) {}

  // Takes ownership of a buffer the weight views point into; returns its data.
  void* keep(Buffer b) {
    bytes_ += b.bytes();
    void* p = b.data();
    buffers_.push_back(std::move(b));
    return p;
  }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  // Bytes of the buffers this store allocated (not the mapped checkpoint).
  size_t owned_bytes() const { return bytes_; }
  const TensorSource* source() const { return source_.get(); }
  const std::shared_ptr<TensorSource>& shared_source() const { return source_; }
  // Weight streaming: the layers that live off the device (memory/streamed_weights.h).
  const std::shared_ptr<StreamedWeights>& streamed() const { return streamed_; }
  void set_streamed(std::shared_ptr<StreamedWeights> s) { streamed_ = std::move(s); }

 private:
  std::shared_ptr<TensorSource> source_;  // the checkpoint the host views map (may be null)
  std::vector<Buffer> buffers_;
  size_t bytes_ = 0;
  std::shared_ptr<StreamedWeights> streamed_;
};

}  // namespace strata
