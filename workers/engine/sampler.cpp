// Token sampling. See sampler.h for the contract; sample() runs these stages in order:
//
//   1. Sanitize: NaN -> -inf (and the +inf limit, below); find the max.
//   2. Raw log-probabilities: log_softmax(logits) = x - (max + log(sum exp(x - max))),
//      the sum accumulated in double and the subtraction done in double. Used for
//      Sample::logprob (the chosen token) and Sample::top, whatever the later stages do.
//   3. logit_bias: v[t] += bias (OpenAI; vLLM applies it before the penalties too).
//   4. Repetition penalty (llama.cpp / CTRL style) on each distinct in-range token of
//      `history`, once per token: logit > 0 ? logit / penalty : logit * penalty.
//   5. Presence / frequency penalties (OpenAI / vLLM) over the generated tokens:
//      logit -= frequency * count + presence, for each token generated at least once.
//      Stages 3-5 skip -inf logits, keep finite ones finite and ignore out-of-range ids.
//   6. temperature == 0: argmax of the reshaped logits, ties to the lowest id. Done.
//   7. Otherwise the filters, always in this order (as vLLM):
//        top-k  on the reshaped logits (keep the k largest; ties by lower id),
//        softmax of (logit - max) / temperature over the survivors,
//        top-p  (smallest prefix, by prob descending, whose cumulative prob >= top_p),
//        min-p  (drop tokens whose prob < min_p * max prob),
//      then renormalize and walk the kept tokens in descending prob (ties by lower id)
//      until the cumulative weight reaches u * total, u = uniform_draw(seed, position);
//      if rounding leaves the walk short, the last kept token is returned.
//
// Special values: a NaN logit is treated as -inf. If any logit is +inf, the +inf logits
// share all the probability equally (the limit of softmax) and every other token has
// logprob -inf. If every logit is -inf or NaN (or the logits are empty), sample() returns
// token 0 with logprob -inf (and a top list of the lowest ids, all -inf).
//
// Numerics: exp is a branch-free float polynomial (exp_neg below, a few ulp), applied
// 4 lanes at a time; sums are accumulated in double per lane in a fixed order. All of it
// is plain IEEE arithmetic, so a given (logits, params, seed, position) yields the same
// token on every x86-64 worker.
//
// Speed (vocab 49152): no allocation after construction; two vectorized passes over the
// vocabulary for greedy, three at temperature != 1. Top-k is one scan with a 2k-entry
// id buffer compacted by nth_element. The descending order needed by top-p and the walk
// is built lazily: the tokens above a threshold (set so the rest holds < 5% of the mass,
// or under half of 1 - top_p) are sorted up front; lighter tokens are sorted in bands,
// only when a walk reaches them. Each band lies entirely below the previous one, so the
// result is exactly the full (prob desc, id asc) order. The presence / frequency stage is
// two passes over the generated tokens (count, then apply and clear), at most the context
// length: small next to a vocabulary pass, and no state survives the call.

#include "workers/engine/sampler.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tandem::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// Shortest round-trip text of a float: 1.5f -> "1.5", NaN -> "nan".
uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 4-lane float / 2-lane double vectors (GCC/Clang vector extensions): one SSE register
// each on the x86-64 baseline the engine is built for, and no control flow, so the loops
// below vectorize and every lane is computed the same way.
using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));
using D2 = double __attribute__((vector_size(16)));

