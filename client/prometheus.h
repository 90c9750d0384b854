// The Prometheus text exposition format (version 0.0.4) of a MetricsReply. Generic: every name,
// help line, type and label comes from the reply; nothing here knows a metric.
#pragma once

#include <string>

#include "tandem/v1/client.pb.h"

namespace tandem::client_detail {

// Per family: # HELP, # TYPE, then its series (a histogram's as _bucket{le=...} lines ending
// with le="+Inf", then _sum and _count), each with the reply's constant labels first.
std::string prometheus_text(const v1::MetricsReply& reply);

}  // namespace tandem::client_detail
