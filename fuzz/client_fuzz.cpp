// libFuzzer target: arbitrary bytes as the client library's inbound traffic, through the
// Client's own I/O side (ClientHarness: the steps its I/O thread takes), interleaved with the
// calls that give events requests to land on: scheduler messages of any frame count (token
// and final events for live, unknown, finished and cancelled ids, duplicate finals, status
// replies, errors, garbage), submits, cancels, status queries, a lost connection and time
// passing (deadlines, liveness probes). A fresh client per input. Must never crash, hang or
// trip ASan/UBSan, and aborts unless every request gets at most one final event and nothing
// after it (exactly one once the client is gone, as client.h promises) and every status
// query exactly one answer.
//
// Records (fuzz/fuzz_input.h), by kind modulo 6:
//   0 a message from the scheduler: the record's frames
//   1 generate: frame 0 the request id (empty: the library makes one; no frame: "r<peer>");
//     frame 1 [flags][timeout ms: 2 bytes LE], flags bit 0: a Stream (else a callback),
//     bit 1: a negative timeout (refused)
//   2 cancel: frame 0 the id (no frame: the id of submission number <peer>)
//   3 status query: frame 0 [timeout ms: 2 bytes LE] (no frame: 1000 ms)
//   4 time passes: frame 0 [ms: 2 bytes LE] (no frame: 1000 ms)
//   5 the connection to the scheduler is lost
#include <cstdio>
#include <cstdlib>
#include <deque>

#include "client/harness.h"
#include "fuzz/fuzz_input.h"
#include "tandem/v1/client.pb.h"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void violated(const std::string& what, const std::string& id) {
  std::fprintf(stderr, "client_fuzz: %s (request '%s')\n", what.c_str(), id.c_str());
  std::abort();
}

// One generate() call and the events it got.
struct Submission {
  std::string id;
  std::shared_ptr<Stream> stream;  // null: events arrive through the callback
  bool final = false;

  void on_event(const Event& e) {
    if (final) violated(e.final ? "a second final event" : "an event after the final event", id);
    final = e.final;
  }
  void take_stream_events() {
    if (!stream) return;
    while (auto e = stream->next_for(0ms)) on_event(*e);
  }
};

uint16_t u16(const fuzz::Record& r, size_t frame, size_t at, uint16_t otherwise) {
  if (r.frames.size() <= frame || r.frames[frame].size() < at + 2) return otherwise;
  const std::string& f = r.frames[frame];
  return static_cast<uint8_t>(f[at]) | static_cast<uint16_t>(static_cast<uint8_t>(f[at + 1]) << 8);
}

// Runs one input's records against a fresh client and checks what came back.
void run(const std::vector<fuzz::Record>& records) {
  ClientOptions options;
  options.endpoint = "inproc://fuzz-scheduler";
  auto client = ClientHarness::create(options);
  if (!client) std::abort();
  std::deque<Submission> submissions;  // stable addresses for the callbacks
  std::vector<std::future<Result<StatusInfo>>> replies;
  for (const fuzz::Record& r : records) {
    switch (r.kind % 6) {
      case 0: (*client)->scheduler(fuzz::frames_of(r, "")); break;
      case 1: {
        GenerateRequest req;
        req.id = r.frames.empty() ? "r" + std::to_string(r.peer) : r.frames[0];
        req.prompt_text = "hi";
        const uint8_t flags = r.frames.size() > 1 && !r.frames[1].empty() ? r.frames[1][0] : 0;
        req.timeout = flags & 2 ? -1ms : std::chrono::milliseconds(u16(r, 1, 1, 0));
        Submission& s = submissions.emplace_back();
        s.id = req.id;  // a refused request's final event comes before generate() returns
        if (flags & 1) {
          s.stream = (*client)->generate(req);
          s.id = s.stream->id();
        } else {
          s.id = (*client)->generate(req, [&s](const Event& e) { s.on_event(e); });
        }
        break;
      }
      case 2:
        if (!r.frames.empty()) {
          (*client)->cancel(r.frames[0]);
        } else if (!submissions.empty()) {
          (*client)->cancel(submissions[r.peer % submissions.size()].id);
        }
        break;
      case 3: replies.push_back((*client)->status(std::chrono::milliseconds(u16(r, 0, 0, 1000)))); break;
      case 4: (*client)->advance(std::chrono::milliseconds(u16(r, 0, 0, 1000))); break;
      default: (*client)->disconnected(); break;
    }
    for (Submission& s : submissions) s.take_stream_events();
  }
  client->reset();  // ends what is still in flight
  for (Submission& s : submissions) {
    s.take_stream_events();
    if (!s.final) violated("no final event once the client is gone", s.id);
  }
  for (auto& f : replies)
    if (f.wait_for(0s) != std::future_status::ready) violated("a status query without an answer", "");
}

