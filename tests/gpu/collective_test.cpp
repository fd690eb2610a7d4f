// NCCL collective groups on a CUDA device. One GPU allows one NCCL rank (NCCL refuses two ranks
// on one device), so the group has world size 1: rendezvous, all-reduce and broadcast of fp32
// and bf16 tensors, bucketed multi-tensor calls, and the refusals of tensors NCCL cannot take.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backends/collective_group.hpp"
#include "backends/error.hpp"
#include "gpu_support.hpp"

using namespace rlforge;
namespace be = rlforge::backends;

namespace {

std::unique_ptr<be::collective_group> nccl_group(const std::string& name) {
  be::collective_options o;
  o.backend = "nccl";
  o.group_name = name;
  o.timeout = std::chrono::milliseconds(60000);
  return be::collective_group::create(be::make_in_process_store(), 0, 1, o);
}

} // namespace

TEST(GpuCollective, NcclWorldOneReducesAndBroadcastsOnTheDevice) {
  RLFORGE_REQUIRE_CUDA();
  auto g = nccl_group("nccl_world_one");
  const auto on = at::TensorOptions().device(gpu_test::cuda0());
  auto t = at::arange(0, 1000, on.dtype(at::kFloat));
  g->all_reduce_sum(t);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(0, 1000, at::kFloat)));
  auto b = at::arange(0, 64, on.dtype(at::kFloat)).to(at::kBFloat16);
  g->broadcast(b, 0);
  EXPECT_TRUE(at::equal(b.cpu(), at::arange(0, 64, at::kFloat).to(at::kBFloat16)));
  // Several tensors in buckets (smaller than one of them).
  std::vector<at::Tensor> many;
  for (int64_t i = 1; i <= 5; ++i)
    many.push_back(at::full({i * 1000}, static_cast<double>(i), on.dtype(at::kFloat)));
  g->all_reduce_sum(many);
  for (int64_t i = 1; i <= 5; ++i)
    EXPECT_TRUE(at::equal(many[static_cast<size_t>(i - 1)].cpu(),
                          at::full({i * 1000}, static_cast<double>(i), at::kFloat)));
  g->barrier();
}

TEST(GpuCollective, NcclRefusesHostTensorsByName) {
  RLFORGE_REQUIRE_CUDA();
  auto g = nccl_group("nccl_refusals");
  auto host = at::ones({8}, at::kFloat);
  try {
    g->all_reduce_sum(host);
    ADD_FAILURE() << "a host tensor went to NCCL";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("the nccl backend takes CUDA tensors"), std::string::npos)
        << e.what();
  }
  // The group is still usable after a refused call.
  auto t = at::ones({8}, at::TensorOptions().device(gpu_test::cuda0()));
  g->all_reduce_sum(t);
  EXPECT_EQ(t.sum().item<double>(), 8.0);
}
