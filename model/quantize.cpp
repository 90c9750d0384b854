#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

namespace tandem::model {

namespace {

struct FileTypeRow {
  std::string_view name;
  FileType type;
  TensorType default_type;
};

constexpr FileTypeRow kFileTypes[] = {
#define TANDEM_ROW(e, id, name, tensor_type) {name, FileType::e, TensorType::k##tensor_type},
    TANDEM_FILE_TYPES(TANDEM_ROW)
#undef TANDEM_ROW
};

const FileTypeRow& file_type_row(FileType type) {
  for (const FileTypeRow& r : kFileTypes) {
    if (r.type == type) return r;
  }
  return kFileTypes[0];
}

// llama-quantize's broad tensor categories (tensor_get_category), by name.
enum class Category { kOutput, kTokenEmbd, kAttnV, kAttnK, kAttnQ, kAttnOutput, kFfnUp, kFfnGate, kFfnDown, kOther };

Category category(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::kTokenEmbd;
  // Fused QKV and MLA's kv_b count as attn_v: they hold the values.
  if (has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight")) return Category::kAttnV;
  if (has("attn_k.weight")) return Category::kAttnK;
  if (has("attn_q.weight")) return Category::kAttnQ;
  if (has("attn_output.weight")) return Category::kAttnOutput;
  if (has("ffn_up")) return Category::kFfnUp;
  if (has("ffn_gate")) return Category::kFfnGate;
  if (has("ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

// ggml_n_dims: dimensions up to the last one above 1.
int n_dims(const GgufTensor& t) {
  int n = 1;
  for (size_t i = 1; i < t.dims.size(); ++i) {
    if (t.dims[i] > 1) n = static_cast<int>(i) + 1;
  }
  return n;
}

// tensor_allows_quantization: 2-D and larger tensors named "*weight", except norms and the small
// or special tensors llama-quantize leaves alone (names as in llama-quant.cpp).
bool allows_quantization(const GgufTensor& t) {
  const std::string& name = t.name;
  if (n_dims(t) < 2) return false;
  if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  static const char* const kKept[] = {
      "_norm.weight",
      "ffn_gate_inp.weight",
      "ffn_gate_tid2eid.weight",
      "altup",
      "laurel",
      "per_layer_model_proj",
      "ssm_conv1d",
      "shortconv.conv.weight",
      "indexer.k_proj.weight",
      "indexer.q_proj.weight",
      "time_mix_first.weight",
      "time_mix_w0.weight",
      "time_mix_w1.weight",
      "time_mix_w2.weight",
      "time_mix_v0.weight",
      "time_mix_v1.weight",
      "time_mix_v2.weight",
      "time_mix_a0.weight",
      "time_mix_a1.weight",
      "time_mix_a2.weight",
      "time_mix_g1.weight",
      "time_mix_g2.weight",
      "time_mix_decay_w1.weight",
      "time_mix_decay_w2.weight",
      "time_mix_lerp_fused.weight",
      "attn_rel_b.weight",
      ".position_embd",
      "sam.pos_embd",
      "sam.neck.",
      "sam.net_",
      ".rel_pos",
      ".patch_embd",
      ".patch_merger",
      "a.rvq.codebook",
      "mm.a.code_embd",
  };
  for (const char* part : kKept) {
    if (name.find(part) != std::string::npos) return false;
  }
  return true;
}

// What llama_tensor_get_type_impl needs of the model and keeps while it walks the tensors.
struct MixState {
  FileType ftype;
  bool tied_embeddings = true;  // no output.weight
  bool is_70b = false;          // llama with 80 layers and GQA, qwen2 with 80 layers
  int n_attention_wv = 0, i_attention_wv = 0;
  int n_ffn_down = 0, i_ffn_down = 0;
};

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The mix rules for the file types tandem writes (the IQ, Q2_K and Q3_K rules are not carried).
TensorType mixed_type(MixState& s, TensorType type, const GgufTensor& t, Category cat) {
  const FileType f = s.ftype;
  if (cat == Category::kOutput || (s.tied_embeddings && cat == Category::kTokenEmbd)) {
    if (t.dims[0] % type_traits(type)->block_elems != 0) return TensorType::kQ8_0;
    return type == TensorType::kQ8_0 ? type : TensorType::kQ6_K;
  }
  if (cat == Category::kAttnV) {
    if ((f == FileType::kQ4_K_M || f == FileType::kQ5_K_M) && use_more_bits(s.i_attention_wv, s.n_attention_wv)) {
      type = TensorType::kQ6_K;
    } else if (f == FileType::kQ4_K_S && s.i_attention_wv < 4) {
      type = TensorType::kQ5_K;
    }
    if (s.is_70b && type == TensorType::kQ4_K) type = TensorType::kQ5_K;
    ++s.i_attention_wv;
  } else if (cat == Category::kFfnDown) {
    const int i = s.i_ffn_down, n = s.n_ffn_down;
    if ((f == FileType::kQ4_K_M || f == FileType::kQ5_K_M) && use_more_bits(i, n)) {
      type = TensorType::kQ6_K;
    } else if (f == FileType::kQ4_K_S && i < n / 8) {
      type = TensorType::kQ5_K;
    }
    ++s.i_ffn_down;
  }
  return type;
}

// tensor_type_fallback: a row that is not a multiple of the block size takes a 32-element type,
// and F16 when that does not fit either.
TensorType fallback(TensorType type, uint64_t row) {
  if (row % type_traits(type)->block_elems == 0) return type;
  switch (type) {
    case TensorType::kQ4_K: type = TensorType::kQ5_0; break;
    case TensorType::kQ5_K: type = TensorType::kQ5_1; break;
    case TensorType::kQ6_K: type = TensorType::kQ8_0; break;
    default: break;
  }
  return row % type_traits(type)->block_elems == 0 ? type : TensorType::kF16;
}

// llama_model_loader's weights order: tensors outside blocks first, then by block number, then by name.
int block_of(const std::string& name) {
  int block = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &block) != 1) block = -1;
  return block;
}

Result<MixState> mix_state(const GgufFile& file, FileType type, const std::vector<const GgufTensor*>& tensors) {
  MixState s{type};
  const std::string arch = file.get_string("general.architecture").value_or("");
  auto fail = [&](const std::string& m) { return Status::model_file(file.path() + ": " + m); };
  if (arch == "falcon") return fail("tandem does not carry llama-quantize's falcon rules");
  if (file.get_uint(arch + ".expert_count").value_or(0) > 1) {
    return fail("a mixture-of-experts model: tandem does not carry llama-quantize's expert rules");
  }
  const std::optional<uint64_t> layers = file.get_uint(arch + ".block_count");
  if (!layers || *layers == 0 || *layers > 4096) return fail("missing or bad key " + arch + ".block_count");
  const uint64_t heads = file.get_uint(arch + ".attention.head_count").value_or(0);
  const uint64_t kv_heads = file.get_uint(arch + ".attention.head_count_kv").value_or(heads);
  s.n_ffn_down = static_cast<int>(*layers);
  s.is_70b = *layers == 80 && (arch == "qwen2" || (arch == "llama" && heads != kv_heads));
  for (const GgufTensor* t : tensors) {
    if (category(t->name) == Category::kAttnV) ++s.n_attention_wv;
    if (category(t->name) == Category::kOutput) s.tied_embeddings = false;
  }
  return s;
}

}  // namespace

std::optional<FileType> parse_file_type(std::string_view name) {
  for (const FileTypeRow& r : kFileTypes) {
    if (r.name == name) return r.type;
  }
  return std::nullopt;
}

std::string_view file_type_choices() {
  return "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k_m|q4_k_s|q5_k_m|q5_k_s|q6_k";
}

Result<std::vector<TensorPlan>> plan_quantization(const GgufFile& file, FileType type) {
  std::vector<const GgufTensor*> tensors;
  for (const GgufTensor& t : file.tensors()) tensors.push_back(&t);
  std::stable_sort(tensors.begin(), tensors.end(), [](const GgufTensor* a, const GgufTensor* b) {
    const int la = block_of(a->name), lb = block_of(b->name);
    return la != lb ? la < lb : a->name < b->name;
  });
  auto state = mix_state(file, type, tensors);
  if (!state) return state.status();
  const TensorType default_type = file_type_row(type).default_type;
  std::vector<TensorPlan> plan;
  for (const GgufTensor* t : tensors) {
    uint32_t to = t->type;
    if (allows_quantization(*t)) {
      TensorType chosen = default_type;
      if (type_traits(default_type)->quantized) {
        chosen = fallback(mixed_type(*state, default_type, *t, category(t->name)), t->dims[0]);
      }
      to = static_cast<uint32_t>(chosen);
    }
    plan.push_back({t, to});
  }
  return plan;
}

namespace {

// The tensor's data as `to`: copied when the type stays, else through F32, rows split between
// threads (each row is quantized on its own, so the bytes do not depend on the split).
Result<std::vector<std::byte>> convert_tensor(const GgufTensor& t, uint32_t to, const std::string& path) {
  if (t.type == to) return std::vector<std::byte>(t.data, t.data + t.nbytes);
  const TypeTraits* from = type_traits(t.type);
  const TypeTraits* dest = type_traits(to);
  if (from->quantized || from->dequantize == nullptr || dest->quantize == nullptr) {
    return Status::model_file(path + ": tensor " + t.name + ": cannot convert " + from->name + " to " + dest->name +
                              " (tandem quantizes from F32, F16 and BF16)");
  }
  const uint64_t row = t.dims.empty() ? 1 : t.dims[0];
  const uint64_t rows = row == 0 ? 0 : t.elements() / row;
  const uint64_t src_row = row / from->block_elems * from->block_bytes;
  const uint64_t dst_row = row / dest->block_elems * dest->block_bytes;
  std::vector<std::byte> out(rows * dst_row);
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned n_threads = static_cast<unsigned>(std::clamp<uint64_t>(std::min(rows, cores), 1, 8));
  std::vector<uint64_t> first_bad(n_threads, UINT64_MAX);  // per thread: its first non-finite element
  auto work = [&](unsigned first) {
    std::vector<float> buf(row);
    for (uint64_t r = first; r < rows; r += n_threads) {
      from->dequantize(t.data + r * src_row, buf.data(), static_cast<int64_t>(row));
      for (uint64_t i = 0; i < row && first_bad[first] == UINT64_MAX; ++i) {
        if (!std::isfinite(buf[i])) first_bad[first] = r * row + i;
      }
      dest->quantize(buf.data(), out.data() + r * dst_row, static_cast<int64_t>(row));
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned i = 1; i < n_threads; ++i) helpers.emplace_back(work, i);
  work(0);
  for (std::thread& h : helpers) h.join();
  if (const uint64_t bad = *std::min_element(first_bad.begin(), first_bad.end()); bad != UINT64_MAX) {
    return Status::model_file(path + ": tensor " + t.name + " has a value that is not finite (element " +
                              std::to_string(bad) + "): no quantization of it would mean anything");
  }
  return out;
}

}  // namespace

Status quantize_model(const std::string& in, const std::string& out, FileType type) {
  auto file = GgufFile::open(in);
  if (!file) return file.status();
  auto plan = plan_quantization(**file, type);
  if (!plan) return plan.status();
  GgufWriter w;
  for (const std::string& key : (*file)->keys_in_file_order()) {
    if (key == "general.quantization_version" || key == "general.file_type" || key == "split.no" ||
        key == "split.count" || key == "split.tensors.count") {
      continue;
    }
    w.add_value(key, *(*file)->find(key));
  }
  w.add_u32("general.quantization_version", 2);  // GGML_QNT_VERSION
  w.add_u32("general.file_type", static_cast<uint32_t>(type));
  for (const TensorPlan& p : *plan) {
    auto data = convert_tensor(*p.tensor, p.to, in);
    if (!data) return data.status();
    w.add_tensor(p.tensor->name, p.tensor->dims, static_cast<TensorType>(p.to), data->data(), data->size());
  }
  return w.write(out);
}

}  // namespace tandem::model
