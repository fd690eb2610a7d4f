#include "actors/actor_kind.hpp"

#include <algorithm>
#include <mutex>

#include "backends/collective_group.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

rank_context::rank_context() = default;
rank_context::~rank_context() = default;
rank_context::rank_context(rank_context&&) noexcept = default;
rank_context& rank_context::operator=(rank_context&&) noexcept = default;

uint64_t rank_context::defer_reply() {
  deferred_ticket = ++next_ticket;
  return *deferred_ticket;
}

void rank_context::deliver(uint64_t ticket, caf::expected<caf::message> result) {
  deliveries.emplace_back(ticket, std::move(result));
}

kind_state* state_of(rank_context& ctx) {
  return ctx.state.get();
}

namespace {

struct kind_table {
  std::mutex mx;
  std::map<std::string, actor_kind> kinds;
};

kind_table& table() {
  static kind_table t;
  return t;
}

} // namespace

namespace {

/// The op of another name that already has `op`'s id, among the built-in ops and `kinds`.
const rank_op* id_taken(const rank_op& op, const std::map<std::string, actor_kind>& kinds,
                        const std::string& except) {
  if (auto b = builtin_ops().find(op.id); b != builtin_ops().end() && b->second.name != op.name)
    return &b->second;
  for (const auto& [name, k] : kinds)
    if (name != except)
      if (auto i = k.ops.find(op.id); i != k.ops.end() && i->second.name != op.name)
        return &i->second;
  return nullptr;
}

[[noreturn]] void refuse(const actor_kind& kind, const std::string& why) {
  backends::fail(backends::error_code::internal, "actor kind '" + kind.name + "': " + why);
}

} // namespace

void register_kind(actor_kind kind) {
  if (kind.spawn == nullptr)
    refuse(kind, "it has no typed interface (actor_kind::implements<rank_interface<...>>)");
  for (size_t i = 0; i < kind.interface_ids.size(); ++i) {
    const auto id = kind.interface_ids[i];
    if (std::count(kind.interface_ids.begin(), kind.interface_ids.begin() + i, id) > 0)
      refuse(kind, "its interface lists the id <" + caf::to_string(id) + "> twice");
    if (kind.ops.count(id) == 0)
      refuse(kind, "its interface lists op <" + caf::to_string(id) + "> and it has no such op");
  }
  for (const auto& [id, op] : kind.ops) {
    if (std::find(kind.interface_ids.begin(), kind.interface_ids.end(), id) ==
        kind.interface_ids.end())
      refuse(kind, "op '" + op.name + "' <" + caf::to_string(id) + "> is not in its interface");
    if (builtin_ops().count(id) > 0)
      refuse(kind, "op '" + op.name + "' <" + caf::to_string(id) +
                       "> has the id of a built-in op of every rank");
  }
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  for (const auto& [id, op] : kind.ops)
    if (const auto* other = id_taken(op, t.kinds, kind.name))
      refuse(kind, "op '" + op.name + "' has the id <" + caf::to_string(id) + "> of op '" +
                       other->name + "'");
  auto name = kind.name;
  t.kinds[name] = std::move(kind);
}

std::string op_name(caf::atom_value id) {
  if (auto b = builtin_ops().find(id); b != builtin_ops().end())
    return b->second.name;
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  for (const auto& [_, k] : t.kinds)
    if (auto i = k.ops.find(id); i != k.ops.end())
      return i->second.name;
  return caf::to_string(id);
}

caf::expected<actor_kind> find_kind(const std::string& name) {
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  auto i = t.kinds.find(name);
  if (i != t.kinds.end())
    return i->second;
  std::string known;
  for (auto& [k, _] : t.kinds)
    known += (known.empty() ? "" : ", ") + k;
  return make_error(errc::not_found,
                    "unknown actor kind '" + name + "' (registered: " + known + ")");
}

std::vector<std::string> kind_names() {
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  std::vector<std::string> out;
  for (auto& [k, _] : t.kinds)
    out.push_back(k);
  return out;
}

namespace {

/// "<kind>.<op><<id>>(<arguments>) -> (<results>)"; an untyped answer reads "-> message".
std::string interface_line(const std::string& kind, const rank_op& op) {
  return kind + "." + op.name + "<" + caf::to_string(op.id) + ">(" + op.signature + ") -> " +
         (op.result == "message" ? op.result : "(" + op.result + ")");
}

} // namespace

std::vector<std::string> kind_interfaces() {
  std::vector<std::string> out;
  for (const auto& [_, op] : builtin_ops())
    out.push_back(interface_line("rank", op));
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  for (const auto& [kind, k] : t.kinds) {
    out.push_back(kind);
    for (const auto& [_, op] : k.ops)
      out.push_back(interface_line(kind, op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace rlforge::actors
