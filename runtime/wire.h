// Protobuf messages over ZeroMQ frames: one message per frame, serialized straight into
// the frame's buffer. Callers include the generated headers they need, e.g.
// "tandem/v1/client.pb.h".
#pragma once

#include <google/protobuf/message_lite.h>

#include <zmq.hpp>

#include "runtime/status.h"
#include "tandem/v1/common.pb.h"

namespace tandem::runtime {

// The protocol version this build sends, and the oldest it still serves (docs/ARCHITECTURE.md,
// "Wire compatibility"): additive changes keep the version, so a peer of an older version in
// [kOldestProtocolVersion, kProtocolVersion] is served; only an incompatible change raises it.
inline constexpr uint32_t kProtocolVersion = v1::PROTOCOL_VERSION_CURRENT;
inline constexpr uint32_t kOldestProtocolVersion = 1;
inline constexpr bool protocol_version_served(uint32_t version) {
  return version >= kOldestProtocolVersion && version <= kProtocolVersion;
}

// The frame holding `message`'s wire bytes (no intermediate buffer). Messages are far
// below protobuf's 2 GiB limit (receivers cap them at SocketLimits::max_message_bytes);
// one over it is logged and yields an empty frame, which parses as an empty message that
// receivers reject for its missing protocol version.
zmq::message_t to_frame(const google::protobuf::MessageLite& message);

// Parses `frame` into `out` with protobuf's default limits (recursion depth included).
// kInvalidArgument "malformed message (N bytes)" on failure; `out` is then unspecified.
[[nodiscard]] Status parse_frame(const zmq::message_t& frame, google::protobuf::MessageLite& out);

}  // namespace tandem::runtime
