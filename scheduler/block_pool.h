// KV block accounting for one worker: which block ids are free, and how many sequences
// reference each used block. The scheduler owns it; the worker only holds the bytes.
// Pure: no sockets, no clocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::scheduler {

class BlockPool {
 public:
  explicit BlockPool(uint32_t n_blocks);

  uint32_t total() const { return static_cast<uint32_t>(refs_.size()); }
  uint32_t free() const { return n_free_; }
  uint32_t used() const { return total() - n_free_; }

  // Appends `n` newly allocated blocks (refcount 1) to `table`. Prefers the id right after
  // the table's last block, then the lowest free ids, so tables stay contiguous where the
  // pool allows (attention reads contiguous blocks ~3x faster). Returns false and changes
  // nothing when fewer than `n` blocks are free.
  [[nodiscard]] bool allocate(uint32_t n, std::vector<int32_t>& table);
  // Adds a reference to each used block (prefix sharing). Referencing a free or unknown
  // block is a caller bug: it asserts in debug builds; release builds skip that id and
  // count it in bad_refs().
  void ref(std::span<const int32_t> ids);
  // Drops one reference from each block; a block whose count reaches 0 is free again.
  // Releasing a free or unknown block is a caller bug (a double release): it asserts in
  // debug builds; release builds skip that id and count it in double_releases().
  void release(std::span<const int32_t> ids);

  // Caller bugs survived in release builds (always 0 in a correct scheduler).
  uint32_t double_releases() const { return double_releases_; }
  uint32_t bad_refs() const { return bad_refs_; }

  // free + used == total, every refcount >= 0, the free count matches. For tests and
  // debug assertions. O(total).
  bool consistent() const;

 private:
  bool is_used(int32_t id) const { return id >= 0 && static_cast<uint32_t>(id) < total() && refs_[id] > 0; }
  // The lowest free id at or above `from`, or total() when none.
  uint32_t next_free(uint32_t from) const;

  std::vector<uint32_t> refs_;  // 0: free
  uint32_t n_free_ = 0;
  uint32_t lowest_free_ = 0;  // no free id below this
  uint32_t double_releases_ = 0;
  uint32_t bad_refs_ = 0;
};

}  // namespace tandem::scheduler
