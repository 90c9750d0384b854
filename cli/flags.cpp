#include "cli/flags.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <toml++/toml.h>
#include <tuple>
#include <utility>

namespace tandem::cli {

// cli/flags.toml as built in (cmake/EmbedText.cmake writes the definition).
extern const std::string_view kFlagsToml;

namespace {

// A word of the table's text and what it stands for.
template <class E>
struct Word {
  std::string_view text;
  E value;
};

constexpr Word<Command> kCommandWords[] = {
    {"make-model", kMakeModel},
    {"run", kRun},
    {"generate", kGenerate},
    {"status", kStatus},
    {"bench", kBench},
    {"up", kUp},
    {"drain", kDrain},
    {"keys", kKeys},
    {"probe", kProbe},
    {"scheduler", kScheduler},
    {"worker", kWorker},
    {"engine-bench", kEngineBench},
    {"serve-bench", kServeBench},
    {"disagg-bench", kDisaggBench},
    {"tokenize", kTokenize},
    {"detokenize", kDetokenize},
    {"chat-template", kChatTemplate},
    {"gateway", kGateway},
};
constexpr Word<FlagType> kTypeWords[] = {
    {"int", FlagType::kInt},       {"real", FlagType::kReal},     {"text", FlagType::kText},
    {"choice", FlagType::kChoice}, {"switch", FlagType::kSwitch}, {"int_list", FlagType::kIntList},
    {"repeat", FlagType::kRepeat},
};
constexpr Word<Section> kSectionWords[] = {
    {"top", Section::kTop},         {"scheduler", Section::kScheduler}, {"supervisor", Section::kSupervisor},
    {"workers", Section::kWorkers}, {"gateway", Section::kGateway},
};

// The value of the word `text` in `words`; nullptr when it is none of them.
template <class E, size_t N>
const E* find_word(const Word<E> (&words)[N], std::string_view text) {
  for (const Word<E>& w : words)
    if (w.text == text) return &w.value;
  return nullptr;
}

// "a, b or c" for the words' texts (error messages).
template <class E, size_t N>
std::string word_list(const Word<E> (&words)[N]) {
  std::string bars;
  for (const Word<E>& w : words) bars += (bars.empty() ? "" : "|") + std::string(w.text);
  return choices_text(bars);
}

// Reads the keys of one [[flag]] table. A read of a key that is there with the wrong type
// records an error and gives the empty value; only the first error is kept, so a row is read
// whole and judged once (status()), which also reports a key that no read asked for.
class RowReader {
 public:
  explicit RowReader(const toml::table& row) : row_(row) {}

  bool has(std::string_view key) const { return row_.contains(key); }

  std::string text(std::string_view key) {
    const toml::node* n = find(key);
    if (n && !n->is_string()) fail(key, "must be a string");
    return n && n->is_string() ? n->as_string()->get() : std::string();
  }

  bool boolean(std::string_view key) {
    const toml::node* n = find(key);
    if (n && !n->is_boolean()) fail(key, "must be true or false");
    return n && n->is_boolean() && n->as_boolean()->get();
  }

  // One of `words`; `absent` when the key is not there.
  template <class E, size_t N>
  E word(std::string_view key, const Word<E> (&words)[N], E absent) {
    const std::string s = text(key);
    if (!has(key)) return absent;
    const E* value = find_word(words, s);
    if (!value) fail(key, "'" + s + "' is not " + word_list(words));
    return value ? *value : absent;
  }

  // The Command bits of an array of command names, each named once.
  uint32_t commands(std::string_view key) {
    const toml::node* n = find(key);
    const toml::array* names = n ? n->as_array() : nullptr;
    if (n && !names) fail(key, "must be an array of command names");
    if (!names) return 0;
    uint32_t bits = 0;
    for (const toml::node& item : *names) {
      const std::string name = item.value_or(std::string());
      const Command* bit = find_word(kCommandWords, name);
      if (!bit)
        fail(key, "'" + name + "' is not " + word_list(kCommandWords));
      else if (bits & *bit)
        fail(key, "names " + name + " twice");
      else
        bits |= *bit;
    }
    return bits;
  }

  // [lo, hi]: two integers, lo <= hi.
  std::pair<int64_t, int64_t> range(std::string_view key) {
    const toml::node* n = find(key);
    if (!n) return {0, 0};
    const toml::array* a = n->as_array();
    if (a && a->size() == 2 && a->get(0)->is_integer() && a->get(1)->is_integer()) {
      const int64_t lo = a->get(0)->as_integer()->get(), hi = a->get(1)->as_integer()->get();
      if (lo <= hi) return {lo, hi};
    }
    fail(key, "must be [lo, hi], two integers with lo <= hi");
    return {0, 0};
  }

  Status status() const {
    if (!error_.empty()) return Status::invalid(error_);
    for (auto&& [key, value] : row_)
      if (!read_.count(key.str())) return Status::invalid(std::string(key.str()) + ": not a key of a flag row");
    return Status::ok();
  }

 private:
  void fail(std::string_view key, const std::string& what) {
    if (error_.empty()) error_ = std::string(key) + ": " + what;
  }

  const toml::node* find(std::string_view key) {
    read_.insert(key);
    return row_.get(key);
  }

