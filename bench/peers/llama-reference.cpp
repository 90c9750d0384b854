// llama.cpp's greedy continuations of token prompts, as tandem's reference outputs: for each
// prompt (a line of comma-separated token ids; BOS only where the line has it), 32 greedy
// tokens with an F32 KV cache, one sequence, a fresh context per prompt; one JSON line each:
//   {"tokens":[...], "top":[[[id, logprob] x 5 best] per generated position]}
// logprobs are log-softmax of llama.cpp's logits, computed in double; ties pick the lower id.
//
//   llama-reference MODEL.gguf PROMPTS.txt [--threads 2] [--tokens 32] [--flash-attn on|off] > OUT.jsonl
//   llama-reference --system-info [--threads 2]     llama.cpp's system_info line, as its tools print it
//
// Built by bench/peers/build-llama-reference.sh against the npm llama.cpp build, outside the
// repository's build; no CI test needs it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "llama.h"

namespace {

struct Options {
  std::string model, prompts;
  int threads = 2, tokens = 32;
  bool flash_attn = false;
  bool system_info = false;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "llama-reference: %s\n", message.c_str());
  std::exit(1);
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--threads") {
      o.threads = std::atoi(value().c_str());
    } else if (a == "--tokens") {
      o.tokens = std::atoi(value().c_str());
    } else if (a == "--flash-attn") {
      const std::string v = value();
      if (v != "on" && v != "off") die("--flash-attn takes on or off");
      o.flash_attn = v == "on";
    } else if (a == "--system-info") {
      o.system_info = true;
    } else if (a.rfind("--", 0) == 0) {
      die("unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (o.system_info && positional.empty()) return o;
  if (positional.size() != 2 || o.threads < 1 || o.tokens < 1) {
    die("usage: llama-reference MODEL.gguf PROMPTS.txt [--threads N] [--tokens N] [--flash-attn on|off]");
  }
  o.model = positional[0];
  o.prompts = positional[1];
  return o;
}

std::vector<std::vector<llama_token>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) die("cannot read " + path);
  std::vector<std::vector<llama_token>> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<llama_token> p;
    std::stringstream ss(line);
    for (std::string item; std::getline(ss, item, ',');) {
      char* end = nullptr;
      const long id = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || id < 0) die(path + ": '" + item + "' is not a token id");
      p.push_back(static_cast<llama_token>(id));
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// One prompt's continuation as a JSON line.
std::string continue_prompt(llama_model* model, const Options& o, std::vector<llama_token> prompt) {
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : prompt) {
    if (t >= n_vocab) die("token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n_vocab));
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + o.tokens + 16);
  cp.n_batch = cp.n_ubatch = std::max<uint32_t>(512, static_cast<uint32_t>(prompt.size()));
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");
  std::string tokens, top;
  std::vector<llama_token> next = prompt;
  std::vector<int> order(n_vocab);
  for (int step = 0; step < o.tokens; ++step) {
    if (llama_decode(ctx, llama_batch_get_one(next.data(), static_cast<int32_t>(next.size()))) != 0) {
      die("llama_decode failed");
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    double max = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) max = std::max(max, static_cast<double>(logits[i]));
    double sum = 0;
    for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    const double log_z = max + std::log(sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    char buf[64];
    top += step ? ",[" : "[";
    for (int k = 0; k < 5; ++k) {
      std::snprintf(buf, sizeof buf, "%s[%d,%g]", k ? "," : "", order[k], logits[order[k]] - log_z);
      top += buf;
    }
    top += "]";
    tokens += (step ? "," : "") + std::to_string(order[0]);
    next.assign(1, order[0]);
  }
  llama_free(ctx);
  return "{\"tokens\":[" + tokens + "],\"top\":[" + top + "]}";
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.system_info) {  // as common_params_get_system_info writes it
    std::printf("system_info: n_threads = %d / %u | %s\n", o.threads, std::thread::hardware_concurrency(),
                llama_print_system_info());
    return 0;
  }
  const auto prompts = read_prompts(o.prompts);
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
  if (!model) die("cannot load " + o.model);
  std::fprintf(stderr, "llama-reference: %s\n", llama_print_system_info());
  for (const auto& p : prompts) std::printf("%s\n", continue_prompt(model, o, p).c_str());
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
