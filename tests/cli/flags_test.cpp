// The flag table (cli/flags.h): every setting defined once, settable from a flag and from a
// deployment file alike, and both reach `tandem up`'s children the same way.
#include "cli/flags.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <tuple>

#include "cli/args.h"
#include "cli/config.h"
#include "cli/scheduler_cmd.h"
#include "cli/supervisor.h"
#include "cli/worker_cmd.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using cli::Flag;
using cli::FlagType;
using cli::Section;

constexpr uint32_t kAllCommands = (cli::kDisaggBench << 1) - 1;

Result<cli::Args> parse(std::vector<std::string> argv, cli::Command command) {
  std::vector<char*> p;
  for (std::string& a : argv) p.push_back(a.data());
  return cli::Args::parse(static_cast<int>(p.size()), p.data(), command);
}

// A value of `f` other than its default, in range: what the round trips below send.
std::string sample_value(const Flag& f) {
  switch (f.type) {
    case FlagType::kInt: return std::to_string(f.fallback == std::to_string(f.lo + 1) ? f.lo + 2 : f.lo + 1);
    case FlagType::kChoice: return std::string(f.choices.substr(f.choices.rfind('|') + 1));
    case FlagType::kSwitch: return "";
    default: return "tcp://127.0.0.1:7777";
  }
}

std::string toml_literal(const Flag& f, const std::string& value) {
  if (f.type == FlagType::kInt) return value;
  if (f.type == FlagType::kSwitch) return "true";
  return "\"" + value + "\"";
}

// The children `tandem up` would start for `config`.
std::vector<cli::ChildSpec> children_of(const cli::DeployConfig& config) {
  return cli::plan_children(config, {"ipc://c", "ipc://w", "run"}, "tandem");
}

// The rows are cli/flags.toml, built in: the file parses, every row checks out, and the
// binary's table is the file's.
TEST(FlagTable, TheBuiltInTableIsTheFileAndEveryRowIsWellFormed) {
  std::ifstream in(TANDEM_SOURCE_DIR "/cli/flags.toml");
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto rows = cli::parse_flag_table(text);
  ASSERT_TRUE(rows) << rows.status().to_string();
  ASSERT_EQ(rows->size(), cli::flag_table().size());
  for (size_t i = 0; i < rows->size(); ++i) {
    const Flag &a = (*rows)[i], &b = cli::flag_table()[i];
    EXPECT_EQ(std::tie(a.name, a.type, a.commands, a.help, a.value, a.lo, a.hi, a.choices, a.fallback, a.section,
                       a.toml_key, a.set_by_up, a.test_only),
              std::tie(b.name, b.type, b.commands, b.help, b.value, b.lo, b.hi, b.choices, b.fallback, b.section,
                       b.toml_key, b.set_by_up, b.test_only))
        << "row " << i << " --" << a.name;
  }
}

