// Stop detection and incremental detokenization, one instance per request. The scheduler
// sees every token, so stops are detected there. Nothing here allocates per token once
// constructed (callers pass reusable output buffers).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "runtime/status.h"

namespace tandem::scheduler {

// Limits enforced at admission (and by build()).
inline constexpr size_t kMaxStopSequences = 16;
inline constexpr size_t kMaxStopSequenceTokens = 64;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// Aho-Corasick automaton over token ids for one request's stop token sequences. Its state
// carries across calls, so a sequence that spans steps is found. feed() is amortized O(1)
// transitions (plus a binary search over a node's edges) and never allocates.
class StopTokenMatcher {
 public:
  StopTokenMatcher() = default;  // matches nothing
  // Errors (kInvalidArgument, naming stop_token_sequences): too many sequences, an empty or
  // too long sequence. Duplicates are fine.
  static Result<StopTokenMatcher> build(const std::vector<std::vector<int32_t>>& sequences);
  // Feeds the next generated token; returns the length of the longest stop sequence that
  // ends with it, or 0.
  uint32_t feed(int32_t token);
  bool empty() const { return nodes_.size() <= 1; }

 private:
  friend class StopStringMatcher;  // runs the same automaton over bytes
  struct Edge {
    int32_t symbol;
    uint32_t target;
  };
  // Nodes are numbered in breadth-first order (root 0); a node's edges are
  // edges_[first_edge, first_edge + n_edges), sorted by symbol.
  struct Node {
    uint32_t first_edge = 0;
    uint32_t n_edges = 0;
    uint32_t fail = 0;   // longest proper suffix of this node's string that is a trie node
    uint32_t out = 0;    // longest pattern that is a suffix of this node's string, 0: none
    uint32_t depth = 0;  // length of this node's string
  };
  // No limits checked: build() checks them for tokens, StopStringMatcher for bytes.
  static StopTokenMatcher build_unchecked(const std::vector<std::vector<int32_t>>& patterns);
  // After feed(): the longest suffix of everything fed that is a prefix of a pattern.
  uint32_t depth() const { return nodes_.empty() ? 0 : nodes_[state_].depth; }

  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  uint32_t state_ = 0;
};

// Tokens to UTF-8 text without ever splitting a character across outputs (the model library's
// streaming decoder; generated text continues the prompt, so no space is stripped).
using Detokenizer = model::StreamDecoder;

// Stop strings over the detokenized text. Bytes that might be the start of a stop string
// are held back until they can be decided, so a stop string never reaches the client
// (unless include_stop, which releases the text up to and including it). The stop that
// completes first in the text wins (on a tie, the longest), so the result does not depend
// on how the text is cut into pieces. Uses the same automaton as StopTokenMatcher over bytes.
class StopStringMatcher {
 public:
  StopStringMatcher() = default;  // matches nothing
  // Errors (kInvalidArgument, naming stop_strings): too many strings, an empty or too long
  // string.
  static Result<StopStringMatcher> build(std::vector<std::string> stops, bool include_stop);
  // Feeds text; appends what may be released now to `emit`. Returns true once a stop string
  // matched (then `emit` ends before it, or after it with include_stop); later calls do
  // nothing and return true. The text after a stop string is dropped.
  bool feed(std::string_view text, std::string& emit);
  // At the end of the request: appends any held-back bytes (nothing once stopped).
  void flush(std::string& emit);
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  bool include_ = false, stopped_ = false;
  std::string held_;            // the automaton's depth in bytes: a prefix of some stop string
  StopTokenMatcher automaton_;  // over bytes 0..255
};

}  // namespace tandem::scheduler
