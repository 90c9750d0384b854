// The `tandem` binary as a user runs it: make-model and run, good and bad inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <string>

#include "tests/test_util.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem {
namespace {

using Output = test::CommandOutput;
using test::read_file;

Output tandem(const std::string& args) { return test::run_command(std::string(TANDEM_TANDEM_BIN) + " " + args); }

// The start of what `run --tokens 1,40,41,42 --max-tokens 12 --ignore-eos --json` must
// print: the tokens generate() gives in-process with this KV format.
std::string engine_json_start(const std::string& model, const engine::KvFormat& kv_format, uint32_t max_tokens = 12) {
  auto e = engine::Engine::load(model).value();
  const std::vector<int32_t> prompt = {1, 40, 41, 42};
  engine::GenerateOptions opt;
  opt.max_tokens = max_tokens;
  opt.ignore_eos = true;
  opt.kv_format = kv_format;
  auto gen = engine::generate(*e, prompt, opt).value();
  std::string want = "{\"tokens\":[";
  for (size_t i = 0; i < gen.tokens.size(); ++i) want += (i ? "," : "") + std::to_string(gen.tokens[i]);
  return want + "],\"logprobs\":[";
}

TEST(Cli, MakeModelIsDeterministic) {
  const std::string dir = test::temp_dir();
  ASSERT_EQ(tandem("make-model --preset tiny --seed 7 --out " + dir + "/a.gguf").exit_code, 0);
  ASSERT_EQ(tandem("make-model --preset tiny --seed 7 --out " + dir + "/b.gguf").exit_code, 0);
  ASSERT_EQ(tandem("make-model --preset tiny --seed 8 --out " + dir + "/c.gguf").exit_code, 0);
  EXPECT_EQ(read_file(dir + "/a.gguf"), read_file(dir + "/b.gguf"));
  EXPECT_NE(read_file(dir + "/a.gguf"), read_file(dir + "/c.gguf"));
  auto bad = tandem("make-model --preset huge --out " + dir + "/d.gguf");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("huge"), std::string::npos) << bad.err;
}

// make-model writes llama-quantize's mixes: from a preset (its F32 weights quantized) or --from a file.
TEST(Cli, MakeModelQuantizes) {
  const std::string dir = test::temp_dir();
  auto made = tandem("make-model --preset tiny --seed 3 --dtype q4_k_m --out " + dir + "/q.gguf");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  ASSERT_EQ(tandem("make-model --preset tiny --seed 3 --out " + dir + "/f32.gguf").exit_code, 0);
  auto from = tandem("make-model --from " + dir + "/f32.gguf --dtype q4_k_m --out " + dir + "/q2.gguf");
  ASSERT_EQ(from.exit_code, 0) << from.err;
  EXPECT_EQ(read_file(dir + "/q.gguf"), read_file(dir + "/q2.gguf"));
  EXPECT_LT(read_file(dir + "/q.gguf").size(), read_file(dir + "/f32.gguf").size() / 4);
  auto both = tandem("make-model --from " + dir + "/f32.gguf --preset tiny --dtype q8_0 --out " + dir + "/x.gguf");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--from quantizes a file: it takes no --preset"), std::string::npos) << both.err;
  auto bad = tandem("make-model --from " + dir + "/f32.gguf --dtype q3_k_m --out " + dir + "/x.gguf");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("q4_k_m"), std::string::npos) << "the error lists the choices: " << bad.err;
  auto missing = tandem("make-model --from " + dir + "/absent.gguf --dtype q8_0 --out " + dir + "/x.gguf");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("absent.gguf: cannot open"), std::string::npos) << missing.err;
}

TEST(Cli, RunJsonEqualsTheEngine) {
  const std::string model = test::model_file("tiny", 1);
  auto r = tandem("run --model " + model + " --tokens 1,40,41,42 --max-tokens 12 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(engine_json_start(model, {}), 0), 0u) << r.out;
  EXPECT_EQ(r.out.back(), '\n');
}

// --kv-bits reaches the engine: tandem run with 4-bit KV equals generate() with 4-bit KV.
// 40 tokens: past position 32 the first block has left the F32 window (the last 2 blocks).
TEST(Cli, RunWithQuantizedKvEqualsTheEngine) {
  const std::string model = test::model_file("tiny", 1);
  const std::string run = "run --model " + model + " --tokens 1,40,41,42 --max-tokens 40 --ignore-eos --json";
  auto r = tandem(run + " --kv-bits 4 --kv-group-size 32 --kv-quant-skip-last-layer");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(engine_json_start(model, {4, 32, true}, 40), 0), 0u) << r.out;
  // and the logprobs differ from F32 KV's: the flag changed the cache
  auto f32 = tandem(run);
  EXPECT_NE(r.out, f32.out);
  auto no_window = tandem(run + " --kv-bits 4 --kv-group-size 32 --kv-quant-skip-last-layer --kv-f32-window 0");
  ASSERT_EQ(no_window.exit_code, 0) << no_window.err;
  EXPECT_EQ(no_window.out.rfind(engine_json_start(model, {4, 32, true, 0}, 40), 0), 0u) << no_window.out;
  EXPECT_NE(no_window.out, r.out);
  auto bad = tandem(run + " --kv-bits 8 --kv-f32-window 3");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("kv-f32-window"), std::string::npos) << bad.err;
}

