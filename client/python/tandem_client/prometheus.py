"""The Prometheus text exposition format (0.0.4) of a tandem.v1.MetricsReply, as the C++ library
renders it (client/prometheus.cpp): generic, every name, help line, type and label comes from
the reply."""
import math

_TYPES = {1: "counter", 2: "gauge", 3: "histogram"}


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == math.floor(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def _escape(s: str, quote: bool) -> str:
    s = s.replace("\\", "\\\\").replace("\n", "\\n")
    return s.replace('"', '\\"') if quote else s


def _sample(out, reply, name, suffix, m, le, value):
    labels = [(l.name, l.value) for l in reply.const_labels] + [(l.name, l.value) for l in m.labels]
    if le is not None:
        labels.append(("le", le))
    text = ",".join(f'{k}="{_escape(v, True)}"' for k, v in labels)
    out.append(f"{name}{suffix}{{{text}}} {_number(value)}\n" if labels else f"{name}{suffix} {_number(value)}\n")


def prometheus_text(reply) -> str:
    out = []
    for f in reply.families:
        out.append(f"# HELP {f.name} {_escape(f.help, False)}\n# TYPE {f.name} {_TYPES.get(f.type, 'untyped')}\n")
        for m in f.metrics:
            if f.type != 3:
                _sample(out, reply, f.name, "", m, None, m.value)
                continue
            for i, bound in enumerate(f.bucket_bounds):
                count = m.bucket_counts[i] if i < len(m.bucket_counts) else 0
                _sample(out, reply, f.name, "_bucket", m, _number(bound), count)
            _sample(out, reply, f.name, "_bucket", m, "+Inf", m.count)
            _sample(out, reply, f.name, "_sum", m, None, m.sum)
            _sample(out, reply, f.name, "_count", m, None, m.count)
    return "".join(out)
