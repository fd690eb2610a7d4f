#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/detail/type_list.hpp>
#include <caf/message.hpp>

#include "runtime/cluster_protocol.hpp"
#include "runtime/messages.hpp"

namespace rlforge::runtime {

/// Every type that may appear in a message between actors on different nodes, beyond CAF's
/// builtins. The one list: `register_types` registers each, and the loopback round-trip test
/// sends a value of each across a real connection.
using message_types = caf::detail::type_list<
    tensor_blob, node_resources, placement_group_request, bundle_placement, placement_group_info,
    rank_info, collective_spec, op_result, resource_amounts, std::vector<int32_t>,
    std::vector<int64_t>, std::vector<float>, std::vector<double>, std::vector<caf::message>,
    std::vector<uint8_t>, batch_payload, loss_request, batch_result, tinker::adam_params,
    optim_result, model_spec, algorithm_config, tensor_map, sample_request, sample_output,
    weight_sync_spec, node_join_request, join_reply, driver_hello, node_endpoint, node_heartbeat,
    group_record, node_agent_actor, head_actor, generation_result, engine_options, rollout,
    rollout_batch, rollout_state, rendezvous_store_actor, tinker::checked_request,
    tinker_pass_result>;

/// The CAF name of each type in `message_types` (same order).
extern const char* const message_type_names[];

/// Registers the `rlforge` error category and every type in `message_types` (and, through CAF,
/// `std::vector<T>` of each). Called by `system_config`'s constructor; idempotent.
void register_types(caf::actor_system_config& cfg);

} // namespace rlforge::runtime
