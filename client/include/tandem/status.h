// Status and Result<T>: how tandem reports failure without exceptions.
// Every fallible function returns one of these; callers must look at it. Public (the client
// library's API returns them) and shared by all of tandem, as leveldb's include/leveldb/status.h:
// runtime/status.h includes this file. Header-only, standard library only.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace tandem {

// Mirrors tandem.v1.ErrorCode (proto/tandem/v1/common.proto); mapped once at the edge.
enum class Code {
  kOk = 0,
  kInvalidArgument = 1,
  kOverloaded = 2,
  kUnavailable = 3,
  kInternal = 4,
  kModelFile = 5,         // a model file that is missing, truncated, malformed or unsupported
  kPermissionDenied = 6,  // a verb the endpoint does not take from this peer (Drain on the client endpoint)
};

inline const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kOverloaded: return "OVERLOADED";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kInternal: return "INTERNAL";
    case Code::kModelFile: return "MODEL_FILE";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(Code code, std::string message) { return Status(code, std::move(message)); }
  static Status invalid(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }
  static Status model_file(std::string message) { return Status(Code::kModelFile, std::move(message)); }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "MODEL_FILE: truncated tensor data ..." for logs and CLI errors.
  std::string to_string() const { return is_ok() ? "OK" : std::string(code_name(code_)) + ": " + message_; }

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or the Status that explains its absence.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).is_ok()); }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tandem

// Returns early from the enclosing function when `expr` yields a failed Status.
#define TANDEM_RETURN_IF_ERROR(expr) \
  do {                               \
    ::tandem::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;    \
  } while (0)
