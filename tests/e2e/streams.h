// What the end-to-end tests of the service share on top of deployment.h: a deployment with
// a client, collecting a stream's tokens and final event, deterministic prompts.
#pragma once

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/sampling.h"
#include "tandem/client.h"
#include "tests/e2e/deployment.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem::test {

using namespace std::chrono_literals;

// KV blocks a worker has in use (neither free nor held by the prefix cache).
inline uint32_t in_use(const WorkerInfo& w) { return w.kv_blocks_total - w.kv_blocks_free - w.kv_blocks_cached; }

// The worker running the most sequences (of `role`, when given): the one to kill or stop.
inline WorkerInfo busiest(const StatusInfo& st, const std::string& role = {}) {
  WorkerInfo best;
  for (const auto& w : st.workers)
    if ((role.empty() || w.role == role) && w.running > best.running) best = w;
  return best;
}

// The process id of the first worker of `role` in `st` (0: none), e.g. to stop it.
inline int64_t worker_pid(const StatusInfo& st, const std::string& role) {
  for (const auto& w : st.workers)
    if (w.role == role) return static_cast<int64_t>(w.pid);
  return 0;
}

// tandem up plus a client connected to it.
class ClientDeployment : public Deployment {
 public:
  using Deployment::Deployment;
  std::unique_ptr<Client> client() {
    ClientOptions o;
    o.endpoint = endpoint();
    auto c = Client::connect(o);
    EXPECT_TRUE(c) << c.status().to_string();
    return c ? std::move(c.value()) : nullptr;
  }
};

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<std::string> texts;  // each token's text
  std::vector<float> logprobs;     // each token's (GenerateRequest::logprobs)
  FinalEvent fin;
  int finals = 0;
  // The stream's text: every token's, then the final event's held-back bytes.
  std::string text() const {
    std::string all;
    for (const auto& t : texts) all += t;
    return all + fin.text;
  }
};

inline Collected collect(Stream& s, std::chrono::milliseconds limit = 60s) {
  Collected c;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto ev = s.next_for(100ms);
    if (!ev) continue;
    if (ev->final) {
      c.fin = ev->fin;
      ++c.finals;
      break;
    }
    c.tokens.push_back(ev->token.id);
    c.texts.push_back(ev->token.text);
    c.logprobs.push_back(ev->token.logprob);
  }
  return c;
}

// `tandem make-model --arch ARCH --preset tiny --seed SEED`, made once per test process.
inline std::string tiny_model(const std::string& arch, unsigned seed) {
  const std::string p = temp_dir() + "/" + arch + "-tiny-" + std::to_string(seed) + ".gguf";
  const std::string cmd = std::string(TANDEM_TANDEM_BIN) + " make-model --arch " + arch + " --preset tiny --seed " +
                          std::to_string(seed) + " --out " + p + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) return "make-model failed: " + cmd;
  return p;
}

// The tokens the engine alone gives `r` (ignore_eos; the whole prompt in one chunk, batch of one).
inline std::vector<int32_t> engine_alone(engine::Engine& e, const GenerateRequest& r) {
  engine::GenerateOptions opt;
  opt.max_tokens = r.max_tokens;
  opt.ignore_eos = true;
  opt.sampling = sampling_params(r);
  return engine::generate(e, r.prompt_tokens, opt).value().tokens;
}

inline std::vector<int32_t> prompt_of(uint32_t len, uint32_t salt) {
  std::vector<int32_t> p;
  for (uint32_t i = 0; i < len; ++i) p.push_back(3 + static_cast<int32_t>((i * 31 + salt * 17) % 500));
  return p;
}

// n greedy requests (ignore_eos; request i from greedy(i): prompt, max_tokens, sampling)
// started on `client`, with the tokens the engine alone gives each (the tiny model, seed 1).
struct GreedyRun {
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<std::vector<int32_t>> want;
};
inline GreedyRun start_greedy(Client& client, uint32_t n, const std::function<GenerateRequest(uint32_t)>& greedy) {
  auto engine = engine::Engine::load(model_file("tiny", 1), {1, engine::GemmBackend::kPacked}).value();
  GreedyRun run;
  std::vector<GenerateRequest> requests;
  for (uint32_t i = 0; i < n; ++i) {  // every reference first: then all requests go out together
    GenerateRequest r = greedy(i);
    r.ignore_eos = true;
    engine::GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.ignore_eos = true;
    opt.sampling = sampling_params(r);
    run.want.push_back(engine::generate(*engine, r.prompt_tokens, opt).value().tokens);
    requests.push_back(std::move(r));
  }
  for (GenerateRequest& r : requests) run.streams.push_back(client.generate(std::move(r)));
  return run;
}

inline GenerateRequest greedy_request(std::vector<int32_t> prompt, uint32_t max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace tandem::test