[[gnu::always_inline]] inline F4 load4(const float* p) {
  F4 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
[[gnu::always_inline]] inline void store4(float* p, F4 x) { std::memcpy(p, &x, sizeof(x)); }
[[gnu::always_inline]] inline F4 splat(float x) { return F4{x, x, x, x}; }

// exp(x) for x <= 0 (or -inf), lane-wise: Cody-Waite reduction to |r| <= ln2/2 and a
// degree-7 Taylor polynomial (truncation < 1e-8 relative), within a few ulp of exp.
// Exactly 0 below -87.3 (where exp < 2^-126, negligible next to the max's weight of
// 1) and exp(0) == 1 exactly. Plain multiplies and adds only, so it gives the same bits
// on every x86-64 (the engine is built with -ffp-contract=off). Every weight, whether
// computed over the whole vocabulary or for one top-k survivor, goes through here.
[[gnu::always_inline]] inline F4 exp_neg(F4 x) {
  constexpr float kMin = -87.3f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const I4 below = x < kMin;
#if defined(__SSE2__)
  const F4 xc = reinterpret_cast<F4>(_mm_max_ps(x, splat(kMin)));  // no NaN here
#else
  const F4 xc = below ? splat(kMin) : x;
#endif
  const F4 n = (xc * 1.44269504088896341f + kRound) - kRound;  // in [-126, 0]
  F4 r = xc - n * 0.693145751953125f;                          // ln2 high part (exact product)
  r = r - n * 1.428606765330187045e-06f;                       // ln2 low part
  F4 p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const I4 e = (__builtin_convertvector(n, I4) + 127) << 23;  // 2^n, n >= -126: normal
  const F4 y = p * reinterpret_cast<F4>(e);
  return below ? F4{} : y;
}

// Lanes as doubles, {x0, x1} and {x2, x3}, and back (exact widening, rounded
// narrowing: the same values either way; the intrinsics just avoid shuffles via memory).
#if defined(__SSE2__)
[[gnu::always_inline]] inline D2 lo2(F4 x) { return reinterpret_cast<D2>(_mm_cvtps_pd(x)); }
[[gnu::always_inline]] inline D2 hi2(F4 x) { return reinterpret_cast<D2>(_mm_cvtps_pd(_mm_movehl_ps(x, x))); }
[[gnu::always_inline]] inline F4 narrow(D2 a, D2 b) {
  return reinterpret_cast<F4>(
      _mm_movelh_ps(_mm_cvtpd_ps(reinterpret_cast<__m128d>(a)), _mm_cvtpd_ps(reinterpret_cast<__m128d>(b))));
}
#else
[[gnu::always_inline]] inline D2 lo2(F4 x) { return D2{x[0], x[1]}; }
[[gnu::always_inline]] inline D2 hi2(F4 x) { return D2{x[2], x[3]}; }
[[gnu::always_inline]] inline F4 narrow(D2 a, D2 b) {
  return F4{static_cast<float>(a[0]), static_cast<float>(a[1]), static_cast<float>(b[0]), static_cast<float>(b[1])};
}
#endif

// float(exp((v - max) * inv_t)) per lane, the argument formed in double.
[[gnu::always_inline]] inline F4 weight4(F4 v, double max, double inv_t) {
  return exp_neg(narrow((lo2(v) - max) * inv_t, (hi2(v) - max) * inv_t));
}

float weight1(float v, double max, double inv_t) { return weight4(splat(v), max, inv_t)[0]; }

// Lane-parallel loops over n floats, 4 at a time; the last n % 4 are padded with -inf
// (which every caller treats as neutral: max identity, weight 0).
template <class Body>
[[gnu::always_inline]] inline void for_each4(const float* in, float* out, uint32_t n, Body body) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const F4 y = body(load4(in + i));
    if (out) store4(out + i, y);
  }
  if (i < n) {
    F4 x = splat(-kInf);
    for (uint32_t l = 0; i + l < n; ++l) x[l] = in[i + l];
    const F4 y = body(x);
    if (out) {
      for (uint32_t l = 0; i + l < n; ++l) out[i + l] = y[l];
    }
  }
}

