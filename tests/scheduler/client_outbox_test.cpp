#include "scheduler/client_outbox.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/wire.h"
#include "scheduler/actor_wire.h"

namespace tandem::scheduler {
namespace {

// A client socket scripted by the test: each send is recorded, and succeeds unless the
// client's queue is marked full. stopped_reading() records the client and, as the actor's
// Core does, adds the final events of its cancelled requests.
class FakeClients {
 public:
  ClientOutbox outbox{/*queue_bound=*/3, callbacks()};
  std::set<std::string> full, known{"a", "b"};
  struct Sent {
    std::string client;
    v1::SchedulerReply reply;
  };
  std::vector<Sent> sent;
  std::vector<std::string> stopped;
  std::vector<std::string> cancel_on_stop;  // request ids whose final events a stop adds

 private:
  ClientOutbox::Callbacks callbacks() {
    ClientOutbox::Callbacks c;
    c.send = [this](const std::string& client, const v1::SchedulerReply& reply) {
      if (full.count(client)) return runtime::SendResult(runtime::SendError::kQueueFull, "send queue full");
      sent.push_back({client, reply});
      return runtime::SendResult();
    };
    c.stopped_reading = [this](const std::string& client) {
      stopped.push_back(client);
      for (const std::string& id : cancel_on_stop) outbox.add(client, final_event(id));
    };
    c.known = [this](const std::string& client) { return known.count(client) > 0; };
    return c;
  }

