#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

namespace tandem::model {

// GGUF is little-endian; tandem reads and writes it with plain memcpy.
static_assert(std::endian::native == std::endian::little, "tandem assumes a little-endian host");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

const char* value_type_name(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
#define TANDEM_NAME(e, id, name, bytes) \
  case GgufValueType::e: return name;
    TANDEM_GGUF_VALUE_TYPES(TANDEM_NAME)
#undef TANDEM_NAME
  }
  return "unknown";
}

// Bytes a scalar value of type t occupies on disk; strings and arrays: their minimum.
uint64_t min_value_size(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
#define TANDEM_SIZE(e, id, name, bytes) \
  case GgufValueType::e: return bytes;
    TANDEM_GGUF_VALUE_TYPES(TANDEM_SIZE)
#undef TANDEM_SIZE
  }
  return 0;
}

// Bounds-checked reader over the mapping. Every failure names the byte offset.
class Cursor {
 public:
  Cursor(const std::byte* base, uint64_t size, const std::string& path) : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }

  Status fail(const std::string& problem) const { return Status::model_file(path_ + ": " + problem); }
  Status truncated(const char* what, uint64_t at) const {
    return fail(std::string("truncated: ") + what + " at byte offset " + std::to_string(at) + " (file size " +
                std::to_string(size_) + ")");
  }

  template <class T>
  Status read(T& out, const char* what) {
    if (remaining() < sizeof(T)) return truncated(what, pos_);
    std::memcpy(&out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status read_string(std::string& out, const char* what) {
    uint64_t at = pos_;
    uint64_t len = 0;
    TANDEM_RETURN_IF_ERROR(read(len, what));
    if (len > remaining()) {
      return fail(std::string(what) + " at byte offset " + std::to_string(at) + " has length " + std::to_string(len) +
                  ", beyond the end of the file (size " + std::to_string(size_) + ")");
    }
    out.assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }

 private:
  const std::byte* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

// Printable form of a key or tensor name for error messages (names come from the file).
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 200) out += "...";
  return out;
}

template <class Wire, class Stored>
Status read_as(Cursor& c, GgufValue& v, const char* what) {
  Wire x{};
  TANDEM_RETURN_IF_ERROR(c.read(x, what));
  v.value = static_cast<Stored>(x);
  return Status::ok();
}

Status read_scalar(Cursor& c, uint32_t type, GgufValue& v, const char* what) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kU8: return read_as<uint8_t, uint64_t>(c, v, what);
    case GgufValueType::kI8: return read_as<int8_t, int64_t>(c, v, what);
    case GgufValueType::kU16: return read_as<uint16_t, uint64_t>(c, v, what);
    case GgufValueType::kI16: return read_as<int16_t, int64_t>(c, v, what);
    case GgufValueType::kU32: return read_as<uint32_t, uint64_t>(c, v, what);
    case GgufValueType::kI32: return read_as<int32_t, int64_t>(c, v, what);
    case GgufValueType::kU64: return read_as<uint64_t, uint64_t>(c, v, what);
    case GgufValueType::kI64: return read_as<int64_t, int64_t>(c, v, what);
    case GgufValueType::kF32: return read_as<float, double>(c, v, what);
    case GgufValueType::kF64: return read_as<double, double>(c, v, what);
    case GgufValueType::kBool: return read_as<uint8_t, bool>(c, v, what);
    case GgufValueType::kString: {
      std::string s;
      TANDEM_RETURN_IF_ERROR(c.read_string(s, what));
      v.value = std::move(s);
      return Status::ok();
    }
    case GgufValueType::kArray: break;  // handled by the caller
  }
  return Status::ok();
}

