#pragma once

// Plain-data message types that cross actor and node boundaries. Every type here has a CAF 0.17
// `inspect` overload and is registered once, in `runtime/type_registry.cpp` (the list
// `message_types` below); tests/runtime/message_roundtrip_test.cpp sends each across a real
// loopback connection.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>

#include "runtime/tensor_blob.hpp"

namespace rlforge {

/// Named resource amounts as the user writes them ({"GPU": 0.2, "CPU": 1}).
using resource_amounts = std::map<std::string, double>;

/// What one node offers: CPUs, memory and GPUs (real CUDA devices or virtual ones).
struct node_resources {
  std::string node_id;
  int32_t cpus = 0;
  int64_t memory_bytes = 0;
  int32_t gpus = 0;
  bool virtual_gpus = true; ///< true: actors on these "GPUs" compute on the CPU
  std::map<std::string, double> custom;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_resources& x) {
  return f(caf::meta::type_name("node_resources"), x.node_id, x.cpus, x.memory_bytes, x.gpus,
           x.virtual_gpus, x.custom);
}

inline bool operator==(const node_resources& a, const node_resources& b) {
  return a.node_id == b.node_id && a.cpus == b.cpus && a.memory_bytes == b.memory_bytes
         && a.gpus == b.gpus && a.virtual_gpus == b.virtual_gpus && a.custom == b.custom;
}

/// A request for a placement group: bundles of resources and a strategy name
/// (`pack`, `spread`, `strict_pack`, `strict_spread`).
struct placement_group_request {
  std::string name;
  std::vector<resource_amounts> bundles;
  std::string strategy = "pack";
  double timeout_s = 0; ///< 0 = the manager's default (RLFORGE_PG_TIMEOUT_S, 180 s)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_group_request& x) {
  return f(caf::meta::type_name("placement_group_request"), x.name, x.bundles, x.strategy,
           x.timeout_s);
}

inline bool operator==(const placement_group_request& a, const placement_group_request& b) {
  return a.name == b.name && a.bundles == b.bundles && a.strategy == b.strategy
         && a.timeout_s == b.timeout_s;
}

/// One placed bundle: where it is and which devices it owns.
struct bundle_placement {
  uint32_t bundle_index = 0; ///< index in the request
  std::string node_id;
  std::vector<int32_t> device_ids;
  resource_amounts resources;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, bundle_placement& x) {
  return f(caf::meta::type_name("bundle_placement"), x.bundle_index, x.node_id, x.device_ids,
           x.resources);
}

inline bool operator==(const bundle_placement& a, const bundle_placement& b) {
  return a.bundle_index == b.bundle_index && a.node_id == b.node_id
         && a.device_ids == b.device_ids && a.resources == b.resources;
}

/// A placed group: its bundles ordered by (node, device), so rank i → bundles[i].
struct placement_group_info {
  std::string name;
  std::string strategy;
  std::vector<bundle_placement> bundles;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_group_info& x) {
  return f(caf::meta::type_name("placement_group_info"), x.name, x.strategy, x.bundles);
}

inline bool operator==(const placement_group_info& a, const placement_group_info& b) {
  return a.name == b.name && a.strategy == b.strategy && a.bundles == b.bundles;
}

/// What a rank of an actor group knows about itself.
struct rank_info {
  std::string group;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string node_id;
  std::vector<int32_t> device_ids;
  double gpu_fraction = 0; ///< share of the bundle's GPU this rank holds (0.2 when colocated)
  int32_t threads = 1;     ///< torch intra-op threads this rank uses
  bool virtual_gpu = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rank_info& x) {
  return f(caf::meta::type_name("rank_info"), x.group, x.rank, x.world_size, x.node_id,
           x.device_ids, x.gpu_fraction, x.threads, x.virtual_gpu);
}

inline bool operator==(const rank_info& a, const rank_info& b) {
  return a.group == b.group && a.rank == b.rank && a.world_size == b.world_size
         && a.node_id == b.node_id && a.device_ids == b.device_ids
         && a.gpu_fraction == b.gpu_fraction && a.threads == b.threads
         && a.virtual_gpu == b.virtual_gpu;
}

/// How the ranks of a group rendezvous for collectives: in one process through a named
/// in-process store, or across processes through a TCP store hosted by rank 0.
struct collective_spec {
  std::string store = "local"; ///< "local" or "tcp"
  std::string name;            ///< unique per group (the in-process store key)
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int64_t timeout_ms = 30000;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, collective_spec& x) {
  return f(caf::meta::type_name("collective_spec"), x.store, x.name, x.host, x.port,
           x.timeout_ms);
}

inline bool operator==(const collective_spec& a, const collective_spec& b) {
  return a.store == b.store && a.name == b.name && a.host == b.host && a.port == b.port
         && a.timeout_ms == b.timeout_ms;
}

/// The reply of one rank to one op: whatever the op returned, as one message. (A bare
/// `caf::message` reply would be flattened into the response itself.)
struct op_result {
  caf::message value;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_result& x) {
  return f(caf::meta::type_name("op_result"), x.value);
}

inline bool operator==(const op_result& a, const op_result& b) {
  return to_string(a.value) == to_string(b.value);
}

/// A list of tensors (a batch chunk, a gradient bucket) in wire form.
using tensor_list = std::vector<tensor_blob>;

} // namespace rlforge
