#include "actors/dispatcher.hpp"

#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/batch_wire.hpp"
#include "actors/protocol.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

namespace {

struct role_entry {
  caf::actor group;
  int32_t world_size = 1;
};

struct dispatcher_state {
  std::map<std::string, role_entry> roles;
  static const char* name;
};

const char* dispatcher_state::name = "rlforge.dispatcher";

using self_ptr = caf::stateful_actor<dispatcher_state>*;

std::string prefix(const std::string& role, const std::string& op) {
  return "dispatcher role '" + role + "' op '" + op + "'";
}

/// Re-labels an error with the dispatcher's context (the group's own message names the rank).
caf::error wrap(self_ptr self, const std::string& role, const std::string& op,
                const caf::error& err) {
  if (err.category() == errc_category)
    return make_error(static_cast<errc>(err.code()),
                      prefix(role, op) + ": " + error_message(err));
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout, prefix(role, op) + ": the group did not answer in time");
  if (err == caf::sec::request_receiver_down)
    return make_error(errc::rank_failed, prefix(role, op) + ": the group is gone");
  return make_error(errc::rank_failed, prefix(role, op) + ": " + self->system().render(err));
}

std::string role_list(const dispatcher_state& st) {
  std::string out;
  for (auto& [name, _] : st.roles)
    out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

bool is_batch_op(const std::string& op) {
  return op == "forward" || op == "forward_backward";
}

caf::result<op_result> batch_call(self_ptr self, const role_entry& entry, const std::string& role,
                                  const std::string& op, const caf::message& args,
                                  int64_t timeout_ms) {
  bool ok = op == "forward" ? args.match_elements<batch_payload>()
                            : args.match_elements<batch_payload, loss_request>();
  if (!ok)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": expects ("
                        + (op == "forward" ? "batch_payload" : "batch_payload, loss_request")
                        + "), got " + caf::to_string(args));
  const auto& payload = args.get_as<batch_payload>(0);
  auto rows = payload_rows(payload);
  if (!rows)
    return make_error(errc::invalid_argument, prefix(role, op) + ": " + error_message(rows.error()));
  if (*rows - payload.pad_size < 1)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": empty batch (" + std::to_string(*rows)
                        + " rows, " + std::to_string(payload.pad_size) + " of them padding)");
  std::vector<caf::message> chunks;
  int64_t added = 0;
  if (entry.world_size == 1) {
    chunks.push_back(args); // shares the payload: no copy
  } else {
    auto padded = pad_payload(payload, entry.world_size);
    if (!padded)
      return make_error(errc::invalid_argument,
                        prefix(role, op) + ": " + error_message(padded.error()));
    added = padded->pad_size - payload.pad_size;
    auto shards = shard_payload(*padded, entry.world_size);
    if (!shards)
      return make_error(errc::invalid_argument,
                        prefix(role, op) + ": " + error_message(shards.error()));
    for (auto& s : *shards) {
      if (op == "forward")
        chunks.push_back(caf::make_message(std::move(s)));
      else
        chunks.push_back(caf::make_message(std::move(s), args.get_as<loss_request>(1)));
    }
  }
  auto promise = self->make_response_promise<op_result>();
  self
    ->request(entry.group, std::chrono::milliseconds{timeout_ms + 1000}, mesh_atom::value, op,
              std::move(chunks), timeout_ms)
    .then(
      [=](std::vector<caf::message>& results) mutable {
        std::vector<batch_result> parts;
        parts.reserve(results.size());
        for (size_t r = 0; r < results.size(); ++r) {
          if (!results[r].match_elements<batch_result>()) {
            promise.deliver(make_error(errc::internal, prefix(role, op) + ": rank "
                                                         + std::to_string(r)
                                                         + " answered "
                                                         + caf::to_string(results[r])));
            return;
          }
          parts.push_back(std::move(results[r].get_mutable_as<batch_result>(0)));
        }
        if (parts.size() == 1 && added == 0) {
          promise.deliver(op_result{caf::make_message(std::move(parts[0]))});
          return;
        }
        auto merged = merge_results(parts, added);
        if (!merged)
          promise.deliver(make_error(errc::internal,
                                     prefix(role, op) + ": " + error_message(merged.error())));
        else
          promise.deliver(op_result{caf::make_message(std::move(*merged))});
      },
      [=](caf::error& err) mutable { promise.deliver(wrap(self, role, op, err)); });
  return promise;
}

caf::result<op_result> all_call(self_ptr self, const role_entry& entry, const std::string& role,
                                const std::string& op, const caf::message& args,
                                int64_t timeout_ms) {
  auto worker_op = op == "save_hf_model" ? std::string{"export_hf"} : op;
  auto promise = self->make_response_promise<op_result>();
  self
    ->request(entry.group, std::chrono::milliseconds{timeout_ms + 1000}, all_atom::value,
              worker_op, args, timeout_ms)
    .then(
      [=](std::vector<caf::message>& results) mutable {
        promise.deliver(op_result{results.empty() ? caf::message{} : std::move(results[0])});
      },
      [=](caf::error& err) mutable { promise.deliver(wrap(self, role, op, err)); });
  return promise;
}

caf::behavior dispatcher(self_ptr self) {
  return {
    [=](dispatcher_register_atom, const std::string& role,
        const caf::actor& group) -> caf::result<int32_t> {
      if (role.empty())
        return make_error(errc::invalid_argument, "dispatcher: a role name must not be empty");
      if (!group)
        return make_error(errc::invalid_argument,
                          "dispatcher: role '" + role + "' registered with an invalid group");
      auto promise = self->make_response_promise<int32_t>();
      self->request(group, std::chrono::seconds(30), ranks_atom::value)
        .then(
          [=](std::vector<rank_info>& ranks) mutable {
            if (ranks.empty()) {
              promise.deliver(make_error(errc::invalid_argument,
                                         "dispatcher: role '" + role + "' has no ranks"));
              return;
            }
            auto world = static_cast<int32_t>(ranks.size());
            self->state.roles[role] = role_entry{group, world};
            runtime::logger("actors.dispatch")->info("register role={} ranks={}", role, world);
            promise.deliver(world);
          },
          [=](caf::error& err) mutable {
            promise.deliver(wrap(self, role, "register", err));
          });
      return promise;
    },
    [=](dispatcher_call_atom, const std::string& role, const std::string& op,
        const caf::message& args, int64_t timeout_ms) -> caf::result<op_result> {
      auto& st = self->state;
      auto i = st.roles.find(role);
      if (i == st.roles.end())
        return make_error(errc::not_found, prefix(role, op) + ": no group registered for role '"
                                             + role + "' (registered: " + role_list(st) + ")");
      if (timeout_ms <= 0)
        return make_error(errc::invalid_argument, prefix(role, op) + ": timeout must be > 0 ms, got "
                                                    + std::to_string(timeout_ms));
      if (is_batch_op(op))
        return batch_call(self, i->second, role, op, args, timeout_ms);
      return all_call(self, i->second, role, op, args, timeout_ms);
    },
    [=](dispatcher_lcm_atom) {
      int32_t out = 1;
      for (auto& [_, e] : self->state.roles)
        out = std::lcm(out, e.world_size);
      return out;
    },
    [=](dispatcher_roles_atom) {
      std::vector<std::string> out;
      for (auto& [name, _] : self->state.roles)
        out.push_back(name);
      return out;
    },
  };
}

} // namespace

caf::actor spawn_dispatcher(caf::actor_system& sys) {
  return sys.spawn(dispatcher);
}

} // namespace rlforge::actors