Status read_value(Cursor& c, const std::string& key, GgufValue& v) {
  uint32_t type = 0;
  uint64_t at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read(type, "metadata value type"));
  if (min_value_size(type) == 0) {
    return c.fail("key " + printable(key) + " has unknown value type " + std::to_string(type) + " at byte offset " +
                  std::to_string(at));
  }
  v.type = static_cast<GgufValueType>(type);
  if (v.type != GgufValueType::kArray) return read_scalar(c, type, v, "metadata value");

  uint32_t elem = 0;
  at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read(elem, "array element type"));
  if (elem == static_cast<uint32_t>(GgufValueType::kArray)) {
    return c.fail("key " + printable(key) + ": nested arrays are not supported");
  }
  uint64_t elem_size = min_value_size(elem);
  if (elem_size == 0) {
    return c.fail("key " + printable(key) + " is an array of unknown element type " + std::to_string(elem) +
                  " at byte offset " + std::to_string(at));
  }
  v.array_type = static_cast<GgufValueType>(elem);
  uint64_t count = 0;
  at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read(count, "array length"));
  // Each element needs at least elem_size bytes: bound the count before reserving.
  if (count > c.remaining() / elem_size) {
    return c.fail("key " + printable(key) + ": array of " + std::to_string(count) + " " + value_type_name(elem) +
                  " elements at byte offset " + std::to_string(at) + " is larger than the rest of the file (size " +
                  std::to_string(c.size()) + ")");
  }
  // Reserve no more than the file could hold (strings are bigger in memory than on disk).
  const size_t reserve = static_cast<size_t>(std::min<uint64_t>(count, 1u << 20));
  GgufValue item;
  switch (v.array_type) {
    case GgufValueType::kString: {
      std::vector<std::string> out;
      out.reserve(reserve);
      for (uint64_t i = 0; i < count; ++i) {
        std::string s;
        TANDEM_RETURN_IF_ERROR(c.read_string(s, "array string"));
        out.push_back(std::move(s));
      }
      v.value = std::move(out);
      break;
    }
    case GgufValueType::kF32:
    case GgufValueType::kF64: {
      std::vector<double> out;
      out.reserve(reserve);
      for (uint64_t i = 0; i < count; ++i) {
        TANDEM_RETURN_IF_ERROR(read_scalar(c, elem, item, "array element"));
        out.push_back(std::get<double>(item.value));
      }
      v.value = std::move(out);
      break;
    }
    default: {  // integers and bools; u64 above INT64_MAX keep their bits
      std::vector<int64_t> out;
      out.reserve(reserve);
      for (uint64_t i = 0; i < count; ++i) {
        TANDEM_RETURN_IF_ERROR(read_scalar(c, elem, item, "array element"));
        if (auto* u = std::get_if<uint64_t>(&item.value))
          out.push_back(static_cast<int64_t>(*u));
        else if (auto* s = std::get_if<int64_t>(&item.value))
          out.push_back(*s);
        else
          out.push_back(std::get<bool>(item.value) ? 1 : 0);
      }
      v.value = std::move(out);
      break;
    }
  }
  return Status::ok();
}

struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  std::map<std::string, GgufValue> metadata;
  std::vector<std::string> key_order;
  std::vector<GgufTensor> tensors;
  std::map<std::string, size_t> tensor_index;
};

// A KV takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
// 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
constexpr uint64_t kMinKv = 13, kMinTensor = 24;

// Magic, version and the two counts, each checked against what the file can hold.
Status parse_header(Cursor& c, const std::byte* base, uint64_t size, Parsed& out, uint64_t& n_tensors, uint64_t& n_kv) {
  if (size < 4) return c.truncated("magic", 0);
  uint32_t magic = 0;
  TANDEM_RETURN_IF_ERROR(c.read(magic, "magic"));
  if (magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%02x %02x %02x %02x", static_cast<unsigned>(base[0]),
                  static_cast<unsigned>(base[1]), static_cast<unsigned>(base[2]), static_cast<unsigned>(base[3]));
    return c.fail(std::string("not a GGUF file (magic ") + buf + ", expected 47 47 55 46 \"GGUF\")");
  }
  TANDEM_RETURN_IF_ERROR(c.read(out.version, "version"));
  if (out.version != 2 && out.version != 3) {
    std::string hint = (out.version & 0xffff) == 0 && out.version != 0 ? " (a big-endian file?)" : "";
    return c.fail("unsupported GGUF version " + std::to_string(out.version) + hint +
                  " (tandem reads versions 2 and 3)");
  }
  TANDEM_RETURN_IF_ERROR(c.read(n_tensors, "tensor_count"));
  TANDEM_RETURN_IF_ERROR(c.read(n_kv, "metadata_kv_count"));
  if (n_kv > c.remaining() / kMinKv || n_tensors > c.remaining() / kMinTensor ||
      n_kv * kMinKv > c.remaining() - n_tensors * kMinTensor) {
    return c.fail("tensor_count " + std::to_string(n_tensors) + " and metadata_kv_count " + std::to_string(n_kv) +
                  " are too large for a file of " + std::to_string(size) + " bytes");
  }
  return Status::ok();
}

