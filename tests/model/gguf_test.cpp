#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "tests/test_util.h"

namespace tandem::model {
namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Opens `bytes` as a file and returns the error message ("" when it opened).
std::string open_error(const std::string& path, const std::vector<char>& bytes) {
  write_bytes(path, bytes);
  auto f = GgufFile::open(path);
  if (f) return "";
  EXPECT_EQ(f.status().code(), Code::kModelFile);
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
  return f.status().message();
}

// Hand-assembled GGUF bytes for files the writer will not produce.
struct Bytes {
  std::vector<char> b;
  template <class T>
  Bytes& put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Bytes& pad(size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
};

// Replaces the first occurrence of `from` with `to` (same length) in the bytes.
void patch(std::vector<char>& bytes, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
  ASSERT_NE(it, bytes.end()) << from;
  std::copy(to.begin(), to.end(), it);
}

class GgufTest : public ::testing::Test {
 protected:
  std::string dir = test::temp_dir();
  std::string path = dir + "/m.gguf";
};

TEST_F(GgufTest, RoundTripsEveryMetadataKindAndTensors) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("s.empty", "");
  w.add_string("s.bytes", std::string("a\0b\xff", 4));
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -7);
  w.add_f32("f32", 0.25f);
  w.add_bool("yes", true);
  w.add_bool("no", false);
  w.add_string_array("sa", {"x", "", "\xe2\x96\x81hi"});
  w.add_f32_array("fa", {1.5f, -2.0f});
  w.add_i32_array("ia", {-1, 0, 2147483647});
  w.add_i32_array("empty", {});
  std::vector<float> f32(3 * 5);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001};
  w.add_tensor("a", {5, 3}, TensorType::kF32, f32.data(), f32.size() * 4);
  w.add_tensor("b", {3}, TensorType::kF16, f16.data(), f16.size() * 2);
  w.add_tensor("c", {1, 1, 1, 1}, TensorType::kF32, f32.data(), 4);
  ASSERT_TRUE(w.write(path).is_ok());

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.status().to_string();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.metadata().size(), 12u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_string("s.empty"), "");
  EXPECT_EQ(g.get_string("s.bytes"), std::string("a\0b\xff", 4));
  EXPECT_EQ(g.get_uint("u32"), 4000000000u);
  EXPECT_EQ(g.find("u32")->type, GgufValueType::kU32);
  EXPECT_EQ(g.get_uint("i32"), std::nullopt);  // negative
  EXPECT_EQ(std::get<int64_t>(g.find("i32")->value), -7);
  EXPECT_EQ(g.get_float("f32"), 0.25);
  EXPECT_EQ(g.get_float("u32"), std::nullopt);
  EXPECT_EQ(g.get_bool("yes"), true);
  EXPECT_EQ(g.get_bool("no"), false);
  EXPECT_EQ(g.get_uint("yes"), std::nullopt);
  EXPECT_EQ(g.get_string("missing"), std::nullopt);
  const GgufValue* sa = g.find("sa");
  ASSERT_NE(sa, nullptr);
  EXPECT_EQ(sa->type, GgufValueType::kArray);
  EXPECT_EQ(sa->array_type, GgufValueType::kString);
  EXPECT_EQ(std::get<std::vector<std::string>>(sa->value), (std::vector<std::string>{"x", "", "\xe2\x96\x81hi"}));
  EXPECT_EQ(g.find("fa")->array_type, GgufValueType::kF32);
  EXPECT_EQ(std::get<std::vector<double>>(g.find("fa")->value), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(g.find("ia")->array_type, GgufValueType::kI32);
  EXPECT_EQ(std::get<std::vector<int64_t>>(g.find("ia")->value), (std::vector<int64_t>{-1, 0, 2147483647}));
  EXPECT_TRUE(std::get<std::vector<int64_t>>(g.find("empty")->value).empty());

  ASSERT_EQ(g.tensors().size(), 3u);
  EXPECT_EQ(g.tensors()[0].name, "a");  // file order kept
  EXPECT_EQ(g.tensors()[2].name, "c");
  const GgufTensor* a = g.tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<uint64_t>{5, 3}));
  EXPECT_EQ(a->type, 0u);
  EXPECT_EQ(a->elements(), 15u);
  EXPECT_EQ(a->nbytes, 60u);
  EXPECT_EQ(std::memcmp(a->data, f32.data(), 60), 0);
  const GgufTensor* b = g.tensor("b");
  EXPECT_EQ(b->type, 1u);
  EXPECT_EQ(b->nbytes, 6u);
  EXPECT_EQ(b->offset, 64u);  // 60 bytes of "a", padded to 32
  EXPECT_EQ(std::memcmp(b->data, f16.data(), 6), 0);
  EXPECT_EQ(g.tensor("c")->dims.size(), 4u);
  for (const GgufTensor& t : g.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
  EXPECT_EQ(g.tensor("nope"), nullptr);

  // The file is exactly: header, padding to 32, tensors each padded to 32.
  auto bytes = read_bytes(path);
  EXPECT_EQ(bytes.size() % 32, 0u);
  EXPECT_EQ(g.tensor("c")->offset, 96u);
  EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - 128 + 96, f32.data(), 4), 0);  // data section: 128 bytes
  // Metadata in insertion order.
  std::string all(bytes.begin(), bytes.end());
  size_t last = 0;
  for (const char* key :
       {"general.architecture", "s.empty", "s.bytes", "u32", "i32", "f32", "yes", "no", "sa", "fa", "ia", "empty"}) {
    size_t at = all.find(std::string(key), last);
    ASSERT_NE(at, std::string::npos) << key;
    last = at;
  }
}

