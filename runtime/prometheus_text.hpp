#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

/// Metrics in Prometheus' text exposition format (version 0.0.4), as `GET /metrics` serves them
/// on `rlforge serve` and `rlforge head`.
///
/// A `metrics_registry` holds families (a name, its help, its type: counter, gauge or
/// histogram), each with one series per label set. Counters only grow (`add` refuses a negative
/// amount, `set_total` a smaller total); gauges are set; histograms count observations into cumulative buckets with fixed upper
/// bounds (declared with the family), plus `_sum` and `_count`. `render()` writes every family in
/// name order, each series in label order, so two renders of the same state are equal.
///
/// Names must match `[a-zA-Z_:][a-zA-Z0-9_:]*` and label names `[a-zA-Z_][a-zA-Z0-9_]*` (not
/// starting with `__`); label values are escaped (`\\`, `\"`, `\n`). A family is declared once
/// with one type: using a name with another type, or a histogram with other buckets, throws
/// `std::invalid_argument` naming it (a programming error, never user input).
///
/// Thread safety: every member function may be called from any thread (one mutex).
namespace rlforge::runtime {

/// Label name → value of one series (ordered, so a label set has one form).
using metric_labels = std::map<std::string, std::string>;

class metrics_registry {
public:
  /// Adds `amount` (>= 0) to counter `name`'s series `labels`, declaring the family on first use.
  void add(const std::string& name, const std::string& help, const metric_labels& labels,
           double amount = 1);

  /// Sets counter `name`'s series `labels` to `total`, a running total kept elsewhere (bytes a
  /// backend synced so far); a total below the series' value throws `std::invalid_argument`.
  void set_total(const std::string& name, const std::string& help, const metric_labels& labels,
                 double total);

  /// Sets gauge `name`'s series `labels` to `value`.
  void set(const std::string& name, const std::string& help, const metric_labels& labels,
           double value);

  /// Removes every series of gauge `name` (for gauges re-read whole at each scrape, so a lane or
  /// node that went away leaves no stale series). The family stays declared.
  void clear_gauge(const std::string& name);

  /// Counts `value` into histogram `name`'s series `labels`; `bounds` are the buckets' upper
  /// bounds, strictly increasing and finite (`+Inf` is implied).
  void observe(const std::string& name, const std::string& help, const metric_labels& labels,
               double value, const std::vector<double>& bounds);

  /// The exposition text of every family.
  std::string render() const;

  /// The content type of `render()`'s text.
  static const char* content_type();

private:
  enum class kind { counter, gauge, histogram };
  struct histogram_series {
    std::vector<uint64_t> counts; ///< per bucket (not cumulative), then the +Inf bucket
    double sum = 0;
    uint64_t count = 0;
  };
  struct family {
    kind type = kind::counter;
    std::string help;
    std::vector<double> bounds;
    std::map<metric_labels, double> values;
    std::map<metric_labels, histogram_series> histograms;
  };
  family& declare(const std::string& name, const std::string& help, kind type,
                  const metric_labels& labels);

  mutable std::mutex mutex_;
  std::map<std::string, family> families_;
};

/// Seconds buckets for request and future latencies: 1 ms .. 300 s.
const std::vector<double>& latency_buckets_seconds();

} // namespace rlforge::runtime
