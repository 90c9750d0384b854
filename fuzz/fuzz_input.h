// What the fuzz targets share: the tiny model file they serve, and the input format.
//
// An input is a sequence of records, each one multipart message for one handler:
//   [kind: 1 byte][peer: 1 byte][frames: 1 byte] then per frame [length: 2 bytes LE][bytes]
// `kind` picks the handler (a target takes it modulo its handler count), `peer` the sending
// identity (modulo 4), `frames` how many frames follow (modulo 5: wrong counts included).
// A truncated record ends the input. Seeds (valid messages) are written by the targets
// themselves when TANDEM_FUZZ_WRITE_SEEDS=DIR is set (see fuzz/README.md).
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/message_lite.h>
#include <google/protobuf/stubs/logging.h>

#include "runtime/event_loop.h"
#include "model/make_model.h"

namespace tandem::fuzz {

struct Record {
  uint8_t kind = 0, peer = 0;
  std::vector<std::string> frames;
};

inline std::vector<Record> parse(const uint8_t* data, size_t size) {
  std::vector<Record> out;
  size_t i = 0;
  while (i + 3 <= size) {
    Record r;
    r.kind = data[i];
    r.peer = data[i + 1] % 4;
    const int n = data[i + 2] % 5;
    i += 3;
    for (int f = 0; f < n; ++f) {
      if (i + 2 > size) return out;
      const size_t len = data[i] | size_t{data[i + 1]} << 8;
      i += 2;
      if (i + len > size) return out;
      r.frames.emplace_back(reinterpret_cast<const char*>(data + i), len);
      i += len;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// The record's frames as ZeroMQ messages, after `identity` when it is not empty.
inline runtime::Frames frames_of(const Record& r, const std::string& identity) {
  runtime::Frames frames;
  if (!identity.empty()) frames.emplace_back(identity.data(), identity.size());
  for (const std::string& f : r.frames) frames.emplace_back(f.data(), f.size());
  return frames;
}

// Builds seed inputs out of valid messages.
class SeedWriter {
 public:
  SeedWriter& add(uint8_t kind, uint8_t peer, const std::vector<const google::protobuf::MessageLite*>& messages) {
    bytes_.push_back(static_cast<char>(kind));
    bytes_.push_back(static_cast<char>(peer));
    bytes_.push_back(static_cast<char>(messages.size()));
    for (const auto* m : messages) {
      const std::string s = m->SerializeAsString();
      bytes_.push_back(static_cast<char>(s.size() & 0xff));
      bytes_.push_back(static_cast<char>(s.size() >> 8));
      bytes_ += s;
    }
    return *this;
  }
  SeedWriter& add_raw(uint8_t kind, uint8_t peer, const std::vector<std::string>& frames) {
    bytes_.push_back(static_cast<char>(kind));
    bytes_.push_back(static_cast<char>(peer));
    bytes_.push_back(static_cast<char>(frames.size()));
    for (const std::string& s : frames) {
      bytes_.push_back(static_cast<char>(s.size() & 0xff));
      bytes_.push_back(static_cast<char>(s.size() >> 8));
      bytes_ += s;
    }
    return *this;
  }
  void write(const std::string& dir, const std::string& name) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes_;
    bytes_.clear();
  }

 private:
  std::string bytes_;
};

// The tiny model every target serves, made once per process in a private folder.
inline const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string p = dir + "/tiny.gguf";
    if (!model::make_model(*model::preset_config("tiny"), 1, p)) std::abort();
    return p;
  }();
  return path;
}

// No logging: a fuzzer's output is its findings (protobuf complains about every malformed
// string it is fed).
inline void quiet() {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);
}

// LLVMFuzzerInitialize's work: silence logs; with TANDEM_FUZZ_WRITE_SEEDS=DIR, write the
// target's seeds there and exit.
inline int initialize(void (*write_seeds)(const std::string& dir)) {
  quiet();
  if (const char* dir = std::getenv("TANDEM_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

}  // namespace tandem::fuzz