// The n_kv metadata pairs (no duplicate keys), then general.alignment if present.
Status parse_metadata(Cursor& c, uint64_t n_kv, Parsed& out) {
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    uint64_t at = c.pos();
    TANDEM_RETURN_IF_ERROR(c.read_string(key, "metadata key"));
    if (out.metadata.count(key)) {
      return c.fail("duplicate key " + printable(key) + " at byte offset " + std::to_string(at));
    }
    GgufValue v;
    TANDEM_RETURN_IF_ERROR(read_value(c, key, v));
    out.key_order.push_back(key);
    out.metadata.emplace(std::move(key), std::move(v));
  }
  if (auto it = out.metadata.find("general.alignment"); it != out.metadata.end()) {
    const uint64_t* a = std::get_if<uint64_t>(&it->second.value);
    if (it->second.type != GgufValueType::kU32) {
      return c.fail(std::string("general.alignment has type ") +
                    value_type_name(static_cast<uint32_t>(it->second.type)) + ", expected u32");
    }
    if (*a == 0 || !std::has_single_bit(*a) || *a > (1u << 30)) {
      return c.fail("general.alignment " + std::to_string(*a) + " is not a power of two between 1 and 2^30");
    }
    out.alignment = *a;
  }
  return Status::ok();
}

// One tensor info: name (unique), dims (product fits int64), a known type whose block
// divides dims[0], an aligned offset. Its byte size follows from dims and type.
Status parse_tensor_info(Cursor& c, Parsed& out) {
  GgufTensor t;
  uint64_t at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read_string(t.name, "tensor name"));
  const std::string name = printable(t.name);
  if (out.tensor_index.count(t.name)) {
    return c.fail("duplicate tensor name " + name + " at byte offset " + std::to_string(at));
  }
  uint32_t n_dims = 0;
  at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read(n_dims, "tensor n_dims"));
  if (n_dims > kMaxDims) {  // 0 is a scalar, as in ggml
    return c.fail("tensor " + name + " has n_dims " + std::to_string(n_dims) + " at byte offset " + std::to_string(at) +
                  " (at most 4 allowed)");
  }
  t.dims.resize(n_dims);
  uint64_t elems = 1;
  bool overflow = false;
  for (uint32_t d = 0; d < n_dims; ++d) {
    TANDEM_RETURN_IF_ERROR(c.read(t.dims[d], "tensor dims"));
    if (t.dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      overflow = true;
    else if (t.dims[d] != 0 && elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / t.dims[d])
      overflow = true;
    else
      elems *= t.dims[d];
  }
  if (overflow) return c.fail("tensor " + name + ": the product of its dims overflows");
  at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.read(t.type, "tensor type"));
  const TypeTraits* info = type_traits(t.type);
  if (info == nullptr) {
    return c.fail("tensor " + name + " has type id " + std::to_string(t.type) + " at byte offset " +
                  std::to_string(at) + ", which is not a ggml type");
  }
  const uint64_t row = n_dims ? t.dims[0] : 1;
  if (row % info->block_elems != 0) {
    return c.fail("tensor " + name + " has type " + info->name + " but a row of " + std::to_string(row) +
                  " elements, not a multiple of its block size " + std::to_string(info->block_elems));
  }
  if (elems / info->block_elems > std::numeric_limits<uint64_t>::max() / info->block_bytes)
    return c.fail("tensor " + name + ": its size in bytes overflows");
  t.nbytes = elems / info->block_elems * info->block_bytes;
  TANDEM_RETURN_IF_ERROR(c.read(t.offset, "tensor offset"));
  if (t.offset % out.alignment != 0) {
    return c.fail("tensor " + name + " offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                  std::to_string(out.alignment));
  }
  out.tensor_index.emplace(t.name, out.tensors.size());
  out.tensors.push_back(std::move(t));
  return Status::ok();
}

// " (Q8_0 [64, 16]: 1088 bytes)", what a tensor's type and shape make its size.
std::string size_hint(const GgufTensor& t) {
  std::string dims;
  for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? ", " : "") + std::to_string(t.dims[i]);
  return std::string(" (") + ggml_type_name(t.type) + " [" + dims + "]: " + std::to_string(t.nbytes) + " bytes)";
}