TEST_F(GgufTest, WritesTheSpecEncodingByteForByte) {
  GgufWriter w;
  w.add_string_array("k", {"ab"});
  float one = 1.0f;
  w.add_tensor("t", {1}, TensorType::kF32, &one, 4);
  ASSERT_TRUE(w.write(path).is_ok());
  Bytes want;
  want.header(1, 1).str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1).str("ab");
  want.str("t").put<uint32_t>(1).put<uint64_t>(1).put<uint32_t>(0).put<uint64_t>(0).pad();
  want.put(one).pad();
  EXPECT_EQ(read_bytes(path), want.b);
}

TEST_F(GgufTest, EmptyFileWithNoMetadataOrTensors) {
  GgufWriter w;
  ASSERT_TRUE(w.write(path).is_ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST_F(GgufTest, WriterKeepsFirstPositionAndLastValueOfARepeatedKey) {
  GgufWriter w;
  w.add_u32("a", 1);
  w.add_u32("b", 2);
  w.add_u32("a", 3);
  ASSERT_TRUE(w.write(path).is_ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f);
  EXPECT_EQ((*f)->get_uint("a"), 3u);
  EXPECT_EQ((*f)->metadata().size(), 2u);
}

TEST_F(GgufTest, WriterRefusesBadTensors) {
  float x[4] = {};
  {
    GgufWriter w;
    w.add_tensor("t", {2}, TensorType::kF32, x, 8);
    w.add_tensor("t", {2}, TensorType::kF32, x, 8);
    Status st = w.write(path);
    EXPECT_NE(st.message().find("tensor t: added twice"), std::string::npos) << st.message();
  }
  {
    GgufWriter w;
    w.add_tensor("t", {3}, TensorType::kF32, x, 8);
    Status st = w.write(path);
    EXPECT_NE(st.message().find("needs 12"), std::string::npos) << st.message();
  }
  {
    GgufWriter w;
    w.add_tensor(std::string(64, 'n'), {2}, TensorType::kF32, x, 8);
    EXPECT_NE(w.write(path).message().find("name must be 1 to 63 bytes"), std::string::npos);
  }
  EXPECT_FALSE(std::ifstream(path).good());  // nothing written
}

TEST_F(GgufTest, WriterHonorsACustomAlignment) {
  GgufWriter w;
  w.add_u32("general.alignment", 64);
  float x[3] = {1, 2, 3};
  w.add_tensor("a", {3}, TensorType::kF32, x, 12);
  w.add_tensor("b", {3}, TensorType::kF32, x, 12);
  ASSERT_TRUE(w.write(path).is_ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->tensor("b")->offset, 64u);
}

TEST_F(GgufTest, TypeNames) {
  EXPECT_STREQ(ggml_type_name(0), "F32");
  EXPECT_STREQ(ggml_type_name(1), "F16");
  EXPECT_STREQ(ggml_type_name(2), "Q4_0");
  EXPECT_STREQ(ggml_type_name(8), "Q8_0");
  EXPECT_STREQ(ggml_type_name(30), "BF16");
  EXPECT_STREQ(ggml_type_name(42), "Q2_0");
  EXPECT_STREQ(ggml_type_name(43), "type 43");
}

TEST_F(GgufTest, QuantizedTensorsOpenWithTheirByteSizes) {
  struct Case {
    uint32_t type;
    uint64_t n;
    uint64_t nbytes;
  };
  for (Case c : {Case{2, 64, 36}, Case{3, 32, 20}, Case{6, 32, 22}, Case{7, 32, 24}, Case{8, 96, 102}, Case{30, 5, 10},
                 Case{12, 256, 144}}) {
    Bytes b;
    b.header(1, 0).str("q").put<uint32_t>(1).put<uint64_t>(c.n).put<uint32_t>(c.type).put<uint64_t>(0).pad();
    b.b.resize(b.b.size() + c.nbytes);
    write_bytes(path, b.b);
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f) << f.status().to_string();
    EXPECT_EQ((*f)->tensor("q")->nbytes, c.nbytes) << ggml_type_name(c.type);
  }
  Bytes b;  // 33 is not a whole number of Q8_0 blocks
  b.header(1, 0).str("q").put<uint32_t>(1).put<uint64_t>(33).put<uint32_t>(8).put<uint64_t>(0).pad();
  b.b.resize(b.b.size() + 64);
  EXPECT_NE(open_error(path, b.b).find("tensor q has type Q8_0 but a row of 33 elements, not a multiple of its "
                                       "block size 32"),
            std::string::npos);
}

TEST_F(GgufTest, AcceptsVersion2) {
  Bytes b;
  b.header(0, 1, 2).str("k").put<uint32_t>(4).put<uint32_t>(5);
  write_bytes(path, b.b);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->get_uint("k"), 5u);
}

