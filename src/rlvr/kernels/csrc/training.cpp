// The training step's kernels (trainer.kernels=cpp) as torch.library ops in the `rlvr` namespace:
// a whole decoder layer forward and backward (one call each), RMSNorm and SwiGLU. Fake
// (shape-only) kernels and the autograd formulas of rms_norm and swiglu are registered from
// Python (rlvr/kernels/ops.py). The layer's autograd kernel is here, in C++ (LayerFunction): it
// runs once per layer and micro-batch, and torch.library.register_autograd's Python wrapper
// costs ≈ 150 µs per call with 18 arguments (most of it re-reading the schema), against ≈ 5 µs.
//
// Each kernel replaces a chain of eager ops that each sweep the whole tensor: at rlvr's sizes
// every sweep is memory traffic, and one pass does the arithmetic of all of them. A layer call
// replaces ≈ 60 autograd ops and their Python. Rows are processed in parallel blocks
// (at::parallel_for); the dispatcher releases the GIL around every call, so row-parallel workers
// (trainer.thread_mode=rows) run their layers at the same time. float32 is the fast path;
// float64 instantiates the same code (with std::exp) so gradients can be checked numerically.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "common.h"

namespace {

using at::Tensor;
using rlvr::dot;
using rlvr::fast_exp;

void check_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
              name, ": a float32 or float64 CPU tensor expected");
}

// ---- SwiGLU: fused gate|up rows (N, 2I) -> silu(gate)·up (N, I) ------------------------------

Tensor swiglu(const Tensor& fused_in) {
  check_rows(fused_in, "swiglu");
  const Tensor fused = fused_in.contiguous();
  const int64_t inter = fused.size(-1) / 2, n = fused.numel() / std::max<int64_t>(2 * inter, 1);
  std::vector<int64_t> shape(fused.sizes().begin(), fused.sizes().end());
  shape.back() = inter;
  Tensor out = at::empty(shape, fused.options());
  AT_DISPATCH_FLOATING_TYPES(fused.scalar_type(), "swiglu", [&] {
    const scalar_t* gu = fused.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
      rlvr::silu_mul(gu + begin * 2 * inter, o + begin * inter, end - begin, inter);
    });
  });
  return out;
}

// Its backward: d gate = g·u·σ·(1 + gate·(1 − σ)), d up = g·silu(gate); σ recomputed, not saved.
Tensor swiglu_backward(const Tensor& grad_in, const Tensor& fused_in) {
  check_rows(fused_in, "swiglu_backward");
  const Tensor fused = fused_in.contiguous(), grad = grad_in.contiguous();
  const int64_t inter = fused.size(-1) / 2, n = fused.numel() / std::max<int64_t>(2 * inter, 1);
  TORCH_CHECK(grad.numel() == n * inter, "swiglu_backward: the gradient does not match the input");
  Tensor out = at::empty_like(fused);
  AT_DISPATCH_FLOATING_TYPES(fused.scalar_type(), "swiglu_backward", [&] {
    const scalar_t* gu = fused.data_ptr<scalar_t>();
    const scalar_t* g = grad.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gate = gu + r * 2 * inter;
        const scalar_t* up = gate + inter;
        const scalar_t* gr = g + r * inter;
        scalar_t* dgate = o + r * 2 * inter;
        scalar_t* dup = dgate + inter;
        for (int64_t i = 0; i < inter; ++i) {
          const scalar_t sig = scalar_t(1) / (scalar_t(1) + fast_exp(-gate[i]));
          dup[i] = gr[i] * gate[i] * sig;
          dgate[i] = gr[i] * up[i] * sig * (scalar_t(1) + gate[i] * (scalar_t(1) - sig));
        }
      }
    });
  });
  return out;
}

// ---- RMSNorm over the last dim: y = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps) -------------------