v1::SchedulerReply events(const std::string& id, int tokens, std::optional<v1::FinishReason> finish = {}) {
  v1::SchedulerReply m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::RequestEvents* ev = m.mutable_events()->add_requests();
  ev->set_request_id(id);
  for (int i = 0; i < tokens; ++i) {
    v1::TokenEvent* t = ev->add_tokens();
    t->set_id(5 + i);
    t->set_text("ab");
    t->set_logprob(-0.25f);
    v1::TopLogprob* top = t->add_top();
    top->set_id(5 + i);
    top->set_logprob(-0.25f);
  }
  if (finish) {
    v1::FinalEvent* f = ev->mutable_final();
    f->set_finish_reason(*finish);
    f->mutable_usage()->set_prompt_tokens(3);
    f->mutable_usage()->set_completion_tokens(tokens);
    f->mutable_timings()->set_total_ms(2.5);
    f->set_text("c");
  }
  return m;
}

void write_seeds(const std::string& dir) {
  const std::string stream = std::string("\x01\x00\x00", 3), deadline_100ms = std::string("\x00\x64\x00", 3);
  const std::string ms_2000 = "\xd0\x07", ms_6000 = "\x70\x17";
  const auto r0_tokens = events("r0", 2), r1_token = events("r1", 1), r0_stop = events("r0", 0, v1::FINISH_REASON_STOP),
             r1_length = events("r1", 1, v1::FINISH_REASON_LENGTH),
             r0_cancelled = events("r0", 0, v1::FINISH_REASON_CANCELLED),
             r2_stop = events("r2", 1, v1::FINISH_REASON_STOP), r3_length = events("r3", 1, v1::FINISH_REASON_LENGTH);
  v1::SchedulerReply status;
  status.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::StatusReply* st = status.mutable_status();
  st->set_ready(true);
  st->set_running(2);
  v1::WorkerStatus* worker = st->add_workers();
  worker->set_worker_id(1);
  worker->set_role("both");
  worker->set_alive(true);
  worker->set_kv_blocks_total(64);
  v1::SchedulerReply error;
  error.set_version(v1::PROTOCOL_VERSION_CURRENT);
  error.mutable_error()->set_code(v1::ERROR_CODE_INVALID_ARGUMENT);
  error.mutable_error()->set_message("unsupported message");
  v1::SchedulerReply future_version = r0_tokens;
  future_version.set_version(99);
  // Two requests in one message, the second a duplicate final of the first.
  v1::SchedulerReply twice = r1_length;
  *twice.mutable_events()->add_requests() = r1_length.events().requests(0);

  fuzz::SeedWriter w;
  w.add_raw(1, 0, {})
      .add_raw(1, 1, {"r1", stream})
      .add(0, 0, {&r0_tokens})
      .add(0, 0, {&r1_token})
      .add(0, 0, {&r0_stop})
      .add(0, 0, {&r0_tokens})
      .add(0, 0, {&r0_stop})
      .add(0, 0, {&twice})
      .write(dir, "tokens-then-finals");
  w.add_raw(1, 0, {})
      .add(0, 0, {&r0_tokens})
      .add_raw(2, 0, {})
      .add(0, 0, {&r0_cancelled})
      .add(0, 0, {&r0_tokens})
      .add_raw(1, 0, {})
      .add(0, 0, {&r0_stop})
      .write(dir, "cancel-then-reuse");
  w.add_raw(1, 2, {"r2", deadline_100ms})
      .add_raw(4, 0, {ms_2000})
      .add(0, 0, {&r2_stop})
      .add_raw(1, 3, {"r3", stream})
      .add_raw(4, 0, {ms_6000})
      .add(0, 0, {&status})
      .add_raw(4, 0, {ms_6000})
      .add_raw(4, 0, {ms_6000})
      .add(0, 0, {&r3_length})
      .write(dir, "deadline-and-liveness");
  w.add_raw(3, 0, {})
      .add(0, 0, {&status})
      .add_raw(1, 0, {})
      .add_raw(1, 1, {"r1", stream})
      .add_raw(3, 0, {})
      .add(0, 0, {&error})
      .add(0, 0, {&r0_tokens})
      .add(0, 0, {&status})
      .write(dir, "status-and-error");
  w.add_raw(1, 0, {})
      .add(0, 0, {&r0_tokens, &r0_stop})
      .add(0, 0, {})
      .add(0, 0, {&future_version})
      .add_raw(1, 0, {})
      .add_raw(1, 0, {})
      .add_raw(5, 0, {})
      .add_raw(1, 0, {})
      .add(0, 0, {&r0_stop})
      .write(dir, "malformed-and-lost");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return fuzz::initialize(write_seeds); }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(fuzz::parse(data, size));
  return 0;
}
