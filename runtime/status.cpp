#include "runtime/status.h"

namespace tandem {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kOverloaded: return "OVERLOADED";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kInternal: return "INTERNAL";
    case Code::kModelFile: return "MODEL_FILE";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(code_name(code_)) + ": " + message_;
}

}  // namespace tandem