// The data section starts at the next multiple of the alignment (it may lie past the end of
// a file whose tensors are all empty); every tensor's bytes must lie inside the file. As ggml
// writes and requires, each tensor starts where the one before it in the table ends, padded
// to the alignment: a gap or an overlap means some tensor's bytes do not match its type and
// shape (a type id or a dimension changed), and the error names both tensors.
Status place_tensors(Cursor& c, const std::byte* base, uint64_t size, Parsed& out) {
  const uint64_t data_start = (c.pos() + out.alignment - 1) / out.alignment * out.alignment;
  uint64_t expected = 0;  // where the next tensor must start; < 2^64 - alignment while it fits
  const GgufTensor* previous = nullptr;
  for (GgufTensor& t : out.tensors) {
    const uint64_t begin = data_start + t.offset;  // offset < 2^64 - size checked below
    const bool fits = t.offset <= size && begin <= size && t.nbytes <= size - begin;
    if (!fits) {
      std::string b = t.offset <= size ? std::to_string(begin) : "past " + std::to_string(size);
      std::string e = t.offset <= size && t.nbytes <= UINT64_MAX - begin ? std::to_string(begin + t.nbytes) : "beyond";
      return c.fail("tensor " + printable(t.name) + " data [" + b + ", " + e + ") is outside the file (size " +
                    std::to_string(size) + ")" + size_hint(t));
    }
    if (t.offset != expected && previous == nullptr) {
      return c.fail("tensor " + printable(t.name) + " starts at data offset " + std::to_string(t.offset) +
                    ", but the first tensor starts the data section (offset 0)");
    }
    if (t.offset != expected) {
      return c.fail("tensor " + printable(t.name) + " starts at data offset " + std::to_string(t.offset) +
                    ", but the tensor before it (" + printable(previous->name) + ") ends at " +
                    std::to_string(expected) + size_hint(*previous) +
                    ": a tensor's data does not match its type and shape");
    }
    const uint32_t block_align = type_traits(t.type)->block_align;
    if (reinterpret_cast<uintptr_t>(base + begin) % block_align != 0) {
      return c.fail("tensor " + printable(t.name) + " data at byte offset " + std::to_string(begin) +
                    " is not aligned to its " + ggml_type_name(t.type) + " blocks (" + std::to_string(block_align) +
                    " bytes; general.alignment " + std::to_string(out.alignment) + ")");
    }
    expected = (t.offset + t.nbytes + out.alignment - 1) / out.alignment * out.alignment;
    previous = &t;
    t.data = base + begin;
  }
  return Status::ok();
}

Status parse(const std::byte* base, uint64_t size, const std::string& path, Parsed& out) {
  Cursor c(base, size, path);
  uint64_t n_tensors = 0, n_kv = 0;
  TANDEM_RETURN_IF_ERROR(parse_header(c, base, size, out, n_tensors, n_kv));
  TANDEM_RETURN_IF_ERROR(parse_metadata(c, n_kv, out));
  if (n_tensors > c.remaining() / kMinTensor) {
    return c.fail("tensor_count " + std::to_string(n_tensors) + " is too large for the " +
                  std::to_string(c.remaining()) + " bytes left after the metadata");
  }
  out.tensors.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, 1u << 16)));
  for (uint64_t i = 0; i < n_tensors; ++i) TANDEM_RETURN_IF_ERROR(parse_tensor_info(c, out));
  return place_tensors(c, base, size, out);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

uint64_t GgufTensor::elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

// ---------------------------------------------------------------------------- GgufFile

