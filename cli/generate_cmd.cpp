// tandem generate: one request to a running service through libtandem-client; tokens are
// printed as they stream in. Ctrl-C cancels the request and still prints its final event.
#include <signal.h>

#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/curve_flag.h"
#include "cli/sampling_flags.h"
#include "runtime/json.h"
#include "tandem/client.h"

namespace tandem::cli {

using runtime::append_json_string;
using runtime::json_number;
using runtime::json_string;

namespace {

constexpr const char* kUsage =
    "usage: tandem generate --endpoint E (--prompt TEXT | --tokens 1,2,3) [flags]\n"
    "       tandem generate --endpoint E --chat [--system TEXT] --prompt TEXT [--model FILE [--template F]] [flags]";
constexpr const char* kNotes = "exit status: 0 stop/length, 1 error, 2 usage, 130 cancelled by Ctrl-C\n";

volatile sig_atomic_t g_interrupted = 0;

void on_sigint(int) { g_interrupted = 1; }

std::string token_json(const TokenEvent& t, bool logprobs) {
  std::string out = "{\"type\":\"token\",\"id\":" + std::to_string(t.id) + ",\"text\":";
  append_json_string(out, t.text);
  if (logprobs) out += ",\"logprob\":" + json_number(t.logprob);
  if (!t.top.empty()) {
    out += ",\"top\":[";
    for (size_t i = 0; i < t.top.size(); ++i)
      out += (i ? ",{\"id\":" : "{\"id\":") + std::to_string(t.top[i].first) +
             ",\"logprob\":" + json_number(t.top[i].second) + "}";
    out += "]";
  }
  out += "}\n";
  return out;
}

std::string final_json(const FinalEvent& f) {
  std::string out = "{\"type\":\"final\",\"finish_reason\":\"";
  out += finish_reason_name(f.reason);
  out += "\",\"error\":";
  append_json_string(out, f.reason == FinishReason::kError ? f.error_code + ": " + f.error_message : f.error_message);
  out += ",\"text\":";
  append_json_string(out, f.text);
  out += ",\"usage\":{\"prompt_tokens\":" + std::to_string(f.prompt_tokens) +
         ",\"completion_tokens\":" + std::to_string(f.completion_tokens) +
         ",\"cached_prompt_tokens\":" + std::to_string(f.cached_prompt_tokens) + "}";
  out += ",\"timings\":{\"queue_ms\":" + json_number(f.queue_ms) + ",\"ttft_ms\":" + json_number(f.ttft_ms) +
         ",\"total_ms\":" + json_number(f.total_ms) + "}}\n";
  return out;
}

// The request the flags describe (endpoint and prompt checked by the caller).
Result<GenerateRequest> request_from_flags(const Args& args) {
  GenerateRequest req;
  auto max_tokens = args.integer("max-tokens", 16);
  auto sampling = sampling_from_flags(args);
  auto top_logprobs = args.integer("top-logprobs", 0);
  auto priority = args.integer("priority", 0);
  auto timeout_ms = args.integer("timeout-ms", 0);
  auto tokens = args.int_list("tokens");
  for (const Status* st : {&max_tokens.status(), &sampling.status(), &top_logprobs.status(), &priority.status(),
                           &timeout_ms.status(), &tokens.status()})
    if (!st->is_ok()) return *st;
  if (args.has("tokens") && tokens->empty()) return Status::invalid("--tokens: no token ids");
  if (args.has("chat") && !args.has("model")) {
    // The request carries the messages; the scheduler renders them with its model's template.
    TANDEM_RETURN_IF_ERROR(check_chat_flags(args));
    if (args.has("template")) return Status::invalid("--template needs --model FILE (rendered here, then sent as ids)");
    if (auto system = args.str("system")) req.messages.push_back(ChatMessage{"system", *system});
    req.messages.push_back(ChatMessage{"user", args.str("prompt").value_or("")});
  } else if (args.has("chat")) {
    // Rendered and tokenized here from a copy of the model file (or --template), sent as ids.
    auto ids = chat_prompt_from_flags(args, *args.str("model"));
    if (!ids) return ids.status();
    req.prompt_tokens = std::move(ids.value());
  } else {
    TANDEM_RETURN_IF_ERROR(check_chat_flags(args));
    if (args.has("model")) return Status::invalid("--model is read only with --chat");
    req.prompt_text = args.str("prompt").value_or("");
    req.prompt_tokens = std::move(tokens.value());
  }
  req.no_bos = args.has("no-bos");
  req.max_tokens = static_cast<uint32_t>(*max_tokens);
  req.temperature = sampling->temperature;
  req.top_k = sampling->top_k;
  req.top_p = sampling->top_p;
  req.min_p = sampling->min_p;
  req.repetition_penalty = sampling->repetition_penalty;
  req.seed = sampling->seed;
  req.presence_penalty = sampling->presence_penalty;
  req.frequency_penalty = sampling->frequency_penalty;
  for (const model::LogitBias& b : sampling->logit_bias) req.logit_bias.emplace_back(b.token, b.bias);
  req.top_logprobs = static_cast<int32_t>(*top_logprobs);
  req.logprobs = args.has("logprobs") || *top_logprobs > 0;
  req.stop_strings = args.all("stop");
  req.include_stop_string = args.has("include-stop-string");
  req.ignore_eos = args.has("ignore-eos");
  req.priority = static_cast<int32_t>(*priority);
  req.timeout = std::chrono::milliseconds(*timeout_ms);
  return req;
}

// Streams the request's tokens to stdout until its final event. The first Ctrl-C cancels
// (the final event still comes); a second one kills as usual.
FinalEvent stream_to_stdout(Client& client, GenerateRequest req, bool json) {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  const bool logprobs = req.logprobs;
  auto stream = client.generate(std::move(req));
  bool cancel_sent = false;
  for (;;) {
    if (g_interrupted && !cancel_sent) {
      stream->cancel();
      cancel_sent = true;
    }
    std::optional<Event> ev = stream->next_for(std::chrono::milliseconds(50));
    if (!ev) continue;
    if (ev->final) return std::move(ev->fin);
    if (json) {
      const std::string line = token_json(ev->token, logprobs);
      std::fwrite(line.data(), 1, line.size(), stdout);
    } else {
      std::fwrite(ev->token.text.data(), 1, ev->token.text.size(), stdout);
    }
    std::fflush(stdout);
  }
}

// The final event on stdout (and a summary or the error on stderr); the exit status.
int report_final(const FinalEvent& fin, bool json) {
  if (json) {
    const std::string line = final_json(fin);
    std::fwrite(line.data(), 1, line.size(), stdout);
  } else {
    std::fwrite(fin.text.data(), 1, fin.text.size(), stdout);
    std::fputs("\n", stdout);
  }
  std::fflush(stdout);
  if (fin.reason == FinishReason::kError) {
    std::fprintf(stderr, "tandem generate: %s: %s\n", fin.error_code.c_str(), fin.error_message.c_str());
  } else if (!json) {
    std::fprintf(stderr,
                 "tandem generate: %u prompt tokens (%u cached), %u generated, queue %.1f ms, first token %.1f ms, "
                 "total %.1f ms, finish: %s\n",
                 fin.prompt_tokens, fin.cached_prompt_tokens, fin.completion_tokens, fin.queue_ms, fin.ttft_ms,
                 fin.total_ms, finish_reason_name(fin.reason));
  }
  switch (fin.reason) {
    case FinishReason::kStop:
    case FinishReason::kLength: return 0;
    case FinishReason::kCancelled: return g_interrupted ? 130 : 1;
    case FinishReason::kError: return 1;
  }
  return 1;
}

}  // namespace

int generate_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kGenerate);
  if (!args) return fail("generate", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kGenerate, kUsage, kNotes).c_str(), stdout);
    return 0;
  }
  auto endpoint = args->str("endpoint");
  if (!endpoint) return fail("generate", Status::invalid("--endpoint E is required"));
  if (args->has("prompt") == args->has("tokens"))
    return fail("generate", Status::invalid("give exactly one of --prompt or --tokens"));
  auto req = request_from_flags(*args);
  if (!req) return fail("generate", req.status());
  const bool json = args->has("json");

  ClientOptions options;
  options.endpoint = *endpoint;
  if (Status st = apply_curve_flag(*args, options); !st) return fail("generate", st);
  auto client = Client::connect(options);
  if (!client) return fail("generate", client.status());
  return report_final(stream_to_stdout(**client, std::move(req.value()), json), json);
}

}  // namespace tandem::cli