// A row the table's readers could misread is refused, naming its line and the key.
TEST(FlagTable, AMalformedRowIsRefusedNamingItsLineAndKey) {
  const std::string good = "[[flag]]\nname = \"a\"\ntype = \"switch\"\ncommands = [\"run\"]\nhelp = \"h\"\n";
  ASSERT_TRUE(cli::parse_flag_table(good));
  const std::pair<std::string, std::string> cases[] = {
      {"name = \"b\"\ntype = \"int\"\ncommands = [\"run\"]\nhelp = \"h\"", "range: missing"},
      {"name = \"b\"\ntype = \"int\"\ncommands = [\"run\"]\nhelp = \"h\"\nrange = [2, 1]", "range: must be"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\"]\nhelp = \"h\"\nrange = [0, 1]", "range: only"},
      {"name = \"b\"\ntype = \"choice\"\ncommands = [\"run\"]\nhelp = \"h\"", "choices: missing"},
      {"name = \"b\"\ntype = \"choice\"\ncommands = [\"run\"]\nhelp = \"h\"\nchoices = \"x||y\"", "choices: must"},
      {"name = \"b\"\ntype = \"switch\"\ncommands = [\"run\"]\nhelp = \"h\"\nvalue = \"V\"", "value: a switch"},
      {"name = \"b\"\ntype = \"integer\"\ncommands = [\"run\"]\nhelp = \"h\"", "type: 'integer' is not"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"runn\"]\nhelp = \"h\"", "commands: 'runn' is not"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\", \"run\"]\nhelp = \"h\"", "commands: names run twice"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\"]\nhelp = 3", "help: must be a string"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\"]\nhelp = \"h\"\nhlep = \"h\"", "hlep: not a key"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\"]\nhelp = \"h\"\nsection = \"top\"", "section and key"},
      {"name = \"b\"\ntype = \"text\"\ncommands = [\"run\"]\nhelp = \"h\"\nset_by_up = 1", "set_by_up: must be"},
      {"type = \"text\"\ncommands = [\"run\"]\nhelp = \"h\"", "name: missing"},
      {"name = \"b\"\ntype = \"text\"\nhelp = \"h\"", "commands: missing"},
      {"name = \"a\"\ntype = \"text\"\ncommands = [\"up\", \"run\"]\nhelp = \"h\"", "name: --a again"},
  };
  for (const auto& [row, error] : cases) {
    const Status st = cli::parse_flag_table(good + "\n[[flag]]\n" + row + "\n").status();
    EXPECT_NE(st.message().find(error), std::string::npos) << row << "\n gave: " << st.to_string();
    EXPECT_NE(st.message().find("(line 7)"), std::string::npos) << st.to_string();  // the second row's [[flag]]
  }
  EXPECT_FALSE(cli::parse_flag_table(good + "[[flag]\n"));
  EXPECT_FALSE(cli::parse_flag_table(good + "[other]\nx = 1\n"));
}

TEST(Flags, EachNameOncePerCommand) {
  for (uint32_t bit = 1; bit & kAllCommands; bit <<= 1) {
    std::set<std::string_view> seen;
    for (const Flag& f : cli::flag_table())
      if (f.commands & bit)
        EXPECT_TRUE(seen.insert(f.name).second) << "--" << f.name << " twice for command bit " << bit;
  }
}

TEST(Flags, EveryTomlKeyHasAFlagAndEveryForwardedFlagAKey) {
  // A [[workers]] table's count and cpus have no flag: --workers / --prefill / --decode say
  // how many workers of a role, and pinning belongs to one worker table.
  const std::set<std::string_view> toml_only = {"count", "cpus"};
  std::set<std::pair<Section, std::string_view>> keys;
  for (const Flag& f : cli::flag_table()) {
    EXPECT_EQ(f.section == Section::kNone, f.toml_key.empty()) << "--" << f.name << " / " << f.toml_key;
    if (f.section == Section::kNone) continue;
    EXPECT_TRUE(keys.insert({f.section, f.toml_key}).second) << f.toml_key << " twice";
    if (toml_only.count(f.toml_key)) {
      EXPECT_TRUE(f.name.empty()) << f.toml_key;
      continue;
    }
    ASSERT_FALSE(f.name.empty()) << f.toml_key << " has no flag";
    // The file's key is the flag's name with '_' for '-'.
    std::string key(f.name);
    for (char& c : key) c = c == '-' ? '_' : c;
    EXPECT_EQ(key, f.toml_key);
    // `tandem up` takes the flag too (role: --prefill / --decode instead).
    if (f.toml_key != "role") EXPECT_TRUE(f.commands & cli::kUp) << "--" << f.name << " is not a flag of tandem up";
  }
  // Every flag of the scheduler and of a worker is a deployment setting or set by `tandem up`
  // for each child: nothing a child takes is out of the file's reach.
  for (const Flag& f : cli::flag_table()) {
    if (!(f.commands & (cli::kScheduler | cli::kWorker)) || f.name == "help") continue;
    EXPECT_TRUE(f.section != Section::kNone || f.set_by_up) << "--" << f.name << " cannot be set through tandem up";
  }
  EXPECT_TRUE(cli::find_flag("test-step-delay-ms", cli::kWorker)->test_only);
}

