#include "core/tensor.h"

#include <cstdint>

#include "core/log.h"

namespace strata {

Tensor Tensor::make(void* data, DType dtype, std::initializer_list<int64_t> dims, Device device) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  STRATA_CHECK(dims.size() <= kMaxDims);
  t.ndim = static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) t.shape[static_cast<size_t>(i++)] = d;
  int64_t s = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    t.stride[static_cast<size_t>(k)] = s;
    s *= t.shape[static_cast<size_t>(k)];
  }
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (shape[static_cast<size_t>(k)] != 1 && stride[static_cast<size_t>(k)] != s) return false;
    s *= shape[static_cast<size_t>(k)];
  }
  return true;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  STRATA_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0]);
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + dtype_bytes(dtype, begin * stride[0]);
  return t;
}

Tensor Tensor::slice_cols(int64_t begin, int64_t end) const {
  STRATA_CHECK(ndim == 2 && begin >= 0 && begin <= end && end <= shape[1] && stride[1] == 1);
  Tensor t = *this;
  t.shape[1] = end - begin;
  t.data = static_cast<char*>(data) + dtype_bytes(dtype, begin);
  return t;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return s + "]";
}

}  // namespace strata