// One read-only mapping of a whole file, unmapped when dropped.
struct GgufFile::Mapping {
  void* base = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(Mapping&& o) noexcept : base(std::exchange(o.base, nullptr)), size(std::exchange(o.size, 0)) {}
  Mapping& operator=(Mapping&&) = delete;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

namespace {

// Maps the whole of `path` read-only into base/size (nothing for an empty file).
Status map_file(const std::string& path, void*& base, size_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::model_file(path + ": cannot open: " + errno_text());
  struct stat st {};
  Status s = Status::ok();
  if (fstat(fd, &st) != 0) {
    s = Status::model_file(path + ": cannot stat: " + errno_text());
  } else if (!S_ISREG(st.st_mode)) {
    s = Status::model_file(path + ": not a regular file");
  } else if (st.st_size > 0) {
    void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      s = Status::model_file(path + ": cannot map " + std::to_string(st.st_size) + " bytes: " + errno_text());
    } else {
      base = map;
      size = static_cast<size_t>(st.st_size);
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  return s;
}

// A split key's value, when present: an unsigned integer (gguf-split writes u16 and i32).
Result<std::optional<uint64_t>> split_key(const std::map<std::string, GgufValue>& metadata, const std::string& path,
                                          const char* key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return std::optional<uint64_t>();
  const GgufValue& v = it->second;
  if (v.type != GgufValueType::kArray && v.type != GgufValueType::kBool) {
    if (auto* u = std::get_if<uint64_t>(&v.value)) return std::optional<uint64_t>(*u);
    if (auto* i = std::get_if<int64_t>(&v.value); i && *i >= 0) return std::optional<uint64_t>(*i);
  }
  return Status::model_file(path + ": " + key + " is not a non-negative integer");
}

// The split keys of one part; count 0 when the file is not a part of a split model.
struct SplitKeys {
  uint64_t no = 0, count = 0, tensors = 0;
  bool has_tensors = false;
};

Result<SplitKeys> read_split_keys(const std::map<std::string, GgufValue>& p, const std::string& path) {
  SplitKeys k;
  auto no = split_key(p, path, "split.no");
  if (!no) return no.status();
  auto count = split_key(p, path, "split.count");
  if (!count) return count.status();
  auto tensors = split_key(p, path, "split.tensors.count");
  if (!tensors) return tensors.status();
  k.no = no->value_or(0);
  k.count = count->value_or(0);
  k.tensors = tensors->value_or(0);
  k.has_tensors = tensors->has_value();
  if (k.count > 0xffff)
    return Status::model_file(path + ": split.count " + std::to_string(k.count) + " is above 65535");
  if (k.count > 1 && k.no >= k.count) {
    return Status::model_file(path + ": split.no " + std::to_string(k.no) + " is not below split.count " +
                              std::to_string(k.count));
  }
  return k;
}

// "PREFIX" when `path` is named as part `no` of `count` ("PREFIX-0000{no+1}-of-0000{count}.gguf").
std::optional<std::string> split_prefix(const std::string& path, uint64_t no, uint64_t count) {
  const std::string tail = split_part_path("", static_cast<uint32_t>(no), static_cast<uint32_t>(count));
  if (path.size() <= tail.size() || path.compare(path.size() - tail.size(), tail.size(), tail) != 0) {
    return std::nullopt;
  }
  return path.substr(0, path.size() - tail.size());
}

}  // namespace

GgufFile::GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->part_paths_.push_back(path);
  Mapping& m = file->maps_.emplace_back();
  TANDEM_RETURN_IF_ERROR(map_file(path, m.base, m.size));
  Parsed parsed;
  TANDEM_RETURN_IF_ERROR(parse(static_cast<const std::byte*>(m.base), m.size, path, parsed));
  file->version_ = parsed.version;
  file->alignment_ = parsed.alignment;
  file->metadata_ = std::move(parsed.metadata);
  file->key_order_ = std::move(parsed.key_order);
  file->tensors_ = std::move(parsed.tensors);
  file->tensor_index_ = std::move(parsed.tensor_index);
  TANDEM_RETURN_IF_ERROR(file->add_split_parts());
  return file;
}

// For the first part of a split model: maps and checks parts 2..N and adds their tensors.
Status GgufFile::add_split_parts() {
  auto keys = read_split_keys(metadata_, path_);
  if (!keys) return keys.status();
  if (keys->count <= 1) return Status::ok();
  const uint64_t count = keys->count;
  auto fail = [&](const std::string& problem) { return Status::model_file(path_ + ": " + problem); };
  if (keys->no != 0) {
    auto prefix = split_prefix(path_, keys->no, count);
    return fail("is part " + std::to_string(keys->no + 1) + " of " + std::to_string(count) +
                " of a split model; open its first part" +
                (prefix ? ", " + split_part_path(*prefix, 0, static_cast<uint32_t>(count)) : std::string()));
  }
  auto prefix = split_prefix(path_, 0, count);
  if (!prefix) {
    return fail("split.count is " + std::to_string(count) + " but the name does not end in " +
                split_part_path("", 0, static_cast<uint32_t>(count)) +
                " (as llama.cpp's gguf-split names parts), so the other parts cannot be found");
  }
  std::vector<size_t> starts = {0};  // index of each part's first tensor
  for (uint32_t no = 1; no < count; ++no) {
    const std::string part = split_part_path(*prefix, no, static_cast<uint32_t>(count));
    const std::string place = "part " + std::to_string(no + 1) + " of " + std::to_string(count);
    if (::access(part.c_str(), F_OK) != 0) return fail(place + ", " + part + ", is missing");
    Mapping& m = maps_.emplace_back();
    TANDEM_RETURN_IF_ERROR(map_file(part, m.base, m.size));
    Parsed p;
    TANDEM_RETURN_IF_ERROR(parse(static_cast<const std::byte*>(m.base), m.size, part, p));
    auto k = read_split_keys(p.metadata, part);
    if (!k) return k.status();
    if (k->count != count || k->no != no || k->tensors != keys->tensors) {
      return fail(place + ", " + part + ", has split.no " + std::to_string(k->no) + ", split.count " +
                  std::to_string(k->count) + ", split.tensors.count " + std::to_string(k->tensors) + " (expected " +
                  std::to_string(no) + ", " + std::to_string(count) + ", " + std::to_string(keys->tensors) +
                  "): a part of another split model");
    }
    starts.push_back(tensors_.size());
    for (GgufTensor& t : p.tensors) {
      if (auto it = tensor_index_.find(t.name); it != tensor_index_.end()) {
        const auto owner = std::upper_bound(starts.begin(), starts.end(), it->second) - starts.begin() - 1;
        return fail("tensor " + printable(t.name) + " is in both " + part_paths_[static_cast<size_t>(owner)] + " and " +
                    part);
      }
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    part_paths_.push_back(part);
  }
  if (keys->has_tensors && tensors_.size() != keys->tensors) {
    return fail("the " + std::to_string(count) + " parts hold " + std::to_string(tensors_.size()) +
                " tensors, split.tensors.count says " + std::to_string(keys->tensors));
  }
  return Status::ok();
}

GgufFile::~GgufFile() = default;

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<uint64_t> GgufFile::get_uint(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type == GgufValueType::kArray || v->type == GgufValueType::kBool) return std::nullopt;
  if (auto* u = std::get_if<uint64_t>(&v->value)) return *u;
  if (auto* s = std::get_if<int64_t>(&v->value); s && *s >= 0) return static_cast<uint64_t>(*s);
  return std::nullopt;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type == GgufValueType::kArray) return std::nullopt;
  if (auto* d = std::get_if<double>(&v->value)) return *d;
  return std::nullopt;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::kString) return std::nullopt;
  return std::get<std::string>(v->value);
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::kBool) return std::nullopt;
  return std::get<bool>(v->value);
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------- GgufWriter

