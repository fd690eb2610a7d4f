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

void register_kind(actor_kind kind) {
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  auto name = kind.name;
  t.kinds[name] = std::move(kind);
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

/// "<kind>.<op>(<arguments>) -> (<results>)"; an untyped answer reads "-> message".
std::string interface_line(const std::string& kind, const std::string& name, const rank_op& op) {
  return kind + "." + name + "(" + op.signature + ") -> " +
         (op.result == "message" ? op.result : "(" + op.result + ")");
}

} // namespace

std::vector<std::string> kind_interfaces() {
  std::vector<std::string> out;
  for (const auto& [name, op] : builtin_ops())
    out.push_back(interface_line("rank", name, op));
  auto& t = table();
  std::lock_guard<std::mutex> guard{t.mx};
  for (const auto& [kind, k] : t.kinds) {
    out.push_back(kind);
    for (const auto& [name, op] : k.ops)
      out.push_back(interface_line(kind, name, op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace rlforge::actors