TEST_F(GgufTest, MissingFile) {
  auto f = GgufFile::open(dir + "/absent.gguf");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.status().code(), Code::kModelFile);
  EXPECT_NE(f.status().message().find("absent.gguf: cannot open"), std::string::npos);
  auto d = GgufFile::open(dir);
  ASSERT_FALSE(d);
  EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos);
}

TEST_F(GgufTest, BadMagic) {
  std::vector<char> b = {'G', 'G', 'M', 'L', 3, 0, 0, 0};
  b.resize(64);
  EXPECT_NE(open_error(path, b).find("not a GGUF file (magic 47 47 4d 4c"), std::string::npos);
}

TEST_F(GgufTest, UnsupportedVersion) {
  Bytes b;
  b.header(0, 0, 1);
  EXPECT_NE(open_error(path, b.b).find("unsupported GGUF version 1 (tandem reads versions 2 and 3)"),
            std::string::npos);
  Bytes big;
  big.header(0, 0, 0x03000000);
  EXPECT_NE(open_error(path, big.b).find("big-endian"), std::string::npos);
}

TEST_F(GgufTest, EmptyAndShortFiles) {
  EXPECT_NE(open_error(path, {}).find("truncated: magic at byte offset 0"), std::string::npos);
  EXPECT_NE(open_error(path, {'G', 'G'}).find("truncated"), std::string::npos);
  std::vector<char> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0};
  EXPECT_NE(open_error(path, b).find("truncated: tensor_count at byte offset 8"), std::string::npos);
}

TEST_F(GgufTest, CountsTooLargeForTheFile) {
  Bytes b;
  b.header(uint64_t{1} << 60, 0);
  b.b.resize(200);
  EXPECT_NE(open_error(path, b.b).find("tensor_count 1152921504606846976 and metadata_kv_count 0 are too large "
                                       "for a file of 200 bytes"),
            std::string::npos);
  Bytes k;
  k.header(0, UINT64_MAX);
  EXPECT_NE(open_error(path, k.b).find("too large"), std::string::npos);
  Bytes a;  // an array claiming 2^40 u32s
  a.header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 40).put<uint32_t>(0);
  EXPECT_NE(open_error(path, a.b).find("key arr: array of 1099511627776 u32 elements at byte offset 43 is larger "
                                       "than the rest of the file"),
            std::string::npos);
}

TEST_F(GgufTest, StringLengthBeyondTheFile) {
  Bytes b;
  b.header(0, 1).put<uint64_t>(uint64_t{1} << 40).put<uint64_t>(0);
  EXPECT_NE(open_error(path, b.b).find("metadata key at byte offset 24 has length 1099511627776, beyond the end "
                                       "of the file (size 40)"),
            std::string::npos);
  Bytes v;
  v.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(UINT64_MAX);
  EXPECT_NE(open_error(path, v.b).find("beyond the end of the file"), std::string::npos);
}

