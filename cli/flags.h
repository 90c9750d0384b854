// The flag table: every setting of every `tandem` command (and of the benches) defined once,
// with its flag, its TOML key and section (`tandem up --config`), its type and range, its
// default as --help shows it, its help line, and the commands that accept it. The rows are
// data, cli/flags.toml, built into the binary and read once; the argument parser (cli/args.h),
// the TOML loader (cli/config.h), every command's --help and the argv `tandem up` gives its
// children (cli/supervisor.h) all read them here; nothing else lists flags.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace tandem::cli {

// The commands a flag belongs to, as bits of Flag::commands.
enum Command : uint32_t {
  kMakeModel = 1u << 0,
  kRun = 1u << 1,
  kGenerate = 1u << 2,
  kStatus = 1u << 3,
  kBench = 1u << 4,
  kUp = 1u << 5,
  kDrain = 1u << 6,
  kKeys = 1u << 7,
  kProbe = 1u << 8,
  kScheduler = 1u << 9,
  kWorker = 1u << 10,
  kEngineBench = 1u << 11,  // bench/engine_bench.cpp
  kServeBench = 1u << 12,   // bench/serve_bench.cpp
  kDisaggBench = 1u << 13,  // bench/disagg_bench.cpp
  kTokenize = 1u << 14,
  kDetokenize = 1u << 15,
  kChatTemplate = 1u << 16,
  kGateway = 1u << 17,
};

enum class FlagType {
  kInt,      // an integer in [lo, hi]
  kReal,     // a number; its range is checked where it is used (engine::validate, ...)
  kText,     // any string: a path, an endpoint, a list another parser reads
  kChoice,   // one of `choices` ("a|b|c")
  kSwitch,   // no value: present or not
  kIntList,  // comma-separated integers, each in [lo, hi]
  kRepeat,   // a string that may be given several times (--stop)
};

// Where a setting lives in a deployment file. kNone: command line only.
enum class Section { kNone, kTop, kScheduler, kSupervisor, kWorkers, kGateway };

struct Flag {
  std::string name;  // without "--"; empty for a TOML-only key
  FlagType type = FlagType::kText;
  uint32_t commands = 0;   // Command bits
  std::string help;        // one line (continued lines start with "\n")
  std::string value;       // the placeholder --help shows: N, MS, FILE ...
  int64_t lo = 0, hi = 0;  // kInt, kIntList: the accepted range, both ends included
  std::string choices;     // kChoice: "packed|openblas"
  std::string fallback;    // the default, as --help shows it; empty: none
  Section section = Section::kNone;
  std::string toml_key;  // with section != kNone
  // A scheduler or worker flag that `tandem up` sets for each child itself (endpoints, the
  // child's name and log file) rather than forwarding a setting.
  bool set_by_up = false;
  bool test_only = false;  // a test seam, not a setting of a service (listed last in --help)
};

// Every row, in --help's order: cli/flags.toml as built in, read on the first call. A name
// appears once per command (two rows may share a name for different commands when they mean
// different things, e.g. --seed of bench and of run). A built-in table that does not parse is
// a build defect: the process stops with the reason (tests/cli/flags_test.cpp checks it).
std::span<const Flag> flag_table();

// The rows of a flag table in the format of cli/flags.toml, checked: known keys of the right
// types, the fields each type needs and no others, a name at most once per command and a key
// at most once per section. Errors name the row's line and the key.
Result<std::vector<Flag>> parse_flag_table(std::string_view text);

// The row of `--name` for `command`; nullptr when the command does not take it.
const Flag* find_flag(std::string_view name, Command command);
// The row of TOML key `key` in `section`; nullptr when there is none.
const Flag* find_toml_key(Section section, std::string_view key);

// "a, b or c" for the choices "a|b|c" (error messages).
std::string choices_text(std::string_view choices);
// The TOML section as written in error messages and files: "", "scheduler", ...
std::string_view section_name(Section section);

// `usage` (one or more lines), then one line per flag of `command` in table order, then
// `notes`: what `tandem <command> --help` prints.
std::string help_text(Command command, std::string_view usage, std::string_view notes = "");

}  // namespace tandem::cli