namespace {

class Encoder {
 public:
  template <class T>
  void put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void put_type(GgufValueType t) { put(static_cast<uint32_t>(t)); }
  void put_string(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    const size_t at = bytes.size();
    bytes.resize(at + s.size());
    if (!s.empty()) std::memcpy(bytes.data() + at, s.data(), s.size());
  }
  std::vector<std::byte> bytes;
};

// A metadata value of one scalar type: its type id, then its bytes.
template <class T>
std::vector<std::byte> encode_scalar(GgufValueType type, T v) {
  Encoder e;
  e.put_type(type);
  e.put(v);
  return std::move(e.bytes);
}

}  // namespace

void GgufWriter::set_kv(const std::string& key, std::vector<std::byte> encoded) {
  for (auto& [k, v] : kvs_) {
    if (k == key) {
      v = std::move(encoded);
      return;
    }
  }
  kvs_.emplace_back(key, std::move(encoded));
}

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  Encoder e;
  e.put_type(GgufValueType::kString);
  e.put_string(v);
  set_kv(key, std::move(e.bytes));
}

void GgufWriter::add_u16(const std::string& key, uint16_t v) { set_kv(key, encode_scalar(GgufValueType::kU16, v)); }

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  set_kv(key, encode_scalar(GgufValueType::kU32, v));
  if (key == "general.alignment") {
    if (v == 0 || !std::has_single_bit(v) || v > (1u << 30)) {
      if (deferred_error_.empty()) {
        deferred_error_ = "general.alignment " + std::to_string(v) + " is not a power of two";
      }
    } else {
      alignment_ = v;
    }
  }
}

void GgufWriter::add_i32(const std::string& key, int32_t v) { set_kv(key, encode_scalar(GgufValueType::kI32, v)); }

void GgufWriter::add_f32(const std::string& key, float v) { set_kv(key, encode_scalar(GgufValueType::kF32, v)); }

void GgufWriter::add_bool(const std::string& key, bool v) {
  set_kv(key, encode_scalar(GgufValueType::kBool, static_cast<uint8_t>(v ? 1 : 0)));
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  Encoder e;
  e.put_type(GgufValueType::kArray);
  e.put_type(GgufValueType::kString);
  e.put(static_cast<uint64_t>(v.size()));
  for (const std::string& s : v) e.put_string(s);
  set_kv(key, std::move(e.bytes));
}

void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& v) {
  Encoder e;
  e.put_type(GgufValueType::kArray);
  e.put_type(GgufValueType::kF32);
  e.put(static_cast<uint64_t>(v.size()));
  for (float x : v) e.put(x);
  set_kv(key, std::move(e.bytes));
}

void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  Encoder e;
  e.put_type(GgufValueType::kArray);
  e.put_type(GgufValueType::kI32);
  e.put(static_cast<uint64_t>(v.size()));
  for (int32_t x : v) e.put(x);
  set_kv(key, std::move(e.bytes));
}