TEST_F(GgufTest, UnknownValueTypesAndNestedArrays) {
  Bytes b;
  b.header(0, 1).str("k").put<uint32_t>(13).put<uint64_t>(0);
  EXPECT_NE(open_error(path, b.b).find("key k has unknown value type 13"), std::string::npos);
  Bytes n;
  n.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).put<uint32_t>(4).put<uint64_t>(0);
  EXPECT_NE(open_error(path, n.b).find("key k: nested arrays are not supported"), std::string::npos);
  Bytes e;
  e.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0);
  EXPECT_NE(open_error(path, e.b).find("array of unknown element type 77"), std::string::npos);
}

TEST_F(GgufTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Bytes b;
    b.header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(a);
    EXPECT_NE(open_error(path, b.b).find("general.alignment " + std::to_string(a) + " is not a power of two"),
              std::string::npos);
  }
  Bytes s;
  s.header(0, 1).str("general.alignment").put<uint32_t>(8).str("32");
  EXPECT_NE(open_error(path, s.b).find("general.alignment has type string, expected u32"), std::string::npos);
  Bytes u;  // llama.cpp reads it as u32 only
  u.header(0, 1).str("general.alignment").put<uint32_t>(10).put<uint64_t>(32);
  EXPECT_NE(open_error(path, u.b).find("general.alignment has type u64, expected u32"), std::string::npos);
  Bytes o;  // offset 16 with alignment 32
  o.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(16).pad();
  o.b.resize(o.b.size() + 64);
  EXPECT_NE(open_error(path, o.b).find("tensor t offset 16 is not a multiple of the alignment 32"), std::string::npos);
}

TEST_F(GgufTest, BadTensorInfos) {
  Bytes d;
  d.header(1, 0).str("t").put<uint32_t>(5).put<uint64_t>(0).put<uint64_t>(0);
  EXPECT_NE(open_error(path, d.b).find("tensor t has n_dims 5 at byte offset 33 (at most 4 allowed)"),
            std::string::npos);
  Bytes z;  // n_dims 0 is a scalar (one element), as in ggml
  z.header(1, 0).str("t").put<uint32_t>(0).put<uint32_t>(0).put<uint64_t>(0).pad().put<float>(2.0f).pad();
  EXPECT_EQ(open_error(path, z.b), "");
  Bytes o;  // 2^32 * 2^32 * 2^32 elements
  o.header(1, 0).str("t").put<uint32_t>(3);
  for (int i = 0; i < 3; ++i) o.put<uint64_t>(uint64_t{1} << 32);
  o.put<uint32_t>(0).put<uint64_t>(0);
  EXPECT_NE(open_error(path, o.b).find("tensor t: the product of its dims overflows"), std::string::npos);
  Bytes wrap;  // 2^62 F32 elements: 2^64 bytes, which wrapped to 0 and passed for an empty tensor (#18)
  wrap.header(1, 0).str("t").put<uint32_t>(2).put<uint64_t>(uint64_t{1} << 31).put<uint64_t>(uint64_t{1} << 31);
  wrap.put<uint32_t>(0).put<uint64_t>(0).pad();
  EXPECT_NE(open_error(path, wrap.b).find("tensor t: its size in bytes overflows"), std::string::npos)
      << open_error(path, wrap.b);
  Bytes big;  // a single dim above INT64_MAX
  big.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(UINT64_MAX).put<uint32_t>(0).put<uint64_t>(0);
  EXPECT_NE(open_error(path, big.b).find("overflows"), std::string::npos);
  Bytes t;
  t.header(1, 0).str("blk.0.x").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(99).put<uint64_t>(0);
  EXPECT_NE(open_error(path, t.b).find("tensor blk.0.x has type id 99 at byte offset"), std::string::npos);
  EXPECT_NE(open_error(path, t.b).find("which is not a ggml type"), std::string::npos);
  for (uint32_t removed : {4u, 31u, 43u, 0xffffffffu}) {  // ids ggml removed or never had
    Bytes r;
    r.header(1, 0).str("blk.0.x").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(removed).put<uint64_t>(0);
    EXPECT_NE(open_error(path, r.b).find("has type id " + std::to_string(removed)), std::string::npos) << removed;
  }
}