float hmax(F4 m) {
  float r = -kInf;
  for (int l = 0; l < 4; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// out[i] = in[i] with NaN -> -inf; returns the max (-inf if all are) and, in *argmax,
// the lowest index holding it (0 if all are -inf).
float sanitize_and_max(const float* in, float* out, uint32_t n, uint32_t* argmax) {
  const F4 ninf = splat(-kInf);
  F4 m = ninf;
  I4 at = {0, 1, 2, 3};  // per lane: the first index holding the lane's max
  I4 idx = at;
  for_each4(in, out, n, [&](F4 x) {
    const F4 y = x != x ? ninf : x;
    const I4 better = y > m;
    m = better ? y : m;
    at = better ? idx : at;
    idx += 4;
    return y;
  });
  const float r = hmax(m);
  uint32_t best = 0;
  bool found = false;
  for (int l = 0; l < 4; ++l) {
    if (m[l] == r && (!found || static_cast<uint32_t>(at[l]) < best)) {
      best = static_cast<uint32_t>(at[l]);
      found = true;
    }
  }
  *argmax = r == -kInf ? 0 : best;
  return r;
}

// sum_i exp(v[i] - max), accumulated per lane in double (fixed order: deterministic).
double sum_exp(const float* v, uint32_t n, float max) {
  D2 a = {}, b = {};
  for_each4(v, nullptr, n, [&](F4 x) {
    const F4 w = weight4(x, max, 1.0);
    a += lo2(w);
    b += hi2(w);
    return w;
  });
  return (a[0] + a[1]) + (b[0] + b[1]);
}

// v[i] = exp((v[i] - max) * inv_t) in place; returns the sum of all weights and, in
// *kept_sum, the sum of the weights >= cutoff.
double weights_in_place(float* v, uint32_t n, float max, double inv_t, float cutoff, double* kept_sum) {
  D2 a = {}, b = {}, ka = {}, kb = {};
  for_each4(v, v, n, [&](F4 x) {
    const F4 w = weight4(x, max, inv_t);
    const F4 k = w >= cutoff ? w : F4{};
    a += lo2(w);
    b += hi2(w);
    ka += lo2(k);
    kb += hi2(k);
    return w;
  });
  *kept_sum = (ka[0] + ka[1]) + (kb[0] + kb[1]);
  return (a[0] + a[1]) + (b[0] + b[1]);
}

}  // namespace

double uniform_draw(uint64_t seed, uint64_t position) {
  const uint64_t h = splitmix64(seed ^ splitmix64(position + 0xD1B54A32D192ED03ull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;  // top 53 bits: [0, 1)
}

Verdict verify_sampled(std::span<const float> p, std::span<const float> q, int32_t draft, uint64_t seed,
                       uint64_t position) {
  auto q_of = [&q](size_t t) { return t < q.size() ? double{q[t]} : 0.0; };
  const auto d = static_cast<size_t>(draft);
  const double pd = d < p.size() ? double{p[d]} : 0.0;
  // Accept when u < p/q, i.e. u * q < p (q > 0: the draft was drawn from q).
  if (uniform_draw(seed, position + kAcceptStream) * q_of(d) < pd) return {true, draft};
  double total = 0.0;
  for (size_t t = 0; t < p.size(); ++t) total += std::max(0.0, double{p[t]} - q_of(t));
  // p == q up to rounding leaves no residual: draw from p itself (the rejection had probability ~0).
  const bool from_p = !(total > 0.0);
  if (from_p) {
    total = 0.0;
    for (float x : p) total += x;
  }
  const double target = uniform_draw(seed, position + kResidualStream) * total;
  double cum = 0.0;
  size_t last = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    const double w = from_p ? double{p[t]} : std::max(0.0, double{p[t]} - q_of(t));
    if (w <= 0.0) continue;
    last = t;
    cum += w;
    if (cum > target) return {false, static_cast<int32_t>(t)};
  }
  return {false, static_cast<int32_t>(last)};
}

Sampler::Sampler(uint32_t vocab_size)
    : vocab_(vocab_size),
      kernels_(&kernels::best()),
      probs_(vocab_size),
      order_(vocab_size),
      sort_keys_(2 * size_t{vocab_size}),
      sort_ids_(vocab_size),
      seen_(vocab_size, 0),
      counts_(vocab_size, 0),
      top_(static_cast<size_t>(kMaxTopLogprobs)) {}

namespace {

// The raw logprob of `token`, from the caller's logits: NaN as -inf, the +inf limit when any
// logit is +inf, then minus the log-softmax normalizer.
float raw_logprob(std::span<const float> logits, uint32_t token, bool inf_mode, double log_norm) {
  float x = logits[token];
  if (std::isnan(x)) x = -kInf;
  if (inf_mode) x = x == kInf ? 0.0f : -kInf;
  return x == -kInf ? -kInf : static_cast<float>(static_cast<double>(x) - log_norm);
}

// The best `n_top` values of v[0, n) into top[], by sorted insertion into a tiny array.
// Scanning in id order means an equal value never displaces an earlier (lower id) entry.
// Returns how many were found.
int32_t collect_top(const float* v, uint32_t n, int32_t n_top, TokenLogprob* top) {
  int32_t n_found = 0;
  if (n_top <= 0) return 0;
  for (uint32_t i = 0; i < n; ++i) {
    const float x = v[i];
    if (n_found == n_top && !(x > top[n_found - 1].logprob)) continue;
    int32_t j = n_found < n_top ? n_found++ : n_top - 1;
    while (j > 0 && x > top[j - 1].logprob) {
      top[j] = top[j - 1];
      --j;
    }
    top[j] = {static_cast<int32_t>(i), x};
  }
  return n_found;
}

// A reshaped finite logit stays finite (a stage never makes a token impossible or certain).
float keep_finite(float y) { return std::isinf(y) ? std::copysign(kFloatMax, y) : y; }

// Stage 1: v = the logits with NaN as -inf, their max and (in arg) the lowest id holding it.
// Any +inf: the limit of softmax, where the +inf logits split the mass (v = 0) and every
// other token is impossible (v = -inf).
struct Sanitized {
  float max = -kInf;
  uint32_t arg = 0;
  bool inf_mode = false;
};
Sanitized sanitize(std::span<const float> logits, float* v, uint32_t n) {
  Sanitized out;
  out.max = sanitize_and_max(logits.data(), v, n, &out.arg);
  out.inf_mode = out.max == kInf;
  if (out.inf_mode) {
    for (uint32_t i = 0; i < n; ++i) v[i] = v[i] == kInf ? 0.0f : -kInf;
    out.max = 0.0f;
  }
  return out;
}

// Which stages between sanitizing and the draw do anything for these inputs. In the +inf
// limit none of the reshaping stages do (a finite shift leaves +inf at +inf).
struct Stages {
  bool logit_bias = false, repetition = false, occurrence = false, top_k = false;
  bool reshapes() const { return logit_bias || repetition || occurrence; }
};
Stages active_stages(const SamplingParams& p, uint32_t n, std::span<const int32_t> history,
                     std::span<const int32_t> generated, bool inf_mode) {
  Stages s;
  s.logit_bias = !inf_mode && !p.logit_bias.empty();
  s.repetition = !inf_mode && p.repetition_penalty != 1.0f && !history.empty();
  s.occurrence = !inf_mode && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && !generated.empty();
  s.top_k = p.top_k > 0 && static_cast<uint32_t>(p.top_k) < n;
  return s;
}

// Stage 3: v[token] += bias for each in-range entry (ids outside [0, n) are ignored; the
// entries are validated, so each token appears once). -inf stays -inf. Returns whether any
// logit changed.
bool add_logit_bias(float* v, uint32_t n, std::span<const model::LogitBias> bias) {
  bool changed = false;
  for (const model::LogitBias& b : bias) {
    if (b.token < 0 || static_cast<uint32_t>(b.token) >= n) continue;
    const float x = v[b.token];
    if (x == -kInf) continue;
    const float y = keep_finite(x + b.bias);
    changed |= y != x;
    v[b.token] = y;
  }
  return changed;
}

// Stage 4: the repetition penalty on v[0, n), once per distinct in-range token of
// `history`. `seen` holds n flags, all 0 before and after. Returns whether any logit changed.
bool penalize_repetition(float* v, uint32_t n, std::span<const int32_t> history, float penalty, uint8_t* seen) {
  bool changed = false;
  for (int32_t t : history) {
    if (t < 0 || static_cast<uint32_t>(t) >= n || seen[t]) continue;
    seen[t] = 1;
    const float x = v[t];
    if (x == -kInf) continue;
    const float y = keep_finite(x > 0.0f ? x / penalty : x * penalty);
    changed |= y != x;
    v[t] = y;
  }
  for (int32_t t : history) {
    if (t >= 0 && static_cast<uint32_t>(t) < n) seen[t] = 0;
  }
  return changed;
}

// Stage 5: presence and frequency penalties (OpenAI / vLLM) over `generated`:
// v[t] = v[t] - frequency * count(t) - presence for each distinct in-range t. `counts` holds
// n counters, all 0 before and after (the second pass applies and clears them). Returns
// whether any logit changed.
bool penalize_occurrences(float* v, uint32_t n, std::span<const int32_t> generated, float presence, float frequency,
                          uint32_t* counts) {
  for (int32_t t : generated) {
    if (t >= 0 && static_cast<uint32_t>(t) < n) ++counts[t];
  }
  bool changed = false;
  for (int32_t t : generated) {
    if (t < 0 || static_cast<uint32_t>(t) >= n || counts[t] == 0) continue;
    const float c = static_cast<float>(counts[t]);
    counts[t] = 0;
    const float x = v[t];
    if (x == -kInf) continue;
    const float y = keep_finite(x - frequency * c - presence);
    changed |= y != x;
    v[t] = y;
  }
  return changed;
}

// The candidates of one draw (stage 4 of the pipeline). Weights are relative to the max,
// which gets exactly 1, and replace the logits in v. A token is "kept" (survives min-p) when
// its weight >= cutoff; with min-p off, cutoff is the smallest positive float, which drops
// only weights that underflowed to 0 (they could never be drawn). min-p keeps a prefix of
// the descending order, so filtering it up front (while top-p still measures against the
// full mass `total`) equals applying it after top-p.
//
// Sorting cost control: only the tokens with weight > band_lo are sorted up front. The rest
// (at most count * band_lo of mass: under 5% of the total, or under half of 1 - top_p, so
// top-p never needs it) is sorted in bands of weight (band_lo / 64, band_lo], one band at a
// time and only when a walk reaches it. Each band's weights are all below the previous
// band's, so the bands concatenate into the exact descending order.
// Descending weight, ties by lower id.
struct ByValue {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Scratch for RadixSort: two key arrays and an id array, each at least the vocabulary.
struct SortScratch {
  uint32_t* keys = nullptr;
  uint32_t* keys2 = nullptr;
  int32_t* ids2 = nullptr;
};

// ord[0, n), ids in ascending order, into ByValue's order over non-negative weights: a stable
// LSD radix sort (8-bit digits) on the weights' bits, which order as unsigned integers for
// non-negative floats, inverted for descending; stability keeps equal weights by lower id, so
// the result is std::sort with ByValue's, bit for bit, in a few passes instead of n log n
// indirect comparisons (a flat distribution over a 32k vocabulary sorts all of it). A digit
// every key shares is skipped. Short runs go to std::sort.
void radix_sort_desc(int32_t* ord, uint32_t n, const float* v, const SortScratch& s) {
  if (n < 512) return std::sort(ord, ord + n, ByValue{v});
  uint32_t* keys = s.keys;
  uint32_t* keys2 = s.keys2;
  int32_t* ids = ord;
  int32_t* ids2 = s.ids2;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[ord[i]], sizeof bits);
    keys[i] = ~bits;
  }
  for (uint32_t shift = 0; shift < 32; shift += 8) {
    uint32_t count[257] = {};
    for (uint32_t i = 0; i < n; ++i) ++count[((keys[i] >> shift) & 0xFF) + 1];
    if (count[((keys[0] >> shift) & 0xFF) + 1] == n) continue;  // one digit for all: nothing moves
    for (uint32_t d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t at = count[(keys[i] >> shift) & 0xFF]++;
      keys2[at] = keys[i];
      ids2[at] = ids[i];
    }
    std::swap(keys, keys2);
    std::swap(ids, ids2);
  }
  if (ids != ord) std::copy(ids, ids + n, ord);
}

class Candidates {
 public:
  Candidates(float* v, int32_t* ord, uint32_t n, float max_v, const SamplingParams& params, SortScratch scratch)
      : v_(v),
        ord_(ord),
        scratch_(scratch),
        n_(n),
        max_v_(max_v),
        inv_t_(1.0 / static_cast<double>(params.temperature)),
        cutoff_(params.min_p > 0.0f ? params.min_p : std::numeric_limits<float>::denorm_min()),
        top_p_(params.top_p) {}

  // top-k on the penalized logits, ties by lower id (dividing by the temperature keeps the
  // order). One scan with a buffer of up to 2k ids: when it fills, nth_element keeps the best
  // k and their k-th value becomes the bar (a later equal value has a higher id, so it loses
  // the tie). -inf logits are skipped: they would get weight 0 anyway.
  void take_top_k(uint32_t want) {
    whole_vocab_ = false;
    const uint32_t cap = want <= n_ / 2 ? 2 * want : n_;
    uint32_t c = 0;
    float bar = -kInf;
    for (uint32_t i = 0; i < n_; ++i) {
      if (!(v_[i] > bar)) continue;
      ord_[c++] = static_cast<int32_t>(i);
      if (c == cap) {
        std::nth_element(ord_, ord_ + (want - 1), ord_ + c, ByValue{v_});
        bar = v_[ord_[want - 1]];
        c = want;
      }
    }
    if (c > want) std::nth_element(ord_, ord_ + (want - 1), ord_ + c, ByValue{v_});
    const uint32_t k = std::min(c, want);
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t i = ord_[j];
      const float w = weight1(v_[i], max_v_, inv_t_);
      v_[i] = w;
      total_ += w;
      kept_total_ += w >= cutoff_ ? w : 0.0f;
    }
    const float cutoff = cutoff_;
    n_keep_ = static_cast<uint32_t>(
        std::partition(ord_, ord_ + k, [v = v_, cutoff](int32_t i) { return v[i] >= cutoff; }) - ord_);
    pick_threshold(k);
    sorted_end_ = static_cast<uint32_t>(
        std::partition(ord_, ord_ + n_keep_, [v = v_, t = band_lo_](int32_t i) { return v[i] > t; }) - ord_);
    tail_pending_ = sorted_end_ < n_keep_;  // already in ord[sorted_end, n_keep), unsorted
    sort_head();
  }

  // The whole vocabulary: weights computed in place (vectorized); only the head is collected
  // into ord. Returns the sum of all weights.
  double take_all() {
    whole_vocab_ = true;
    total_ = weights_in_place(v_, n_, max_v_, inv_t_, cutoff_, &kept_total_);
    pick_threshold(n_);
    const float head_min = std::max(band_lo_, cutoff_);  // head: w > thr and w >= cutoff
    uint32_t h = 0;
    for (uint32_t i = 0; i < n_; ++i) {
      ord_[h] = static_cast<int32_t>(i);
      h += v_[i] > band_lo_ && v_[i] >= head_min;
    }
    sorted_end_ = h;
    n_keep_ = h;                          // grows as bands are materialized
    tail_pending_ = cutoff_ <= band_lo_;  // otherwise no kept token lies at or below thr
    sort_head();
    return total_;
  }

  // top-p: the smallest prefix whose cumulative weight >= top_p * total (the max token,
  // weight 1, is always kept, so the prefix is never empty).
  void keep_nucleus() {
    if (top_p_ >= 1.0) return;
    const double target = top_p_ * total_;
    double cum = 0.0;
    uint32_t len = 0;
    for (uint32_t j = 0;; ++j) {
      if (j == sorted_end_ && (extend(), j == sorted_end_)) break;
      cum += v_[ord_[j]];
      len = j + 1;
      if (cum >= target) break;
    }
    tail_pending_ = false;  // the nucleus is ord[0, len), all sorted
    n_keep_ = len;
    sorted_end_ = len;
    kept_total_ = cum;
  }

  // Every kept token's probability into probs (zeroed first): its weight over their sum.
  void fill(std::span<float> probs) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    while (tail_pending_) extend();
    double sum = 0.0;
    for (uint32_t j = 0; j < sorted_end_; ++j) sum += v_[ord_[j]];
    if (!(sum > 0.0)) return;
    for (uint32_t j = 0; j < sorted_end_; ++j) probs[ord_[j]] = static_cast<float>(v_[ord_[j]] / sum);
  }

  // Walks the kept tokens in descending weight until cum >= u * kept_total.
  uint32_t draw(double u) {
    const double target = u * kept_total_;
    double cum = 0.0;
    for (uint32_t j = 0;; ++j) {
      if (j == sorted_end_ && (extend(), j == sorted_end_)) break;
      cum += v_[ord_[j]];
      if (cum >= target) return static_cast<uint32_t>(ord_[j]);
    }
    // Rounding left cum just below the target: the last kept token (all are sorted now).
    return static_cast<uint32_t>(ord_[sorted_end_ - 1]);
  }

 private:
  // Sorts ord[from, to): ids there are ascending when the whole vocabulary was scanned in order
  // (take_all, extend), so the radix sort applies; top-k's come from nth_element.
  void sort_range(uint32_t from, uint32_t to) {
    if (whole_vocab_)
      radix_sort_desc(ord_ + from, to - from, v_, scratch_);
    else
      std::sort(ord_ + from, ord_ + to, ByValue{v_});
  }
  void sort_head() { sort_range(0, sorted_end_); }
  void pick_threshold(uint32_t count) {
    const double thr = top_p_ < 1.0 ? (1.0 - top_p_) * total_ / (2.0 * count) : 0.05 * total_ / count;
    band_lo_ = static_cast<float>(thr);
  }
  float next_band_lo() const { return band_lo_ < 1e-12f ? 0.0f : band_lo_ * (1.0f / 64.0f); }

  // Appends the next band, sorted, to ord[0, sorted_end) (a no-op once all is sorted).
  void extend() {
    if (!tail_pending_) return;
    const float hi = band_lo_;
    const float lo = next_band_lo();
    uint32_t end;
    if (whole_vocab_) {
      end = sorted_end_;
      for (uint32_t i = 0; i < n_; ++i) {
        const float w = v_[i];
        if (w >= cutoff_ && w <= hi && w > lo) ord_[end++] = static_cast<int32_t>(i);
      }
      n_keep_ = end;
      tail_pending_ = lo > 0.0f && cutoff_ <= lo;
    } else {
      // The not yet sorted kept tokens are ord[sorted_end, n_keep).
      end = static_cast<uint32_t>(
          std::partition(ord_ + sorted_end_, ord_ + n_keep_, [v = v_, lo](int32_t i) { return v[i] > lo; }) - ord_);
      tail_pending_ = end < n_keep_;
    }
    sort_range(sorted_end_, end);
    sorted_end_ = end;
    band_lo_ = lo;
  }

  float* const v_;
  int32_t* const ord_;
  const SortScratch scratch_;
  const uint32_t n_;
  const float max_v_;
  const double inv_t_;
  const float cutoff_;
  const double top_p_;
  bool whole_vocab_ = true;
  double total_ = 0.0;       // mass of all candidates (the top-k survivors)
  double kept_total_ = 0.0;  // mass of the kept ones
  uint32_t n_keep_ = 0;      // kept tokens, once known (see tail_pending_)
  uint32_t sorted_end_ = 0;  // ord[0, sorted_end) is the exact descending prefix
  bool tail_pending_ = false;
  float band_lo_ = 0.0f;  // every kept token with weight > band_lo is in ord[0, sorted_end)
};

}  // namespace

