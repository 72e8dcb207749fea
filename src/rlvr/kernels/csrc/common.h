// Row-wise math shared by the decode engine (decode.cpp, float32) and the training layer
// (training.cpp, float32 and float64): dot products, exp, RMSNorm, SiLU·up and RoPE over raw
// row-major buffers. Written as plain loops the compiler vectorises (-O3 -march=native, no
// -ffast-math), so a whole op is one pass over memory instead of one ATen op per step.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace rlvr {

constexpr int64_t kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Dot product with kLanes independent partial sums: without -ffast-math the compiler may not
// reorder one running sum, but independent lanes vectorise.
template <typename T>
inline T dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  T s = 0;
  for (int64_t l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// exp(x) = 2^n · exp(r), n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by Cephes' expf polynomial.
// Branch-free and call-free so loops over it vectorise (std::exp does not without -ffast-math).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float magic = 12582912.0f;                 // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + magic) - magic;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The exp of the hot loops: the vectorisable polynomial in float32 (≈ 1 ulp); std::exp in
// float64, where the kernels serve gradient checks rather than speed.
inline float fast_exp(float x) { return exp_approx(x); }
inline double fast_exp(double x) { return std::exp(x); }

// out = x / sqrt(mean(x^2) + eps) * w, row by row (F.rms_norm); each row's 1/sqrt(...) also goes
// to rstd[r] when given (the training backward needs it).
template <typename T>
void rms_norm(const T* x, const T* w, T* out, int64_t rows, int64_t n, T eps, T* rstd = nullptr) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* o = out + r * n;
    const T inv = T(1) / std::sqrt(dot(xr, xr, n) / static_cast<T>(n) + eps);
    if (rstd) rstd[r] = inv;
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * inv * w[i];
  }
}

// act = silu(gate) * up over b fused (2I) gate|up rows.
template <typename T>
void silu_mul(const T* gu, T* act, int64_t b, int64_t inter) {
  for (int64_t r = 0; r < b; ++r) {
    const T* gate = gu + r * 2 * inter;
    const T* up = gate + inter;
    T* a = act + r * inter;
    for (int64_t i = 0; i < inter; ++i) a[i] = gate[i] / (T(1) + fast_exp(-gate[i])) * up[i];
  }
}

// Rotates q and k heads in place: the weight rows are permuted so that pair i of a head is the
// adjacent (re, im) = (x[2i], x[2i+1]), rotated by angle pos * inv_freq[i] (cos/sin tables).
// `inverse` rotates by the negative angle: the backward of RoPE (a rotation's transpose).
template <typename T>
void rope(T* qkv, const int64_t* pos, const T* cos, const T* sin, int64_t rows, int64_t row_width,
          int64_t rotated_heads, int64_t d, bool inverse = false) {
  const int64_t half = d / 2;
  const T sign = inverse ? T(-1) : T(1);
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = cos + pos[r] * half;
    const T* s = sin + pos[r] * half;
    for (int64_t head = 0; head < rotated_heads; ++head) {
      T* x = qkv + r * row_width + head * d;
      for (int64_t i = 0; i < half; ++i) {
        const T re = x[2 * i], im = x[2 * i + 1], si = sign * s[i];
        x[2 * i] = re * c[i] - im * si;
        x[2 * i + 1] = re * si + im * c[i];
      }
    }
  }
}

}  // namespace rlvr
