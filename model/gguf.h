// GGUF v3 files: reading (mmap, zero-copy tensor views) and writing.
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/quant.h"
#include "runtime/status.h"

namespace tandem::model {

// GGUF metadata value types (gguf_type): X(enumerator, id, name, bytes on disk: a scalar's size,
// a string's or an array's minimum).
// clang-format off
#define TANDEM_GGUF_VALUE_TYPES(X)                                                                  \
  X(kU8, 0, "u8", 1)     X(kI8, 1, "i8", 1)     X(kU16, 2, "u16", 2)         X(kI16, 3, "i16", 2)   \
  X(kU32, 4, "u32", 4)   X(kI32, 5, "i32", 4)   X(kF32, 6, "f32", 4)         X(kBool, 7, "bool", 1) \
  X(kString, 8, "string", 8) X(kArray, 9, "array", 12) X(kU64, 10, "u64", 8) X(kI64, 11, "i64", 8) \
  X(kF64, 12, "f64", 8)
// clang-format on

enum class GgufValueType : uint32_t {
#define TANDEM_ENUMERATOR(e, id, ...) e = id,
  TANDEM_GGUF_VALUE_TYPES(TANDEM_ENUMERATOR)
#undef TANDEM_ENUMERATOR
};

// One metadata value. Integers of every width are kept as int64/uint64, floats as double;
// arrays keep their element type and hold one vector of the matching kind.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  GgufValueType array_type = GgufValueType::kU8;  // element type when type == kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;
};

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;       // ggml order: dims[0] is the contiguous (innermost) one
  uint32_t type = 0;                // ggml type id, one type_traits() knows (model/quant.h)
  uint64_t offset = 0;              // from the start of the data section
  const std::byte* data = nullptr;  // points into the mapping
  uint64_t nbytes = 0;
  uint64_t elements() const;
};

// A GGUF file mapped read-only. Tensor data pointers stay valid while it lives.
// A split model (llama.cpp's gguf-split: parts NAME-00001-of-0000N.gguf, each a GGUF holding
// its own tensors and split.no / split.count / split.tensors.count, the first part all the
// metadata) opens as one file from its first part: every part is mapped, metadata is the
// first part's, tensors() is every part's tensors in part order.
class GgufFile {
 public:
  // Errors (Code::kModelFile), each naming the file and the problem: cannot open,
  // not a GGUF file (bad magic), unsupported version, truncated header/metadata/tensor
  // data, absurd counts or lengths, duplicate keys or tensor names, bad alignment,
  // tensor data out of bounds; and, naming the tensor: a type id ggml does not define, a row
  // (dims[0]) not a multiple of its type's block size, data whose size does not match its type
  // and shape (tensors must lie one after the other in table order, each padded to the
  // alignment, as ggml writes and requires them). Never crashes on any byte sequence.
  // A split model's first part also fails, naming the part, when: its name does not end in
  // -00001-of-0000N.gguf (so the other parts cannot be named), a part is missing, a part's
  // split.no / split.count / split.tensors.count is not what its place says (a part of another
  // split), a tensor is in two parts, or the parts hold other than split.tensors.count tensors.
  // Opening a later part fails and names the first part.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // Every mapped file, path() first: one for an unsplit file.
  const std::vector<std::string>& part_paths() const { return part_paths_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const GgufValue* find(const std::string& key) const;
  // Typed look-ups: nullopt when absent or of a kind that does not convert
  // (any integer type converts to uint64 if non-negative; f32/f64 convert to double).
  std::optional<uint64_t> get_uint(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;

  const GgufTensor* tensor(const std::string& name) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // The metadata keys in the order the file lists them.
  const std::vector<std::string>& keys_in_file_order() const { return key_order_; }

 private:
  struct Mapping;
  GgufFile();
  Status add_split_parts();
  std::string path_;
  std::vector<std::string> part_paths_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<Mapping> maps_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF v3 file in memory order: metadata in insertion order, then tensors.
class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& v);
  void add_u16(const std::string& key, uint16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // Any value read by GgufFile, re-encoded with its own GGUF type (copying a file's metadata).
  void add_value(const std::string& key, const GgufValue& v);
  // dims in ggml order (dims[0] contiguous). Data is copied: rows of dims[0] elements in `type`'s
  // layout (model/quant.h), dims[0] a multiple of its block size. A key added twice keeps its
  // first position and its last value.
  void add_tensor(const std::string& name, std::vector<uint64_t> dims, TensorType type, const void* data,
                  size_t nbytes);
  // Writes to a temporary file beside `path` and renames it into place, so `path` is
  // either the complete new file or untouched. Errors: Code::kModelFile.
  Status write(const std::string& path) const;
  // Writes the file as llama.cpp's `llama-gguf-split --split --split-max-tensors N` does, byte
  // for byte (checked against de3ff815's tool by hand; no CI test runs it):
  // parts split_part_path(prefix, i, count) of at most max_tensors tensors each (in order),
  // the first holding all metadata, every part then split.no (u16), split.tensors.count (i32)
  // and split.count (u16), in that order. Returns the parts' paths. Errors as write(); max_tensors 0:
  // Code::kInvalidArgument.
  Result<std::vector<std::string>> write_split(const std::string& prefix, uint64_t max_tensors) const;

 private:
  struct Kv;
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    TensorType type;
    std::vector<std::byte> data;
  };
  void set_kv(const std::string& key, std::vector<std::byte> encoded);
  // One file: the given metadata and tensors [first, last).
  Status write_part(const std::string& path, const std::vector<std::pair<std::string, std::vector<std::byte>>>& kvs,
                    size_t first, size_t last) const;
  std::vector<std::pair<std::string, std::vector<std::byte>>> kvs_;  // key, encoded type+value
  std::vector<Tensor> tensors_;
  uint64_t alignment_ = 32;  // general.alignment when set, else the GGUF default
  // add_tensor() cannot fail; a bad call (duplicate name, size that does not match the
  // shape) is remembered here and returned by write().
  std::string deferred_error_;
};

// Part `no` (0-based) of `count` of a split model: "PREFIX-00002-of-00003.gguf" (llama.cpp's
// llama_split_path).
std::string split_part_path(const std::string& prefix, uint32_t no, uint32_t count);

// Copies the GGUF file `in` (split or not) into parts as GgufWriter::write_split does.
// Errors: those of GgufFile::open and write_split.
Result<std::vector<std::string>> split_gguf(const std::string& in, const std::string& prefix, uint64_t max_tensors);

}  // namespace tandem::model
