// #18 item 1 (in part): a refused registration never tells the peer what the scheduler expects.
// The refusal of a worker with another model used to contain the scheduler's own model
// fingerprint, so any peer could read it and register with it next.
#include <gtest/gtest.h>

#include <string>
#include <zmq.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

TEST(Registration, ARefusalNamesNeitherFingerprint) {
  const std::string model = model_file("tiny", 1);
  Deployment d({"--workers", "1", "--threads", "1"}, model);
  ASSERT_TRUE(d.ok());
  auto file = model::GgufFile::open(model);
  ASSERT_TRUE(file);
  const std::string expected = model::model_fingerprint(**file, model::read_model_config(**file).value());
  ASSERT_FALSE(expected.empty());

  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(d.worker_endpoint());
  v1::WorkerMessage reg;
  reg.set_version(v1::PROTOCOL_VERSION_CURRENT);
  reg.mutable_register_()->set_role(v1::WORKER_ROLE_BOTH);
  reg.mutable_register_()->set_model_fingerprint("guess");
  ASSERT_TRUE(dealer.send(runtime::to_frame(reg), zmq::send_flags::none));
  zmq::message_t frame;
  ASSERT_TRUE(dealer.recv(frame));
  v1::SchedulerCommand c;
  ASSERT_TRUE(runtime::parse_frame(frame, c).is_ok());
  ASSERT_TRUE(c.has_register_reply());
  EXPECT_FALSE(c.register_reply().accepted());
  EXPECT_EQ(c.register_reply().reason(), v1::REFUSAL_REASON_MODEL_FINGERPRINT);
  const std::string message = c.register_reply().error_message();
  EXPECT_EQ(message.find(expected), std::string::npos) << "the refusal gives the scheduler's fingerprint: " << message;
  EXPECT_EQ(message.find("guess"), std::string::npos) << message;
  EXPECT_NE(message.find("must load the same model file"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::test
