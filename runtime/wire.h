// Protobuf messages over ZeroMQ frames: one message per frame, serialized straight into
// the frame's buffer. Callers include the generated headers they need, e.g.
// "tandem/v1/client.pb.h".
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <cstdint>

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

// Limits of a request both sides check (scheduler/admission.h; the client library, so that its
// caller gets the error rather than a dropped connection): a request id's bytes, and a
// prompt's: a text, or a conversation's messages and tools together.
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxPromptBytes = size_t{1} << 20;
// A Submit's principal (whom a proxy sends it for): at most this many bytes of printable ASCII.
inline constexpr size_t kMaxPrincipalBytes = 128;

// The largest message the client library accepts from the scheduler (its socket's
// ZMQ_MAXMSGSIZE: a larger one drops the connection). The scheduler sends events in messages
// far below it (scheduler/client_outbox.h, kReplyChunkBytes).
inline constexpr int64_t kClientReceiveLimitBytes = int64_t{64} << 20;

// The frame holding `message`'s wire bytes (no intermediate buffer). Messages are far
// below protobuf's 2 GiB limit (receivers cap them at SocketLimits::max_message_bytes);
// one over it is logged and yields an empty frame, which parses as an empty message that
// receivers reject for its missing protocol version.
zmq::message_t to_frame(const google::protobuf::MessageLite& message);

// Parses `frame` into `out` with protobuf's default limits (recursion depth included).
// kInvalidArgument "malformed message (N bytes)" on failure; `out` is then unspecified.
[[nodiscard]] Status parse_frame(const zmq::message_t& frame, google::protobuf::MessageLite& out);

}  // namespace tandem::runtime
