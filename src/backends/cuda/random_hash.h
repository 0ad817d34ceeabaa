// Counter-based random numbers for dummy weights (`--load-format dummy`): value i of a fill is a
// pure function of (seed, i), so a fill is the same on every run, device and grid shape, and the
// host can recompute any element (tests/cuda/test_fused_bf16_cuda.cpp checks bit equality).
// Usable from host code (g++) and from device code (nvcc): no CUDA headers needed.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::cuda {

// splitmix64 (Steele et al., "Fast splittable pseudorandom number generators"): one step of the
// Weyl sequence plus its 64-bit finalizer; a bijection with full avalanche.
STRATA_HOST_DEVICE inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 random bits for element `index` of the stream `seed`. The seed is mixed first so that
// nearby seeds give unrelated streams rather than shifted copies of one another.
STRATA_HOST_DEVICE inline uint64_t random_hash(uint64_t seed, uint64_t index) {
  return splitmix64(splitmix64(seed) ^ index);
}

// Uniform in [-scale, scale): the top 24 bits as k / 2^23 - 1, which is exact in f32, so the
// only rounding is the multiply by scale, the same on host and device.
STRATA_HOST_DEVICE inline float random_uniform(uint64_t seed, uint64_t index, float scale) {
  const uint32_t k = static_cast<uint32_t>(random_hash(seed, index) >> 40);
  const float u = static_cast<float>(k) * 0x1p-23f - 1.0f;
  return u * scale;
}

}  // namespace strata::cuda