TEST(Cli, RunTextPromptAndSampling) {
  const std::string model = test::model_file("tiny", 1);
  auto a =
      tandem("run --model " + model + " --prompt 'héllo' --max-tokens 8 --temperature 0.8 --top-p 0.9 --seed 3 --json");
  auto b =
      tandem("run --model " + model + " --prompt 'héllo' --max-tokens 8 --temperature 0.8 --top-p 0.9 --seed 3 --json");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);  // same seed, same tokens
  auto text = tandem("run --model " + model + " --prompt 'héllo' --max-tokens 8");
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.err.find("prompt tokens"), std::string::npos) << text.err;
}

// --logit-bias TOKEN=100 forces TOKEN at every step (here while sampling at temperature 1);
// the penalties run (their arithmetic is tests/engine/sampler_test.cpp's).
TEST(Cli, RunLogitBiasAndPenalties) {
  const std::string model = test::model_file("tiny", 1);
  auto forced = tandem("run --model " + model +
                       " --tokens 1,40 --max-tokens 6 --ignore-eos --temperature 1 --seed 2 --logit-bias 77=100,3=-100 "
                       "--json");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.out.rfind("{\"tokens\":[77,77,77,77,77,77]", 0), 0u) << forced.out;
  auto penalized = tandem("run --model " + model +
                          " --tokens 1,40 --max-tokens 6 --ignore-eos --presence-penalty 1.5 --frequency-penalty 0.5");
  EXPECT_EQ(penalized.exit_code, 0) << penalized.err;
}

TEST(Cli, BadInputsGiveClearErrors) {
  const std::string model = test::model_file("tiny", 1);
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/junk.gguf") << "this is not a model file at all";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"run --model " + dir + "/junk.gguf --tokens 1", "not a GGUF file"},
      {"run --model " + dir + "/missing.gguf --tokens 1", "missing.gguf"},
      {"run --model " + model + " --tokens 1,x", "'x' is not a token id"},
      {"run --model " + model + " --tokens 1,99999", "outside the vocabulary"},
      {"run --model " + model + " --tokens 1 --top-p 1.5", "top_p"},
      {"run --model " + model + " --tokens 1 --bogus", "unknown flag --bogus"},
      {"run --model " + model + " --tokens 1 --logit-bias 5", "--logit-bias: '5' is not TOKEN=BIAS"},
      {"run --model " + model + " --tokens 1 --logit-bias 5=1,x=2", "--logit-bias: 'x=2' is not TOKEN=BIAS"},
      {"run --model " + model + " --tokens 1 --logit-bias 5=200", "logit_bias: bias 200 for token 5 is outside"},
      {"run --model " + model + " --tokens 1 --logit-bias 512=1", "logit_bias: token id 512 is outside the vocabulary"},
      {"run --model " + model + " --tokens 1 --presence-penalty 3", "presence_penalty 3 is outside [-2, 2]"},
      {"run --model " + model + " --tokens 1 --frequency-penalty x", "--frequency-penalty"},
      {"run --model " + model, "exactly one of --prompt or --tokens"},
      {"run --model " + model + " --tokens 1 --gemm magic", "--gemm"},
      {"run --model " + model + " --tokens 1 --kv-bits 5", "KV bits must be 0 (f32), 8 or 4, got 5"},
      {"run --model " + model + " --tokens 1 --kv-group-size 48", "KV group size must be 32, 64 or 128, got 48"},
      {"worker --model " + model + " --scheduler ipc:///nonexistent --kv-bits 3", "got 3"},
      {"frobnicate", "unknown command"},
  };
  for (const Case& c : cases) {
    auto r = tandem(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << " -> " << r.err;
  }
}

}  // namespace
}  // namespace tandem
