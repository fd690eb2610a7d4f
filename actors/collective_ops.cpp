#include "actors/collective_ops.hpp"

#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "actors/rank_actor.hpp"
#include "actors/rank_device.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/tensor_convert.hpp"
#include "actors/weight_sync.hpp"
#include "backends/collective_group.hpp"
#include "backends/error.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace {

using backends::error_code;
using backends::fail;

/// In-process stores by group: every rank of a local group must get the same one.
struct local_stores {
  std::mutex mx;
  std::map<std::string, backends::store_handle> by_name;
};

local_stores& stores() {
  static local_stores s;
  return s;
}

backends::store_handle local_store(const std::string& name) {
  auto& s = stores();
  std::lock_guard<std::mutex> guard{s.mx};
  auto i = s.by_name.find(name);
  if (i == s.by_name.end())
    i = s.by_name.emplace(name, backends::make_in_process_store()).first;
  return i->second;
}

std::vector<at::Tensor> to_tensors(const tensor_list& blobs) {
  std::vector<at::Tensor> out;
  out.reserve(blobs.size());
  for (size_t i = 0; i < blobs.size(); ++i) {
    auto t = from_blob(blobs[i]);
    if (!t)
      fail(error_code::invalid_argument,
           "tensor " + std::to_string(i) + ": " + error_message(t.error()));
    out.push_back(std::move(*t));
  }
  return out;
}

tensor_list to_blobs(const std::vector<at::Tensor>& ts) {
  tensor_list out;
  out.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    auto blob = to_blob(ts[i]);
    if (!blob)
      fail(error_code::internal,
           "tensor " + std::to_string(i) + " after the collective: " + error_message(blob.error()));
    out.push_back(std::move(*blob));
  }
  return out;
}

/// The wire's host tensors where the group reduces them: the rank's CUDA device for NCCL.
std::vector<at::Tensor> on_group_device(const backends::collective_group& group,
                                        const rank_context& ctx, std::vector<at::Tensor> ts) {
  if (group.options().backend == "nccl")
    for (auto& t : ts)
      t = t.to(compute_device(ctx.info));
  return ts;
}

std::vector<at::Tensor> on_host(std::vector<at::Tensor> ts) {
  for (auto& t : ts)
    t = t.to(at::kCPU);
  return ts;
}

backends::collective_group& require_group(rank_context& ctx, const std::string& op) {
  if (!ctx.collective)
    fail(error_code::invalid_argument,
         op + " before init_collective: this group was spawned without collectives");
  return *ctx.collective;
}

} // namespace

void release_local_store(const std::string& name) {
  auto& s = stores();
  std::lock_guard<std::mutex> guard{s.mx};
  s.by_name.erase(name);
}

caf::expected<no_values> init_collective_op(rank_context& ctx, const collective_spec& spec) {
  if (spec.timeout_ms <= 0)
    fail(error_code::invalid_argument,
         "collective timeout must be > 0 ms, got " + std::to_string(spec.timeout_ms));
  backends::collective_options opts;
  // Ranks on CUDA devices reduce their device tensors with NCCL; the others with Gloo.
  if (compute_device(ctx.info).is_cuda())
    opts.backend = "nccl";
  opts.timeout = std::chrono::milliseconds{spec.timeout_ms};
  opts.group_name = spec.name;
  if (spec.store == "local") {
    ctx.collective = backends::collective_group::create(local_store(spec.name), ctx.info.rank,
                                                        ctx.info.world_size, opts);
  } else if (spec.store == "actor") {
    // Ranks in several processes meet through the group's store actor (in the driver's
    // process, reached over the cluster's connections); each binds its Gloo pairs to its own
    // node's advertised address.
    opts.interface_host = advertised_address();
    auto store = connect_rendezvous_store(spec.store_actor, opts.timeout);
    ctx.collective =
        backends::collective_group::create(store, ctx.info.rank, ctx.info.world_size, opts);
  } else {
    fail(error_code::invalid_argument,
         "unknown collective store '" + spec.store + "' (expected local or actor)");
  }
  return no_values{};
}

caf::expected<tensor_list> all_reduce_op(rank_context& ctx, const tensor_list& tensors) {
  auto& group = require_group(ctx, rank_ops::all_reduce.name);
  auto ts = on_group_device(group, ctx, to_tensors(tensors));
  group.all_reduce_sum(ts);
  return to_blobs(on_host(ts));
}

caf::expected<tensor_list> broadcast_op(rank_context& ctx, const tensor_list& tensors,
                                         const int32_t& root) {
  auto& group = require_group(ctx, rank_ops::broadcast.name);
  auto ts = on_group_device(group, ctx, to_tensors(tensors));
  group.broadcast(ts, root);
  return to_blobs(on_host(ts));
}

} // namespace rlforge::actors
