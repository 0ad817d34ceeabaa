// Scalar conversions between f32 and the 16- and 8-bit float formats, usable on the host.
// bf16 rounds to nearest even; f16 conversion handles subnormals, inf and NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace strata {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;        // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;       // overflow -> inf (65520 rounds up)
  if (abs < 0x38800000u) {                             // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                // rounds to zero
    const uint32_t e = abs >> 23;                      // 102..112
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;  // value = m * 2^(e-150)
    const int shift = static_cast<int>(126 - e);       // f16 subnormal unit is 2^-24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even
  return static_cast<uint16_t>(sign | (r >> 13));
}

// FP8 E4M3 (OCP "fn" variant: no inf, 0x7f/0xff are NaN, max 448).
inline float fp8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  float f;
  if (exp == 0xf && mant == 0x7) {
    uint32_t nan = 0x7fc00000u | sign;
    std::memcpy(&f, &nan, 4);
    return f;
  }
  if (exp == 0) {
    f = static_cast<float>(mant) * (1.0f / 512.0f);  // 2^-6 * mant/8
  } else {
    uint32_t u = (exp + 127 - 7) << 23 | mant << 20;
    std::memcpy(&f, &u, 4);
  }
  return sign ? -f : f;
}

// f32 -> FP8 E4M3 ("fn"), round to nearest even, saturating: finite values beyond +-448 and
// +-inf give +-448 (0x7e / 0xfe), NaN gives 0x7f. Bit-identical to the GPU's
// cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)), so weights
// quantized on the host and on the device are the same bytes.
inline uint8_t f32_to_fp8e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;         // NaN
  if (abs > 0x43e00000u) return sign | 0x7e;  // > 448 (incl. inf): saturate
  float a;
  std::memcpy(&a, &abs, 4);
  // Subnormal e4m3 (< 2^-6): multiples of 2^-9. m == 8 is the smallest normal, whose encoding
  // (exponent 1, mantissa 0) is also 8, so no special case.
  if (abs < 0x3c800000u) {
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 512.0f));  // exact scaling
    return static_cast<uint8_t>(sign | m);
  }
  // Normal: 3 mantissa bits below the leading one, i.e. multiples of 2^(e-3) in [2^e, 2^(e+1)).
  const int e = static_cast<int>(abs >> 23) - 127;                           // -6 .. 8
  uint32_t q = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 3 - e)));  // 8 .. 16
  int biased = e + 7;
  if (q == 16) {  // rounded up into the next binade
    q = 8;
    ++biased;
  }
  // <= 448 rounds to at most 448 (biased 15, q 14), so the NaN code 0x7f is never produced here.
  return static_cast<uint8_t>(sign | biased << 3 | (q - 8));
}

}  // namespace strata
