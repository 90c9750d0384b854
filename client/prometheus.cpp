#include "client/prometheus.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace tandem::client_detail {

namespace {

// Whole numbers below 2^53 (counts, token totals) as integers; others as the shortest form that
// reads back exactly (std::to_chars), which Go's ParseFloat reads.
void append_number(std::string& out, double v) {
  char buf[32];
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    out.append(buf, std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v)).ptr);
  } else {
    out.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  }
}

// HELP text escapes backslash and newline; label values also the double quote.
void append_escaped(std::string& out, const std::string& s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

const char* type_name(v1::MetricType type) {
  switch (type) {
    case v1::METRIC_TYPE_COUNTER: return "counter";
    case v1::METRIC_TYPE_GAUGE: return "gauge";
    case v1::METRIC_TYPE_HISTOGRAM: return "histogram";
    default: return "untyped";
  }
}

// `name`{const labels, the series' labels, `le` when given} value
void append_sample(std::string& out, const v1::MetricsReply& reply, const std::string& name, const char* suffix,
                   const v1::Metric& m, const std::string* le, double value) {
  out += name;
  out += suffix;
  char sep = '{';
  auto label = [&](const std::string& k, const std::string& v) {
    out += sep;
    out += k;
    out += "=\"";
    append_escaped(out, v, true);
    out += '"';
    sep = ',';
  };
  for (const v1::MetricLabel& l : reply.const_labels()) label(l.name(), l.value());
  for (const v1::MetricLabel& l : m.labels()) label(l.name(), l.value());
  if (le) label("le", *le);
  if (sep == ',') out += '}';
  out += ' ';
  append_number(out, value);
  out += '\n';
}

void append_histogram(std::string& out, const v1::MetricsReply& reply, const v1::MetricFamily& f, const v1::Metric& m) {
  std::string le;
  for (int i = 0; i < f.bucket_bounds_size(); ++i) {
    le.clear();
    append_number(le, f.bucket_bounds(i));
    append_sample(out, reply, f.name(), "_bucket", m, &le, i < m.bucket_counts_size() ? double(m.bucket_counts(i)) : 0);
  }
  le = "+Inf";
  append_sample(out, reply, f.name(), "_bucket", m, &le, double(m.count()));
  append_sample(out, reply, f.name(), "_sum", m, nullptr, m.sum());
  append_sample(out, reply, f.name(), "_count", m, nullptr, double(m.count()));
}

}  // namespace

std::string prometheus_text(const v1::MetricsReply& reply) {
  std::string out;
  for (const v1::MetricFamily& f : reply.families()) {
    out += "# HELP " + f.name() + ' ';
    append_escaped(out, f.help(), false);
    out += "\n# TYPE " + f.name() + ' ' + type_name(f.type()) + '\n';
    for (const v1::Metric& m : f.metrics()) {
      if (f.type() == v1::METRIC_TYPE_HISTOGRAM) {
        append_histogram(out, reply, f, m);
      } else {
        append_sample(out, reply, f.name(), "", m, nullptr, m.value());
      }
    }
  }
  return out;
}

}  // namespace tandem::client_detail
