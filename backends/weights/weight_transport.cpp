#include "backends/weights/weight_transport.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include "backends/error.hpp"
#include "strings/format.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace rlforge::backends {

namespace {

// Dtypes a manifest may name, with their wire names (c10's own spelling).
constexpr at::ScalarType wire_dtypes[] = {
  at::kFloat, at::kDouble, at::kHalf,  at::kBFloat16, at::kChar,
  at::kByte,  at::kShort,  at::kInt,   at::kLong,     at::kBool,
};

std::string squote(const std::string& s) {
  return "'" + s + "'";
}

using strings::shape_text;

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

std::uint64_t byte_size(at::ScalarType dtype, const std::vector<int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape)
    n *= static_cast<std::uint64_t>(d);
  return n * c10::elementSize(dtype);
}

} // namespace

std::uint64_t weight_manifest::total_bytes() const {
  std::uint64_t sum = 0;
  for (const auto& t : tensors)
    sum += t.bytes;
  return sum;
}

weight_manifest make_manifest(const named_tensors& weights) {
  weight_manifest m;
  m.tensors.reserve(weights.size());
  std::set<std::string> seen;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const auto& [name, t] = weights[i];
    if (name.empty())
      fail(error_code::invalid_argument,
           "weight manifest: tensor " + std::to_string(i) + " has an empty name");
    if (!seen.insert(name).second)
      fail(error_code::invalid_argument,
           "weight manifest: tensor name " + squote(name) + " appears more than once");
    if (!t.defined())
      fail(error_code::invalid_argument,
           "weight manifest: tensor " + squote(name) + " is undefined");
    if (t.layout() != at::kStrided)
      fail(error_code::invalid_argument,
           "weight manifest: tensor " + squote(name) + " is not dense (layout " +
               c10::str(t.layout()) + ")");
    tensor_spec s;
    s.name = name;
    s.dtype = t.scalar_type();
    s.shape = t.sizes().vec();
    s.bytes = static_cast<std::uint64_t>(t.numel()) * t.element_size();
    m.tensors.push_back(std::move(s));
  }
  return m;
}

bucket_plan make_bucket_plan(const weight_manifest& m, std::uint64_t bucket_bytes) {
  if (bucket_bytes == 0)
    fail(error_code::invalid_argument, "bucket plan: bucket_bytes must be > 0, got 0");
  bucket_plan plan;
  plan.bucket_bytes = bucket_bytes;
  std::uint64_t cursor = 0; // end of the layout so far
  weight_bucket cur;
  auto close = [&] {
    if (cur.tensors.empty())
      return;
    plan.max_bucket_bytes = std::max(plan.max_bucket_bytes, cur.bytes);
    cursor = cur.offset + cur.bytes;
    plan.buckets.push_back(std::move(cur));
    cur = weight_bucket{};
  };
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    auto bytes = m.tensors[i].bytes;
    if (!cur.tensors.empty()) {
      auto start = align_up(cur.bytes, tensor_alignment);
      if (start + bytes > bucket_bytes)
        close();
    }
    if (cur.tensors.empty())
      cur.offset = align_up(cursor, tensor_alignment);
    auto local = cur.tensors.empty() ? 0 : align_up(cur.bytes, tensor_alignment);
    cur.tensors.push_back(packed_tensor{i, cur.offset + local, bytes});
    cur.bytes = local + bytes;
  }
  close();
  plan.total_bytes = cursor;
  return plan;
}

bool same_layout(const weight_manifest& a, const weight_manifest& b) {
  if (a.tensors.size() != b.tensors.size())
    return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape)
      return false;
  }
  return true;
}

std::string encode_transfer_header(const weight_manifest& m, std::uint64_t version,
                                   std::uint64_t bucket_bytes, std::uint64_t delta_base) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : m.tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", c10::toString(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.bytes}});
  nlohmann::json j = {{"format", "rlforge.weights.v1"},
                      {"version", version},
                      {"bucket_bytes", bucket_bytes},
                      {"tensors", std::move(tensors)}};
  if (delta_base != 0)
    j["delta_base"] = delta_base;
  return j.dump();
}

transfer_header decode_transfer_header(const std::string& text) {
  auto bad = [](const std::string& what) {
    fail(error_code::decode_error, "weight transfer header: " + what);
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("not JSON: ") + e.what());
  }
  transfer_header h;
  try {
    if (!j.is_object() || j.value("format", "") != "rlforge.weights.v1")
      bad("format is not rlforge.weights.v1");
    h.version = j.at("version").get<std::uint64_t>();
    h.bucket_bytes = j.at("bucket_bytes").get<std::uint64_t>();
    h.delta_base = j.value("delta_base", std::uint64_t{0});
    for (const auto& t : j.at("tensors")) {
      tensor_spec s;
      s.name = t.at("name").get<std::string>();
      auto dtype = t.at("dtype").get<std::string>();
      auto it = std::find_if(std::begin(wire_dtypes), std::end(wire_dtypes),
                             [&](at::ScalarType d) { return dtype == c10::toString(d); });
      if (it == std::end(wire_dtypes))
        bad("tensor " + squote(s.name) + " has unknown dtype " + squote(dtype));
      s.dtype = *it;
      s.shape = t.at("shape").get<std::vector<int64_t>>();
      for (auto d : s.shape)
        if (d < 0)
          bad("tensor " + squote(s.name) + " has a negative dimension in " +
              shape_text(s.shape));
      s.bytes = t.at("bytes").get<std::uint64_t>();
      if (s.bytes != byte_size(s.dtype, s.shape))
        bad("tensor " + squote(s.name) + " claims " + std::to_string(s.bytes) +
            " bytes, its dtype and shape give " + std::to_string(byte_size(s.dtype, s.shape)));
      h.manifest.tensors.push_back(std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("malformed field: ") + e.what());
  }
  return h;
}

