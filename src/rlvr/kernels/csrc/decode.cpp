// The fused decode engine (rollout.decode_engine=cpp): a Llama/Qwen2 prefill, decode step and
// whole top_p = 1 sampling loop over a static KV cache, one call each from Python.
//
// At rlvr's scale (hidden 128, batch ≈ 64) one eager decode step is ≈ 35 small ATen ops per
// layer; the weight matmuls are only ≈ 30% of its CPU time, the rest is dispatch, temporaries
// and cache traffic around ops that each take microseconds. Here a step is:
//
//     embedding row copy
//     per layer:  RMSNorm (loop) -> q|k|v = mm(x, Wqkvᵀ) (+ bias)          [MKL via at::mm_out]
//                 RoPE in place on q and k, k and v written into the cache     [loop]
//                 attention per (row, kv head): scores over the readable cache
//                 columns, softmax, weighted sum of values                     [loop, at::parallel_for]
//                 x += attn · Woᵀ (+ bias)                                     [at::addmm_]
//                 RMSNorm -> g|u = mm(x, Wguᵀ) -> silu(g)·u -> x += · Wdᵀ      [mm, loop, addmm_]
//     RMSNorm -> logits = x · lm_headᵀ (+ bias)
//
// The weights are pre-transposed to (in, out) row-major once per engine (MKL is faster on that
// layout at these shapes) and activations live in workspaces sized for the first batch, so a
// step allocates only its logits. Columns whose key bias is -inf (left padding, columns not yet
// written) are skipped rather than scored, so the cache need not be zeroed. Same math as
// rlvr.kernels.decoder.Decoder.step, summed in another order, with exp_approx (≈ 1 ulp).
//
// Only the headers used (not torch/extension.h, which pulls in the whole C++ frontend): this
// halves the one-off build.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"

