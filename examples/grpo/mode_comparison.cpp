#include "examples/grpo/mode_comparison.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace rlforge::examples::grpo {

namespace {

const nlohmann::json& field(const nlohmann::json& r, const char* key) {
  if (!r.is_object() || !r.contains(key))
    throw std::invalid_argument(
        "metrics: step " + (r.is_object() && r.contains("step") ? r["step"].dump() : "?") +
        " has no '" + key + "' (was it written by this version of grpo?)");
  return r.at(key);
}

std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

} // namespace

run_summary summarize(const std::vector<nlohmann::json>& records) {
  if (records.empty())
    throw std::invalid_argument("metrics: no records");
  run_summary s;
  double gap = 0, gap_corrected = 0;
  double step_seconds = 0, wait_seconds = 0;
  double engine_busy = 0, engine_capacity = 0, in_flight = 0;
  int64_t busy_steps = 0, in_flight_steps = 0;
  std::vector<double> rewards;
  try {
    s.mode = field(records.front(), "mode").get<std::string>();
    for (const auto& r : records) {
      const auto n = field(r, "samples").get<int64_t>();
      s.samples += n;
      s.wall_seconds = field(r, "wall_seconds").get<double>();
      const auto counts = field(r, "staleness_counts").get<std::vector<int64_t>>();
      if (s.staleness_counts.size() < counts.size())
        s.staleness_counts.resize(counts.size(), 0);
      for (size_t k = 0; k < counts.size(); ++k)
        s.staleness_counts[k] += counts[k];
      gap += field(r, "logprob_gap").get<double>() * static_cast<double>(n);
      gap_corrected += field(r, "logprob_gap_corrected").get<double>() * static_cast<double>(n);
      s.dropped += field(r, "dropped").get<int64_t>();
      s.requeued += field(r, "requeued").get<int64_t>();
      const auto seconds = field(r, "seconds").get<double>();
      step_seconds += seconds;
      wait_seconds += field(r, "generate_seconds").get<double>();
      const auto& ranks = field(r, "engine_ranks");
      const auto& busy = field(r, "engine_busy_seconds");
      if (!ranks.is_null() && !busy.is_null()) {
        engine_busy += busy.get<double>();
        engine_capacity += ranks.get<double>() * seconds;
        ++busy_steps;
      }
      const auto& tokens = field(r, "tokens_in_flight");
      if (!tokens.is_null()) {
        in_flight += tokens.get<double>();
        ++in_flight_steps;
      }
      if (r.contains("held_out_accuracy"))
        s.accuracy.emplace_back(s.wall_seconds, r.at("held_out_accuracy").get<double>());
      rewards.push_back(field(r, "reward").get<double>());
      if (rewards.size() >= static_cast<size_t>(reward_window)) {
        double sum = 0;
        for (auto k = rewards.size() - reward_window; k < rewards.size(); ++k)
          sum += rewards[k];
        s.reward.emplace_back(s.wall_seconds, sum / reward_window);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string{"metrics: a field has the wrong type: "} + e.what());
  }
  if (s.samples > 0) {
    gap /= static_cast<double>(s.samples);
    gap_corrected /= static_cast<double>(s.samples);
  }
  s.logprob_gap = gap;
  s.logprob_gap_corrected = gap_corrected;
  s.samples_per_second = s.wall_seconds > 0 ? s.samples / s.wall_seconds : 0.0;
  if (busy_steps > 0 && engine_capacity > 0)
    s.engine_busy_share = engine_busy / engine_capacity;
  s.trainer_wait_share = step_seconds > 0 ? wait_seconds / step_seconds : 0.0;
  if (in_flight_steps > 0)
    s.tokens_in_flight = in_flight / static_cast<double>(in_flight_steps);
  return s;
}

double seconds_to_reach(const std::vector<std::pair<double, double>>& curve, double target) {
  for (const auto& [t, value] : curve)
    if (value >= target)
      return t;
  return -1;
}

namespace {

/// ", reached BASE's final WHAT X at T s" or ", never reached BASE's final WHAT X", for the
/// baseline's final value `target` of `curve`; `percent` prints values as percentages.
std::string reached(const std::vector<std::pair<double, double>>& curve, double target,
                    const std::string& base, const std::string& what, bool percent) {
  const auto value = percent ? fmt("%.1f", 100 * target) + "%" : fmt("%.3f", target);
  const auto t = seconds_to_reach(curve, target);
  return t < 0 ? ", never reached " + base + "'s final " + what + value
               : ", reached " + base + "'s final " + what + value + " at " + fmt("%.1f", t) + " s";
}

} // namespace

std::string compare_runs(const std::vector<run_summary>& runs) {
  if (runs.empty())
    throw std::invalid_argument("compare: no runs");
  const auto& base = runs.front();
  const double base_final = base.accuracy.empty() ? -1 : base.accuracy.back().second;
  std::string out;
  for (const auto& r : runs) {
    std::string line = "grpo: " + r.mode + ": " + fmt("%.1f", r.samples_per_second) +
                       " samples/s (" + fmt("%.2f", base.samples_per_second > 0
                                                        ? r.samples_per_second /
                                                              base.samples_per_second
                                                        : 0.0) +
                       "x " + base.mode + ")";
    if (!r.accuracy.empty()) {
      line += ", final held-out accuracy " + fmt("%.1f", 100 * r.accuracy.back().second) +
              "% after " + fmt("%.1f", r.wall_seconds) + " s";
      if (base_final >= 0)
        line += reached(r.accuracy, base_final, base.mode, "", true);
    } else if (!r.reward.empty()) {
      // No held-out set (an environment's episodes): the trailing mean reward instead.
      line += ", final reward " + fmt("%.3f", r.reward.back().second) + " (mean of the last " +
              std::to_string(reward_window) + " steps) after " + fmt("%.1f", r.wall_seconds) + " s";
      if (base.accuracy.empty() && !base.reward.empty())
        line += reached(r.reward, base.reward.back().second, base.mode, "reward ", false);
    }
    std::string hist;
    int64_t total = 0;
    for (auto c : r.staleness_counts)
      total += c;
    for (size_t k = 0; k < r.staleness_counts.size(); ++k)
      hist += std::string(k ? " " : "") + std::to_string(k) + ":" +
              fmt("%.0f", total ? 100.0 * r.staleness_counts[k] / total : 0.0) + "%";
    line += "; staleness {" + hist + "}, |engine - trainer log-prob| " +
            fmt("%.4f", r.logprob_gap) + " raw, " + fmt("%.4f", r.logprob_gap_corrected) +
            " corrected; " + std::to_string(r.dropped) + " dropped, " +
            std::to_string(r.requeued) + " requeued; trainer waiting " +
            fmt("%.0f", 100 * r.trainer_wait_share) + "% of the steps";
    if (r.engine_busy_share >= 0)
      line += ", engines busy " + fmt("%.0f", 100 * r.engine_busy_share) + "%";
    if (r.tokens_in_flight >= 0)
      line += ", " + fmt("%.0f", r.tokens_in_flight) + " tokens in flight at a take";
    line += "\n";
    out += line;
  }
  return out;
}

} // namespace rlforge::examples::grpo