// Returns (y shaped as x, rstd shaped as x without its last dim).
std::tuple<Tensor, Tensor> rms_norm(const Tensor& x_in, const Tensor& w_in, double eps) {
  check_rows(x_in, "rms_norm");
  const int64_t h = x_in.size(-1), n = x_in.numel() / std::max<int64_t>(h, 1);
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  TORCH_CHECK(w.numel() == h && w.scalar_type() == x.scalar_type(), "rms_norm: a weight of the hidden size expected");
  Tensor y = at::empty_like(x), rstd = at::empty({n}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
    const scalar_t *xp = x.data_ptr<scalar_t>(), *wp = w.data_ptr<scalar_t>();
    scalar_t *yp = y.data_ptr<scalar_t>(), *rp = rstd.data_ptr<scalar_t>();
    at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
      rlvr::rms_norm(xp + begin * h, wp, yp + begin * h, end - begin, h, static_cast<scalar_t>(eps), rp + begin);
    });
  });
  return {y, rstd.view(x.sizes().slice(0, x.dim() - 1))};
}

// Its backward: dx = rstd·(g·w − x·rstd²·mean(g·w·x)), dw = Σ_rows g·x·rstd. dw is summed per
// fixed block of kBlock rows and the blocks in order, so it does not depend on the thread count.
template <typename T>
void rms_norm_backward_rows(const T* gp, const T* xp, const T* wp, const T* rp, T* dxp, T* dwp, int64_t n,
                            int64_t h) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<T> partial(blocks * h);
  T* pp = partial.data();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> gw(h);
    for (int64_t b = b0; b < b1; ++b) {
      T* acc = pp + b * h;
      std::fill(acc, acc + h, T(0));
      for (int64_t r = b * kBlock; r < std::min(n, (b + 1) * kBlock); ++r) {
        const T* gr = gp + r * h;
        const T* xr = xp + r * h;
        const T inv = rp[r];
        for (int64_t i = 0; i < h; ++i) gw[i] = gr[i] * wp[i];
        const T c = dot(gw.data(), xr, h) / static_cast<T>(h) * inv * inv;
        for (int64_t i = 0; i < h; ++i) {
          dxp[r * h + i] = inv * (gw[i] - xr[i] * c);
          acc[i] += gr[i] * xr[i] * inv;
        }
      }
    }
  });
  std::fill(dwp, dwp + h, T(0));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < h; ++i) dwp[i] += pp[b * h + i];
}

// Returns (dx shaped as x, dw).
std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& w_in,
                                             const Tensor& rstd_in) {
  check_rows(x_in, "rms_norm_backward");
  const int64_t h = x_in.size(-1), n = x_in.numel() / std::max<int64_t>(h, 1);
  const Tensor grad = grad_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous(), rstd = rstd_in.contiguous();
  TORCH_CHECK(grad.numel() == x.numel() && rstd.numel() == n && w.numel() == h, "rms_norm_backward: shape mismatch");
  Tensor dx = at::empty_like(x), dw = at::empty({h}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
    rms_norm_backward_rows(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                           rstd.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), n, h);
  });
  return {dx, dw};
}

// ---- A whole training layer: forward and backward in one call each -----------------------------
// Rows: the U·Tp rows of the distinct left-padded prompts (prompt u, column t), then N packed
// completion rows. A real prompt row attends causally to its prompt's real rows; a padding row
// to itself only; completion row i to its prompt's real rows and to its own sequence's packed
// rows start[i] .. i. The same attention as rlvr.kernels.training's eager layers.
struct Plan {
  int64_t prompts, tp, n;
  const int64_t* mask;   // (U, Tp) 1 on real prompt tokens
  const int64_t* owner;  // (N,) the prompt of each completion row
  const int64_t* start;  // (N,) packed index of the first completion row of its sequence
  std::vector<std::vector<int64_t>> queries;  // per prompt: every row whose keys lie in its family

  Plan(const Tensor& mask_t, const Tensor& owner_t, const Tensor& start_t)
      : prompts(mask_t.size(0)), tp(mask_t.size(1)), n(owner_t.size(0)), mask(mask_t.data_ptr<int64_t>()),
        owner(owner_t.data_ptr<int64_t>()), start(start_t.data_ptr<int64_t>()), queries(prompts) {
    for (int64_t u = 0; u < prompts; ++u)
      for (int64_t t = 0; t < tp; ++t) queries[u].push_back(u * tp + t);
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(owner[i] >= 0 && owner[i] < prompts && start[i] >= 0 && start[i] <= i, "bad attention plan");
      queries[owner[i]].push_back(prompts * tp + i);
    }
  }

  void keys(int64_t row, std::vector<int64_t>& out) const {
    out.clear();
    const int64_t prompt_rows = prompts * tp;
    if (row < prompt_rows) {
      const int64_t u = row / tp, t = row % tp;
      if (!mask[row]) { out.push_back(row); return; }
      for (int64_t c = 0; c <= t; ++c) if (mask[u * tp + c]) out.push_back(u * tp + c);
      return;
    }
    const int64_t i = row - prompt_rows, u = owner[i];
    for (int64_t c = 0; c < tp; ++c) if (mask[u * tp + c]) out.push_back(u * tp + c);
    for (int64_t j = start[i]; j <= i; ++j) out.push_back(prompt_rows + j);
  }
};

