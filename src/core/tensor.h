// Tensor: a non-owning view (data pointer, dtype, shape, strides, device). Shapes are
// outermost-first (row-major): a linear layer's weight is [out_features, in_features].
// Strides count elements; for block-quantized dtypes only the innermost dim may be indexed
// and it must be contiguous, with outer strides a multiple of the block size.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/device.h"
#include "strata/types.h"

namespace strata {

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};
  Device device;

  // Contiguous view over `data` with the given shape.
  static Tensor make(void* data, DType dtype, std::initializer_list<int64_t> dims,
                     Device device = Device::cpu());

  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t numel() const;
  int64_t nbytes() const { return dtype_bytes(dtype, numel()); }  // when contiguous
  bool is_contiguous() const;
  bool defined() const { return data != nullptr; }

  // Rows of a 2-D tensor (or the product of all dims but the last).
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[static_cast<size_t>(ndim - 1)]; }
  int64_t cols() const { return ndim == 0 ? 1 : shape[static_cast<size_t>(ndim - 1)]; }
  // Elements between consecutive rows (stride of dim ndim-2), for strided 2-D views.
  int64_t row_stride() const { return ndim < 2 ? cols() : stride[static_cast<size_t>(ndim - 2)]; }

  // Rows [begin, end) of the outermost dim, still a view.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) of the innermost dim of a 2-D tensor: a strided view.
  Tensor slice_cols(int64_t begin, int64_t end) const;

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  std::string shape_string() const;  // "[72, 1031]"
};

}  // namespace strata