void check_transfer(const weight_manifest& incoming, std::uint64_t version,
                    const named_tensors& targets, std::uint64_t current_version,
                    c10::Device device) {
  constexpr std::size_t max_listed = 8;
  std::vector<std::string> problems;
  std::size_t count = 0;
  auto problem = [&](std::string p) {
    if (problems.size() < max_listed)
      problems.push_back(std::move(p));
    ++count;
  };
  if (version <= current_version)
    problem("version " + std::to_string(version) + " is not newer than the version held, " +
            std::to_string(current_version));

  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : targets) {
    if (!by_name.emplace(name, &t).second) {
      problem("the receiver names tensor " + squote(name) + " more than once");
      continue;
    }
    if (!t.defined()) {
      problem("receiver tensor " + squote(name) + " is undefined");
      continue;
    }
    if (t.layout() != at::kStrided || !t.is_contiguous())
      problem("receiver tensor " + squote(name) + " is not contiguous (it is written in place)");
    if (t.device() != device)
      problem("receiver tensor " + squote(name) + " is on " + t.device().str() + ", expected " +
              device.str());
  }
  std::set<std::string> sent;
  for (const auto& s : incoming.tensors) {
    sent.insert(s.name);
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      problem("unexpected tensor " + squote(s.name) + " (" + c10::toString(s.dtype) + " " +
              shape_text(s.shape) + "): the receiver has no tensor of that name");
      continue;
    }
    const auto& t = *it->second;
    if (!t.defined())
      continue;
    if (t.scalar_type() != s.dtype)
      problem("tensor " + squote(s.name) + " has dtype " + c10::toString(s.dtype) +
              ", expected " + c10::toString(t.scalar_type()));
    if (t.sizes() != at::IntArrayRef(s.shape))
      problem("tensor " + squote(s.name) + " has shape " + shape_text(s.shape) +
              ", expected " + shape_text(t.sizes()));
  }
  for (const auto& [name, t] : targets)
    if (!sent.count(name))
      problem("missing tensor " + squote(name) + " (" +
              (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " +
                                 shape_text(t.sizes())
                           : std::string("undefined")) +
              "): the sender did not send it");
  if (problems.empty())
    return;
  std::string msg = "weight transfer of version " + std::to_string(version) + " rejected (" +
                    std::to_string(count) + (count == 1 ? " problem" : " problems") +
                    "; weights unchanged): ";
  for (std::size_t i = 0; i < problems.size(); ++i)
    msg += (i ? "; " : "") + problems[i];
  if (count > problems.size())
    msg += "; and " + std::to_string(count - problems.size()) + " more";
  fail(error_code::invalid_argument, msg);
}

void validate(const transport_options& opts, const char* who) {
  if (opts.bucket_bytes == 0)
    fail(error_code::invalid_argument, std::string(who) + ": bucket_bytes must be > 0, got 0");
  if (opts.timeout.count() <= 0)
    fail(error_code::invalid_argument, std::string(who) + ": timeout must be > 0 ms, got " +
                                           std::to_string(opts.timeout.count()) + " ms");
}

weight_sender::~weight_sender() = default;
weight_receiver::~weight_receiver() = default;

namespace detail {

named_tensors sender_sources(const named_tensors& weights, std::uint64_t version,
                             c10::Device device, const char* who) {
  if (version == 0)
    fail(error_code::invalid_argument,
         std::string(who) + ": version must be >= 1 (0 means 'nothing received'), got 0");
  named_tensors out;
  out.reserve(weights.size());
  for (const auto& [name, t] : weights) {
    if (t.defined() && t.device() != device)
      fail(error_code::invalid_argument, std::string(who) + ": tensor " + squote(name) +
                                             " is on " + t.device().str() + ", expected " +
                                             device.str());
    if (t.defined() && t.layout() == at::kStrided && !t.is_contiguous())
      out.emplace_back(name, t.contiguous());
    else
      out.emplace_back(name, t);
  }
  return out;
}

std::vector<at::Tensor> targets_in_manifest_order(const weight_manifest& m,
                                                  const named_tensors& targets) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : targets)
    by_name.emplace(name, &t);
  std::vector<at::Tensor> out;
  out.reserve(m.tensors.size());
  for (const auto& s : m.tensors)
    out.push_back(*by_name.at(s.name));
  return out;
}


} // namespace detail

std::uint64_t bucket_bytes_for_link(double bytes_per_second, std::uint64_t total_bytes) {
  if (!std::isfinite(bytes_per_second) || bytes_per_second < 0)
    fail(error_code::invalid_argument, "bucket_bytes_for_link: the link rate must be a finite "
                                       "number >= 0 bytes/s, got " +
                                           std::to_string(bytes_per_second));
  constexpr std::uint64_t mib = std::uint64_t{1} << 20, grain = std::uint64_t{64} << 10;
  if (bytes_per_second == 0)
    return 4 * mib;
  auto bytes = static_cast<std::uint64_t>(std::min(bytes_per_second * 0.002, 64.0 * mib));
  bytes = std::min(bytes, total_bytes / 4);
  bytes = std::max(bytes, mib);
  return bytes / grain * grain;
}

} // namespace rlforge::backends
