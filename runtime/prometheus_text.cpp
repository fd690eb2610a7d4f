#include "runtime/prometheus_text.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace rlforge::runtime {

namespace {

bool valid_name(const std::string& s, bool label) {
  if (s.empty() || (label && s.rfind("__", 0) == 0))
    return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                       (!label && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
      return false;
  }
  return true;
}

std::string escape(const std::string& v, bool help) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && !help)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

/// A sample value as Prometheus reads it: integers without a fraction, else shortest round trip.
std::string number(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

std::string label_text(const metric_labels& labels, const std::string& le = "") {
  std::string out;
  for (const auto& [k, v] : labels)
    out += (out.empty() ? "" : ",") + k + "=\"" + escape(v, false) + "\"";
  if (!le.empty())
    out += (out.empty() ? "" : ",") + std::string("le=\"") + le + "\"";
  return out.empty() ? "" : "{" + out + "}";
}

} // namespace

metrics_registry::family& metrics_registry::declare(const std::string& name,
                                                    const std::string& help, kind type,
                                                    const metric_labels& labels) {
  if (!valid_name(name, false))
    throw std::invalid_argument("metrics_registry: invalid metric name '" + name + "'");
  for (const auto& [k, v] : labels)
    if (!valid_name(k, true) || (type == kind::histogram && k == "le"))
      throw std::invalid_argument("metrics_registry: invalid label name '" + k + "' on '" + name +
                                  "'");
  auto [it, fresh] = families_.try_emplace(name);
  if (fresh) {
    it->second.type = type;
    it->second.help = help;
  } else if (it->second.type != type) {
    throw std::invalid_argument("metrics_registry: '" + name + "' is already declared as another "
                                "type");
  }
  return it->second;
}

void metrics_registry::add(const std::string& name, const std::string& help,
                           const metric_labels& labels, double amount) {
  if (!(amount >= 0) || std::isinf(amount))
    throw std::invalid_argument("metrics_registry: counter '" + name +
                                "' takes a finite amount >= 0, got " + number(amount));
  std::lock_guard<std::mutex> guard(mutex_);
  declare(name, help, kind::counter, labels).values[labels] += amount;
}

void metrics_registry::set_total(const std::string& name, const std::string& help,
                                 const metric_labels& labels, double total) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& value = declare(name, help, kind::counter, labels).values[labels];
  if (!(total >= value) || std::isinf(total))
    throw std::invalid_argument("metrics_registry: counter '" + name + "' cannot go from " +
                                number(value) + " to " + number(total));
  value = total;
}

void metrics_registry::set(const std::string& name, const std::string& help,
                           const metric_labels& labels, double value) {
  std::lock_guard<std::mutex> guard(mutex_);
  declare(name, help, kind::gauge, labels).values[labels] = value;
}

void metrics_registry::clear_gauge(const std::string& name) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = families_.find(name);
  if (it != families_.end() && it->second.type == kind::gauge)
    it->second.values.clear();
}

void metrics_registry::observe(const std::string& name, const std::string& help,
                               const metric_labels& labels, double value,
                               const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& f = declare(name, help, kind::histogram, labels);
  if (f.bounds.empty() && f.histograms.empty()) {
    for (size_t i = 0; i < bounds.size(); ++i)
      if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
        throw std::invalid_argument("metrics_registry: histogram '" + name +
                                    "' needs finite, strictly increasing bounds");
    f.bounds = bounds;
  } else if (f.bounds != bounds) {
    throw std::invalid_argument("metrics_registry: histogram '" + name +
                                "' is already declared with other bounds");
  }
  auto& h = f.histograms[labels];
  if (h.counts.empty())
    h.counts.assign(f.bounds.size() + 1, 0);
  size_t b = 0;
  while (b < f.bounds.size() && value > f.bounds[b])
    ++b;
  ++h.counts[b];
  h.sum += value;
  ++h.count;
}

std::string metrics_registry::render() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == kind::counter ? "counter"
                       : f.type == kind::gauge ? "gauge"
                                               : "histogram";
    out += "# HELP " + name + " " + escape(f.help, true) + "\n";
    out += "# TYPE " + name + " " + type + "\n";
    for (const auto& [labels, v] : f.values)
      out += name + label_text(labels) + " " + number(v) + "\n";
    for (const auto& [labels, h] : f.histograms) {
      uint64_t cumulative = 0;
      for (size_t b = 0; b <= f.bounds.size(); ++b) {
        cumulative += h.counts[b];
        const std::string le = b < f.bounds.size() ? number(f.bounds[b]) : "+Inf";
        out += name + "_bucket" + label_text(labels, le) + " " + std::to_string(cumulative) + "\n";
      }
      out += name + "_sum" + label_text(labels) + " " + number(h.sum) + "\n";
      out += name + "_count" + label_text(labels) + " " + std::to_string(h.count) + "\n";
    }
  }
  return out;
}

const char* metrics_registry::content_type() {
  return "text/plain; version=0.0.4; charset=utf-8";
}

const std::vector<double>& latency_buckets_seconds() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,   5,    10,    30,   60,  120, 300};
  return b;
}

} // namespace rlforge::runtime