// The plan's index tensors must outlive it (it keeps their data pointers): callers hold these.
struct PlanInputs {
  Tensor mask, owner, start, pos;
  PlanInputs(const Tensor& m, const Tensor& o, const Tensor& s, const Tensor& p)
      : mask(m.contiguous()), owner(o.contiguous()), start(s.contiguous()), pos(p.contiguous()) {
    for (const Tensor* t : {&mask, &owner, &start, &pos})
      TORCH_CHECK(t->scalar_type() == at::kLong && t->device().is_cpu(), "int64 CPU index tensors expected");
  }
};

struct Heads {
  int64_t heads, kv, d;
  int64_t width() const { return (heads + 2 * kv) * d; }
  int64_t q(int64_t h) const { return h * d; }
  int64_t k(int64_t h) const { return (heads + h / (heads / kv)) * d; }       // kv head of query head h
  int64_t v(int64_t h) const { return (heads + kv + h / (heads / kv)) * d; }
};

// p[j] = softmax over `keys` of q·k_j/√d, for query head h of `row` (recomputed by the backward).
template <typename T>
void attention_weights(const T* qkv, const Heads& hd, int64_t row, int64_t h, const std::vector<int64_t>& keys,
                       T* p) {
  const int64_t w = hd.width();
  const T scale = T(1) / std::sqrt(static_cast<T>(hd.d));
  const T* q = qkv + row * w + hd.q(h);
  T top = -std::numeric_limits<T>::infinity();
  for (size_t j = 0; j < keys.size(); ++j) {
    p[j] = dot(q, qkv + keys[j] * w + hd.k(h), hd.d) * scale;
    top = std::max(top, p[j]);
  }
  T total = 0;
  for (size_t j = 0; j < keys.size(); ++j) total += (p[j] = std::exp(p[j] - top));
  for (size_t j = 0; j < keys.size(); ++j) p[j] /= total;
}

// o += p·v over d; o (the output) and v (q|k|v) never overlap, so the loop vectorises.
template <typename T>
inline void add_scaled(T* __restrict o, const T* __restrict v, T p, int64_t d) {
  for (int64_t i = 0; i < d; ++i) o[i] += p * v[i];
}

// out (R, h·d) = softmax(q·kᵀ/√d)·v per row and head. One task per prompt family: no shared writes.
template <typename T>
void attention_forward(const T* qkv, T* out, const Plan& plan, const Heads& hd) {
  const int64_t w = hd.width(), d = hd.d;
  at::parallel_for(0, plan.prompts, 1, [&](int64_t u0, int64_t u1) {
    std::vector<int64_t> keys;
    std::vector<T> p(plan.tp + plan.n + 1);
    for (int64_t u = u0; u < u1; ++u)
      for (int64_t row : plan.queries[u]) {
        plan.keys(row, keys);
        for (int64_t h = 0; h < hd.heads; ++h) {
          attention_weights(qkv, hd, row, h, keys, p.data());
          T* o = out + row * hd.heads * d + h * d;
          std::fill(o, o + d, T(0));
          for (size_t j = 0; j < keys.size(); ++j) add_scaled(o, qkv + keys[j] * w + hd.v(h), p[j], d);
        }
      }
  });
}

