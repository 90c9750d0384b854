#include "runtime/sampling_proto.h"

#include <gtest/gtest.h>

namespace tandem::model {
namespace {

void expect_same(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.logit_bias, b.logit_bias);
}

// Through the wire bytes, as the client's Submit and the scheduler's plans travel.
SamplingParams round_trip(const SamplingParams& p) {
  v1::SamplingParams wire;
  to_proto(p, &wire);
  v1::SamplingParams parsed;
  EXPECT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  return from_proto(parsed);
}

TEST(SamplingProto, DefaultsRoundTrip) { expect_same(round_trip(SamplingParams{}), SamplingParams{}); }

TEST(SamplingProto, EveryFieldRoundTrips) {
  const SamplingParams p{0.7f, 40, 0.9f, 0.05f, 1.1f, 0xDEADBEEFCAFEull, 5, -1.5f, 2.0f, {{42, -100.0f}, {0, 3.25f}}};
  expect_same(round_trip(p), p);
  EXPECT_TRUE(validate(p).is_ok());
}

TEST(SamplingProto, PenaltiesAndLogitBiasRoundTripInOrder) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.75f;
  for (int32_t t = 299; t >= 0; --t) p.logit_bias.push_back({t * 7, static_cast<float>(t % 201) - 100.0f});
  const SamplingParams back = round_trip(p);
  expect_same(back, p);
  EXPECT_EQ(back.logit_bias.size(), kMaxLogitBias);
  EXPECT_EQ(back.logit_bias.front().token, 299 * 7);  // the order given, not sorted
  // Absent on the wire (an older client): off and empty.
  v1::SamplingParams wire;
  wire.set_temperature(1.0f);
  const SamplingParams old = from_proto(wire);
  EXPECT_EQ(old.presence_penalty, 0.0f);
  EXPECT_EQ(old.frequency_penalty, 0.0f);
  EXPECT_TRUE(old.logit_bias.empty());
}

TEST(SamplingProto, ZeroMeansUnsetOnlyWhereZeroIsNoValue) {
  // An empty message (an old or minimal client that set nothing) is the defaults: greedy,
  // every filter off.
  expect_same(from_proto(v1::SamplingParams{}), SamplingParams{});
  // top_p and repetition_penalty of 0 would be invalid: they read as "unset", 1.
  v1::SamplingParams wire;
  wire.set_temperature(0.5f);
  wire.set_top_p(0.0f);
  wire.set_repetition_penalty(0.0f);
  const SamplingParams p = from_proto(wire);
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_TRUE(validate(p).is_ok());
}

}  // namespace
}  // namespace tandem::model