namespace {

using at::Tensor;
using rlvr::dot;
using rlvr::exp_approx;
using rlvr::kNegInf;
using rlvr::rms_norm;
using rlvr::rope;
using rlvr::silu_mul;

// (out, in) row-major -> (in, out) row-major in 16x16 tiles, writing along output rows: ≈ 0.7 ms for
// the warm start's 1M weights, against ≈ 1.2 ms for torch's strided copy and ≈ 3 ms for tiles
// written down columns (power-of-two strides map a tile's writes onto the same cache sets).
Tensor transposed(const Tensor& w) {
  const int64_t rows = w.size(0), cols = w.size(1);
  Tensor out = at::empty({cols, rows}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  constexpr int64_t tile = 16;
  for (int64_t i0 = 0; i0 < rows; i0 += tile)
    for (int64_t j0 = 0; j0 < cols; j0 += tile) {
      const int64_t i1 = std::min(rows, i0 + tile), j1 = std::min(cols, j0 + tile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = src[i * cols + j];
    }
  return out;
}

// lowbias32 (Wellons), the hash of rlvr.noise (which computes it in int64 masked to 32 bits).
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// One row's token: argmax(logits / T + Gumbel(hash(row_key ^ column_keys[j]))) in float64, as
// torch_ar.choose_tokens with top_p = 1; argmax(logits) when T <= 0 (first maximum, as torch).
// *logp = log-softmax of the (scaled) logits at the token.
int64_t pick(const float* logits, int64_t vocab, double temperature, uint32_t row_key, const uint32_t* column_keys,
             float* logp) {
  const bool greedy = temperature <= 0, scale = !greedy && temperature != 1.0;
  const float t = static_cast<float>(temperature);  // x / T in float32, as the float32 tensor op does
  auto scaled = [&](int64_t j) { return scale ? logits[j] / t : logits[j]; };
  int64_t best = 0;
  double best_value = -std::numeric_limits<double>::infinity();
  float top = kNegInf;
  for (int64_t j = 0; j < vocab; ++j) {
    const float x = scaled(j);
    top = std::max(top, x);
    double value = x;
    if (!greedy) {
      const double u = (static_cast<double>(mix32(row_key ^ column_keys[j])) + 0.5) / 4294967296.0;
      value -= std::log(-std::log(u));
    }
    if (j == 0 || value > best_value) best = j, best_value = value;
  }
  float total = 0.f;
  for (int64_t j = 0; j < vocab; ++j) total += std::exp(scaled(j) - top);
  *logp = scaled(best) - top - std::log(total);
  return best;
}

struct Layer {
  Tensor ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd;  // wqkv/wo/wgu/wd stored (in, out); biases may be empty
};

class Engine {
 public:
  Engine(Tensor embed, Tensor norm, Tensor lm_head, Tensor lm_bias, std::vector<Tensor> flat, Tensor cos,
         Tensor sin, int64_t heads, int64_t kv_heads, double eps, int64_t max_rows)
      : embed_(embed), norm_(norm), lm_bias_(lm_bias), cos_(cos), sin_(sin),
        heads_(heads), kv_(kv_heads), eps_(static_cast<float>(eps)) {
    TORCH_CHECK(flat.size() % 8 == 0, "8 tensors per layer");
    for (const Tensor& t : flat) check(t);
    for (auto* t : {&embed_, &norm_, &lm_head, &lm_bias_, &cos_, &sin_}) check(*t);
    // MKL is ≈ 25% faster on (in, out) row-major weights at these shapes than on nn.Linear's layout.
    lm_head_ = transposed(lm_head);
    for (size_t i = 0; i < flat.size(); i += 8)
      layers_.push_back({flat[i], transposed(flat[i + 1]), flat[i + 2], transposed(flat[i + 3]), flat[i + 4],
                         flat[i + 5], transposed(flat[i + 6]), transposed(flat[i + 7])});
    hidden_ = embed_.size(1);
    d_ = 2 * cos_.size(1);
    allocate(max_rows);
  }

  // An engine over the same weights (shared, not copied or transposed again) with its own RoPE
  // tables and workspaces: row-parallel workers decoding one batch prepare the weights once.
  Engine fork(Tensor cos, Tensor sin, int64_t max_rows) const {
    check(cos), check(sin);
    TORCH_CHECK(cos.size(1) == cos_.size(1) && sin.sizes() == cos.sizes(), "RoPE tables of another head size");
    Engine out(*this);
    out.cos_ = cos, out.sin_ = sin;
    out.allocate(max_rows);
    return out;
  }

  // tokens (b,) long, pos (b,) long; cache (L, 2, b, kv, S, d); key_bias (b, kv, 1, S), 0 on the
  // readable columns (this step's column `col` included) and -inf elsewhere. Returns logits (b, V).
  Tensor step(const Tensor& tokens, const Tensor& pos, Tensor& cache, const Tensor& key_bias, int64_t col) {
    const int64_t b = tokens.size(0);
    TORCH_CHECK(cache.is_contiguous() && key_bias.is_contiguous() && tokens.is_contiguous() && pos.is_contiguous(),
                "contiguous inputs expected");
    TORCH_CHECK(cache.size(2) == b && key_bias.size(0) == b && col < cache.size(4), "shape mismatch");
    return step_rows(tokens.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), nullptr, b, cache, key_bias, col);
  }

  // The whole sampling loop of `torch_ar._decode` (top_p = 1) from the prefill's logits (b, V):
  // per step, each live row picks argmax(logits / T + Gumbel noise) with the noise of
  // `rlvr.noise` (hash of seed, step, vocab index; float64), or argmax(logits) when T <= 0,
  // records the token and its log-softmax, and a row that emits EOS leaves the batch at once.
  // The next step runs over the live rows only, reading and writing their own cache rows through
  // a slot map (no cache copy, unlike `Decoder.keep`). Returns (tokens (b, n) long, pad after EOS;
  // log-probs (b, n), 0 after EOS; done (b,) bool). Called with the GIL released: row-parallel
  // workers (trainer.thread_mode=rows) decode their shares without taking turns on Python.
  std::vector<Tensor> generate(const Tensor& first_logits, const Tensor& seeds, const Tensor& pos0, Tensor& cache,
                               Tensor& key_bias, int64_t col, int64_t max_new_tokens, double temperature,
                               int64_t eos_id, int64_t pad_id) {
    const int64_t b = first_logits.size(0), vocab = first_logits.size(1);
    TORCH_CHECK(cache.is_contiguous() && key_bias.is_contiguous() && seeds.is_contiguous() && pos0.is_contiguous(),
                "contiguous inputs expected");
    TORCH_CHECK(cache.size(2) == b && key_bias.size(0) == b && seeds.size(0) == b && pos0.size(0) == b,
                "shape mismatch");
    TORCH_CHECK(col + max_new_tokens <= cache.size(4) + 1, "the cache is too narrow for max_new_tokens");
    Tensor tokens = at::empty({b, max_new_tokens}, seeds.options());
    Tensor logprobs = at::zeros({b, max_new_tokens}, first_logits.options());
    Tensor done = at::zeros({b}, seeds.options().dtype(at::kBool));
    int64_t* tok_out = tokens.data_ptr<int64_t>();
    std::fill(tok_out, tok_out + b * max_new_tokens, pad_id);
    float* logp_out = logprobs.data_ptr<float>();
    bool* done_out = done.data_ptr<bool>();
    const int64_t* seed = seeds.data_ptr<int64_t>();
    std::vector<uint32_t> column_keys(vocab);
    for (int64_t j = 0; j < vocab; ++j) column_keys[j] = mix32(static_cast<uint32_t>(j) * 0x632BE5ABu + 0x85EBCA6Bu);
    std::vector<int64_t> slot(b), pos(pos0.data_ptr<int64_t>(), pos0.data_ptr<int64_t>() + b), chosen(b);
    for (int64_t r = 0; r < b; ++r) slot[r] = r;
    float* bias = key_bias.data_ptr<float>();
    const int64_t width = key_bias.size(-1);
    Tensor logits = first_logits.contiguous();
    for (int64_t step = 0; step < max_new_tokens && !slot.empty(); ++step) {
      const int64_t n = static_cast<int64_t>(slot.size());
      const float* lg = logits.data_ptr<float>();
      const uint32_t step_key = mix32(static_cast<uint32_t>(step) + 0x9E3779B9u);
      at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t r = slot[i];
          const uint32_t row_key = mix32(mix32(static_cast<uint32_t>(seed[r])) ^ step_key);
          float logp;
          chosen[i] = pick(lg + i * vocab, vocab, temperature, row_key, column_keys.data(), &logp);
          tok_out[r * max_new_tokens + step] = chosen[i];
          logp_out[r * max_new_tokens + step] = logp;
        }
      });
      // Keep the rows that did not emit EOS, in order (chosen/pos compacted along with slot).
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (chosen[i] == eos_id) { done_out[slot[i]] = true; continue; }
        slot[kept] = slot[i], chosen[kept] = chosen[i], pos[kept] = pos[i];
        ++kept;
      }
      slot.resize(kept);
      if (step == max_new_tokens - 1 || kept == 0) break;
      for (int64_t i = 0; i < kept; ++i)
        for (int64_t g = 0; g < kv_; ++g) bias[(slot[i] * kv_ + g) * width + col] = 0.f;
      logits = step_rows(chosen.data(), pos.data(), slot.data(), kept, cache, key_bias, col);
      ++col;
      for (int64_t i = 0; i < kept; ++i) ++pos[i];
    }
    return {tokens, logprobs, done};
  }

  // The prompts: ids/mask (U, Tp) long, left-padded; row (b,) long, the prompt of each cache row.
  // Writes every layer's prompt keys/values into columns [0, Tp) of each row's cache (keys
  // transposed, as `step` reads them) and returns the next-token logits of each row (b, V). The
  // same math as the eager prefill (rlvr.kernels.decoder): causal attention over real prompt
  // tokens, positions cumsum(mask) - 1, and a padding query attending to itself only (its output
  // is never read).
  Tensor prefill(const Tensor& ids, const Tensor& mask, const Tensor& row, Tensor& cache) {
    TORCH_CHECK(ids.is_contiguous() && mask.is_contiguous() && row.is_contiguous() && cache.is_contiguous(),
                "contiguous inputs expected");
    const int64_t prompts = ids.size(0), tp = ids.size(1), n = prompts * tp, b = row.size(0);
    TORCH_CHECK(cache.size(2) == b && tp <= cache.size(4), "shape mismatch");
    auto opts = x_.options();
    Work w{at::empty({n, hidden_}, opts), at::empty({n, hidden_}, opts), at::empty({n, qkv_.size(1)}, opts),
           at::empty({n, attn_.size(1)}, opts), at::empty({n, gu_.size(1)}, opts), at::empty({n, act_.size(1)}, opts)};
    const int64_t* m = mask.data_ptr<int64_t>();
    std::vector<int64_t> pos(n);
    for (int64_t u = 0; u < prompts; ++u)
      for (int64_t t = 0, seen = 0; t < tp; ++t) {
        seen += m[u * tp + t] != 0;
        pos[u * tp + t] = std::max<int64_t>(seen - 1, 0);
      }
    embed_rows(ids.data_ptr<int64_t>(), n, w.x.data_ptr<float>());
    for (size_t i = 0; i < layers_.size(); ++i) {
      project(layers_[i], w, pos.data());
      write_prompt_cache(w.qkv.data_ptr<float>(), row.data_ptr<int64_t>(),
                         cache.data_ptr<float>() + i * cache.stride(0), b, tp, cache.size(4));
      attend_prompt(w.qkv.data_ptr<float>(), m, w.attn.data_ptr<float>(), prompts, tp);
      finish(layers_[i], w);
    }
    Tensor last = w.x.view({prompts, tp, hidden_}).select(1, tp - 1).contiguous();
    return head(last, at::empty_like(last)).index_select(0, row);
  }

 private:
  // Workspaces for up to max_rows rows (a step allocates only its logits).
  void allocate(int64_t max_rows) {
    const int64_t inter = layers_[0].wd.size(0);
    auto opts = embed_.options();
    x_ = at::empty({max_rows, hidden_}, opts);
    xn_ = at::empty({max_rows, hidden_}, opts);
    qkv_ = at::empty({max_rows, (heads_ + 2 * kv_) * d_}, opts);
    attn_ = at::empty({max_rows, heads_ * d_}, opts);
    gu_ = at::empty({max_rows, 2 * inter}, opts);
    act_ = at::empty({max_rows, inter}, opts);
  }

  struct Work {  // activations of n rows: residual stream, its norm, q|k|v, attention, gate|up, act
    Tensor x, xn, qkv, attn, gu, act;
  };

  // One decode step of n rows: row i feeds tokens[i] at pos[i] into cache row slot[i] (row i when
  // slot is null) at column col; returns their next-token logits (n, V).
  Tensor step_rows(const int64_t* tokens, const int64_t* pos, const int64_t* slot, int64_t n, Tensor& cache,
                   const Tensor& key_bias, int64_t col) {
    TORCH_CHECK(n <= x_.size(0), "more rows than the engine was built for");
    Work w{x_.narrow(0, 0, n), xn_.narrow(0, 0, n), qkv_.narrow(0, 0, n), attn_.narrow(0, 0, n),
           gu_.narrow(0, 0, n), act_.narrow(0, 0, n)};
    embed_rows(tokens, n, w.x.data_ptr<float>());
    const Rows rows{slot, n, cache.size(2), cache.size(4)};
    for (size_t i = 0; i < layers_.size(); ++i) {
      project(layers_[i], w, pos);
      float* layer_cache = cache.data_ptr<float>() + i * cache.stride(0);
      write_cache(w.qkv.data_ptr<float>(), layer_cache, rows, col);
      attend(w.qkv.data_ptr<float>(), layer_cache, key_bias.data_ptr<float>(), w.attn.data_ptr<float>(), rows,
             col + 1);
      finish(layers_[i], w);
    }
    return head(w.x, w.xn);
  }

  struct Rows {  // which cache rows a step's n activation rows use: slot[i] (or i when null) of `total`
    const int64_t* slot;
    int64_t n, total, width;
    int64_t operator[](int64_t i) const { return slot ? slot[i] : i; }
  };

  // RMSNorm, the fused q|k|v matmul (+ bias) and RoPE at each row's position.
  void project(const Layer& l, Work& w, const int64_t* pos) const {
    const int64_t n = w.x.size(0);
    for (int64_t r = 0; r < n; ++r) TORCH_CHECK(pos[r] >= 0 && pos[r] < cos_.size(0), "position out of the RoPE table");
    rms_norm(w.x.data_ptr<float>(), l.ln1.data_ptr<float>(), w.xn.data_ptr<float>(), n, hidden_, eps_);
    if (l.bqkv.numel()) at::addmm_out(w.qkv, l.bqkv, w.xn, l.wqkv); else at::mm_out(w.qkv, w.xn, l.wqkv);
    rope(w.qkv.data_ptr<float>(), pos, cos_.data_ptr<float>(), sin_.data_ptr<float>(), n, w.qkv.size(1),
         heads_ + kv_, d_);
  }

  // x += attn·Woᵀ (+ bias), then the SwiGLU MLP block with its residual.
  void finish(const Layer& l, Work& w) const {
    const int64_t n = w.x.size(0);
    w.x.addmm_(w.attn, l.wo);
    if (l.bo.numel()) w.x.add_(l.bo);
    rms_norm(w.x.data_ptr<float>(), l.ln2.data_ptr<float>(), w.xn.data_ptr<float>(), n, hidden_, eps_);
    at::mm_out(w.gu, w.xn, l.wgu);
    silu_mul(w.gu.data_ptr<float>(), w.act.data_ptr<float>(), n, w.act.size(1));
    w.x.addmm_(w.act, l.wd);
  }

  // Final RMSNorm and LM head of the rows of x (xn: scratch of the same shape).
  Tensor head(const Tensor& x, Tensor xn) const {
    rms_norm(x.data_ptr<float>(), norm_.data_ptr<float>(), xn.data_ptr<float>(), x.size(0), hidden_, eps_);
    return lm_bias_.numel() ? at::addmm(lm_bias_, xn, lm_head_) : at::mm(xn, lm_head_);
  }

  // Prompt u's k/v (rows u·Tp .. u·Tp+Tp-1 of qkv) into columns [0, Tp) of every cache row r with row[r] = u.
  void write_prompt_cache(const float* qkv, const int64_t* row, float* cache, int64_t b, int64_t tp,
                          int64_t width) const {
    const int64_t row_width = (heads_ + 2 * kv_) * d_;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t g = 0; g < kv_; ++g) {
        float* keys = cache + (r * kv_ + g) * width * d_;
        float* values = cache + ((b + r) * kv_ + g) * width * d_;
        for (int64_t t = 0; t < tp; ++t) {
          const float* k = qkv + (row[r] * tp + t) * row_width + (heads_ + g) * d_;
          for (int64_t i = 0; i < d_; ++i) keys[i * width + t] = k[i];
          std::memcpy(values + t * d_, k + kv_ * d_, d_ * sizeof(float));
        }
      }
  }

  // Causal attention within each prompt over its real tokens (mask (U, Tp)); a padding query
  // attends to itself only. Prompts are short (tens of tokens): one dot product per pair.
  void attend_prompt(const float* qkv, const int64_t* mask, float* out, int64_t prompts, int64_t tp) const {
    const int64_t group = heads_ / kv_, row_width = (heads_ + 2 * kv_) * d_, d = d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    at::parallel_for(0, prompts * heads_, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> p(tp);
      for (int64_t idx = begin; idx < end; ++idx) {
        const int64_t u = idx / heads_, head = idx % heads_, g = head / group;
        const float* base = qkv + u * tp * row_width;
        const int64_t* m = mask + u * tp;
        for (int64_t t = 0; t < tp; ++t) {
          const float* q = base + t * row_width + head * d;
          float* o = out + (u * tp + t) * heads_ * d + head * d;
          if (!m[t]) {  // padding: attends to itself, weight 1
            std::memcpy(o, base + t * row_width + (heads_ + kv_ + g) * d, d * sizeof(float));
            continue;
          }
          float top = kNegInf;
          for (int64_t c = 0; c <= t; ++c) {
            p[c] = m[c] ? dot(q, base + c * row_width + (heads_ + g) * d, d) * scale : kNegInf;
            top = std::max(top, p[c]);
          }
          float total = 0.f;
          for (int64_t c = 0; c <= t; ++c) {
            p[c] = m[c] ? exp_approx(p[c] - top) : 0.f;
            total += p[c];
          }
          const float inv = 1.0f / total;
          std::fill(o, o + d, 0.f);
          for (int64_t c = 0; c <= t; ++c) {
            if (p[c] == 0.f) continue;
            const float wgt = p[c] * inv;
            const float* v = base + c * row_width + (heads_ + kv_ + g) * d;
            for (int64_t i = 0; i < d; ++i) o[i] += wgt * v[i];
          }
        }
      }
    });
  }

  static void check(const Tensor& t) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
                "float32 contiguous CPU tensors expected");
  }

  // Embedding rows, range-checked (a bad id must raise like F.embedding, not read stray memory).
  void embed_rows(const int64_t* tokens, int64_t b, float* x) const {
    const float* e = embed_.data_ptr<float>();
    const int64_t vocab = embed_.size(0);
    for (int64_t r = 0; r < b; ++r) {
      TORCH_CHECK(tokens[r] >= 0 && tokens[r] < vocab, "token id ", tokens[r], " out of range [0, ", vocab, ")");
      std::memcpy(x + r * hidden_, e + tokens[r] * hidden_, hidden_ * sizeof(float));
    }
  }

  // k|v of each row (after RoPE) into column `col`: values at cache[1][r, g, col, :], keys
  // transposed at cache[0][r, g, :, col] (the key block of a (row, kv head) is (d, S), see attend).
  void write_cache(const float* qkv, float* cache, const Rows& rows, int64_t col) const {
    const int64_t row_width = (heads_ + 2 * kv_) * d_, width = rows.width;
    for (int64_t r = 0; r < rows.n; ++r)
      for (int64_t g = 0; g < kv_; ++g) {
        const int64_t s = rows[r];
        const float* k = qkv + r * row_width + (heads_ + g) * d_;
        float* keys = cache + (s * kv_ + g) * width * d_;
        for (int64_t i = 0; i < d_; ++i) keys[i * width + col] = k[i];
        std::memcpy(cache + (((rows.total + s) * kv_ + g) * width + col) * d_, k + kv_ * d_, d_ * sizeof(float));
      }
  }

  // softmax(q·kᵀ/√d + bias)·v for each (row, kv head) and its query heads, over columns [0, span).
  // Keys are stored transposed, (d, S) per (row, kv head), so the scores of all columns are one
  // loop over d of contiguous multiply-adds across columns (vectorises), instead of a dot product
  // and a horizontal sum per column. Scores run over `padded` >= span columns (a multiple of 16, so
  // the loop has no scalar tail); columns whose bias is -inf (left padding, not written yet: stale
  // but never NaN-propagating, since they are replaced, not added) get probability 0 and are skipped.
  void attend(const float* qkv, const float* cache, const float* key_bias, float* out, const Rows& rows,
              int64_t span) const {
    const int64_t group = heads_ / kv_, row_width = (heads_ + 2 * kv_) * d_, d = d_, width = rows.width;
    const int64_t padded = std::min(width, (span + 15) / 16 * 16);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    at::parallel_for(0, rows.n * kv_, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> buf(padded + d);
      float* __restrict p = buf.data();
      float* __restrict acc = p + padded;
      for (int64_t idx = begin; idx < end; ++idx) {
        const int64_t r = idx / kv_, g = idx % kv_, s = rows[r];
        const float* __restrict keys = cache + (s * kv_ + g) * width * d;
        const float* __restrict values = cache + ((rows.total + s) * kv_ + g) * width * d;
        const float* __restrict bias = key_bias + (s * kv_ + g) * width;
        for (int64_t j = 0; j < group; ++j) {
          const int64_t head = g * group + j;
          const float* __restrict q = qkv + r * row_width + head * d;
          std::fill(p, p + padded, 0.f);
          for (int64_t i = 0; i < d; ++i) {
            const float qi = q[i];
            const float* __restrict k = keys + i * width;
            for (int64_t c = 0; c < padded; ++c) p[c] += qi * k[c];
          }
          float top = kNegInf;
          for (int64_t c = 0; c < padded; ++c) {
            p[c] = bias[c] == kNegInf ? kNegInf : p[c] * scale + bias[c];
            top = std::max(top, p[c]);
          }
          float total = 0.f;
          for (int64_t c = 0; c < padded; ++c) {
            const float e = exp_approx(p[c] - top);
            p[c] = p[c] == kNegInf ? 0.f : e;
            total += p[c];
          }
          const float inv = 1.0f / total;
          std::fill(acc, acc + d, 0.f);
          for (int64_t c = 0; c < span; ++c) {
            if (p[c] == 0.f) continue;
            const float w = p[c] * inv;
            const float* __restrict v = values + c * d;
            for (int64_t i = 0; i < d; ++i) acc[i] += w * v[i];
          }
          std::copy(acc, acc + d, out + r * heads_ * d + head * d);
        }
      }
    });
  }

  Tensor embed_, norm_, lm_head_, lm_bias_, cos_, sin_;
  std::vector<Layer> layers_;
  int64_t heads_, kv_, hidden_ = 0, d_ = 0;
  float eps_;
  Tensor x_, xn_, qkv_, attn_, gu_, act_;
};

}  // namespace

// The engine is a bound class, not torch.library ops: it holds state across calls (transposed
// weights, workspaces, RoPE tables) and raw pointers into them, has no autograd, and is never
// traced or compiled. Every method releases the GIL, since it touches no Python object, so
// row-parallel workers (trainer.thread_mode=rows) decode their shares of a batch at once.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  pybind11::class_<Engine>(m, "Engine")
      .def(pybind11::init<Tensor, Tensor, Tensor, Tensor, std::vector<Tensor>, Tensor, Tensor, int64_t, int64_t,
                          double, int64_t>(), release())
      .def("fork", &Engine::fork, release())
      .def("step", &Engine::step, release())
      .def("prefill", &Engine::prefill, release())
      .def("generate", &Engine::generate, release());
}
