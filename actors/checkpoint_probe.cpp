#include "actors/checkpoint_probe.hpp"

#include <filesystem>
#include <system_error>

#include "actors/actor_kind.hpp"
#include "actors/weight_sync.hpp"
#include "backends/error.hpp"
#include "backends/train/checkpoint.hpp"

namespace rlforge::actors {

caf::expected<no_values> checkpoint_visible_op(rank_context& ctx, const std::string& root,
                                                  const int64_t& global_step,
                                                  const std::string& role) {
  namespace be = rlforge::backends;
  be::checkpoint_location where{root, global_step, role, ctx.info.rank, ctx.info.world_size};
  where.validate();
  auto meta = std::filesystem::path{be::rank_directory(where)} / "meta.json";
  std::error_code ec;
  if (!std::filesystem::exists(meta, ec))
    be::fail(be::error_code::not_found,
             "checkpoint file '" + meta.string() + "' is not visible on node '"
               + ctx.info.node_id + "' (address " + this_process().address
               + "): every rank must see its own rank directory, either on a file system shared "
                 "by all nodes or in a per-node directory at the same path on the node the rank "
                 "runs on (ranks keep their placement order, so rank "
               + std::to_string(ctx.info.rank) + " needs it on its node)");
  return no_values{};
}

} // namespace rlforge::actors