  const toml::table& row_;
  std::set<std::string_view> read_;
  std::string error_;
};

std::string line_of(const toml::source_region& where) { return " (line " + std::to_string(where.begin.line) + ")"; }

// What a row must say beyond its keys' types: the fields its type needs and no others, a
// flag name with commands or else a deployment-file key, a section and a key together.
Status check_row(const Flag& f, const RowReader& r) {
  const bool ranged = f.type == FlagType::kInt || f.type == FlagType::kIntList;
  const bool choice = f.type == FlagType::kChoice;
  if (!r.has("type")) return Status::invalid("type: missing");
  if (f.help.empty()) return Status::invalid("help: missing");
  if (ranged != r.has("range")) return Status::invalid(ranged ? "range: missing" : "range: only int and int_list");
  if (choice != r.has("choices")) return Status::invalid(choice ? "choices: missing" : "choices: only choice");
  if (choice && ("|" + f.choices + "|").find("||") != std::string::npos)
    return Status::invalid("choices: must be \"a|b|...\"");
  if (f.type == FlagType::kSwitch && r.has("value")) return Status::invalid("value: a switch takes none");
  if ((f.section == Section::kNone) != f.toml_key.empty()) return Status::invalid("section and key go together");
  if (f.name.empty() && (f.commands != 0 || f.section == Section::kNone))
    return Status::invalid("name: missing (a file key without a flag has a section and no commands)");
  if (!f.name.empty() && f.commands == 0) return Status::invalid("commands: missing");
  return Status::ok();
}

Result<Flag> read_row(const toml::table& row) {
  RowReader r(row);
  Flag f;
  f.name = r.text("name");
  f.type = r.word("type", kTypeWords, FlagType::kText);
  f.commands = r.commands("commands");
  f.help = r.text("help");
  f.value = r.text("value");
  std::tie(f.lo, f.hi) = r.range("range");
  f.choices = r.text("choices");
  f.fallback = r.text("default");
  f.section = r.word("section", kSectionWords, Section::kNone);
  f.toml_key = r.text("key");
  f.set_by_up = r.boolean("set_by_up");
  f.test_only = r.boolean("test_only");
  TANDEM_RETURN_IF_ERROR(r.status());
  TANDEM_RETURN_IF_ERROR(check_row(f, r));
  return f;
}

// A name once per command and a file key once per section, against the rows before `f`.
Status check_unique(const Flag& f, std::span<const Flag> before) {
  for (const Flag& b : before) {
    if (!f.name.empty() && b.name == f.name && (b.commands & f.commands))
      return Status::invalid("name: --" + f.name + " again for a command of an earlier row");
    if (f.section != Section::kNone && b.section == f.section && b.toml_key == f.toml_key)
      return Status::invalid("key: " + f.toml_key + " again in its section");
  }
  return Status::ok();
}

std::string placeholder(const Flag& f) {
  if (!f.value.empty()) return f.value;
  switch (f.type) {
    case FlagType::kChoice: return f.choices;
    case FlagType::kInt: return "N";
    case FlagType::kReal: return "X";
    case FlagType::kIntList: return "N,N,...";
    case FlagType::kSwitch: return "";
    default: return "S";
  }
}

}  // namespace

Result<std::vector<Flag>> parse_flag_table(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    return Status::invalid("not valid TOML: " + std::string(e.description()) + line_of(e.source()));
  }
  const toml::array* rows = root["flag"].as_array();
  if (root.size() != 1 || !rows || !rows->is_array_of_tables())
    return Status::invalid("a flag table is [[flag]] rows and nothing else");
  std::vector<Flag> flags;
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    Result<Flag> f = read_row(row);
    const Status st = f ? check_unique(*f, flags) : f.status();
    if (!st) return Status::invalid(st.message() + line_of(row.source()));
    flags.push_back(std::move(f.value()));
  }
  return flags;
}

std::span<const Flag> flag_table() {
  static const std::vector<Flag> rows = [] {
    Result<std::vector<Flag>> parsed = parse_flag_table(kFlagsToml);
    if (!parsed) {  // a defect of this build, not of anything a user gave
      std::fprintf(stderr, "tandem: the built-in flag table (cli/flags.toml): %s\n", parsed.status().message().c_str());
      std::abort();
    }
    return std::move(parsed.value());
  }();
  return rows;
}

const Flag* find_flag(std::string_view name, Command command) {
  if (name.empty()) return nullptr;
  for (const Flag& f : flag_table())
    if (f.name == name && (f.commands & command)) return &f;
  return nullptr;
}

const Flag* find_toml_key(Section section, std::string_view key) {
  for (const Flag& f : flag_table())
    if (f.section == section && f.toml_key == key) return &f;
  return nullptr;
}

std::string choices_text(std::string_view choices) {
  std::string out;
  size_t count = 0;
  for (char c : choices) count += c == '|';
  size_t seen = 0;
  for (char c : choices) {
    if (c != '|') {
      out += c;
    } else {
      out += ++seen == count ? " or " : ", ";
    }
  }
  return out;
}

std::string_view section_name(Section section) {
  switch (section) {
    case Section::kScheduler: return "scheduler";
    case Section::kSupervisor: return "supervisor";
    case Section::kWorkers: return "workers";
    case Section::kGateway: return "gateway";
    default: return "";
  }
}

std::string help_text(Command command, std::string_view usage, std::string_view notes) {
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  for (bool test_only : {false, true}) {
    for (const Flag& f : flag_table()) {
      if (!(f.commands & command) || f.test_only != test_only) continue;
      std::string line = "  --" + f.name;
      if (f.type != FlagType::kSwitch) line += " " + placeholder(f);
      if (line.size() < 28)
        line.resize(28, ' ');
      else
        line += "\n" + std::string(28, ' ');
      std::string help = f.help;
      if (!f.fallback.empty())
        help += (help.empty() ? "default " : " (default ") + f.fallback + (help.empty() ? "" : ")");
      for (size_t at; (at = help.find('\n')) != std::string::npos;) {
        line += help.substr(0, at) + "\n" + std::string(28, ' ');
        help.erase(0, at + 1);
      }
      out += line + help + "\n";
    }
  }
  out += notes;
  if (!notes.empty() && out.back() != '\n') out += '\n';
  return out;
}

}  // namespace tandem::cli
