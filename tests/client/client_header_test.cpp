// The public header stands alone: a service that includes only <tandem/client.h> sees no
// ZeroMQ or protobuf type (nor needs their include paths), and nothing of tandem outside
// client/include: this file is compiled with that folder alone on the include path
// (tests/CMakeLists.txt). Compiling it is the check.
#include <tandem/client.h>

#if defined(ZMQ_VERSION_MAJOR) || defined(CPPZMQ_VERSION_MAJOR) || defined(GOOGLE_PROTOBUF_VERSION) || \
    defined(PROTOBUF_VERSION)
#error "tandem/client.h must not include ZeroMQ or protobuf headers"
#endif
#if __has_include("runtime/status.h") || __has_include("tandem/v1/client.pb.h")
#error "client_header_test must see client/include alone"
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
  EXPECT_STREQ(tandem::code_name(client.status().code()), "INVALID_ARGUMENT");
  EXPECT_EQ(client.status().to_string().rfind("INVALID_ARGUMENT: ", 0), 0u);
  tandem::Event e;
  e.final = true;
  e.fin.reason = tandem::FinishReason::kCancelled;
  EXPECT_STREQ(tandem::finish_reason_name(e.fin.reason), "cancelled");
  void (tandem::Stream::*cancel)() = &tandem::Stream::cancel;
  EXPECT_NE(cancel, nullptr);
}

}  // namespace
