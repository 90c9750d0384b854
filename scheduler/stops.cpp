#include "scheduler/stops.h"

#include <algorithm>
#include <map>
#include <utility>

namespace tandem::scheduler {

// ---- StopTokenMatcher ----

Result<StopTokenMatcher> StopTokenMatcher::build(const std::vector<std::vector<int32_t>>& sequences) {
  if (sequences.size() > kMaxStopSequences) {
    return Status::invalid("stop_token_sequences: " + std::to_string(sequences.size()) + " given, at most " +
                           std::to_string(kMaxStopSequences));
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::string field = "stop_token_sequences[" + std::to_string(i) + "]: ";
    if (sequences[i].empty()) return Status::invalid(field + "empty");
    if (sequences[i].size() > kMaxStopSequenceTokens) {
      return Status::invalid(field + std::to_string(sequences[i].size()) + " tokens, at most " +
                             std::to_string(kMaxStopSequenceTokens));
    }
  }
  return build_unchecked(sequences);
}

StopTokenMatcher StopTokenMatcher::build_unchecked(const std::vector<std::vector<int32_t>>& patterns) {
  // 1. A plain trie; std::map keeps each node's children sorted.
  struct TrieNode {
    std::map<int32_t, uint32_t> children;
    uint32_t depth = 0;
    bool terminal = false;
  };
  std::vector<TrieNode> trie(1);
  for (const auto& p : patterns) {
    uint32_t n = 0;
    for (int32_t sym : p) {
      auto it = trie[n].children.find(sym);
      if (it == trie[n].children.end()) {
        const uint32_t child = static_cast<uint32_t>(trie.size());
        const uint32_t depth = trie[n].depth + 1;
        trie[n].children.emplace(sym, child);  // before push_back: it may move trie[n]
        trie.push_back(TrieNode{{}, depth, false});
        n = child;
      } else {
        n = it->second;
      }
    }
    if (!p.empty()) trie[n].terminal = true;
  }

  // 2. Renumber breadth-first and lay the edges out flat, sorted per node.
  StopTokenMatcher m;
  std::vector<uint32_t> order{0};  // new id -> trie id
  order.reserve(trie.size());
  std::vector<uint32_t> new_id(trie.size(), 0);
  m.nodes_.resize(trie.size());
  m.edges_.reserve(trie.size() - 1);
  for (size_t i = 0; i < order.size(); ++i) {
    const TrieNode& t = trie[order[i]];
    Node& node = m.nodes_[i];
    node.depth = t.depth;
    node.out = t.terminal ? t.depth : 0;
    node.first_edge = static_cast<uint32_t>(m.edges_.size());
    node.n_edges = static_cast<uint32_t>(t.children.size());
    for (const auto& [sym, child] : t.children) {
      new_id[child] = static_cast<uint32_t>(order.size());
      order.push_back(child);
      m.edges_.push_back(Edge{sym, new_id[child]});
    }
  }

  // 3. Failure links and outputs, in breadth-first order (= id order): a node's failure
  // target is shallower, so it is final when the node is reached.
  auto go = [&m](uint32_t n, int32_t sym) -> int64_t {
    const Edge* first = m.edges_.data() + m.nodes_[n].first_edge;
    const Edge* last = first + m.nodes_[n].n_edges;
    const Edge* e = std::lower_bound(first, last, sym, [](const Edge& a, int32_t s) { return a.symbol < s; });
    return e != last && e->symbol == sym ? static_cast<int64_t>(e->target) : int64_t{-1};
  };
  for (uint32_t n = 0; n < m.nodes_.size(); ++n) {
    const Node& node = m.nodes_[n];
    for (uint32_t e = node.first_edge; e < node.first_edge + node.n_edges; ++e) {
      const Edge edge = m.edges_[e];
      Node& child = m.nodes_[edge.target];
      uint32_t fail = 0;
      if (n != 0) {
        uint32_t f = node.fail;
        while (true) {
          const int64_t next = go(f, edge.symbol);
          if (next >= 0) {
            fail = static_cast<uint32_t>(next);
            break;
          }
          if (f == 0) break;
          f = m.nodes_[f].fail;
        }
      }
      child.fail = fail;
      // A terminal node is the longest match ending here; else the longest along the
      // failure chain (already final: shallower).
      if (child.out == 0) child.out = m.nodes_[fail].out;
    }
  }
  return m;
}

uint32_t StopTokenMatcher::feed(int32_t token) {
  if (nodes_.empty()) return 0;
  uint32_t s = state_;
  while (true) {
    const Node& node = nodes_[s];
    const Edge* first = edges_.data() + node.first_edge;
    const Edge* last = first + node.n_edges;
    const Edge* e = std::lower_bound(first, last, token, [](const Edge& a, int32_t t) { return a.symbol < t; });
    if (e != last && e->symbol == token) {
      s = e->target;
      break;
    }
    if (s == 0) break;
    s = node.fail;
  }
  state_ = s;
  return nodes_[s].out;
}

// ---- StopStringMatcher ----

Result<StopStringMatcher> StopStringMatcher::build(std::vector<std::string> stops, bool include_stop) {
  if (stops.size() > kMaxStopStrings) {
    return Status::invalid("stop_strings: " + std::to_string(stops.size()) + " given, at most " +
                           std::to_string(kMaxStopStrings));
  }
  std::vector<std::vector<int32_t>> patterns;
  patterns.reserve(stops.size());
  size_t longest = 0;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string field = "stop_strings[" + std::to_string(i) + "]: ";
    if (stops[i].empty()) return Status::invalid(field + "empty");
    if (stops[i].size() > kMaxStopStringBytes) {
      return Status::invalid(field + std::to_string(stops[i].size()) + " bytes, at most " +
                             std::to_string(kMaxStopStringBytes));
    }
    auto& p = patterns.emplace_back();
    for (unsigned char c : stops[i]) p.push_back(c);
    longest = std::max(longest, stops[i].size());
  }
  StopStringMatcher m;
  m.automaton_ = StopTokenMatcher::build_unchecked(patterns);
  m.stops_ = std::move(stops);
  m.include_ = include_stop;
  m.held_.reserve(longest);
  return m;
}

bool StopStringMatcher::feed(std::string_view text, std::string& emit) {
  if (stopped_) return true;
  // The text seen but not yet released is held_ + text; `pos` indexes into it.
  const size_t h = held_.size();
  auto append_range = [&](size_t begin, size_t end) {  // [begin, end) of held_ + text
    if (begin < h) {
      emit.append(held_, begin, std::min(end, h) - begin);
      begin = h;
    }
    if (end > begin) emit.append(text.substr(begin - h, end - begin));
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const uint32_t match = automaton_.feed(static_cast<unsigned char>(text[i]));
    if (match == 0) continue;
    const size_t end = h + i + 1;  // the stop string is [end - match, end)
    append_range(0, include_ ? end : end - match);
    held_.clear();
    stopped_ = true;
    return true;
  }
  // Keep the longest suffix that may still grow into a stop string: the automaton's depth.
  const size_t keep = automaton_.depth();
  const size_t total = h + text.size();
  append_range(0, total - keep);
  if (keep <= text.size()) {
    held_.assign(text.substr(text.size() - keep));
  } else {
    held_.erase(0, total - keep);
    held_.append(text);
  }
  return false;
}

void StopStringMatcher::flush(std::string& emit) {
  emit += held_;
  held_.clear();
}

}  // namespace tandem::scheduler
