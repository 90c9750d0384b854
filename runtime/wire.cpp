#include "runtime/wire.h"

#include <spdlog/spdlog.h>

#include <climits>
#include <string>

namespace tandem::runtime {

zmq::message_t to_frame(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();  // also caches sub-message sizes for the write
  if (size > size_t{INT_MAX}) {
    spdlog::error("wire: {} of {} bytes exceeds protobuf's 2 GiB limit; sending an empty frame", message.GetTypeName(),
                  size);
    return zmq::message_t();
  }
  zmq::message_t frame(size);
  message.SerializeWithCachedSizesToArray(static_cast<uint8_t*>(frame.data()));
  return frame;
}

Status parse_frame(const zmq::message_t& frame, google::protobuf::MessageLite& out) {
  const size_t size = frame.size();
  if (size > size_t{INT_MAX} || !out.ParseFromArray(frame.data(), static_cast<int>(size))) {
    return Status::invalid("malformed message (" + std::to_string(size) + " bytes)");
  }
  return Status::ok();
}

}  // namespace tandem::runtime