TEST_F(GgufTest, TensorDataOutOfBounds) {
  Bytes b;  // 4 floats = 16 bytes claimed, 8 present
  b.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(0).pad();
  const size_t data_start = b.b.size();
  b.b.resize(data_start + 8);
  std::string want = "tensor t data [" + std::to_string(data_start) + ", " + std::to_string(data_start + 16) +
                     ") is outside the file (size " + std::to_string(data_start + 8) + ")";
  EXPECT_NE(open_error(path, b.b).find(want), std::string::npos) << open_error(path, b.b);
  Bytes far;  // an offset far past the end, and one near 2^64
  far.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(uint64_t{1} << 40).pad();
  far.b.resize(far.b.size() + 16);
  EXPECT_NE(open_error(path, far.b).find("is outside the file"), std::string::npos);
  Bytes wrap;
  wrap.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(UINT64_MAX - 31).pad();
  wrap.b.resize(wrap.b.size() + 16);
  EXPECT_NE(open_error(path, wrap.b).find("is outside the file"), std::string::npos);
}

// A tensor whose bytes do not match its type and shape: its type id (or a dim) was changed, so the
// next tensor no longer starts where this one ends (ggml requires tensors back to back).
TEST_F(GgufTest, TensorSizeThatDoesNotMatchItsTypeAndShape) {
  std::vector<float> x(64, 1.0f);
  std::vector<std::byte> q8(row_bytes(TensorType::kQ8_0, 64));
  quantize_row_q8_0(x.data(), reinterpret_cast<BlockQ8_0*>(q8.data()), 64);
  GgufWriter w;
  w.add_tensor("blk.0.attn_q.weight", {64, 1}, TensorType::kQ8_0, q8.data(), q8.size());
  w.add_tensor("blk.0.attn_k.weight", {64}, TensorType::kF32, x.data(), 256);
  ASSERT_TRUE(w.write(path).is_ok());
  auto good = read_bytes(path);
  // The Q8_0 tensor's type id (8, after its dims) set to F16 (1): 128 bytes, not 68.
  auto retyped = good;
  const std::string name = "blk.0.attn_q.weight";
  auto at = std::search(retyped.begin(), retyped.end(), name.begin(), name.end()) + name.size();
  const size_t type_at = static_cast<size_t>(at - retyped.begin()) + 4 + 2 * 8;
  ASSERT_EQ(retyped[type_at], 8);
  retyped[type_at] = 1;
  const std::string err = open_error(path, retyped);
  EXPECT_NE(err.find("tensor blk.0.attn_k.weight starts at data offset 96, but the tensor before it "
                     "(blk.0.attn_q.weight) ends at 128 (F16 [64, 1]: 128 bytes): a tensor's data does not match "
                     "its type and shape"),
            std::string::npos)
      << err;
  retyped[type_at] = 2;  // Q4_0: 36 bytes, padded 64: a gap before the next tensor
  EXPECT_NE(open_error(path, retyped).find("ends at 64 (Q4_0 [64, 1]: 36 bytes)"), std::string::npos);
  auto first = good;  // the first tensor must start the data section
  const std::string k = "blk.0.attn_k.weight";
  auto k_at = std::search(first.begin(), first.end(), k.begin(), k.end()) + k.size() + 4 + 8 + 4;
  const uint64_t zero = 0;
  std::memcpy(&*k_at, &zero, 8);  // attn_k now claims offset 0 too: it overlaps attn_q
  EXPECT_NE(open_error(path, first).find("blk.0.attn_k.weight starts at data offset 0"), std::string::npos);
  auto moved = good;
  auto q_at = std::search(moved.begin(), moved.end(), name.begin(), name.end()) + name.size() + 4 + 16 + 4;
  const uint64_t off = 32;
  std::memcpy(&*q_at, &off, 8);
  EXPECT_NE(open_error(path, moved).find("but the first tensor starts the data section (offset 0)"), std::string::npos);
}

// general.alignment 1 lets a tensor start at an odd byte: a Q8_0 block (a binary16 scale first)
// there cannot be read in place, so the file is refused rather than read misaligned.
TEST_F(GgufTest, TensorDataMisalignedForItsBlocks) {
  std::vector<std::byte> q8(34);
  int refused = 0;
  for (uint64_t pad : {1u, 2u}) {  // one of the two puts the Q8_0 tensor at an odd address
    GgufWriter w;
    w.add_u32("general.alignment", 1);
    std::vector<std::byte> i8(pad);
    w.add_tensor("pad", {pad}, static_cast<TensorType>(24), i8.data(), i8.size());  // I8
    w.add_tensor("q", {32}, TensorType::kQ8_0, q8.data(), q8.size());
    ASSERT_TRUE(w.write(path).is_ok());
    const std::string err = open_error(path, read_bytes(path));
    if (err.empty()) continue;
    ++refused;
    EXPECT_NE(err.find("tensor q data at byte offset"), std::string::npos) << err;
    EXPECT_NE(err.find("is not aligned to its Q8_0 blocks (2 bytes; general.alignment 1)"), std::string::npos) << err;
  }
  EXPECT_EQ(refused, 1);
}

