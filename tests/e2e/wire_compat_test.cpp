// Wire compatibility (docs/ARCHITECTURE.md, "Wire compatibility"): the exact bytes an older
// client sent (tests/data/wire/, made once by tests/data/wire/generate.cpp) are parsed and
// served by this scheduler, over a real DEALER against `tandem up`; and a message carrying
// fields this scheduler does not know (a newer client) is served as if they were absent.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <zmq.hpp>

#include "runtime/wire.h"
#include "tandem/v1/client.pb.h"
#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using Deployment = test::Deployment;

// The bytes of tests/data/wire/<name>.hex (hex digits; whitespace ignored).
std::string golden(const std::string& name) {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/data/wire/" + name + ".hex");
  EXPECT_TRUE(f) << "missing golden " << name;
  std::string digits, bytes;
  for (char c; f.get(c);)
    if (std::isxdigit(static_cast<unsigned char>(c))) digits += c;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    bytes += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
  return bytes;
}

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : dealer_(ctx_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::rcvtimeo, 20000);
    dealer_.connect(endpoint);
  }
  void send(const std::string& bytes) { ASSERT_TRUE(dealer_.send(zmq::buffer(bytes), zmq::send_flags::none)); }
  // The next reply; one with no body when none came in time.
  v1::SchedulerReply recv() {
    v1::SchedulerReply r;
    zmq::message_t frame;
    if (!dealer_.recv(frame)) {
      ADD_FAILURE() << "no reply from the scheduler";
      return r;
    }
    EXPECT_TRUE(runtime::parse_frame(frame, r).is_ok());
    return r;
  }
  // Events of `request_id` up to its final event: the final, and the number of tokens before it.
  v1::FinalEvent until_final(const std::string& request_id, int* tokens = nullptr) {
    int n = 0;
    for (;;) {
      v1::SchedulerReply r = recv();
      if (r.body_case() == v1::SchedulerReply::BODY_NOT_SET) return {};
      EXPECT_FALSE(r.has_error()) << r.error().message();
      if (!r.has_events()) continue;
      for (const v1::RequestEvents& ev : r.events().requests()) {
        EXPECT_EQ(ev.request_id(), request_id);
        n += ev.tokens_size();
        if (ev.has_final()) {
          if (tokens) *tokens = n;
          return ev.final();
        }
      }
    }
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t dealer_;
};

// Appends fields 100 (varint) and 101 (bytes) to `m`'s unknown fields: what a newer peer's
// additions look like to this build.
void add_unknown_fields(google::protobuf::Message& m) {
  google::protobuf::UnknownFieldSet* u = m.GetReflection()->MutableUnknownFields(&m);
  u->AddVarint(100, 7);
  u->AddLengthDelimited(101, "a field of a newer protocol");
}

TEST(WireCompat, GoldenClientMessagesAreParsedAndServed) {
  v1::ClientMessage submit, cancel, status, heartbeat;
  ASSERT_TRUE(submit.ParseFromString(golden("submit")));
  ASSERT_TRUE(cancel.ParseFromString(golden("cancel")));
  ASSERT_TRUE(status.ParseFromString(golden("status")));
  ASSERT_TRUE(heartbeat.ParseFromString(golden("heartbeat")));
  // What the goldens hold (generate.cpp): a Submit with sampling parameters and stops.
  ASSERT_TRUE(submit.has_submit());
  EXPECT_EQ(submit.submit().request_id(), "golden-1");
  EXPECT_EQ(submit.submit().stop_strings_size(), 2);
  EXPECT_FLOAT_EQ(submit.submit().sampling().top_p(), 0.95f);
  ASSERT_TRUE(cancel.has_cancel());
  EXPECT_EQ(cancel.cancel().request_id(), "golden-1");
  ASSERT_TRUE(status.has_status());
  ASSERT_TRUE(heartbeat.has_heartbeat());

  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  RawClient client(d.endpoint());

  // The submit runs to its end: tokens, then a final event that is no error.
  client.send(golden("submit"));
  int tokens = 0;
  v1::FinalEvent fin = client.until_final("golden-1", &tokens);
  EXPECT_TRUE(fin.finish_reason() == v1::FINISH_REASON_STOP || fin.finish_reason() == v1::FINISH_REASON_LENGTH)
      << fin.finish_reason() << ": " << fin.error_message();
  EXPECT_GE(tokens, 1);
  EXPECT_GT(fin.usage().prompt_tokens(), 0u);
  EXPECT_EQ(fin.usage().completion_tokens(), static_cast<uint32_t>(tokens));

  // Heartbeat and cancel (of a request already finished) are taken silently: the next reply
  // is the status query's, echoing its id.
  client.send(golden("heartbeat"));
  client.send(golden("cancel"));
  client.send(golden("status"));
  v1::SchedulerReply r = client.recv();
  ASSERT_TRUE(r.has_status()) << r.DebugString();
  EXPECT_EQ(r.status().query_id(), status.status().query_id());
  EXPECT_TRUE(r.status().ready());
  EXPECT_EQ(r.status().requests_finished(), 1u);
  EXPECT_EQ(r.status().workers_size(), 1);

  // Submit then cancel at once: exactly one final event, cancelled or (if it won) finished.
  client.send(golden("submit"));
  client.send(golden("cancel"));
  fin = client.until_final("golden-1");
  EXPECT_NE(fin.finish_reason(), v1::FINISH_REASON_ERROR) << fin.error_message();
  EXPECT_NE(fin.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  client.send(golden("status"));
  r = client.recv();
  ASSERT_TRUE(r.has_status()) << r.DebugString();  // no second final event came before it
  EXPECT_EQ(r.status().requests_finished(), 2u);
}

TEST(WireCompat, FieldsOfANewerClientAreIgnored) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  RawClient client(d.endpoint());

  // Unknown fields in the envelope, in the Submit and in its sampling parameters.
  v1::ClientMessage submit;
  ASSERT_TRUE(submit.ParseFromString(golden("submit")));
  add_unknown_fields(submit);
  add_unknown_fields(*submit.mutable_submit());
  add_unknown_fields(*submit.mutable_submit()->mutable_sampling());
  const std::string bytes = submit.SerializeAsString();
  ASSERT_GT(bytes.size(), golden("submit").size());
  client.send(bytes);
  int tokens = 0;
  const v1::FinalEvent fin = client.until_final("golden-1", &tokens);
  EXPECT_TRUE(fin.finish_reason() == v1::FINISH_REASON_STOP || fin.finish_reason() == v1::FINISH_REASON_LENGTH)
      << fin.finish_reason() << ": " << fin.error_message();
  EXPECT_GE(tokens, 1);

  // A status query with raw bytes appended: field 100 (varint 1) and field 101 (3 bytes).
  std::string query = golden("status") + std::string("\xa0\x06\x01\xaa\x06\x03new", 9);
  client.send(query);
  const v1::SchedulerReply r = client.recv();
  ASSERT_TRUE(r.has_status()) << r.DebugString();
  v1::ClientMessage status;
  ASSERT_TRUE(status.ParseFromString(golden("status")));
  EXPECT_EQ(r.status().query_id(), status.status().query_id());
  EXPECT_EQ(r.status().requests_finished(), 1u);
}

}  // namespace
}  // namespace tandem
