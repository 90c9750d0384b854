#include "cli/kv_format_flags.h"

#include <string>

namespace tandem::cli {

Result<engine::KvFormat> kv_format_from_flags(const Args& args) {
  engine::KvFormat f;
  auto bits = args.integer("kv-bits", f.bits);
  if (!bits) return bits.status();
  auto group = args.integer("kv-group-size", f.group_size);
  if (!group) return group.status();
  f.bits = static_cast<uint32_t>(*bits);
  f.group_size = static_cast<uint32_t>(*group);
  f.skip_last_layer = args.has("kv-quant-skip-last-layer");
  auto window = args.integer("kv-f32-window", f.f32_window);
  if (!window) return window.status();
  f.f32_window = static_cast<uint32_t>(*window);
  auto scheme = args.choice("kv-quant-scheme", "uniform");
  if (!scheme) return scheme.status();
  if (*scheme == "rotated") f.scheme = engine::KvScheme::kRotated;
  if (f.rotated() && f.bits != 4 && f.bits != 3)
    return Status::invalid("--kv-quant-scheme rotated needs --kv-bits 4 or 3, got --kv-bits " + std::to_string(f.bits));
  if (Status st = f.validate_values(); !st)
    return Status::invalid("--kv-bits / --kv-quant-scheme / --kv-group-size / --kv-f32-window: " + st.message());
  return f;
}

Result<engine::GemmBackend> gemm_from_flags(const Args& args) {
  auto gemm = args.choice("gemm", "packed");
  if (!gemm) return gemm.status();
  return *gemm == "openblas" ? engine::GemmBackend::kOpenBlas : engine::GemmBackend::kPacked;
}

Result<SpecFlags> spec_from_flags(const Args& args) {
  auto spec = args.choice("spec", "off");
  if (!spec) return spec.status();
  auto k = args.integer("spec-tokens", 4);
  if (!k) return k.status();
  SpecFlags out;
  out.draft_model = args.str("draft-model").value_or("");
  if (*spec == "draft" && out.draft_model.empty())
    return Status::invalid("--spec draft needs --draft-model FILE (the draft model, of the target's vocabulary)");
  if (*spec != "draft" && !out.draft_model.empty())
    return Status::invalid("--draft-model is given but --spec is " + *spec + ": add --spec draft");
  out.spec_tokens = *spec == "off" ? 0u : static_cast<uint32_t>(*k);
  return out;
}

}  // namespace tandem::cli
