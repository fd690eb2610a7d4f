#include "runtime/cluster_protocol.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/deep_to_string.hpp>

#include "runtime/type_registry.hpp"

#ifndef RLFORGE_VERSION_STRING
#error "RLFORGE_VERSION_STRING must be defined by the build (runtime/CMakeLists.txt)"
#endif

namespace rlforge {

namespace {

template <class... Ts>
void describe_types(std::vector<std::string>& out, caf::detail::type_list<Ts...>) {
  size_t i = 0;
  // A default value's rendering lists its fields in order (their types show in their
  // defaults), so a field added, removed or retyped changes the line.
  ((out.push_back(std::string{runtime::message_type_names[i++]} + ": "
                  + caf::deep_to_string(Ts{}))),
   ...);
}

template <class Handle>
void describe_interface(std::vector<std::string>& out, const caf::actor_system& sys,
                        const char* name) {
  std::string line = std::string{"interface "} + name + ":";
  for (auto& sig : sys.message_types<Handle>())
    line += " " + sig;
  out.push_back(std::move(line));
}

} // namespace

const char* rlforge_version() noexcept {
  return RLFORGE_VERSION_STRING;
}

std::vector<std::string> wire_signature(const caf::actor_system& sys) {
  std::vector<std::string> out;
  describe_types(out, runtime::message_types{});
  describe_interface<node_agent_actor>(out, sys, "node_agent_actor");
  describe_interface<head_actor>(out, sys, "head_actor");
  describe_interface<rendezvous_store_actor>(out, sys, "rendezvous_store_actor");
  return out;
}

std::string describe_mismatch(const std::string& peer, const std::string& self,
                              const std::string& peer_version,
                              const std::vector<std::string>& peer_wire,
                              const std::vector<std::string>& own_wire) {
  if (peer_version != rlforge_version())
    return peer + " runs rlforge " + peer_version + ", the " + self + " runs "
           + rlforge_version() + "; build both from the same version";
  auto head_of = [](const std::string& line) { return line.substr(0, line.find(": ")); };
  for (size_t i = 0; i < std::max(peer_wire.size(), own_wire.size()); ++i) {
    if (i < peer_wire.size() && i < own_wire.size() && peer_wire[i] == own_wire[i])
      continue;
    if (i >= peer_wire.size())
      return peer + " lacks '" + head_of(own_wire[i]) + "' that the " + self
             + " has (another build of rlforge " + peer_version + ")";
    if (i >= own_wire.size())
      return peer + " has '" + head_of(peer_wire[i]) + "' that the " + self
             + " lacks (another build of rlforge " + peer_version + ")";
    return peer + " differs in " + head_of(own_wire[i]) + ": " + peer + " has '" + peer_wire[i]
           + "', the " + self + " has '" + own_wire[i] + "' (another build of rlforge "
           + peer_version + ")";
  }
  return {};
}

} // namespace rlforge