Sample Sampler::sample(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                       std::span<const int32_t> history, std::span<const int32_t> generated, Logprob logprob) {
  return run(logits, params, position, history, generated, logprob, {});
}

Sample Sampler::distribution(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                             std::span<const int32_t> history, std::span<const int32_t> generated,
                             std::span<float> probs) {
  assert(probs.size() == vocab_ && "probs must have vocab_size entries");
  return run(logits, params, position, history, generated, Logprob::kReport, probs);
}

float Sampler::last_logprob(std::span<const float> logits, int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) return -kInf;
  return raw_logprob(logits, static_cast<uint32_t>(token), last_inf_mode_, last_log_norm_);
}

// sample() and distribution(): `probs` empty for sample().
Sample Sampler::run(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                    std::span<const int32_t> history, std::span<const int32_t> generated, Logprob logprob,
                    std::span<float> probs) {
  assert(logits.size() == vocab_ && "logits must have vocab_size entries");
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(logits.size(), vocab_));
  const int32_t n_top = std::clamp(params.top_logprobs, 0, kMaxTopLogprobs);
  float* const v = probs_.data();  // sanitized logits, then reshaped, then weights

  // Greedy, nothing reshaping the logits and nothing to report but the token: the lowest id
  // holding the max (NaN as -inf), which is what the stages below end with, in one read.
  if (params.temperature <= 0.0f && n_top == 0 && logprob == Logprob::kSkip &&
      !active_stages(params, n, history, generated, false).reshapes()) {
    float max = 0.0f;
    Sample out;
    out.token = static_cast<int32_t>(kernels_->argmax(logits.data(), n, &max));
    return out;
  }

  // 1. Sanitize.
  Sanitized in = sanitize(logits, v, n);
  auto one_hot = [&probs](uint32_t token) {
    if (probs.empty()) return;
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[token] = 1.0f;
  };
  if (in.max == -kInf) {
    last_inf_mode_ = false;
    last_log_norm_ = kInf;
    one_hot(0);
    return nothing_possible(n, n_top);
  }

  // 2. The raw log-softmax normalizer and top list, before anything reshapes v. At
  // temperature 1 over the whole vocabulary with nothing reshaping the logits, the sampling
  // weights are exactly the raw exp(logit - max) terms (same function, same summation order),
  // so take_all()'s sum is reused below instead of a pass here.
  const Stages stages = active_stages(params, n, history, generated, in.inf_mode);
  const bool reuse_norm = params.temperature == 1.0f && !stages.reshapes() && !stages.top_k;
  const bool norm_needed = logprob == Logprob::kReport || n_top > 0;
  double log_norm = 0.0;
  if (!reuse_norm && norm_needed) log_norm = static_cast<double>(in.max) + std::log(sum_exp(v, n, in.max));
  const int32_t n_found = collect_top(v, n, n_top, top_.data());

  // 3-5. logit_bias, repetition penalty, presence / frequency penalties.
  bool changed = false;
  if (stages.logit_bias) changed |= add_logit_bias(v, n, params.logit_bias);
  if (stages.repetition) changed |= penalize_repetition(v, n, history, params.repetition_penalty, seen_.data());
  if (stages.occurrence)
    changed |= penalize_occurrences(v, n, generated, params.presence_penalty, params.frequency_penalty, counts_.data());
  if (changed) in.max = sanitize_and_max(v, v, n, &in.arg);  // (already sanitized)

  // 6. Greedy: the lowest id holding the max. 7. Otherwise temperature, top-k, top-p, min-p
  // and the draw.
  uint32_t token = in.arg;
  if (params.temperature > 0.0f) {
    Candidates candidates(v, order_.data(), n, in.max, params,
                          SortScratch{sort_keys_.data(), sort_keys_.data() + vocab_, sort_ids_.data()});
    if (stages.top_k) {
      candidates.take_top_k(static_cast<uint32_t>(params.top_k));
    } else {
      const double total = candidates.take_all();
      if (reuse_norm) log_norm = static_cast<double>(in.max) + std::log(total);
    }
    candidates.keep_nucleus();
    token = candidates.draw(uniform_draw(params.seed, position));
    if (!probs.empty()) candidates.fill(probs);
  } else {
    one_hot(token);
  }
  last_inf_mode_ = in.inf_mode;
  last_log_norm_ = log_norm;
  Sample out = report(logits, token, in.inf_mode, log_norm, n_found);
  if (logprob == Logprob::kSkip) out.logprob = 0.0f;
  return out;
}

// Nothing is possible (or the vocabulary is empty): token 0, logprob -inf; the top list is
// the lowest ids, all -inf.
Sample Sampler::nothing_possible(uint32_t n, int32_t n_top) {
  const int32_t m = static_cast<int32_t>(std::min<uint32_t>(static_cast<uint32_t>(n_top), n));
  for (int32_t j = 0; j < m; ++j) top_[j] = {j, -kInf};
  Sample out;
  out.logprob = -kInf;
  out.top = std::span<const TokenLogprob>(top_.data(), static_cast<size_t>(m));
  return out;
}

// The chosen token and the top list with their raw logprobs (log_norm is final here).
Sample Sampler::report(std::span<const float> logits, uint32_t token, bool inf_mode, double log_norm, int32_t n_found) {
  for (int32_t j = 0; j < n_found; ++j) top_[j].logprob = raw_logprob(logits, top_[j].token, inf_mode, log_norm);
  Sample out;
  out.token = static_cast<int32_t>(token);
  out.logprob = raw_logprob(logits, token, inf_mode, log_norm);
  out.top = std::span<const TokenLogprob>(top_.data(), static_cast<size_t>(n_found));
  return out;
}

}  // namespace tandem::engine