TEST(Flags, SamplingFlagsOfRunAndGenerateAreOneDefinition) {
  for (const char* name :
       {"temperature", "top-k", "top-p", "min-p", "repetition-penalty", "seed", "tokens", "prompt"}) {
    const Flag* run = cli::find_flag(name, cli::kRun);
    ASSERT_NE(run, nullptr) << name;
    EXPECT_EQ(run, cli::find_flag(name, cli::kGenerate)) << name;
  }
  EXPECT_EQ(cli::find_flag("top-k", cli::kRun)->hi, INT32_MAX);
  ASSERT_FALSE(parse({"--top-k", "2147483648"}, cli::kRun).value().integer("top-k", 0));
  ASSERT_FALSE(parse({"--top-k", "2147483648"}, cli::kGenerate).value().integer("top-k", 0));
}

TEST(Flags, HelpListsEveryFlagOfACommand) {
  for (cli::Command c :
       {cli::kMakeModel, cli::kRun, cli::kGenerate, cli::kStatus, cli::kBench, cli::kUp, cli::kDrain, cli::kKeys,
        cli::kProbe, cli::kScheduler, cli::kWorker, cli::kTokenize, cli::kDetokenize, cli::kChatTemplate}) {
    const std::string help = cli::help_text(c, "usage");
    for (const Flag& f : cli::flag_table())
      if (f.commands & c) EXPECT_NE(help.find("--" + std::string(f.name)), std::string::npos) << "--" << f.name;
  }
}

TEST(Flags, DefaultsShownAreTheActorsDefaults) {
  // With each flag given its table default, the options equal the untouched ones.
  for (const Flag& f : cli::flag_table()) {
    if (f.type != FlagType::kInt || f.fallback.empty() || f.fallback.find(' ') != std::string::npos) continue;
    if (f.commands & cli::kScheduler) {
      scheduler::ActorOptions given, plain;
      ASSERT_TRUE(cli::scheduler_options_from(
          parse({"--" + std::string(f.name), std::string(f.fallback)}, cli::kScheduler).value(), given));
      EXPECT_EQ(given.core.max_batch_tokens, plain.core.max_batch_tokens) << f.name;
      EXPECT_EQ(given.core.prefill_chunk, plain.core.prefill_chunk) << f.name;
      EXPECT_EQ(given.core.max_queue, plain.core.max_queue) << f.name;
      EXPECT_EQ(given.core.max_running, plain.core.max_running) << f.name;
      EXPECT_EQ(given.core.pipeline_depth, plain.core.pipeline_depth) << f.name;
      EXPECT_EQ(given.core.handoff_timeout_ms, plain.core.handoff_timeout_ms) << f.name;
      EXPECT_EQ(given.heartbeat_ms, plain.heartbeat_ms) << f.name;
      EXPECT_EQ(given.worker_liveness, plain.worker_liveness) << f.name;
      EXPECT_EQ(given.client_timeout_ms, plain.client_timeout_ms) << f.name;
      EXPECT_EQ(given.client_send_queue, plain.client_send_queue) << f.name;
      EXPECT_EQ(given.drain_timeout_ms, plain.drain_timeout_ms) << f.name;
    }
    if ((f.commands & cli::kWorker) && f.name != "threads") {  // threads: 2 alone, 1 under tandem up
      worker::WorkerOptions given, plain;
      ASSERT_TRUE(cli::worker_options_from(
          parse({"--" + std::string(f.name), std::string(f.fallback)}, cli::kWorker).value(), given));
      EXPECT_EQ(given.kv_blocks, plain.kv_blocks) << f.name;
      EXPECT_EQ(given.kv_memory, plain.kv_memory) << f.name;
      EXPECT_EQ(given.block_tokens, plain.block_tokens) << f.name;
      EXPECT_EQ(given.kv_format.bits, plain.kv_format.bits) << f.name;
      EXPECT_EQ(given.kv_format.group_size, plain.kv_format.group_size) << f.name;
      EXPECT_EQ(given.kv_format.f32_window, plain.kv_format.f32_window) << f.name;
      EXPECT_EQ(given.test_step_delay_ms, plain.test_step_delay_ms) << f.name;
    }
  }
  scheduler::ActorOptions s;
  EXPECT_EQ(cli::find_flag("prefix-cache", cli::kScheduler)->fallback, s.core.prefix_cache ? "on" : "off");
  EXPECT_EQ(cli::find_flag("threads", cli::kWorker)->fallback.substr(0, 1),
            std::to_string(worker::WorkerOptions{}.threads));
  EXPECT_EQ(cli::find_flag("threads", cli::kUp)->fallback.back(), '0' + cli::WorkerGroup{}.threads);
}

