#include "backends/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "backends/error.hpp"
#include "backends/train/detail.hpp"

namespace rlforge::backends {

namespace {

constexpr double pi = 3.14159265358979323846;

using detail::number_text;

[[noreturn]] void bad_field(const std::string& field, const std::string& value,
                            const std::string& domain) {
  fail(error_code::invalid_argument,
       "lr_schedule: " + field + " = " + value + " must be " + domain);
}

template <class T> T field(const nlohmann::json& j, const char* name) {
  if (!j.is_object() || !j.contains(name))
    fail(error_code::decode_error, std::string("lr_schedule state: missing field '") + name + "'");
  const auto& v = j.at(name);
  if (!detail::json_holds<T>(v))
    fail(error_code::decode_error, std::string("lr_schedule state: field '") + name +
                                       "' has the wrong type (" + v.dump() + ")");
  return v.get<T>();
}

} // namespace

const char* to_string(lr_schedule_kind x) noexcept {
  switch (x) {
  case lr_schedule_kind::constant:
    return "constant";
  case lr_schedule_kind::constant_with_warmup:
    return "constant_with_warmup";
  case lr_schedule_kind::cosine:
    return "cosine";
  }
  return "unknown";
}

lr_schedule_kind parse_lr_schedule_kind(const std::string& name) {
  for (auto k : {lr_schedule_kind::constant, lr_schedule_kind::constant_with_warmup,
                 lr_schedule_kind::cosine})
    if (name == to_string(k))
      return k;
  if (name == "linear_warmup")
    return lr_schedule_kind::constant_with_warmup;
  fail(error_code::invalid_argument,
       "lr_schedule: unknown kind '" + name +
           "' (valid: constant, constant_with_warmup or linear_warmup, cosine)");
}

void lr_schedule_config::validate() const {
  if (!std::isfinite(base_lr) || base_lr < 0)
    bad_field("base_lr", number_text(base_lr), "finite and >= 0");
  if (warmup_steps < 0)
    bad_field("warmup_steps", std::to_string(warmup_steps), ">= 0");
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    bad_field("min_lr_ratio", number_text(min_lr_ratio), "in [0, 1]");
  if (kind == lr_schedule_kind::cosine) {
    if (total_steps < 1)
      bad_field("total_steps", std::to_string(total_steps), ">= 1 for a cosine schedule");
    if (warmup_steps > total_steps)
      bad_field("warmup_steps", std::to_string(warmup_steps),
                "<= total_steps (" + std::to_string(total_steps) + ")");
  }
}

bool operator==(const lr_schedule_config& a, const lr_schedule_config& b) {
  return a.kind == b.kind && a.base_lr == b.base_lr && a.warmup_steps == b.warmup_steps &&
         a.total_steps == b.total_steps && a.min_lr_ratio == b.min_lr_ratio;
}

lr_schedule::lr_schedule(lr_schedule_config config) : config_(config) {
  config_.validate();
}

double lr_schedule::lr_at(int64_t step) const {
  if (step < 0)
    step = 0;
  const auto& c = config_;
  if (c.kind == lr_schedule_kind::constant)
    return c.base_lr;
  if (step < c.warmup_steps)
    return c.base_lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  if (c.kind == lr_schedule_kind::constant_with_warmup)
    return c.base_lr;
  double span = static_cast<double>(std::max<int64_t>(1, c.total_steps - c.warmup_steps));
  double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  double cosine = 0.5 * (1.0 + std::cos(pi * progress));
  return c.base_lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * cosine);
}

nlohmann::json lr_schedule::to_json() const {
  return nlohmann::json{
      {"kind", to_string(config_.kind)},      {"base_lr", config_.base_lr},
      {"warmup_steps", config_.warmup_steps}, {"total_steps", config_.total_steps},
      {"min_lr_ratio", config_.min_lr_ratio}, {"step", step_}};
}

lr_schedule lr_schedule::from_json(const nlohmann::json& j) {
  lr_schedule_config c;
  try {
    c.kind = parse_lr_schedule_kind(field<std::string>(j, "kind"));
  } catch (const error& e) {
    if (e.code() == error_code::decode_error)
      throw;
    fail(error_code::decode_error, std::string("lr_schedule state: ") + e.what());
  }
  c.base_lr = field<double>(j, "base_lr");
  c.warmup_steps = field<int64_t>(j, "warmup_steps");
  c.total_steps = field<int64_t>(j, "total_steps");
  c.min_lr_ratio = field<double>(j, "min_lr_ratio");
  auto step = field<int64_t>(j, "step");
  if (step < 0)
    fail(error_code::decode_error,
         "lr_schedule state: step " + std::to_string(step) + " is negative");
  lr_schedule out(c);
  out.step_ = step;
  return out;
}

} // namespace rlforge::backends
