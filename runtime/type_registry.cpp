#include "runtime/type_registry.hpp"

#include "runtime/errc.hpp"

namespace rlforge::runtime {

const char* const message_type_names[] = {
    "rlforge::tensor_blob",
    "rlforge::node_resources",
    "rlforge::placement_group_request",
    "rlforge::bundle_placement",
    "rlforge::placement_group_info",
    "rlforge::rank_info",
    "rlforge::collective_spec",
    "rlforge::op_result",
    "rlforge::resource_amounts",
    "std::vector<int32_t>",
    "std::vector<int64_t>",
    "std::vector<float>",
    "std::vector<double>",
    "std::vector<caf::message>",
    "std::vector<uint8_t>",
    "rlforge::batch_payload",
    "rlforge::loss_request",
    "rlforge::batch_result",
    "rlforge::adam_params",
    "rlforge::optim_result",
    "rlforge::model_spec",
    "rlforge::algorithm_config",
    "rlforge::tensor_map",
    "rlforge::sample_request",
    "rlforge::sample_output",
    "rlforge::weight_sync_spec",
    "rlforge::node_join_request",
    "rlforge::join_reply",
    "rlforge::driver_hello",
    "rlforge::node_endpoint",
    "rlforge::node_heartbeat",
    "rlforge::group_record",
    "rlforge::node_agent_actor",
    "rlforge::head_actor",
    "rlforge::generation_result",
    "rlforge::engine_options",
    "rlforge::rollout",
    "rlforge::rollout_batch",
    "rlforge::rollout_state",
    "rlforge::rendezvous_store_actor",
    "rlforge::checked_request",
    "rlforge::tinker_pass_result",
};

namespace {

template <class... Ts>
void add_all(caf::actor_system_config& cfg, caf::detail::type_list<Ts...>) {
  static_assert(sizeof(message_type_names) / sizeof(message_type_names[0]) == sizeof...(Ts),
                "message_type_names and message_types must have the same length");
  size_t i = 0;
  (cfg.add_message_type<Ts>(message_type_names[i++]), ...);
}

} // namespace

void register_types(caf::actor_system_config& cfg) {
  cfg.add_error_category(errc_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    return render_errc(code, ctx);
  });
  add_all(cfg, message_types{});
}

} // namespace rlforge::runtime