namespace {

// One scalar of GGUF type t from a GgufValue's storage (integers as int64/uint64, floats as double).
void put_scalar(Encoder& e, GgufValueType t, uint64_t u, double f) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool: e.put(static_cast<uint8_t>(u)); break;
    case GgufValueType::kU16:
    case GgufValueType::kI16: e.put(static_cast<uint16_t>(u)); break;
    case GgufValueType::kU32:
    case GgufValueType::kI32: e.put(static_cast<uint32_t>(u)); break;
    case GgufValueType::kU64:
    case GgufValueType::kI64: e.put(u); break;
    case GgufValueType::kF32: e.put(static_cast<float>(f)); break;  // exact: it was read from an f32
    case GgufValueType::kF64: e.put(f); break;
    case GgufValueType::kString:
    case GgufValueType::kArray: break;
  }
}

uint64_t integer_bits(const GgufValue& v) {
  if (auto* u = std::get_if<uint64_t>(&v.value)) return *u;
  if (auto* i = std::get_if<int64_t>(&v.value)) return static_cast<uint64_t>(*i);
  if (auto* b = std::get_if<bool>(&v.value)) return *b ? 1 : 0;
  return 0;
}

}  // namespace

void GgufWriter::add_value(const std::string& key, const GgufValue& v) {
  Encoder e;
  e.put_type(v.type);
  if (v.type == GgufValueType::kString) {
    e.put_string(std::get<std::string>(v.value));
  } else if (v.type != GgufValueType::kArray) {
    const double* f = std::get_if<double>(&v.value);
    put_scalar(e, v.type, integer_bits(v), f ? *f : 0.0);
  } else {
    e.put_type(v.array_type);
    if (auto* strings = std::get_if<std::vector<std::string>>(&v.value)) {
      e.put(static_cast<uint64_t>(strings->size()));
      for (const std::string& s : *strings) e.put_string(s);
    } else if (auto* floats = std::get_if<std::vector<double>>(&v.value)) {
      e.put(static_cast<uint64_t>(floats->size()));
      for (double f : *floats) put_scalar(e, v.array_type, 0, f);
    } else if (auto* ints = std::get_if<std::vector<int64_t>>(&v.value)) {
      e.put(static_cast<uint64_t>(ints->size()));
      for (int64_t i : *ints) put_scalar(e, v.array_type, static_cast<uint64_t>(i), 0.0);
    }
  }
  if (key == "general.alignment" && v.type == GgufValueType::kU32) {
    add_u32(key, static_cast<uint32_t>(integer_bits(v)));  // also sets the writer's alignment
    return;
  }
  set_kv(key, std::move(e.bytes));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> dims, TensorType type, const void* data,
                            size_t nbytes) {
  auto defer = [&](std::string problem) {
    if (deferred_error_.empty()) deferred_error_ = "tensor " + name + ": " + std::move(problem);
  };
  for (const Tensor& t : tensors_) {
    if (t.name == name) return defer("added twice");
  }
  // llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more.
  if (name.empty() || name.size() >= 64) return defer("name must be 1 to 63 bytes");
  if (dims.empty() || dims.size() > kMaxDims) return defer("needs 1 to 4 dims");
  const TypeTraits* traits = type_traits(type);
  if (traits == nullptr) return defer("unknown type id " + std::to_string(static_cast<uint32_t>(type)));
  if (dims[0] % traits->block_elems != 0) {
    return defer(std::string("a row of ") + std::to_string(dims[0]) + " elements is not a multiple of " + traits->name +
                 "'s block size " + std::to_string(traits->block_elems));
  }
  uint64_t elems = 1;
  for (uint64_t d : dims) {
    if (d != 0 && elems > (uint64_t{1} << 62) / d) return defer("dims overflow");
    elems *= d;
  }
  const uint64_t expected = elems / traits->block_elems * traits->block_bytes;
  if (expected != nbytes) {
    return defer("has " + std::to_string(nbytes) + " bytes of data, its shape needs " + std::to_string(expected) +
                 " as " + traits->name);
  }
  Tensor t{name, std::move(dims), type, {}};
  const std::byte* bytes = static_cast<const std::byte*>(data);
  if (nbytes) t.data.assign(bytes, bytes + nbytes);
  tensors_.push_back(std::move(t));
}

Status GgufWriter::write(const std::string& path) const {
  if (!deferred_error_.empty()) return Status::model_file(path + ": cannot write: " + deferred_error_);
  return write_part(path, kvs_, 0, tensors_.size());
}

