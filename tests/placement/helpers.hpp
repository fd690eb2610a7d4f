#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "placement/cluster.hpp"
#include "placement/request.hpp"
#include "placement/resources.hpp"
#include "placement/scheduler.hpp"

namespace rlforge::placement::test_support {

/// A resource set that must be valid; fails the test otherwise.
inline resource_set res(std::initializer_list<std::pair<std::string_view, double>> amounts) {
  auto r = make_resources(amounts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : resource_set{};
}

/// A node with whole GPUs and CPUs.
inline node_spec gpu_node(std::string id, int gpus, double cpus = 64) {
  auto n = make_node(std::move(id), gpus, cpus);
  EXPECT_TRUE(n.ok()) << (n.ok() ? "" : n.error().message);
  return n.ok() ? n.value() : node_spec{};
}

/// A request; bundles as written, strategy by value.
inline placement_request req(placement_strategy s, std::vector<resource_set> bundles) {
  return placement_request{s, std::move(bundles)};
}

/// n copies of one bundle.
inline std::vector<resource_set> repeat(std::size_t n, const resource_set& bundle) {
  return std::vector<resource_set>(n, bundle);
}

/// A cluster from node specs that must be valid.
inline cluster_state cluster_of(const std::vector<node_spec>& nodes) {
  cluster_state c;
  for (const auto& n : nodes) {
    auto ok = c.add_node(n);
    EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  }
  return c;
}

/// Number of distinct nodes used by placed bundles.
inline std::size_t distinct_nodes(const std::vector<placed_bundle>& bundles) {
  std::vector<std::string> seen;
  for (const auto& b : bundles) {
    bool found = false;
    for (const auto& s : seen)
      found = found || s == b.node_id;
    if (!found)
      seen.push_back(b.node_id);
  }
  return seen.size();
}

/// Checks an error's code and that its message contains `needle` (the bad value).
inline ::testing::AssertionResult error_names(const placement_error& e, placement_errc code,
                                              const std::string& needle) {
  if (e.code != code)
    return ::testing::AssertionFailure()
           << "code " << to_string(e.code) << " != " << to_string(code) << ": " << e.message;
  if (e.message.find(needle) == std::string::npos)
    return ::testing::AssertionFailure()
           << "'" << e.message << "' does not name '" << needle << "'";
  return ::testing::AssertionSuccess();
}

} // namespace rlforge::placement::test_support