// One key's share of the attention backward: dq += ds·k, dk += ds·q, dv += p·g over d. dq, dk and
// dv are disjoint runs of d q|k|v (q, k and v columns; a row that is its own key writes its q and
// its k|v parts) and the inputs are other buffers, so the pointers are __restrict (as parameters:
// GCC keeps that through inlining) and the loop vectorises. Element-wise, so every sum is the one
// a scalar loop makes.
template <typename T>
inline void key_gradients(T* __restrict dq, T* __restrict dk, T* __restrict dv, const T* __restrict q,
                          const T* __restrict k, const T* __restrict g, T ds, T p, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    dq[i] += ds * k[i];
    dk[i] += ds * q[i];
    dv[i] += p * g[i];
  }
}

// d q|k|v (R, W) from d out: dv_j += p_j·do, dS_j = p_j·(do·v_j − Σ_l p_l·do·v_l), dq += dS_j·k_j/√d,
// dk_j += dS_j·q/√d. A prompt family's keys are written by its own task only.
template <typename T>
void attention_backward(const T* qkv, const T* dout, T* dqkv, const Plan& plan, const Heads& hd) {
  const int64_t w = hd.width(), d = hd.d;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  at::parallel_for(0, plan.prompts, 1, [&](int64_t u0, int64_t u1) {
    std::vector<int64_t> keys;
    std::vector<T> p(plan.tp + plan.n + 1), dp(plan.tp + plan.n + 1);
    for (int64_t u = u0; u < u1; ++u)
      for (int64_t row : plan.queries[u]) {
        plan.keys(row, keys);
        for (int64_t h = 0; h < hd.heads; ++h) {
          attention_weights(qkv, hd, row, h, keys, p.data());
          const T* g = dout + row * hd.heads * d + h * d;
          T mean = 0;
          for (size_t j = 0; j < keys.size(); ++j) {
            dp[j] = dot(g, qkv + keys[j] * w + hd.v(h), d);
            mean += p[j] * dp[j];
          }
          const T* q = qkv + row * w + hd.q(h);
          T* dq = dqkv + row * w + hd.q(h);
          for (size_t j = 0; j < keys.size(); ++j)
            key_gradients(dq, dqkv + keys[j] * w + hd.k(h), dqkv + keys[j] * w + hd.v(h), q,
                          qkv + keys[j] * w + hd.k(h), g, p[j] * (dp[j] - mean) * scale, p[j], d);
        }
      }
  });
}

// RoPE on the q and k heads of every row, in place (`inverse`: the backward's rotation). A
// position outside the tables must raise, not read stray memory.
void rope_rows(Tensor& qkv, const Tensor& pos, const Tensor& cos, const Tensor& sin, const Heads& hd, bool inverse) {
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < pos.numel(); ++r)
    TORCH_CHECK(p[r] >= 0 && p[r] < cos.size(0), "position ", p[r], " out of the RoPE table");
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "rope", [&] {
    rlvr::rope(qkv.data_ptr<scalar_t>(), pos.data_ptr<int64_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
               qkv.size(0), hd.width(), hd.heads + hd.kv, hd.d, inverse);
  });
}

using LayerOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// One decoder layer over the rows (see Plan): RMSNorm, q|k|v (+ bias), RoPE at `pos` (tables cos/sin
// (S, d/2), weight rows permuted as rlvr.kernels.weights.LlamaWeights does), attention,
// x1 = x + attn·Woᵀ (+ bias), RMSNorm, gate|up, SwiGLU, y = x1 + act·Wdᵀ. Weights in nn.Linear's
// (out, in) layout. Returns y and what the backward needs: xn1, rstd1, qkv (rotated), attn, x1,
// xn2, rstd2, gu, act.
LayerOut layer_forward(const Tensor& x_in, const Tensor& ln1, const Tensor& wqkv, const std::optional<Tensor>& bqkv,
                       const Tensor& wo, const std::optional<Tensor>& bo, const Tensor& ln2, const Tensor& wgu,
                       const Tensor& wd, const Tensor& mask, const Tensor& owner, const Tensor& start,
                       const Tensor& pos_in, const Tensor& cos_in, const Tensor& sin_in, int64_t heads, int64_t kv,
                       double eps) {
  check_rows(x_in, "layer_forward");
  const Tensor x = x_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const PlanInputs in(mask, owner, start, pos_in);
  const Plan plan(in.mask, in.owner, in.start);
  const Heads hd{heads, kv, 2 * cos.size(1)};
  const int64_t rows = x.size(0);
  TORCH_CHECK(rows == plan.prompts * plan.tp + plan.n && in.pos.size(0) == rows, "rows do not match the plan");
  TORCH_CHECK(wqkv.size(0) == hd.width(), "heads do not match the q|k|v weight");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "RoPE tables of another dtype than the rows");
  auto [xn1, rstd1] = rms_norm(x, ln1, eps);
  Tensor qkv = bqkv ? at::addmm(*bqkv, xn1, wqkv.t()) : at::mm(xn1, wqkv.t());
  rope_rows(qkv, in.pos, cos, sin, hd, /*inverse=*/false);
  Tensor attn = at::empty({rows, heads * hd.d}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "attention_forward", [&] {
    attention_forward(qkv.data_ptr<scalar_t>(), attn.data_ptr<scalar_t>(), plan, hd);
  });
  Tensor x1 = at::addmm(x, attn, wo.t());
  if (bo) x1.add_(*bo);
  auto [xn2, rstd2] = rms_norm(x1, ln2, eps);
  Tensor gu = at::mm(xn2, wgu.t());
  Tensor act = swiglu(gu);
  Tensor y = at::addmm(x1, act, wd.t());
  return {y, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act};
}

using LayerGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// Its backward: returns dx, d ln1, d Wqkv, d bqkv (empty without), d Wo, d bo (empty without),
// d ln2, d Wgu, d Wd.
LayerGrads layer_backward(const Tensor& dy_in, const Tensor& x, const Tensor& xn1, const Tensor& rstd1,
                          const Tensor& qkv, const Tensor& attn, const Tensor& x1, const Tensor& xn2,
                          const Tensor& rstd2, const Tensor& gu, const Tensor& act, const Tensor& ln1,
                          const Tensor& wqkv, bool has_bqkv, const Tensor& wo, bool has_bo, const Tensor& ln2,
                          const Tensor& wgu, const Tensor& wd, const Tensor& mask, const Tensor& owner,
                          const Tensor& start, const Tensor& pos_in, const Tensor& cos_in, const Tensor& sin_in,
                          int64_t heads, int64_t kv) {
  check_rows(x, "layer_backward");
  const Tensor dy = dy_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const Tensor qkv_c = qkv.contiguous();
  const PlanInputs in(mask, owner, start, pos_in);
  const Plan plan(in.mask, in.owner, in.start);
  const Heads hd{heads, kv, 2 * cos.size(1)};
  const int64_t rows = x.size(0);
  Tensor dwd = at::mm(dy.t(), act);
  Tensor dgu = swiglu_backward(at::mm(dy, wd), gu);
  Tensor dwgu = at::mm(dgu.t(), xn2);
  auto [dx1, dln2] = rms_norm_backward(at::mm(dgu, wgu), x1, ln2, rstd2);
  dx1.add_(dy);
  Tensor dwo = at::mm(dx1.t(), attn);
  Tensor dbo = has_bo ? dx1.sum(0) : at::empty({0}, x.options());
  Tensor dattn = at::mm(dx1, wo);
  Tensor dqkv = at::zeros({rows, hd.width()}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "attention_backward", [&] {
    attention_backward(qkv_c.data_ptr<scalar_t>(), dattn.data_ptr<scalar_t>(), dqkv.data_ptr<scalar_t>(), plan, hd);
  });
  rope_rows(dqkv, in.pos, cos, sin, hd, /*inverse=*/true);
  Tensor dwqkv = at::mm(dqkv.t(), xn1);
  Tensor dbqkv = has_bqkv ? dqkv.sum(0) : at::empty({0}, x.options());
  auto [dx, dln1] = rms_norm_backward(at::mm(dqkv, wqkv), x, ln1, rstd1);
  dx.add_(dx1);
  return {dx, dln1, dwqkv, dbqkv, dwo, dbo, dln2, dwgu, dwd};
}