// For each setting of the scheduler, the workers and the supervisor: `tandem up --flag v`
// and `tandem up --config` with `key = v` plan the same children with the same argv, and the
// value is in it.
TEST(Flags, FlagAndFileReachTheChildrenAlike) {
  const std::string dir = test::temp_dir();
  int checked = 0;
  for (const Flag& f : cli::flag_table()) {
    if (!(f.commands & cli::kUp) || f.section == Section::kNone || f.section == Section::kTop) continue;
    const std::string value = sample_value(f);
    SCOPED_TRACE("--" + std::string(f.name) + " " + value);

    std::vector<std::string> argv = {"--" + std::string(f.name)};
    if (f.type != FlagType::kSwitch) argv.push_back(value);
    // The gateway runs (and takes its settings) only with an address.
    const bool gateway = f.section == Section::kGateway, needs_http = gateway && f.name != "http";
    if (needs_http) argv.insert(argv.end(), {"--http", "127.0.0.1:8000"});
    auto args = parse(argv, cli::kUp);
    ASSERT_TRUE(args) << args.status().to_string();
    cli::DeployConfig from_flags;
    from_flags.model = "/models/m.gguf";
    ASSERT_TRUE(cli::apply_flags(*args, from_flags));

    const std::string path = dir + "/" + std::string(f.toml_key) + ".toml";
    {
      std::ofstream file(path);
      file << "model = \"/models/m.gguf\"\n";
      file << (f.section == Section::kWorkers ? "[[workers]]\n"
                                              : "[" + std::string(cli::section_name(f.section)) + "]\n");
      file << f.toml_key << " = " << toml_literal(f, value) << "\n";
      if (needs_http) file << "http = \"127.0.0.1:8000\"\n";
    }
    auto from_file = cli::load_config(path);
    ASSERT_TRUE(from_file) << from_file.status().to_string();

    const auto a = children_of(from_flags), b = children_of(*from_file);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].argv, b[i].argv) << a[i].name;
    EXPECT_EQ(from_flags.supervision.ready_timeout_ms, from_file->supervision.ready_timeout_ms);
    EXPECT_EQ(from_flags.supervision.max_restarts, from_file->supervision.max_restarts);
    EXPECT_EQ(from_flags.supervision.restart_backoff_ms, from_file->supervision.restart_backoff_ms);
    EXPECT_EQ(from_flags.supervision.restart_backoff_max_ms, from_file->supervision.restart_backoff_max_ms);
    EXPECT_EQ(from_flags.supervision.healthy_after_ms, from_file->supervision.healthy_after_ms);
    EXPECT_EQ(from_flags.supervision.stop_timeout_ms, from_file->supervision.stop_timeout_ms);
    EXPECT_EQ(from_flags.supervision.drain_timeout_ms, from_file->supervision.drain_timeout_ms);

    if (f.section == Section::kSupervisor && f.name != "drain-timeout-ms") {
      ++checked;
      continue;  // the supervisor's own setting: no child takes it
    }
    // The child that takes it has it in its argv, exactly once, as its parser reads it.
    const cli::ChildSpec& child = f.section == Section::kWorkers || gateway ? a.back() : a.front();
    std::vector<std::string> rest(child.argv.begin() + 2, child.argv.end());
    auto child_args = parse(rest, f.section == Section::kWorkers ? cli::kWorker
                                  : gateway                      ? cli::kGateway
                                                                 : cli::kScheduler);
    ASSERT_TRUE(child_args) << child_args.status().to_string();
    const std::string name = f.name == "http" ? "listen" : std::string(f.name);  // the gateway's --listen
    ASSERT_TRUE(child_args->has(name));
    if (f.type != FlagType::kSwitch) EXPECT_EQ(*child_args->str(name), value);
    EXPECT_EQ(child_args->all(name).size(), f.type == FlagType::kSwitch ? 0u : 1u);
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(Flags, RangesAreTheSameFromAFlagAndFromTheFile) {
  const std::string dir = test::temp_dir();
  // kv_blocks = 0 means "size from kv_memory" both ways.
  ASSERT_TRUE(parse({"--kv-blocks", "0"}, cli::kUp));
  {
    std::ofstream(dir + "/zero.toml") << "model = \"/m.gguf\"\n[[workers]]\nkv_blocks = 0\n";
    EXPECT_TRUE(cli::load_config(dir + "/zero.toml"));
  }
  for (const Flag& f : cli::flag_table()) {
    if (f.type != FlagType::kInt || f.section != Section::kScheduler) continue;
    const std::string over = std::to_string(f.hi + 1);
    cli::DeployConfig c;
    auto args = parse({"--" + std::string(f.name), over}, cli::kUp);
    ASSERT_TRUE(args);
    const Status flag = cli::apply_flags(*args, c);
    EXPECT_FALSE(flag) << f.name;
    EXPECT_NE(flag.message().find("--" + std::string(f.name)), std::string::npos) << flag.message();
    std::ofstream(dir + "/over.toml") << "[scheduler]\n" << f.toml_key << " = " << over << "\n";
    auto file = cli::load_config(dir + "/over.toml");
    ASSERT_FALSE(file) << f.toml_key;
    EXPECT_NE(file.status().message().find("scheduler." + std::string(f.toml_key) + ": must be in"), std::string::npos)
        << file.status().message();
  }
}

}  // namespace
// #18 item 1: a scheduler on tcp:// takes an ipc:// kv_endpoint only when allowed; tandem up
// allows the decode workers' KV sockets it makes itself (and keeps the configured list).
TEST(PlanChildren, ATcpWorkerEndpointAllowsTheKvSocketsTandemUpMakes) {
  cli::DeployConfig c;
  c.model = "m.gguf";
  c.workers = {cli::WorkerGroup{"prefill"}, cli::WorkerGroup{"decode"}};
  c.scheduler["kv-endpoint-allow"] = "10.0.0.7";
  const auto allow_of = [](const cli::ChildSpec& s) {
    auto it = std::find(s.argv.begin(), s.argv.end(), "--kv-endpoint-allow");
    return it == s.argv.end() ? std::string("-") : *(it + 1);
  };
  EXPECT_EQ(allow_of(cli::plan_children(c, {"ipc://c", "ipc://w", "run"}, "tandem")[0]), "10.0.0.7")
      << "over ipc:// the decode worker's own socket needs no allowing";
  const auto children = cli::plan_children(c, {"ipc://c", "tcp://127.0.0.1:5556", "run"}, "tandem");
  EXPECT_EQ(allow_of(children[0]), "10.0.0.7,ipc://run/kv-worker-1.sock");
  EXPECT_EQ(std::count(children[0].argv.begin(), children[0].argv.end(), "--kv-endpoint-allow"), 1);
}

}  // namespace tandem
