// The Prometheus text the client library renders from a MetricsReply: HELP and TYPE per family,
// constant labels first, histograms as _bucket lines ending with +Inf, then _sum and _count,
// label values and help escaped as the text format (0.0.4) wants.
#include "client/prometheus.h"

#include <gtest/gtest.h>

namespace tandem::client_detail {
namespace {

TEST(PrometheusText, FamiliesSeriesAndHistogramsInTheTextFormat) {
  v1::MetricsReply r;
  v1::MetricLabel* model = r.add_const_labels();
  model->set_name("model_name");
  model->set_value("m\"1\\");
  v1::MetricFamily* g = r.add_families();
  g->set_name("tandem:kv_cache_usage_perc");
  g->set_help("KV in use.\nOver the total.");
  g->set_type(v1::METRIC_TYPE_GAUGE);
  v1::Metric* w = g->add_metrics();
  v1::MetricLabel* l = w->add_labels();
  l->set_name("worker");
  l->set_value("1");
  w->set_value(0.25);
  v1::MetricFamily* h = r.add_families();
  h->set_name("tandem:ttft_seconds");
  h->set_help("TTFT.");
  h->set_type(v1::METRIC_TYPE_HISTOGRAM);
  h->add_bucket_bounds(0.001);
  h->add_bucket_bounds(1);
  v1::Metric* m = h->add_metrics();
  m->add_bucket_counts(1);
  m->add_bucket_counts(3);
  m->set_count(4);
  m->set_sum(12.5);
  EXPECT_EQ(prometheus_text(r),
            "# HELP tandem:kv_cache_usage_perc KV in use.\\nOver the total.\n"
            "# TYPE tandem:kv_cache_usage_perc gauge\n"
            "tandem:kv_cache_usage_perc{model_name=\"m\\\"1\\\\\",worker=\"1\"} 0.25\n"
            "# HELP tandem:ttft_seconds TTFT.\n"
            "# TYPE tandem:ttft_seconds histogram\n"
            "tandem:ttft_seconds_bucket{model_name=\"m\\\"1\\\\\",le=\"0.001\"} 1\n"
            "tandem:ttft_seconds_bucket{model_name=\"m\\\"1\\\\\",le=\"1\"} 3\n"
            "tandem:ttft_seconds_bucket{model_name=\"m\\\"1\\\\\",le=\"+Inf\"} 4\n"
            "tandem:ttft_seconds_sum{model_name=\"m\\\"1\\\\\"} 12.5\n"
            "tandem:ttft_seconds_count{model_name=\"m\\\"1\\\\\"} 4\n");
}

TEST(PrometheusText, ASeriesWithoutLabelsHasNoBraces) {
  v1::MetricsReply r;
  v1::MetricFamily* c = r.add_families();
  c->set_name("tandem:generation_tokens_total");
  c->set_type(v1::METRIC_TYPE_COUNTER);
  c->add_metrics()->set_value(100000);
  c->add_metrics()->set_value(1e20);
  EXPECT_EQ(prometheus_text(r),
            "# HELP tandem:generation_tokens_total \n# TYPE tandem:generation_tokens_total counter\n"
            "tandem:generation_tokens_total 100000\ntandem:generation_tokens_total 1e+20\n");
}

}  // namespace
}  // namespace tandem::client_detail
