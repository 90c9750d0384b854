// The public header stands alone: a service that includes only <tandem/client.h> sees no
// ZeroMQ or protobuf type (nor needs their include paths). Compiling this file is the check.
#include <tandem/client.h>

#if defined(ZMQ_VERSION_MAJOR) || defined(CPPZMQ_VERSION_MAJOR) || defined(GOOGLE_PROTOBUF_VERSION) || \
    defined(PROTOBUF_VERSION)
#error "tandem/client.h must not include ZeroMQ or protobuf headers"
#endif

#include <gtest/gtest.h>

namespace {

TEST(ClientHeader, UsableWithoutTheWire) {
  tandem::GenerateRequest req;
  req.prompt_text = "hi";
  req.stop_strings.push_back("\n");
  EXPECT_EQ(req.max_tokens, 16u);
  EXPECT_TRUE(req.stream);
  tandem::ClientOptions opt;  // no endpoint: refused without touching the network
  auto client = tandem::Client::connect(opt);
  EXPECT_FALSE(client.is_ok());
  EXPECT_EQ(client.status().code(), tandem::Code::kInvalidArgument);
  tandem::Event e;
  e.final = true;
  e.fin.reason = tandem::FinishReason::kCancelled;
  EXPECT_STREQ(tandem::finish_reason_name(e.fin.reason), "cancelled");
  void (tandem::Stream::*cancel)() = &tandem::Stream::cancel;
  EXPECT_NE(cancel, nullptr);
}

}  // namespace
