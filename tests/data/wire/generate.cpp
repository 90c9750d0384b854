// Writes the golden client messages of tests/data/wire/: what libtandem-client puts on the
// wire for a Submit (sampling parameters, stop strings), a heartbeat, a Cancel and a status
// query, captured on a ROUTER standing in for the scheduler. Run once, by hand, when the
// goldens were made (see README.md); never again for the same protocol version: the files
// are what an old client sends, and a newer scheduler must keep serving them.
//   wire_golden_generate <output dir>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "tandem/client.h"
#include "tandem/v1/client.pb.h"

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
    if (i % 32 == 31 || i + 1 == bytes.size()) out += '\n';
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  using namespace tandem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_golden_generate <output dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, 5000);
  router.bind("tcp://127.0.0.1:*");
  ClientOptions options;
  options.endpoint = router.get(zmq::sockopt::last_endpoint);
  options.heartbeat_interval = 200ms;
  auto client = Client::connect(options);
  if (!client) {
    std::fprintf(stderr, "%s\n", client.status().to_string().c_str());
    return 1;
  }

  GenerateRequest request;
  request.id = "golden-1";
  request.prompt_text = "The quick brown fox";
  request.temperature = 0.8f;
  request.top_k = 40;
  request.top_p = 0.95f;
  request.min_p = 0.05f;
  request.repetition_penalty = 1.1f;
  request.seed = 1234;
  request.top_logprobs = 2;
  request.max_tokens = 8;
  request.stop_token_sequences = {{13, 13}};
  request.stop_strings = {"\n\n", "END"};
  request.logprobs = true;
  request.priority = 3;
  request.timeout = 60000ms;
  auto stream = (*client)->generate(request);
  std::thread status([&] { (void)(*client)->status(2s); });

  // Captured in the order they arrive; each kind written once.
  bool have_submit = false, have_heartbeat = false, have_cancel = false, have_status = false;
  while (!(have_submit && have_heartbeat && have_cancel && have_status)) {
    zmq::message_t identity, body;
    if (!router.recv(identity) || !router.recv(body)) {
      std::fprintf(stderr, "no message from the client within 5 s\n");
      return 1;
    }
    const std::string bytes = body.to_string();
    tandem::v1::ClientMessage m;
    if (!m.ParseFromString(bytes)) return 1;
    std::string name;
    if (m.has_submit() && !have_submit) name = "submit", have_submit = true;
    if (m.has_heartbeat() && !have_heartbeat) {
      name = "heartbeat", have_heartbeat = true;
      (void)(*client)->cancel(request.id);  // after the heartbeat: the stream is still in flight
    }
    if (m.has_cancel() && !have_cancel) name = "cancel", have_cancel = true;
    if (m.has_status() && !have_status) name = "status", have_status = true;
    if (name.empty()) continue;
    std::ofstream(dir + "/" + name + ".hex") << hex(bytes);
    std::printf("%s: %zu bytes\n", name.c_str(), bytes.size());
  }
  status.join();
  return 0;
}
