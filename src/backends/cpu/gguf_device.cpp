// GGUF block formats on the GPU, host side: the device row layout (pack), the scalar twin of the
// GPU's dequantization, and random rows for benchmarks. The layout and the value rule are in
// backends/cuda/kernels/gguf_fragments.h; this file reads them off the format definitions
// (quant_impl.h lists the GGUF block layouts) without the kernels' lane mapping, so the CUDA
// tests and tests/ops/test_gguf_fragments.cpp check the mapping against an independent twin.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/kernels/gguf_fragments.h"
#include "core/half.h"

namespace strata::cpu {
namespace {

using cuda::gguf::bf16_from_double;
using cuda::gguf::bf16_rn;

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float f16(const uint8_t* p) {
  return f16_to_f32(u16(p));
}

float bf16_round(float v) {
  return bf16_to_f32(static_cast<uint16_t>(bf16_rn(v)));
}

// w = bf16_rn(q * S - M), one rounding.
uint16_t weight(int q, float S, float M) {
  return static_cast<uint16_t>(
      bf16_from_double(static_cast<double>(q) * static_cast<double>(S) - static_cast<double>(M)));
}

// 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (GGUF's packing).
void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// splitmix64: the random rows' generator.
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

bool gguf_device_ok(DType dt, int64_t k) {
  return cuda::gguf::gpu_format(dt) && k > 0 && k % 256 == 0;
}

void gguf_pack_row(DType dt, const uint8_t* raw, uint8_t* dev, int64_t k) {
  const int64_t nb = k / 32, nsb = k / 256;
  switch (dt) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(dev + k + 2 * b, raw + 34 * b, 2);
        std::memcpy(dev + 32 * b, raw + 34 * b + 2, 32);
      }
      break;
    case DType::kQ4_0:
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(dev + k / 2 + 2 * b, raw + 18 * b, 2);
        std::memcpy(dev + 16 * b, raw + 18 * b + 2, 16);
      }
      break;
    case DType::kQ6_K:
      for (int64_t c = 0; c < nsb; ++c) {
        const uint8_t* blk = raw + 210 * c;
        std::memcpy(dev + 192 * c, blk, 192);                  // ql, qh
        std::memcpy(dev + 192 * nsb + 16 * c, blk + 192, 16);  // scales
        std::memcpy(dev + 208 * nsb + 2 * c, blk + 208, 2);    // d
      }
      break;
    default:  // Q4_K, Q5_K: the blocks as they are
      std::memcpy(dev, raw, static_cast<size_t>(dtype_bytes(dt, k)));
      break;
  }
}

void gguf_row_to_bf16(DType dt, const uint8_t* dev, int64_t k, uint16_t* out) {
  const int64_t nb = k / 32, nsb = k / 256;
  switch (dt) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < nb; ++b) {
        const float S = bf16_round(f16(dev + k + 2 * b));
        for (int l = 0; l < 32; ++l) {
          out[32 * b + l] = weight(static_cast<int8_t>(dev[32 * b + l]), S, 0.0f);
        }
      }
      break;
    case DType::kQ4_0:
      for (int64_t b = 0; b < nb; ++b) {
        const float S = bf16_round(f16(dev + k / 2 + 2 * b));
        for (int l = 0; l < 16; ++l) {
          const uint8_t q = dev[16 * b + l];
          out[32 * b + l] = weight((q & 15) - 8, S, 0.0f);
          out[32 * b + 16 + l] = weight((q >> 4) - 8, S, 0.0f);
        }
      }
      break;
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dt == DType::kQ5_K;
      const int64_t bytes = five ? 176 : 144;
      for (int64_t c = 0; c < nsb; ++c) {
        const uint8_t* blk = dev + bytes * c;
        const float d = f16(blk), dmin = f16(blk + 2);
        const uint8_t* qh = blk + 16;
        const uint8_t* qs = blk + (five ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
          int sc = 0, m = 0;
          k_scale_min(blk + 4, j, &sc, &m);
          const float S = bf16_round(d * static_cast<float>(sc));
          const float M = bf16_round(dmin * static_cast<float>(m));
          for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            if (five) q |= ((qh[l] >> j) & 1) << 4;
            out[256 * c + 32 * j + l] = weight(q, S, M);
          }
        }
      }
      break;
    }
    case DType::kQ6_K:
      for (int64_t c = 0; c < nsb; ++c) {
        const uint8_t* ql = dev + 192 * c;
        const uint8_t* qh = ql + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(dev + 192 * nsb + 16 * c);
        const float d = f16(dev + 208 * nsb + 2 * c);
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, q4 = (e / 32) % 4, l = e % 32;
          const int lo = (ql[64 * h + 32 * (q4 & 1) + l] >> (4 * (q4 >> 1))) & 15;
          const int hi = (qh[32 * h + l] >> (2 * q4)) & 3;
          const float S = bf16_round(d * static_cast<float>(sc[e / 16]));
          out[256 * c + e] = weight((lo | (hi << 4)) - 32, S, 0.0f);
        }
      }
      break;
    default:
      for (int64_t i = 0; i < k; ++i) out[i] = 0x7fc0;  // not a device format: NaN
      break;
  }
}

void gguf_fill_random_row(DType dt, uint64_t seed, int64_t row, float scale, int64_t k,
                          uint8_t* dev) {
  uint64_t s = seed * 0x2545f4914f6cdd1dULL + static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL;
  const int64_t bytes = dtype_bytes(dt, k);
  std::vector<uint8_t> raw(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = mix(s);
    std::memcpy(raw.data() + i, &v, static_cast<size_t>(std::min<int64_t>(8, bytes - i)));
  }
  const auto put_f16 = [&](int64_t at, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(raw.data() + at, &h, 2);
  };
  const int64_t nb = k / 32, nsb = k / 256;
  switch (dt) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < nb; ++b) {
        put_f16(34 * b, scale / 127.0f);
        for (int l = 0; l < 32; ++l) {
          if (raw[static_cast<size_t>(34 * b + 2 + l)] == 0x80) raw[34 * b + 2 + l] = 0x81;
        }
      }
      break;
    case DType::kQ4_0:
      for (int64_t b = 0; b < nb; ++b) put_f16(18 * b, scale / 8.0f);
      break;
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const int64_t bb = dt == DType::kQ4_K ? 144 : 176;
      const float qmax = dt == DType::kQ4_K ? 15.0f : 31.0f;
      for (int64_t c = 0; c < nsb; ++c) {
        // sc in [32, 63], m in [0, 63]: w = d sc q - dmin m within about [-scale, scale].
        uint8_t* sb = raw.data() + bb * c + 4;
        for (int i = 0; i < 12; ++i) sb[i] |= (i < 4) ? 0x20 : 0;
        put_f16(bb * c, 2.0f * scale / (qmax * 63.0f));
        put_f16(bb * c + 2, scale / 63.0f);
      }
      break;
    }
    case DType::kQ6_K:
      for (int64_t c = 0; c < nsb; ++c) {
        auto* sc = reinterpret_cast<int8_t*>(raw.data() + 210 * c + 192);
        for (int i = 0; i < 16; ++i) sc[i] = static_cast<int8_t>(64 + (sc[i] & 63));
        put_f16(210 * c + 208, scale / (32.0f * 127.0f));
      }
      break;
    default:
      break;
  }
  gguf_pack_row(dt, raw.data(), dev, k);
}

}  // namespace strata::cpu