TEST_F(GgufTest, WriterTakesEveryKnownTypeAndRefusesUnknownOnes) {
  std::vector<float> x(512, 0.5f);
  for (uint32_t id : {1u, 2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u, 30u}) {
    const auto type = static_cast<TensorType>(id);
    std::vector<std::byte> data(row_bytes(type, 512));
    type_traits(type)->quantize(x.data(), data.data(), 512);
    GgufWriter w;
    w.add_tensor("t", {256, 2}, type, data.data(), data.size());
    ASSERT_TRUE(w.write(path).is_ok()) << ggml_type_name(id);
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f) << f.status().to_string();
    EXPECT_EQ((*f)->tensor("t")->type, id);
    EXPECT_EQ((*f)->tensor("t")->nbytes, data.size());
  }
  GgufWriter w;
  w.add_tensor("t", {48}, TensorType::kQ4_K, x.data(), 144);
  EXPECT_NE(w.write(path).message().find("a row of 48 elements is not a multiple of Q4_K's block size 256"),
            std::string::npos);
  GgufWriter u;
  u.add_tensor("t", {32}, static_cast<TensorType>(4), x.data(), 18);
  EXPECT_NE(u.write(path).message().find("unknown type id 4"), std::string::npos);
}

TEST_F(GgufTest, DuplicateKeysAndTensorNames) {
  GgufWriter w;
  w.add_u32("key.one", 1);
  w.add_u32("key.two", 2);
  float x[2] = {};
  w.add_tensor("tensor_a", {2}, TensorType::kF32, x, 8);
  w.add_tensor("tensor_b", {2}, TensorType::kF32, x, 8);
  ASSERT_TRUE(w.write(path).is_ok());
  auto good = read_bytes(path);
  auto keys = good;
  patch(keys, "key.two", "key.one");
  EXPECT_NE(open_error(path, keys).find("duplicate key key.one"), std::string::npos);
  auto names = good;
  patch(names, "tensor_b", "tensor_a");
  EXPECT_NE(open_error(path, names).find("duplicate tensor name tensor_a"), std::string::npos);
}

// Every prefix of a real model file fails cleanly: every cut through the header
// region, and a sampling of cuts through the tensor data.
TEST_F(GgufTest, EveryTruncationErrors) {
  const auto full = read_bytes(test::model_file("tiny", 1));
  auto f = GgufFile::open(test::model_file("tiny", 1));
  ASSERT_TRUE(f);
  // The first 2 KiB (header and the start of the vocabulary) at every byte.
  const std::string cut = dir + "/cut.gguf";
  for (size_t n = 0; n < 2048; ++n) {
    std::vector<char> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_NE(open_error(cut, prefix), "") << "prefix of " << n << " bytes opened";
  }
  // Then every 11th byte through the rest of the header, every 4093rd through the data.
  // The last tensor's padding is the only tail that can go without harm.
  const GgufTensor& last = (*f)->tensors().back();
  const size_t data_begin = full.size() - static_cast<size_t>(last.offset + (last.nbytes + 31) / 32 * 32);
  const size_t needed = data_begin + static_cast<size_t>(last.offset + last.nbytes);
  for (size_t n = 2048; n < needed; n += n < data_begin ? 11 : 4093) {
    std::vector<char> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    std::string err = open_error(cut, prefix);
    ASSERT_NE(err, "") << "prefix of " << n << " bytes opened";
    if (n >= data_begin) {
      EXPECT_NE(err.find("is outside the file"), std::string::npos) << err;
    }
  }
  std::vector<char> exact(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(needed));
  EXPECT_EQ(open_error(cut, exact), "");
}

