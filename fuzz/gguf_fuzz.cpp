// Arbitrary bytes as a GGUF model file: GgufFile::open, read_model_config, and for every tensor of
// a type tandem converts its first rows dequantized (and quantized back), and llama-quantize's
// plan for a Q4_K_M mix. The input is the file itself (no record format); seeds are small valid
// files of every type tandem reads (TANDEM_FUZZ_WRITE_SEEDS=DIR writes them, see README.md).
// Each input is also opened as the second part of a split model whose first part is fixed
// (gguf-split's layout), so the split checks (split keys, tensors in two parts, the count) and
// the merged tensor table see arbitrary bytes too.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/quant.h"
#include "model/quantize.h"

namespace tandem {
namespace {

// Llama metadata of one block, dim 256.
model::GgufWriter llama_metadata() {
  model::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.embedding_length", 256);
  w.add_u32("llama.attention.head_count", 4);
  w.add_u32("llama.feed_forward_length", 512);
  w.add_u32("llama.context_length", 64);
  return w;
}

// Part `no` (0 or 1) of a split model in two, 3 tensors in all: the first (the fuzz target's
// fixed one) holds the metadata and one tensor, the second (the seed split-part2.gguf) two.
model::GgufWriter split_part(uint16_t no) {
  std::vector<float> x(256, 0.5f);
  model::GgufWriter w = no == 0 ? llama_metadata() : model::GgufWriter();
  w.add_u16("split.no", no);
  w.add_i32("split.tensors.count", 3);
  w.add_u16("split.count", 2);
  if (no == 0) {
    w.add_tensor("token_embd.weight", {256}, model::TensorType::kF32, x.data(), 1024);
  } else {
    w.add_tensor("blk.0.attn_v.weight", {256}, model::TensorType::kF32, x.data(), 1024);
    w.add_tensor("output_norm.weight", {256}, model::TensorType::kF32, x.data(), 1024);
  }
  return w;
}

// A file of every type tandem converts: llama metadata (one block) and two matrices and a norm,
// rows of 256 so every block size fits.
void write_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37 % 101) - 50) / 64.0f;
  for (uint32_t id : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u, 15u, 30u}) {
    const auto type = static_cast<model::TensorType>(id);
    std::vector<std::byte> data(model::row_bytes(type, x.size()));
    model::type_traits(type)->quantize(x.data(), data.data(), static_cast<int64_t>(x.size()));
    model::GgufWriter w = llama_metadata();
    w.add_tensor("token_embd.weight", {256, 2}, type, data.data(), data.size());
    w.add_tensor("blk.0.attn_v.weight", {256, 2}, type, data.data(), data.size());
    w.add_tensor("output_norm.weight", {256}, model::TensorType::kF32, x.data(), 1024);
    if (!w.write(dir + "/" + model::ggml_type_name(id) + ".gguf")) std::abort();
  }
  if (!split_part(1).write(dir + "/split-part2.gguf")) std::abort();
}

void exercise(const model::GgufFile& file) {
  (void)model::read_model_config(file);
  (void)model::plan_quantization(file, model::FileType::kQ4_K_M);
  std::vector<float> values;
  std::vector<std::byte> blocks;
  for (const model::GgufTensor& t : file.tensors()) {
    const model::TypeTraits* traits = model::type_traits(t.type);  // every tensor of an open file has one
    if (traits == nullptr) std::abort();
    const uint64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (traits->dequantize == nullptr || row == 0 || row > (1u << 16)) continue;
    const uint64_t row_size = row / traits->block_elems * traits->block_bytes;
    const uint64_t rows = std::min<uint64_t>(t.elements() / row, 4);
    values.resize(row);
    blocks.resize(row_size);
    for (uint64_t r = 0; r < rows; ++r) {
      if ((r + 1) * row_size > t.nbytes) std::abort();  // GgufFile promised the bytes are there
      traits->dequantize(t.data + r * row_size, values.data(), static_cast<int64_t>(row));
      traits->quantize(values.data(), blocks.data(), static_cast<int64_t>(row));
    }
  }
}

}  // namespace
}  // namespace tandem

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TANDEM_FUZZ_WRITE_SEEDS")) {
    tandem::write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

// The split model's folder (in /dev/shm when there is one, removed at exit) and its fixed
// first part, written once; returns the parts' prefix.
static const std::string& split_prefix() {
  struct Folder {
    std::filesystem::path dir;
    std::string prefix;
    Folder() {
      const auto base = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                            : std::filesystem::temp_directory_path();
      dir = base / ("tandem-gguf-fuzz-" + std::to_string(getpid()));
      std::filesystem::create_directories(dir);
      prefix = (dir / "split").string();
      if (!tandem::split_part(0).write(tandem::model::split_part_path(prefix, 0, 2))) std::abort();
    }
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  };
  static const Folder folder;
  return folder.prefix;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The bytes as a file without touching the disk: a memfd, opened by its /proc path.
  static const int fd = memfd_create("gguf_fuzz", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  auto file = tandem::model::GgufFile::open("/proc/self/fd/" + std::to_string(fd));
  if (file) tandem::exercise(**file);
  // The same bytes as part 2 of 2 (a file in /dev/shm: the parts are found by name).
  static const std::string second = tandem::model::split_part_path(split_prefix(), 1, 2);
  const int part = ::open(second.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (part < 0) std::abort();
  const bool written = size == 0 || write(part, data, size) == static_cast<ssize_t>(size);
  ::close(part);
  if (!written) std::abort();
  auto split = tandem::model::GgufFile::open(tandem::model::split_part_path(split_prefix(), 0, 2));
  if (split) tandem::exercise(**split);
  return 0;
}