 public:
  static v1::RequestEvents token_event(const std::string& id) {
    v1::RequestEvents ev;
    ev.set_request_id(id);
    ev.add_tokens()->set_id(7);
    return ev;
  }
  static v1::RequestEvents final_event(const std::string& id) {
    v1::RequestEvents ev;
    set_final(ev, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, "cancelled");
    ev.set_request_id(id);
    return ev;
  }
};

std::vector<std::string> ids(const v1::SchedulerReply& reply) {
  std::vector<std::string> out;
  for (const v1::RequestEvents& ev : reply.events().requests()) out.push_back(ev.request_id());
  return out;
}

TEST(ClientOutbox, CoalescesOneMessagePerClientPerFlush) {
  FakeClients f;
  f.outbox.add("a", FakeClients::token_event("r1"));
  f.outbox.add("b", FakeClients::token_event("r2"));
  f.outbox.add("a", FakeClients::token_event("r3"));
  EXPECT_TRUE(f.sent.empty());  // add() only queues
  f.outbox.flush(0);
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_EQ(f.sent[0].client, "a");
  EXPECT_EQ(ids(f.sent[0].reply), (std::vector<std::string>{"r1", "r3"}));
  EXPECT_EQ(f.sent[0].reply.version(), runtime::kProtocolVersion);
  EXPECT_EQ(f.sent[1].client, "b");
  f.outbox.flush(1);
  EXPECT_EQ(f.sent.size(), 2u);  // nothing new: nothing sent
  EXPECT_TRUE(f.stopped.empty());
}

TEST(ClientOutbox, AFullQueueStallsTheClientKeepsItsFinalsAndCancelsItsRequests) {
  FakeClients f;
  f.full.insert("a");
  f.cancel_on_stop = {"r2"};
  v1::RequestEvents done = FakeClients::final_event("r1");
  done.add_tokens()->set_id(9);  // the tokens of a final event's message are dropped too
  f.outbox.add("a", FakeClients::token_event("r0"));
  f.outbox.add("a", done);
  f.outbox.add("b", FakeClients::token_event("r5"));
  f.outbox.flush(0);
  EXPECT_EQ(f.stopped, (std::vector<std::string>{"a"}));
  EXPECT_TRUE(f.outbox.stalled("a"));
  EXPECT_FALSE(f.outbox.stalled("b"));
  EXPECT_EQ(f.outbox.kept_events("a"), 2);  // r1's final and the cancelled r2's
  ASSERT_EQ(f.sent.size(), 1u);             // b reads: it is not held up by a
  EXPECT_EQ(f.sent[0].client, "b");

  // While stalled, only final events are kept, and stopped_reading is not called again.
  f.outbox.add("a", FakeClients::token_event("r3"));
  f.outbox.add("a", FakeClients::final_event("r3"));
  f.outbox.flush(1);
  EXPECT_EQ(f.stopped.size(), 1u);
  EXPECT_EQ(f.outbox.kept_events("a"), 3);
}

TEST(ClientOutbox, ARetryAtMostEvery20MsDeliversTheKeptFinals) {
  FakeClients f;
  f.full.insert("a");
  f.outbox.add("a", FakeClients::final_event("r1"));
  f.outbox.flush(1000);  // stalls a; its first retry falls in the same flush, and fails
  ASSERT_TRUE(f.outbox.stalled("a"));
  f.full.clear();  // a reads again
  f.outbox.flush(1000 + ClientOutbox::kRetryUs - 1);
  EXPECT_TRUE(f.sent.empty());  // too soon after the last attempt
  EXPECT_TRUE(f.outbox.stalled("a"));
  f.outbox.flush(1000 + ClientOutbox::kRetryUs);
  ASSERT_EQ(f.sent.size(), 1u);
  EXPECT_EQ(ids(f.sent[0].reply), (std::vector<std::string>{"r1"}));
  EXPECT_TRUE(f.sent[0].reply.events().requests(0).has_final());
  EXPECT_FALSE(f.outbox.stalled("a"));  // an ordinary client again
  f.outbox.add("a", FakeClients::token_event("r2"));
  f.outbox.flush(1000 + ClientOutbox::kRetryUs + 1);
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_EQ(ids(f.sent[1].reply), (std::vector<std::string>{"r2"}));
}

TEST(ClientOutbox, AStalledClientsSubmitsAreRefusedInOrderThenDroppedPastTheBound) {
  FakeClients f;
  EXPECT_FALSE(f.outbox.refuse_submit_if_stalled("a", "s0"));  // reads: admit
  f.full.insert("a");
  f.outbox.add("a", FakeClients::final_event("r1"));
  f.outbox.flush(0);
  EXPECT_TRUE(f.outbox.refuse_submit_if_stalled("a", "s1"));
  EXPECT_TRUE(f.outbox.refuse_submit_if_stalled("a", "s2"));
  EXPECT_EQ(f.outbox.kept_events("a"), 3);                    // at the bound (3)
  EXPECT_TRUE(f.outbox.refuse_submit_if_stalled("a", "s3"));  // refused, and dropped
  EXPECT_EQ(f.outbox.kept_events("a"), 3);
  f.full.clear();
  f.outbox.flush(ClientOutbox::kRetryUs);
  ASSERT_EQ(f.sent.size(), 1u);
  EXPECT_EQ(ids(f.sent[0].reply), (std::vector<std::string>{"r1", "s1", "s2"}));
  const v1::FinalEvent& refusal = f.sent[0].reply.events().requests(1).final();
  EXPECT_EQ(refusal.error_code(), v1::ERROR_CODE_OVERLOADED);
}

TEST(ClientOutbox, AStalledClientNoLongerKnownIsForgotten) {
  FakeClients f;
  f.full.insert("a");
  f.outbox.add("a", FakeClients::final_event("r1"));
  f.outbox.flush(0);
  ASSERT_TRUE(f.outbox.stalled("a"));
  f.outbox.flush(ClientOutbox::kRetryUs);
  EXPECT_TRUE(f.outbox.stalled("a"));  // known, still not reading: kept
  f.known.erase("a");
  f.outbox.flush(2 * ClientOutbox::kRetryUs);
  EXPECT_FALSE(f.outbox.stalled("a"));
  EXPECT_EQ(f.outbox.kept_events("a"), 0);
  EXPECT_TRUE(f.sent.empty());
}

TEST(ClientOutbox, OtherSendFailuresDropTheMessageWithoutStalling) {
  FakeClients f;
  ClientOutbox gone(3, ClientOutbox::Callbacks{[](const std::string&, const v1::SchedulerReply&) {
                                                 return runtime::SendResult(runtime::SendError::kPeerGone, "peer gone");
                                               },
                                               [&f](const std::string& client) { f.stopped.push_back(client); },
                                               [](const std::string&) { return true; }});
  gone.add("a", FakeClients::final_event("r1"));
  gone.flush(0);
  EXPECT_FALSE(gone.stalled("a"));
  EXPECT_TRUE(f.stopped.empty());
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// #18 item 6: a slow client never gets a success with missing tokens. A request that finished
// in the batch that found the client's queue full (its tokens dropped, its final event kept)
// used to end with LENGTH and fewer tokens than its usage said; so did one whose earlier token
// events were dropped while the client was stalled.
TEST(ClientOutbox, ARequestThatLostTokensNeverEndsWithSuccess) {
  FakeClients f;
  f.full.insert("a");
  v1::RequestEvents done = FakeClients::token_event("r1");  // its last tokens and final, together
  done.add_tokens()->set_id(8);
  set_final(done, v1::FINISH_REASON_LENGTH, v1::ERROR_CODE_UNSPECIFIED, "");
  done.mutable_final()->mutable_usage()->set_completion_tokens(2);
  f.outbox.add("a", done);
  f.outbox.add("a", FakeClients::token_event("r2"));  // r2 goes on, its token dropped
  f.outbox.flush(0);
  ASSERT_TRUE(f.outbox.stalled("a"));
  v1::RequestEvents r2_done;
  r2_done.set_request_id("r2");
  set_final(r2_done, v1::FINISH_REASON_STOP, v1::ERROR_CODE_UNSPECIFIED, "");
  f.outbox.add("a", r2_done);
  v1::RequestEvents r3_done;  // no token of r3 was lost: its success stays
  r3_done.set_request_id("r3");
  set_final(r3_done, v1::FINISH_REASON_STOP, v1::ERROR_CODE_UNSPECIFIED, "");
  f.outbox.add("a", r3_done);
  f.outbox.flush(1);
  f.full.clear();
  f.outbox.flush(ClientOutbox::kRetryUs + 1);
  ASSERT_EQ(f.sent.size(), 1u);
  std::map<std::string, v1::FinalEvent> finals;
  for (const v1::RequestEvents& ev : f.sent[0].reply.events().requests())
    if (ev.has_final()) finals[ev.request_id()] = ev.final();
  ASSERT_EQ(finals.size(), 3u);
  EXPECT_EQ(finals["r1"].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_EQ(finals["r1"].error_code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_NE(finals["r1"].error_message().find("2 of its tokens were not delivered"), std::string::npos)
      << finals["r1"].error_message();
  EXPECT_EQ(finals["r1"].usage().completion_tokens(), 2u);
  EXPECT_EQ(finals["r2"].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_NE(finals["r2"].error_message().find("1 of its tokens"), std::string::npos) << finals["r2"].error_message();
  EXPECT_EQ(finals["r3"].finish_reason(), v1::FINISH_REASON_STOP);
}

// #18 item 5: no message of events is larger than kReplyChunkBytes. Many requests' events are
// spread over several messages, and one request's tokens (a non-streaming request's, all at once)
// over several RequestEvents, its final event in the last; nothing is lost or reordered.
TEST(ClientOutbox, RepliesAreSplitBelowTheChunkSize) {
  FakeClients f;
  v1::RequestEvents big;
  big.set_request_id("big");
  for (int i = 0; i < 1000; ++i) {
    v1::TokenEvent* t = big.add_tokens();
    t->set_id(i);
    t->set_logprob(-1.5f);
    for (int k = 0; k < 20; ++k) t->add_top()->set_id(k);
  }
  set_final(big, v1::FINISH_REASON_LENGTH, v1::ERROR_CODE_UNSPECIFIED, "");
  ASSERT_GT(big.ByteSizeLong(), 4 * kReplyChunkBytes);
  for (int i = 0; i < 2000; ++i) f.outbox.add("a", FakeClients::token_event("s" + std::to_string(i % 50)));
  f.outbox.add("a", big);
  f.outbox.add("a", FakeClients::token_event("after"));
  f.outbox.flush(0);
  ASSERT_GT(f.sent.size(), 5u);
  std::vector<int32_t> big_ids;
  int small = 0, finals = 0;
  std::string last;
  for (const auto& s : f.sent) {
    EXPECT_LE(runtime::to_frame(s.reply).size(), kReplyChunkBytes);
    for (const auto& ev : s.reply.events().requests()) {
      if (ev.request_id() == "big") {
        EXPECT_EQ(finals, 0) << "the final event comes last";
        for (const auto& t : ev.tokens()) big_ids.push_back(t.id());
        finals += ev.has_final();
      } else {
        small += ev.tokens_size();
      }
      last = ev.request_id();
    }
  }
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(small, 2001);
  EXPECT_EQ(last, "after");
  ASSERT_EQ(big_ids.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(big_ids[i], i);
}

TEST(ClientOutbox, TheSendQueueBoundComesFromTheByteBudget) {
  EXPECT_EQ(send_hwm_for(64 << 20, 10000), 4096u);  // the defaults: 4096 messages of 16 KiB
  EXPECT_EQ(send_hwm_for(64 << 20, 1000), 1000u);   // --client-send-queue is a cap
  EXPECT_EQ(send_hwm_for(256 << 10, 10000), 16u);   // the least budget
  EXPECT_EQ(send_hwm_for(1, 10000), 16u);           // never below 16 messages
}

// Query replies are split as events are (#18 item 5): a tokenize reply's ids and a status's
// workers continue in parts of at most the chunk size, in order, under the same query id.
TEST(SplitQueryReply, ATokenizeReplyComesInPartsOfAtMostTheChunkSize) {
  v1::SchedulerReply whole;
  whole.set_version(runtime::kProtocolVersion);
  v1::TokenizeReply* t = whole.mutable_tokenized();
  t->set_query_id(77);
  for (int32_t i = 0; i < 200000; ++i) t->add_ids(i * 7919 % 128000);
  t->set_count(200000);
  std::vector<v1::SchedulerReply> parts;
  split_query_reply(whole, kReplyChunkBytes, parts);
  ASSERT_GT(parts.size(), 30u);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(parts[i].ByteSizeLong(), kReplyChunkBytes) << i;
    if (i + 1 == parts.size()) break;
    EXPECT_GT(parts[i].ByteSizeLong(), kReplyChunkBytes - 64) << i << " of " << parts.size();  // full
    const v1::TokenizeReply& p = parts[i].tokenized();
    EXPECT_EQ(p.query_id(), 77u);
    EXPECT_EQ(p.count(), 200000u);
    EXPECT_TRUE(p.more()) << i;
    ids.insert(ids.end(), p.ids().begin(), p.ids().end());
  }
  EXPECT_FALSE(parts.back().tokenized().more());
  ids.insert(ids.end(), parts.back().tokenized().ids().begin(), parts.back().tokenized().ids().end());
  EXPECT_EQ(ids, std::vector<int32_t>(t->ids().begin(), t->ids().end()));
  // One that fits is one part, as it was.
  t->mutable_ids()->Truncate(100);
  split_query_reply(whole, kReplyChunkBytes, parts);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].SerializeAsString(), whole.SerializeAsString());
}

TEST(SplitQueryReply, AStatusWithManyWorkersComesInParts) {
  v1::SchedulerReply whole;
  whole.set_version(runtime::kProtocolVersion);
  v1::StatusReply* s = whole.mutable_status();
  s->set_query_id(5);
  s->set_queued(3);
  s->set_ready(true);
  for (uint32_t i = 0; i < 1000; ++i) {
    v1::WorkerStatus* w = s->add_workers();
    w->set_worker_id(i + 1);
    w->set_role("decode");
    w->set_pid(100000 + i);
    w->set_alive(true);
    w->set_kv_blocks_total(1 << 24);
    w->set_steps(uint64_t{1} << 40);
    w->set_idle_share(0.5);
    w->set_weight_bytes(uint64_t{1} << 34);
  }
  std::vector<v1::SchedulerReply> parts;
  split_query_reply(whole, kReplyChunkBytes, parts);
  ASSERT_GE(parts.size(), 3u);
  v1::StatusReply joined = parts[0].status();
  EXPECT_EQ(joined.queued(), 3u);
  EXPECT_TRUE(joined.ready());
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(parts[i].ByteSizeLong(), kReplyChunkBytes) << i;
    EXPECT_EQ(parts[i].status().query_id(), 5u);
    EXPECT_EQ(parts[i].status().more(), i + 1 < parts.size()) << i;
    if (i > 0)
      for (const auto& w : parts[i].status().workers()) *joined.add_workers() = w;
  }
  joined.clear_more();
  EXPECT_EQ(joined.SerializeAsString(), s->SerializeAsString());
}

}  // namespace
}  // namespace tandem::scheduler