// Random corruption never crashes: each variant opens or fails with kModelFile.
TEST_F(GgufTest, RandomCorruptionNeverCrashes) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 32);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "<0x00>"});
  w.add_f32_array("s", {1, 2, 3});
  w.add_i32_array("t", {1, 2, 3});
  w.add_bool("b", true);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  w.add_tensor("w1", {4, 2}, TensorType::kF32, x, 32);
  w.add_tensor("w2", {2}, TensorType::kF16, x, 4);
  ASSERT_TRUE(w.write(path).is_ok());
  const auto good = read_bytes(path);
  std::mt19937_64 rng(7);
  int opened = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    auto bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      size_t at = rng() % bad.size();
      switch (rng() % 3) {
        case 0: bad[at] = static_cast<char>(rng()); break;
        case 1: bad[at] = static_cast<char>(0xff); break;
        default: bad[at] ^= static_cast<char>(1u << (rng() % 8)); break;
      }
    }
    if (open_error(path, bad).empty()) ++opened;
  }
  EXPECT_GT(opened, 0);  // flips in tensor data or padding are harmless
}

// ---------------------------------------------------------------- split models (gguf-split)

class GgufSplitTest : public GgufTest {
 protected:
  std::string prefix = dir + "/model";
  // `n` F32 tensors t0..t{n-1} of 8 values each, t_i's values i*8 .. i*8+7.
  GgufWriter writer(int n, const std::string& name = "m") {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", name);
    for (int i = 0; i < n; ++i) {
      std::vector<float> v(8);
      for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(i * 8 + j);
      w.add_tensor("t" + std::to_string(i), {8}, TensorType::kF32, v.data(), v.size() * sizeof(float));
    }
    return w;
  }
  std::string part(int no, int count) { return split_part_path(prefix, no, count); }
  std::string error_of(const std::string& p) {
    auto f = GgufFile::open(p);
    EXPECT_FALSE(f) << p;
    if (f) return "";
    EXPECT_EQ(f.status().code(), Code::kModelFile);
    return f.status().message();
  }
  // A part written by hand: split keys (no, count, tensors) and tensors named in `names`.
  void write_part(const std::string& p, int no, int count, int total, const std::vector<std::string>& names) {
    GgufWriter w;
    w.add_u16("split.no", static_cast<uint16_t>(no));
    w.add_u16("split.count", static_cast<uint16_t>(count));
    w.add_i32("split.tensors.count", total);
    const float v[8] = {};
    for (const auto& n : names) w.add_tensor(n, {8}, TensorType::kF32, v, sizeof v);
    ASSERT_TRUE(w.write(p).is_ok());
  }
};

TEST_F(GgufSplitTest, PartsOpenAsOneFileFromTheFirst) {
  auto parts = writer(5).write_split(prefix, 2);
  ASSERT_TRUE(parts) << parts.status().to_string();
  ASSERT_EQ(*parts, (std::vector<std::string>{part(0, 3), part(1, 3), part(2, 3)}));
  EXPECT_EQ(part(1, 3), dir + "/model-00002-of-00003.gguf");
  auto f = GgufFile::open(part(0, 3));
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_EQ((*f)->part_paths(), *parts);
  EXPECT_EQ((*f)->get_string("general.name"), "m");
  EXPECT_EQ((*f)->get_uint("split.count"), 3u);
  EXPECT_EQ((*f)->find("split.count")->type, GgufValueType::kU16);  // llama.cpp reads them as u16
  EXPECT_EQ((*f)->find("split.tensors.count")->type, GgufValueType::kI32);
  // gguf-split's key order (byte-identical files, checked by hand against its tool).
  const auto& keys = (*f)->keys_in_file_order();
  EXPECT_EQ(std::vector<std::string>(keys.end() - 3, keys.end()),
            (std::vector<std::string>{"split.no", "split.tensors.count", "split.count"}));
  ASSERT_EQ((*f)->tensors().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const GgufTensor* t = (*f)->tensor("t" + std::to_string(i));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ((*f)->tensors()[i].name, t->name);  // in part order
    float v[8];
    std::memcpy(v, t->data, sizeof v);
    EXPECT_EQ(v[0], i * 8.0f);
    EXPECT_EQ(v[7], i * 8.0f + 7);
  }
  // Later parts hold only the split keys, as gguf-split writes them.
  auto second = read_bytes(part(1, 3));
  EXPECT_EQ(std::search(second.begin(), second.end(), std::begin("general.name"), std::end("general.name") - 1),
            second.end());
}

