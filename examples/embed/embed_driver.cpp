// A tiny driver on the installed rlforge package: one local node, a placement group, an actor
// group of three ranks of a kind defined here, a mesh call (each rank sums the cubes of its
// chunk) and a Gloo all-reduce of the partial sums, checked against a direct computation.
//
//   embed_driver        prints the sums and "embed: ok", exits 0 (1 on a mismatch, 2 on error)
#include <cstdio>
#include <iostream>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rank_interface.hpp"
#include "actors/tensor_convert.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;

namespace {

struct failed {
  std::string what;
};

template <class T>
T value(caf::actor_system& sys, caf::expected<T> x, const char* what) {
  if (!x)
    throw failed{std::string(what) + ": " + sys.render(x.error())};
  return std::move(*x);
}

/// Rank kind "embed.cubes": `sum_cubes` (tensor_list{chunk}) → tensor_list{[Σ chunk³]}, declared
/// once with its wire id and types; the kind's typed interface lists it.
constexpr op_ref<tensor_list(tensor_list)> sum_cubes_op{"sum_cubes", caf::atom("sum_cubes")};
using cubes_interface = rank_interface<sum_cubes_op>;

caf::expected<tensor_list> sum_cubes(rank_context&, const tensor_list& in) {
  caf::expected<at::Tensor> chunk = in.empty() ? make_error(errc::invalid_argument, "no tensor")
                                               : from_blob(in.front());
  if (!chunk)
    return chunk.error();
  auto out = to_blob(chunk->pow(3).sum().reshape({1}));
  if (!out)
    return out.error();
  return tensor_list{std::move(*out)};
}

} // namespace

int main(int argc, char** argv) {
  runtime::system_config cfg;
  cfg.gpus = 1;
  if (auto err = cfg.parse_all(argc, argv)) {
    std::cerr << "embed: " << to_string(err) << "\n";
    return 2;
  }
  actor_kind cubes;
  cubes.name = "embed.cubes";
  cubes.implements<cubes_interface>();
  cubes.add(context_op(sum_cubes_op, sum_cubes, {"chunk"}));
  register_kind(std::move(cubes));
  caf::actor_system sys{cfg};
  auto manager = spawn_placement_manager(sys, {local_node(cfg)}, std::chrono::seconds(10));
  int status = 0;
  try {
    placement_client pgs{sys, manager};
    auto pg = value(sys, pgs.create({"embed", {{{"GPU", 1}, {"CPU", 1}}}, "strict_pack", 10}),
                    "placement group");
    group_spec spec;
    spec.name = "cubes";
    spec.kind = "embed.cubes";
    spec.placement = pg;
    spec.num_ranks = 3;
    spec.threads_per_rank = 1;
    spec.placement_manager = manager;
    auto group = value(sys, actor_group::spawn(sys, spec), "actor group");
    auto batch = at::arange(1, 31, at::kFloat); // 1..30
    std::vector<caf::message> chunks;
    for (auto& c : batch.chunk(3))
      chunks.push_back(sum_cubes_op.args(tensor_list{value(sys, to_blob(c), "to_blob")}));
    auto partials =
        value(sys, group.call_mesh(sum_cubes_op, chunks, std::chrono::seconds(30)), "mesh call");
    std::vector<caf::message> reduce_in;
    for (auto& p : partials)
      reduce_in.push_back(rank_ops::all_reduce.args(p));
    auto reduced =
        value(sys, group.call_mesh(rank_ops::all_reduce, reduce_in, std::chrono::seconds(30)),
              "all-reduce");
    const double expected = batch.pow(3).sum().item<double>();
    for (auto& r : reduced) {
      auto t = value(sys, from_blob(r.at(0)), "from_blob");
      std::printf("rank sum %.0f\n", t.item<double>());
      if (t.item<double>() != expected)
        status = 1;
    }
    std::printf("direct %.0f\nembed: %s\n", expected, status == 0 ? "ok" : "MISMATCH");
    group.stop();
  } catch (const failed& f) {
    std::cerr << "embed: " << f.what << "\n";
    status = 2;
  }
  caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
  return status;
}
