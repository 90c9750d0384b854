// The tandem target: each request through libtandem-client, cancellation by Client::cancel.
#include <atomic>

#include "tandem/bench.h"
#include "tandem/client.h"

namespace tandem::bench {

namespace {

// Ends a tracker with the final event's outcome.
void finish(RequestTracker& tracker, const FinalEvent& f) {
  switch (f.reason) {
    case FinishReason::kCancelled: return tracker.finish(Outcome::kCancelled, "cancelled", {}, f.prompt_tokens);
    case FinishReason::kError:
      return tracker.finish(Outcome::kFailed, "error", f.error_code + ": " + f.error_message, f.prompt_tokens);
    default:
      return tracker.finish(Outcome::kCompleted, finish_reason_name(f.reason), {}, f.prompt_tokens,
                            f.cached_prompt_tokens);
  }
}

class TandemTarget final : public Target {
 public:
  TandemTarget(std::string endpoint, std::unique_ptr<Client> client)
      : endpoint_(std::move(endpoint)), client_(std::move(client)) {}

  void start(std::shared_ptr<RequestTracker> tracker) override {
    const BenchRequest& b = tracker->request();
    GenerateRequest req;
    req.id = "bench-" + std::to_string(next_id_.fetch_add(1));
    req.prompt_tokens = b.prompt_tokens;
    req.prompt_text = b.prompt_text;
    req.max_tokens = b.max_tokens;
    req.ignore_eos = b.ignore_eos;
    req.temperature = b.temperature;
    req.seed = b.seed;
    req.logit_bias = b.logit_bias;
    const std::string id = req.id;
    client_->generate(std::move(req), [tracker, client = client_.get(), id](const Event& ev) {
      if (ev.final) return finish(*tracker, ev.fin);
      if (tracker->token() == tracker->request().cancel_after) (void)client->cancel(id);
    });
  }
  std::string describe() const override { return "tandem " + endpoint_; }

 private:
  std::string endpoint_;
  std::unique_ptr<Client> client_;  // its destructor gives every request still live its final event
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace

Result<std::unique_ptr<Target>> make_tandem_target(const std::string& endpoint) {
  ClientOptions options;
  options.endpoint = endpoint;
  auto client = Client::connect(options);
  if (!client) return client.status();
  return std::unique_ptr<Target>(new TandemTarget(endpoint, std::move(client.value())));
}

}  // namespace tandem::bench