Result<std::vector<std::string>> GgufWriter::write_split(const std::string& prefix, uint64_t max_tensors) const {
  if (max_tensors == 0) return Status::invalid("write_split: at most 0 tensors per part");
  const uint64_t parts = std::max<uint64_t>(1, (tensors_.size() + max_tensors - 1) / max_tensors);
  if (parts > 0xffff) return Status::invalid("write_split: " + std::to_string(parts) + " parts, at most 65535");
  std::vector<std::string> paths;
  for (uint32_t no = 0; no < parts; ++no) paths.push_back(split_part_path(prefix, no, static_cast<uint32_t>(parts)));
  if (!deferred_error_.empty()) return Status::model_file(paths[0] + ": cannot write: " + deferred_error_);
  for (uint32_t no = 0; no < parts; ++no) {
    GgufWriter keys;  // encodes the split keys; the first part keeps every key before them
    if (no == 0) keys.kvs_ = kvs_;
    // In gguf-split's order (it sets split.count last, which moves the key to the end).
    keys.add_u16("split.no", static_cast<uint16_t>(no));
    keys.add_i32("split.tensors.count", static_cast<int32_t>(tensors_.size()));
    keys.add_u16("split.count", static_cast<uint16_t>(parts));
    const size_t first = static_cast<size_t>(no * max_tensors);
    const size_t last = static_cast<size_t>(std::min<uint64_t>(tensors_.size(), first + max_tensors));
    TANDEM_RETURN_IF_ERROR(write_part(paths[no], keys.kvs_, first, last));
  }
  return paths;
}

Status GgufWriter::write_part(const std::string& path,
                              const std::vector<std::pair<std::string, std::vector<std::byte>>>& kvs, size_t first,
                              size_t last) const {
  // A later part's alignment is the default: gguf-split copies general.alignment to the first only.
  const bool has_alignment =
      std::any_of(kvs.begin(), kvs.end(), [](auto& kv) { return kv.first == "general.alignment"; });
  const uint64_t align = has_alignment ? alignment_ : kDefaultAlignment;
  auto align_up = [align](uint64_t x) { return (x + align - 1) / align * align; };
  Encoder head;
  head.put(kMagic);
  head.put(uint32_t{3});
  head.put(static_cast<uint64_t>(last - first));
  head.put(static_cast<uint64_t>(kvs.size()));
  for (const auto& [key, value] : kvs) {
    head.put_string(key);
    head.bytes.insert(head.bytes.end(), value.begin(), value.end());
  }
  uint64_t offset = 0;
  for (size_t i = first; i < last; ++i) {
    const Tensor& t = tensors_[i];
    head.put_string(t.name);
    head.put(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) head.put(d);
    head.put(static_cast<uint32_t>(t.type));
    head.put(offset);
    offset = align_up(offset + t.data.size());
  }
  head.bytes.resize(align_up(head.bytes.size()));

  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::model_file(path + ": cannot create " + tmp + ": " + errno_text());
  static const std::byte kZeros[4096] = {};
  bool ok = std::fwrite(head.bytes.data(), 1, head.bytes.size(), f) == head.bytes.size();
  for (size_t i = first; i < last && ok; ++i) {
    const Tensor& t = tensors_[i];
    if (!t.data.empty()) ok = std::fwrite(t.data.data(), 1, t.data.size(), f) == t.data.size();
    uint64_t pad = align_up(t.data.size()) - t.data.size();
    while (ok && pad > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof kZeros));
      ok = std::fwrite(kZeros, 1, n, f) == n;
      pad -= n;
    }
  }
  std::string err = ok ? "" : errno_text();
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno_text();
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return Status::model_file(path + ": cannot write: " + err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::model_file(path + ": cannot rename " + tmp + " into place: " + errno_text());
    std::remove(tmp.c_str());
    return s;
  }
  return Status::ok();
}

std::string split_part_path(const std::string& prefix, uint32_t no, uint32_t count) {
  char tail[48];
  std::snprintf(tail, sizeof tail, "-%05u-of-%05u.gguf", no + 1, count);
  return prefix + tail;
}

Result<std::vector<std::string>> split_gguf(const std::string& in, const std::string& prefix, uint64_t max_tensors) {
  auto file = GgufFile::open(in);
  if (!file) return file.status();
  GgufWriter w;
  for (const std::string& key : (*file)->keys_in_file_order()) {
    if (key.rfind("split.", 0) != 0) w.add_value(key, *(*file)->find(key));
  }
  for (const GgufTensor& t : (*file)->tensors()) {
    w.add_tensor(t.name, t.dims, static_cast<TensorType>(t.type), t.data, t.nbytes);
  }
  return w.write_split(prefix, max_tensors);
}

}  // namespace tandem::model
