// An independent, straightforward Llama forward pass for tests: double precision, no
// paging, no batching, weights read straight from the GGUF file.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"

namespace tandem::test {

class ReferenceModel {
 public:
  explicit ReferenceModel(const std::string& path) {
    auto f = engine::GgufFile::open(path);
    if (!f) throw std::runtime_error(f.status().to_string());
    file_ = std::move(f.value());
    auto c = engine::read_model_config(*file_);
    if (!c) throw std::runtime_error(c.status().to_string());
    c_ = *c;
  }
  const engine::ModelConfig& config() const { return c_; }

  // Logits of every position of `tokens`, [n][vocab].
  std::vector<std::vector<double>> logits(const std::vector<int32_t>& tokens) const {
    const size_t n = tokens.size(), d = c_.dim, hd = c_.head_dim(), nh = c_.n_heads, nkv = c_.n_kv_heads;
    const size_t ffn = c_.ffn_dim, vocab = c_.vocab_size;
    auto emb = tensor("token_embd.weight");
    std::vector<std::vector<double>> x(n, std::vector<double>(d));
    for (size_t t = 0; t < n; ++t)
      for (size_t i = 0; i < d; ++i) x[t][i] = emb[tokens[t] * d + i];
    for (uint32_t l = 0; l < c_.n_layers; ++l) {
      auto L = [&](const char* w) { return tensor(engine::layer_tensor(l, w)); };
      auto wq = L("attn_q"), wk = L("attn_k"), wv = L("attn_v"), wo = L("attn_output");
      auto an = L("attn_norm"), fn = L("ffn_norm"), wg = L("ffn_gate"), wu = L("ffn_up"), wd = L("ffn_down");
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (size_t t = 0; t < n; ++t) {
        auto h = rms(x[t], an);
        q[t] = matvec(wq, h, d);
        k[t] = matvec(wk, h, nkv * hd);
        v[t] = matvec(wv, h, nkv * hd);
        rope(q[t], t);
        rope(k[t], t);
      }
      for (size_t t = 0; t < n; ++t) {
        std::vector<double> att(d);
        for (size_t h = 0; h < nh; ++h) {
          const size_t kvh = h / (nh / nkv);
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (size_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (size_t i = 0; i < hd; ++i) dot += q[t][h * hd + i] * k[j][kvh * hd + i];
            s[j] = dot / std::sqrt(double(hd));
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (auto& e : s) sum += (e = std::exp(e - mx));
          for (size_t j = 0; j <= t; ++j)
            for (size_t i = 0; i < hd; ++i) att[h * hd + i] += s[j] / sum * v[j][kvh * hd + i];
        }
        auto o = matvec(wo, att, d);
        for (size_t i = 0; i < d; ++i) x[t][i] += o[i];
        auto h = rms(x[t], fn);
        auto g = matvec(wg, h, ffn), u = matvec(wu, h, ffn);
        for (size_t i = 0; i < ffn; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        auto dn = matvec(wd, g, d);
        for (size_t i = 0; i < d; ++i) x[t][i] += dn[i];
      }
    }
    auto on = tensor("output_norm.weight");
    auto out = file_->tensor("output.weight") ? tensor("output.weight") : emb;
    std::vector<std::vector<double>> logits(n);
    for (size_t t = 0; t < n; ++t) logits[t] = matvec(out, rms(x[t], on), vocab);
    return logits;
  }

 private:
  std::vector<double> tensor(const std::string& name) const {
    const engine::GgufTensor* t = file_->tensor(name);
    if (!t) throw std::runtime_error("missing " + name);
    std::vector<double> v(t->elements());
    for (size_t i = 0; i < v.size(); ++i) {
      if (t->type == 0) {
        float f;
        std::memcpy(&f, t->data + i * 4, 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, t->data + i * 2, 2);
        v[i] = half(h);
      }
    }
    return v;
  }
  static double half(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = (h & 0x8000) ? -1 : 1;
    if (e == 0) return s * std::ldexp(m, -24);
    if (e == 31) return m ? NAN : s * INFINITY;
    return s * std::ldexp(1024 + m, e - 25);
  }
  // W is [rows][cols] in memory (ggml dims [cols, rows]).
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x, size_t rows) {
    const size_t cols = x.size();
    std::vector<double> y(rows);
    for (size_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (size_t i = 0; i < cols; ++i) acc += w[r * cols + i] * x[i];
      y[r] = acc;
    }
    return y;
  }
  std::vector<double> rms(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / x.size() + c_.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
  }
  // GGUF llama convention: rotate adjacent pairs (x[2i], x[2i+1]) of each head.
  void rope(std::vector<double>& v, size_t pos) const {
    const size_t hd = c_.head_dim();
    for (size_t h = 0; h < v.size() / hd; ++h)
      for (size_t i = 0; i < hd / 2; ++i) {
        const double theta = pos * std::pow(double(c_.rope_freq_base), -2.0 * i / hd);
        const double x0 = v[h * hd + 2 * i], x1 = v[h * hd + 2 * i + 1];
        v[h * hd + 2 * i] = x0 * std::cos(theta) - x1 * std::sin(theta);
        v[h * hd + 2 * i + 1] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
  }

  std::unique_ptr<engine::GgufFile> file_;
  engine::ModelConfig c_;
};

}  // namespace tandem::test