TEST_F(GgufSplitTest, SplitGgufCopiesAFileAndOnePartIsAWholeModel) {
  ASSERT_TRUE(writer(3).write(path).is_ok());
  auto parts = split_gguf(path, prefix, 100);
  ASSERT_TRUE(parts) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0], dir + "/model-00001-of-00001.gguf");
  auto f = GgufFile::open((*parts)[0]);
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_EQ((*f)->tensors().size(), 3u);
  // Re-splitting a split model drops its old split keys for the new ones.
  auto again = split_gguf((*parts)[0], dir + "/again", 1);
  ASSERT_TRUE(again) << again.status().to_string();
  auto g = GgufFile::open((*again)[0]);
  ASSERT_TRUE(g) << g.status().to_string();
  EXPECT_EQ((*g)->get_uint("split.count"), 3u);
  EXPECT_EQ((*g)->tensors().size(), 3u);
  EXPECT_FALSE(writer(1).write_split(prefix, 0));
}

TEST_F(GgufSplitTest, AMissingPartIsNamed) {
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  std::remove(part(1, 3).c_str());
  const std::string e = error_of(part(0, 3));
  EXPECT_NE(e.find("part 2 of 3, " + dir + "/model-00002-of-00003.gguf, is missing"), std::string::npos) << e;
}

TEST_F(GgufSplitTest, ALaterPartNamesTheFirst) {
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  const std::string e = error_of(part(2, 3));
  EXPECT_NE(e.find("is part 3 of 3 of a split model; open its first part, " + part(0, 3)), std::string::npos) << e;
}

TEST_F(GgufSplitTest, APartOfAnotherSplitIsRefused) {
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  // Another model's part 2 of 3 (6 tensors in all) in this model's place.
  ASSERT_TRUE(writer(6, "other").write_split(dir + "/other", 2));
  std::rename(split_part_path(dir + "/other", 1, 3).c_str(), part(1, 3).c_str());
  std::string e = error_of(part(0, 3));
  EXPECT_NE(e.find("part 2 of 3, " + part(1, 3) +
                   ", has split.no 1, split.count 3, split.tensors.count 6 (expected "
                   "1, 3, 5): a part of another split model"),
            std::string::npos)
      << e;
  // This model's part 3 renamed as part 2.
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  std::rename(part(2, 3).c_str(), part(1, 3).c_str());
  e = error_of(part(0, 3));
  EXPECT_NE(e.find("has split.no 2"), std::string::npos) << e;
  // A part of a split into 2.
  ASSERT_TRUE(writer(5).write_split(dir + "/two", 3));
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  std::rename(split_part_path(dir + "/two", 1, 2).c_str(), part(2, 3).c_str());
  e = error_of(part(0, 3));
  EXPECT_NE(e.find("split.count 2"), std::string::npos) << e;
}

TEST_F(GgufSplitTest, EveryTensorOnce) {
  write_part(part(0, 2), 0, 2, 2, {"a", "b"});
  write_part(part(1, 2), 1, 2, 2, {"b"});
  std::string e = error_of(part(0, 2));
  EXPECT_NE(e.find("tensor b is in both " + part(0, 2) + " and " + part(1, 2)), std::string::npos) << e;
  write_part(part(1, 2), 1, 2, 3, {"c"});
  write_part(part(0, 2), 0, 2, 3, {"a"});
  e = error_of(part(0, 2));
  EXPECT_NE(e.find("the 2 parts hold 2 tensors, split.tensors.count says 3"), std::string::npos) << e;
  write_part(part(0, 2), 0, 2, 2, {});  // gguf-split --no-tensor-first-split: an empty first part
  write_part(part(1, 2), 1, 2, 2, {"a", "b"});
  auto f = GgufFile::open(part(0, 2));
  ASSERT_TRUE(f) << f.status().to_string();
  EXPECT_EQ((*f)->tensors().size(), 2u);
}

TEST_F(GgufSplitTest, AFirstPartNotNamedAsGgufSplitNamesIt) {
  ASSERT_TRUE(writer(5).write_split(prefix, 2));
  std::rename(part(0, 3).c_str(), path.c_str());
  const std::string e = error_of(path);
  EXPECT_NE(e.find("split.count is 3 but the name does not end in -00001-of-00003.gguf"), std::string::npos) << e;
  write_part(path, 0, 1, 1, {"a"});  // split.count 1: an ordinary file
  EXPECT_TRUE(GgufFile::open(path));
  GgufWriter w;
  w.add_u16("split.no", 0);
  w.add_string("split.count", "2");
  ASSERT_TRUE(w.write(path).is_ok());
  EXPECT_NE(error_of(path).find("split.count is not a non-negative integer"), std::string::npos);
}

}  // namespace
}  // namespace tandem::model
