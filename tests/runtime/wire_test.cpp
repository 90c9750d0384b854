#include "runtime/wire.h"

#include <gtest/gtest.h>

#include <string>

#include "tandem/v1/client.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::runtime {
namespace {

v1::ClientMessage sample_submit() {
  v1::ClientMessage m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::Submit* s = m.mutable_submit();
  s->set_request_id("req-1");
  for (int id : {1, 15043, 3186, 29991}) s->mutable_tokens()->add_ids(id);
  s->mutable_sampling()->set_temperature(0.7f);
  s->mutable_sampling()->set_seed(42);
  s->set_max_tokens(128);
  s->add_stop_strings("\n\n");
  return m;
}

TEST(Wire, RoundTrip) {
  v1::ClientMessage in = sample_submit();
  zmq::message_t frame = to_frame(in);
  EXPECT_EQ(frame.size(), in.ByteSizeLong());
  v1::ClientMessage out;
  ASSERT_TRUE(parse_frame(frame, out).is_ok());
  EXPECT_EQ(out.SerializeAsString(), in.SerializeAsString());
  EXPECT_EQ(out.submit().tokens().ids(1), 15043);
  EXPECT_EQ(out.submit().sampling().seed(), 42u);
}

TEST(Wire, RoundTripLargeMessage) {
  v1::ClientMessage in;
  in.set_version(v1::PROTOCOL_VERSION_CURRENT);
  for (int i = 0; i < 100000; ++i) in.mutable_submit()->mutable_tokens()->add_ids(i);
  zmq::message_t frame = to_frame(in);
  v1::ClientMessage out;
  ASSERT_TRUE(parse_frame(frame, out).is_ok());
  ASSERT_EQ(out.submit().tokens().ids_size(), 100000);
  EXPECT_EQ(out.submit().tokens().ids(99999), 99999);
}

TEST(Wire, EmptyFrameIsTheDefaultMessage) {
  v1::ClientMessage out;
  ASSERT_TRUE(parse_frame(zmq::message_t(), out).is_ok());
  EXPECT_EQ(out.version(), 0);  // receivers reject it: no protocol version
  EXPECT_EQ(to_frame(v1::ClientMessage()).size(), 0u);
}

TEST(Wire, MalformedBytesAreAnError) {
  v1::ClientMessage out;
  // Field 2 (submit), length-delimited, claims 50 bytes but 2 follow.
  const std::string truncated("\x12\x32\x0a\x00", 4);
  Status st = parse_frame(zmq::message_t(truncated.data(), truncated.size()), out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "malformed message (4 bytes)");

  std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";  // an endless varint tag
  st = parse_frame(zmq::message_t(garbage.data(), garbage.size()), out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "malformed message (11 bytes)");

  // A valid message of another type read as this one is not caught by protobuf unless
  // it is malformed for this type; version checks at the edge catch the rest.
  v1::WorkerMessage other;
  EXPECT_FALSE(parse_frame(zmq::message_t(truncated.data(), truncated.size()), other).is_ok());
}

// Deeply nested input stops at protobuf's recursion limit instead of overflowing the stack.
TEST(Wire, RecursionLimitHolds) {
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += '\x7b';  // field 15, start group
  v1::ClientMessage out;
  Status st = parse_frame(zmq::message_t(nested.data(), nested.size()), out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);

  std::string shallow;  // 50 nested unknown groups, properly closed: within the limit
  for (int i = 0; i < 50; ++i) shallow += '\x7b';
  for (int i = 0; i < 50; ++i) shallow += '\x7c';  // field 15, end group
  EXPECT_TRUE(parse_frame(zmq::message_t(shallow.data(), shallow.size()), out).is_ok());
}

}  // namespace
}  // namespace tandem::runtime