// The layer's autograd: forward and backward through the dispatcher (so tracing sees the ops and
// their fake kernels). Only y is differentiable; the saved activations, returned as the other
// outputs, are marked otherwise and their gradients are not materialised as zero tensors.
class LayerFunction : public torch::autograd::Function<LayerFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& ln1, const Tensor& wqkv,
      const std::optional<Tensor>& bqkv, const Tensor& wo, const std::optional<Tensor>& bo, const Tensor& ln2,
      const Tensor& wgu, const Tensor& wd, const Tensor& mask, const Tensor& owner, const Tensor& start,
      const Tensor& pos, const Tensor& cos, const Tensor& sin, int64_t heads, int64_t kv, double eps) {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("rlvr::layer_forward", "")
                         .typed<decltype(layer_forward)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act] =
        op.call(x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd, mask, owner, start, pos, cos, sin, heads, kv, eps);
    ctx->save_for_backward({x, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act, ln1, wqkv, wo, ln2, wgu, wd, mask,
                            owner, start, pos, cos, sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv"] = kv;
    ctx->saved_data["has_bqkv"] = bqkv.has_value();
    ctx->saved_data["has_bo"] = bo.has_value();
    ctx->mark_non_differentiable({xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act});
    ctx->set_materialize_grads(false);
    return {y, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    constexpr size_t kInputs = 18;
    if (!grads[0].defined()) return torch::autograd::variable_list(kInputs);
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("rlvr::layer_backward", "")
                         .typed<decltype(layer_backward)>();
    const auto s = ctx->get_saved_variables();
    const bool has_bqkv = ctx->saved_data["has_bqkv"].toBool(), has_bo = ctx->saved_data["has_bo"].toBool();
    auto [dx, dln1, dwqkv, dbqkv, dwo, dbo, dln2, dwgu, dwd] =
        op.call(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], has_bqkv, s[12],
                has_bo, s[13], s[14], s[15], s[16], s[17], s[18], s[19], s[20], s[21],
                ctx->saved_data["heads"].toInt(), ctx->saved_data["kv"].toInt());
    torch::autograd::variable_list out(kInputs);  // undefined: no gradient (plan tensors, ints, eps)
    out[0] = dx, out[1] = dln1, out[2] = dwqkv, out[4] = dwo, out[6] = dln2, out[7] = dwgu, out[8] = dwd;
    if (has_bqkv) out[3] = dbqkv;
    if (has_bo) out[5] = dbo;
    return out;
  }
};

LayerOut layer_forward_autograd(const Tensor& x, const Tensor& ln1, const Tensor& wqkv,
                                const std::optional<Tensor>& bqkv, const Tensor& wo, const std::optional<Tensor>& bo,
                                const Tensor& ln2, const Tensor& wgu, const Tensor& wd, const Tensor& mask,
                                const Tensor& owner, const Tensor& start, const Tensor& pos, const Tensor& cos,
                                const Tensor& sin, int64_t heads, int64_t kv, double eps) {
  auto o = LayerFunction::apply(x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd, mask, owner, start, pos, cos, sin, heads,
                                kv, eps);
  return {o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9]};
}

}  // namespace

TORCH_LIBRARY(rlvr, m) {
  m.def("swiglu(Tensor fused) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor fused) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  m.def(
      "layer_forward(Tensor x, Tensor ln1, Tensor wqkv, Tensor? bqkv, Tensor wo, Tensor? bo, Tensor ln2, "
      "Tensor wgu, Tensor wd, Tensor mask, Tensor owner, Tensor start, Tensor pos, Tensor cos, Tensor sin, "
      "int heads, int kv_heads, float eps) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "layer_backward(Tensor dy, Tensor x, Tensor xn1, Tensor rstd1, Tensor qkv, Tensor attn, Tensor x1, "
      "Tensor xn2, Tensor rstd2, Tensor gu, Tensor act, Tensor ln1, Tensor wqkv, bool has_bqkv, Tensor wo, "
      "bool has_bo, Tensor ln2, Tensor wgu, Tensor wd, Tensor mask, Tensor owner, Tensor start, Tensor pos, "
      "Tensor cos, Tensor sin, int heads, int kv_heads) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rlvr, CPU, m) {
  m.impl("swiglu", &swiglu);
  m.impl("swiglu_backward", &swiglu_backward);
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("layer_forward", &layer_forward);
  m.impl("layer_backward", &layer_backward);
}

TORCH_LIBRARY_IMPL(rlvr, Autograd, m) {
  m.impl("layer_forward", &layer_forward_autograd);
}
