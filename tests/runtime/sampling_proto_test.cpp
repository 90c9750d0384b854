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
  const SamplingParams p{0.7f, 40, 0.9f, 0.05f, 1.1f, 0xDEADBEEFCAFEull, 5};
  expect_same(round_trip(p), p);
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
