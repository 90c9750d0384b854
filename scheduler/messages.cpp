#include "scheduler/messages.h"

#include "scheduler/admission.h"

namespace tandem::scheduler {

TokenEvent& RequestEvents::add_token() {
  if (used_ == tokens_.size()) tokens_.emplace_back();
  TokenEvent& t = tokens_[used_++];
  t.id = 0;
  t.text.clear();
  t.logprob = 0.0f;
  t.top.clear();
  return t;
}

void RequestEvents::clear() {
  request_id.clear();
  used_ = 0;
  final.reset();
}

FinalEvent& set_final(RequestEvents& out, v1::FinishReason reason, v1::ErrorCode code, const std::string& message) {
  FinalEvent& f = out.final.emplace();
  f.finish_reason = reason;
  f.error_code = code;
  if (reason == v1::FINISH_REASON_ERROR || reason == v1::FINISH_REASON_CANCELLED) f.error_message = message;
  return f;
}

RequestEvents& set_refusal(RequestEvents& out, const std::string& request_id, v1::ErrorCode code,
                           const std::string& message) {
  if (request_id.size() <= kMaxRequestIdBytes) {
    out.request_id = request_id;
  } else {
    // Cut at a character's start: the id stays valid UTF-8, as a proto3 string must.
    size_t n = kMaxRequestIdBytes;
    while (n > 0 && (static_cast<unsigned char>(request_id[n]) & 0xC0) == 0x80) --n;
    out.request_id.assign(request_id.data(), n);
  }
  set_final(out, v1::FINISH_REASON_ERROR, code, message);
  return out;
}

}  // namespace tandem::scheduler
