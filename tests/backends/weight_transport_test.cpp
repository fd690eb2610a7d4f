#include "backends/weights/weight_transport.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backends/collective_group.hpp"
#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "backends/weights/fake_transport.hpp"
#include "backends/weights/gloo_transport.hpp"
#include "backends/weights/in_process_transport.hpp"
#include "backends/weights/shm_transport.hpp"
#include "tests/backends/test_support.hpp"
#ifdef RLFORGE_WITH_CUDA
#include "backends/weights/nccl_transport.hpp"
#endif

using namespace rlforge::backends;
using namespace std::chrono_literals;
using rlforge::backends::testing::same_bits;

namespace {

// Bounds a failing test only; healthy transfers here take milliseconds.
constexpr std::chrono::milliseconds test_timeout{20000};

transport_options opts_with(std::uint64_t bucket_bytes = default_bucket_bytes,
                            std::chrono::milliseconds timeout = test_timeout) {
  transport_options o;
  o.bucket_bytes = bucket_bytes;
  o.timeout = timeout;
  return o;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <class F> error expect_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e;
  }
  ADD_FAILURE() << "expected rlforge::backends::error";
  return error(error_code::internal, "no error was thrown");
}

// A deterministic tensor whose values depend on `seed` and on every element's position.
at::Tensor pattern(std::vector<int64_t> shape, at::ScalarType dtype, double seed) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  auto v = at::arange(n, at::kDouble).mul(0.731 * seed + 0.1).sin().mul(3.0);
  return v.to(dtype).reshape(shape).contiguous();
}

// Assorted shapes (0-d, odd sizes that break 4-byte alignment, an empty tensor) and the
// dtypes an engine meets: fp32, bf16, f16.
named_tensors model_weights(double seed) {
  return {
    {"model.embed_tokens.weight", pattern({37, 16}, at::kFloat, seed)},
    {"model.layers.0.self_attn.q_proj.weight", pattern({16, 16}, at::kBFloat16, seed)},
    {"model.layers.0.input_layernorm.weight", pattern({17}, at::kHalf, seed)},
    {"model.layers.0.mlp.down_proj.weight", pattern({3, 5, 7}, at::kFloat, seed)},
    {"model.layers.0.scale", pattern({}, at::kFloat, seed)},
    {"model.layers.0.self_attn.q_proj.bias", pattern({1}, at::kBFloat16, seed)},
    {"model.empty", pattern({0, 4}, at::kFloat, seed)},
    {"lm_head.weight", pattern({5, 16}, at::kHalf, seed)},
  };
}

// Same names, shapes and dtypes, distinct values (the receiver's own, pre-sync weights).
named_tensors like(const named_tensors& w, double seed = 99.0) {
  named_tensors out;
  for (const auto& [name, t] : w)
    out.emplace_back(name, pattern(t.sizes().vec(), t.scalar_type(), seed));
  return out;
}

named_tensors deep_copy(const named_tensors& w) {
  named_tensors out;
  for (const auto& [name, t] : w)
    out.emplace_back(name, t.clone());
  return out;
}

::testing::AssertionResult same_weights(const named_tensors& a, const named_tensors& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " tensors";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first)
      return ::testing::AssertionFailure() << "name " << a[i].first << " vs " << b[i].first;
    if (!same_bits(a[i].second, b[i].second))
      return ::testing::AssertionFailure() << "tensor " << a[i].first << " differs";
  }
  return ::testing::AssertionSuccess();
}

named_tensors without(named_tensors w, const std::string& name) {
  w.erase(std::remove_if(w.begin(), w.end(), [&](const auto& p) { return p.first == name; }),
          w.end());
  return w;
}

// -- the transports under test -------------------------------------------------------------------

// One sender and its receivers. Groups come first so that they outlive the endpoints.
struct endpoints {
  std::vector<std::unique_ptr<collective_group>> groups;
  std::unique_ptr<weight_sender> sender;
  std::vector<std::unique_ptr<weight_receiver>> receivers;
};

struct in_process_kind {
  static constexpr int receivers = 1;
  static endpoints make(transport_options o) {
    auto ch = std::make_shared<in_process_channel>(o);
    endpoints e;
    e.sender = std::make_unique<in_process_sender>(ch);
    e.receivers.push_back(std::make_unique<in_process_receiver>(ch));
    return e;
  }
};

struct shm_kind {
  static constexpr int receivers = 1;
  static endpoints make(transport_options o) {
    auto [a, b] = make_socket_link_pair();
    endpoints e;
    e.sender = std::make_unique<shm_sender>(a, o);
    e.receivers.push_back(std::make_unique<shm_receiver>(b, o));
    return e;
  }
};

// Whole-segment mode: the segment holds the whole layout, written before the receiver reads.
struct shm_whole_kind {
  static constexpr int receivers = 1;
  static endpoints make(transport_options o) {
    auto [a, b] = make_socket_link_pair();
    shm_options whole;
    whole.ring_slot_bytes = 0;
    endpoints e;
    e.sender = std::make_unique<shm_sender>(a, o, whole);
    e.receivers.push_back(std::make_unique<shm_receiver>(b, o));
    return e;
  }
};

// Ring mode with a tiny ring (3 slots of 192 bytes), so that every transfer wraps around it
// many times and chunks cut through tensors.
struct shm_ring_kind {
  static constexpr int receivers = 1;
  static endpoints make(transport_options o) {
    auto [a, b] = make_socket_link_pair();
    shm_options ring;
    ring.ring_slot_bytes = 192;
    ring.ring_slots = 3;
    endpoints e;
    e.sender = std::make_unique<shm_sender>(a, o, ring);
    e.receivers.push_back(std::make_unique<shm_receiver>(b, o));
    return e;
  }
};

struct fake_kind {
  static constexpr int receivers = 1;
  static endpoints make(transport_options o) {
    auto ch = std::make_shared<fake_channel>(o);
    endpoints e;
    e.sender = std::make_unique<fake_sender>(ch);
    e.receivers.push_back(std::make_unique<fake_receiver>(ch));
    return e;
  }
};

// Creates the ranks of one group concurrently (each create blocks in the rendezvous).
std::vector<std::unique_ptr<collective_group>> make_groups(const std::vector<store_handle>& stores,
                                                           std::chrono::milliseconds timeout) {
  int n = static_cast<int>(stores.size());
  std::vector<std::unique_ptr<collective_group>> groups(stores.size());
  std::vector<std::string> errors(stores.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        collective_options co;
        co.timeout = timeout;
        co.group_name = "weights";
        groups[static_cast<std::size_t>(r)] =
            collective_group::create(stores[static_cast<std::size_t>(r)], r, n, co);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  for (const auto& e : errors)
    if (!e.empty())
      throw std::runtime_error("group creation failed: " + e);
  return groups;
}

// Trainer rank 0 and two engines, as threads over an in-process store.
struct gloo_kind {
  static constexpr int receivers = 2;
  static endpoints make(transport_options o) {
    endpoints e;
    e.groups = make_groups(std::vector<store_handle>(3, make_in_process_store()), test_timeout);
    e.sender = std::make_unique<gloo_sender>(*e.groups[0], o);
    for (int r = 1; r < 3; ++r)
      e.receivers.push_back(std::make_unique<gloo_receiver>(*e.groups[std::size_t(r)], o));
    return e;
  }
};

// What one transfer did on each end.
struct outcome {
  std::optional<error> sender_error;
  std::vector<std::optional<error>> receiver_errors;
  std::vector<std::uint64_t> versions; // each receiver's version() afterwards
};

std::optional<error> capture(const std::function<void()>& f) {
  try {
    f();
  } catch (const error& e) {
    return e;
  } catch (const std::exception& e) {
    return error(error_code::internal, std::string("unexpected exception: ") + e.what());
  }
  return std::nullopt;
}

// Runs one transfer: every receiver on its own thread, the sender on this one.
outcome transfer(endpoints& e, const named_tensors& weights, std::uint64_t version,
                 const std::vector<named_tensors>& targets) {
  outcome out;
  out.receiver_errors.resize(e.receivers.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < e.receivers.size(); ++i)
    threads.emplace_back([&, i] {
      out.receiver_errors[i] = capture([&] {
        auto v = e.receivers[i]->receive(targets[i]);
        if (v != e.receivers[i]->version())
          throw std::runtime_error("receive returned " + std::to_string(v) + ", version() is " +
                                   std::to_string(e.receivers[i]->version()));
      });
    });
  out.sender_error = capture([&] { e.sender->send(weights, version); });
  for (auto& t : threads)
    t.join();
  for (const auto& r : e.receivers)
    out.versions.push_back(r->version());
  return out;
}

std::string describe(const std::optional<error>& e) {
  return e ? std::string(to_string(e->code())) + ": " + e->what() : "no error";
}

void expect_committed(const outcome& o, std::uint64_t version) {
  EXPECT_FALSE(o.sender_error) << describe(o.sender_error);
  for (std::size_t i = 0; i < o.receiver_errors.size(); ++i) {
    EXPECT_FALSE(o.receiver_errors[i]) << "receiver " << i << ": "
                                       << describe(o.receiver_errors[i]);
    EXPECT_EQ(o.versions[i], version) << "receiver " << i;
  }
}

template <class Kind> class WeightTransport : public ::testing::Test {
public:
  static int receivers() { return Kind::receivers; }
  static endpoints make(transport_options o = opts_with()) { return Kind::make(o); }

  // One copy of `w` per receiver.
  static std::vector<named_tensors> per_receiver(const named_tensors& w) {
    std::vector<named_tensors> out;
    for (int i = 0; i < Kind::receivers; ++i)
      out.push_back(deep_copy(w));
    return out;
  }
};

struct kind_names {
  template <class T> static std::string GetName(int) {
    if (std::is_same_v<T, in_process_kind>)
      return "in_process";
    if (std::is_same_v<T, shm_kind>)
      return "shm";
    if (std::is_same_v<T, shm_whole_kind>)
      return "shm_whole";
    if (std::is_same_v<T, shm_ring_kind>)
      return "shm_small_ring";
    if (std::is_same_v<T, fake_kind>)
      return "fake";
    return "gloo";
  }
};

using transport_kinds = ::testing::Types<in_process_kind, shm_kind, shm_whole_kind, shm_ring_kind,
                                         fake_kind, gloo_kind>;
TYPED_TEST_SUITE(WeightTransport, transport_kinds, kind_names);

TYPED_TEST(WeightTransport, FullTransferIsBitExactForFp32Bf16AndF16) {
  auto e = this->make();
  auto w = model_weights(1.0);
  auto targets = this->per_receiver(like(w));
  ASSERT_FALSE(same_weights(targets[0], w)); // the sync has something to do
  auto o = transfer(e, w, 1, targets);
  expect_committed(o, 1);
  for (const auto& t : targets)
    EXPECT_TRUE(same_weights(t, w));
}

TYPED_TEST(WeightTransport, TinyBucketsSplitTheTransferAndALargeTensorTravelsAlone) {
  constexpr std::uint64_t bucket = 256; // the 2,368-byte embedding is larger than a bucket
  auto w = model_weights(2.0);
  auto plan = make_bucket_plan(make_manifest(w), bucket);
  ASSERT_GT(plan.buckets.size(), 4u);
  EXPECT_EQ(plan.buckets.front().tensors.size(), 1u);
  EXPECT_EQ(plan.buckets.front().bytes, 37u * 16u * 4u);
  auto e = this->make(opts_with(bucket));
  auto targets = this->per_receiver(like(w));
  expect_committed(transfer(e, w, 1, targets), 1);
  for (const auto& t : targets)
    EXPECT_TRUE(same_weights(t, w));
}

TYPED_TEST(WeightTransport, VersionIncrementsAndEachTransferReplacesTheWeights) {
  auto e = this->make(opts_with(512));
  auto targets = this->per_receiver(like(model_weights(1.0)));
  for (std::uint64_t v = 1; v <= 3; ++v) {
    auto w = model_weights(double(v) + 10.0);
    expect_committed(transfer(e, w, v, targets), v);
    for (const auto& t : targets)
      EXPECT_TRUE(same_weights(t, w)) << "version " << v;
  }
}

TYPED_TEST(WeightTransport, NonContiguousSourceTensorsArriveWithTheirLogicalLayout) {
  auto e = this->make();
  auto base = pattern({6, 4}, at::kFloat, 3.0);
  named_tensors w = {{"w.t", base.t()}, {"w.slice", base.narrow(1, 1, 2)}};
  named_tensors expected = {{"w.t", base.t().contiguous()},
                            {"w.slice", base.narrow(1, 1, 2).contiguous()}};
  auto targets = this->per_receiver(like(expected));
  expect_committed(transfer(e, w, 1, targets), 1);
  for (const auto& t : targets)
    EXPECT_TRUE(same_weights(t, expected));
}

// Commits version 1, then offers version 2 built from `bad`; every end must fail with
// invalid_argument, the receivers keep version 1's bits and version, and the transport stays
// usable for version 3.
template <class Fixture>
void expect_rejected_keeps_weights(Fixture* self, const named_tensors& bad,
                                   const std::vector<std::string>& message_parts) {
  auto e = self->make(opts_with(300));
  auto w1 = model_weights(1.0);
  auto targets = self->per_receiver(like(w1));
  expect_committed(transfer(e, w1, 1, targets), 1);
  auto o = transfer(e, bad, 2, targets);
  ASSERT_TRUE(o.sender_error) << "the sender must learn of the rejection";
  EXPECT_EQ(o.sender_error->code(), error_code::invalid_argument) << describe(o.sender_error);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    ASSERT_TRUE(o.receiver_errors[i]) << "receiver " << i;
    EXPECT_EQ(o.receiver_errors[i]->code(), error_code::invalid_argument)
        << describe(o.receiver_errors[i]);
    for (const auto& part : message_parts)
      EXPECT_TRUE(contains(o.receiver_errors[i]->what(), part))
          << "missing '" << part << "' in: " << o.receiver_errors[i]->what();
    EXPECT_TRUE(same_weights(targets[i], w1)) << "receiver " << i << " changed its weights";
    EXPECT_EQ(o.versions[i], 1u);
  }
  auto w3 = model_weights(3.0);
  expect_committed(transfer(e, w3, 3, targets), 3);
  for (const auto& t : targets)
    EXPECT_TRUE(same_weights(t, w3));
}

TYPED_TEST(WeightTransport, RejectedWrongNameKeepsPreviousWeightsAndVersion) {
  auto bad = model_weights(2.0);
  bad[3].first = "model.layers.0.mlp.down_proj.weigth";
  expect_rejected_keeps_weights(
      this, bad,
      {"unexpected tensor 'model.layers.0.mlp.down_proj.weigth'",
       "missing tensor 'model.layers.0.mlp.down_proj.weight' (Float [3, 5, 7])", "version 2"});
}

TYPED_TEST(WeightTransport, RejectedWrongShapeKeepsPreviousWeightsAndVersion) {
  auto bad = model_weights(2.0);
  bad[0].second = pattern({16, 37}, at::kFloat, 2.0);
  expect_rejected_keeps_weights(
      this, bad,
      {"tensor 'model.embed_tokens.weight' has shape [16, 37], expected [37, 16]"});
}

TYPED_TEST(WeightTransport, RejectedWrongDtypeKeepsPreviousWeightsAndVersion) {
  auto bad = model_weights(2.0);
  bad[1].second = bad[1].second.to(at::kFloat);
  expect_rejected_keeps_weights(
      this, bad,
      {"tensor 'model.layers.0.self_attn.q_proj.weight' has dtype Float, expected BFloat16"});
}

TYPED_TEST(WeightTransport, RejectedMissingTensorKeepsPreviousWeightsAndVersion) {
  auto bad = without(model_weights(2.0), "lm_head.weight");
  expect_rejected_keeps_weights(
      this, bad, {"missing tensor 'lm_head.weight' (Half [5, 16]): the sender did not send it"});
}

TYPED_TEST(WeightTransport, RejectedStaleVersionKeepsPreviousWeights) {
  auto e = this->make();
  auto targets = this->per_receiver(like(model_weights(1.0)));
  expect_committed(transfer(e, model_weights(1.0), 5, targets), 5);
  auto before = deep_copy(targets[0]);
  auto o = transfer(e, model_weights(2.0), 5, targets);
  ASSERT_TRUE(o.sender_error);
  EXPECT_EQ(o.sender_error->code(), error_code::invalid_argument);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    ASSERT_TRUE(o.receiver_errors[i]);
    EXPECT_TRUE(contains(o.receiver_errors[i]->what(),
                         "version 5 is not newer than the version held, 5"))
        << o.receiver_errors[i]->what();
    EXPECT_TRUE(same_weights(targets[i], before));
    EXPECT_EQ(o.versions[i], 5u);
  }
}

TYPED_TEST(WeightTransport, TargetsThatCannotBeWrittenInPlaceAreRejected) {
  auto w = model_weights(1.0);
  auto e = this->make();
  auto targets = this->per_receiver(like(w));
  auto transposed = pattern({16, 37}, at::kFloat, 5.0);
  for (auto& t : targets)
    t[0].second = transposed.clone().t(); // the right shape, but not contiguous
  auto o = transfer(e, w, 1, targets);
  ASSERT_TRUE(o.sender_error);
  EXPECT_EQ(o.sender_error->code(), error_code::invalid_argument);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    ASSERT_TRUE(o.receiver_errors[i]);
    EXPECT_TRUE(contains(o.receiver_errors[i]->what(),
                         "receiver tensor 'model.embed_tokens.weight' is not contiguous"))
        << o.receiver_errors[i]->what();
    EXPECT_TRUE(same_bits(targets[i][0].second, transposed.t()));
    EXPECT_EQ(o.versions[i], 0u);
  }
}

TYPED_TEST(WeightTransport, EmptyModelCommitsAVersion) {
  auto e = this->make();
  auto targets = this->per_receiver({});
  expect_committed(transfer(e, {}, 1, targets), 1);
  expect_committed(transfer(e, {}, 2, targets), 2);
}

TYPED_TEST(WeightTransport, ZeroBucketBytesIsRejected) {
  auto err = expect_error([&] { this->make(opts_with(0)); });
  EXPECT_EQ(err.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(err.what(), "bucket_bytes must be > 0, got 0")) << err.what();
}

TYPED_TEST(WeightTransport, BadSenderInputFailsWithoutTouchingReceivers) {
  // Receivers give up quickly: in the point-to-point transports nothing reaches them.
  auto e = this->make(opts_with(default_bucket_bytes, 1000ms));
  auto w = model_weights(1.0);
  auto targets = this->per_receiver(like(w));
  auto before = deep_copy(targets[0]);
  auto dup = w;
  dup.push_back(dup.front());
  for (const auto& [bad, version, text] :
       std::vector<std::tuple<named_tensors, std::uint64_t, std::string>>{
         {dup, 1, "tensor name 'model.embed_tokens.weight' appears more than once"},
         {w, 0, "version must be >= 1"}}) {
    auto o = transfer(e, bad, version, targets);
    ASSERT_TRUE(o.sender_error);
    EXPECT_EQ(o.sender_error->code(), error_code::invalid_argument) << describe(o.sender_error);
    EXPECT_TRUE(contains(o.sender_error->what(), text)) << o.sender_error->what();
    for (std::size_t i = 0; i < targets.size(); ++i) {
      EXPECT_TRUE(o.receiver_errors[i]); // timed out, or told of the abort
      EXPECT_TRUE(same_weights(targets[i], before));
      EXPECT_EQ(o.versions[i], 0u);
    }
  }
  // Still usable afterwards.
  expect_committed(transfer(e, w, 1, targets), 1);
  for (const auto& t : targets)
    EXPECT_TRUE(same_weights(t, w));
}

// -- manifest, bucket plan, header ---------------------------------------------------------------

weight_manifest manifest_of_bytes(const std::vector<std::uint64_t>& sizes) {
  weight_manifest m;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    m.tensors.push_back(tensor_spec{"t" + std::to_string(i), at::kByte,
                                    {static_cast<int64_t>(sizes[i])}, sizes[i]});
  return m;
}

TEST(WeightBucketPlan, PacksGreedilyWithAlignedOffsetsAndLetsALargeTensorTravelAlone) {
  // 100 + pad to 128 + 100 = 228 <= 256; 300 > 256 alone at 256; 50 at align(556) = 576.
  auto plan = make_bucket_plan(manifest_of_bytes({100, 100, 300, 50}), 256);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].offset, 0u);
  EXPECT_EQ(plan.buckets[0].bytes, 228u);
  ASSERT_EQ(plan.buckets[0].tensors.size(), 2u);
  EXPECT_EQ(plan.buckets[0].tensors[1].offset, 128u);
  EXPECT_EQ(plan.buckets[1].offset, 256u);
  EXPECT_EQ(plan.buckets[1].bytes, 300u);
  EXPECT_EQ(plan.buckets[2].offset, 576u);
  EXPECT_EQ(plan.buckets[2].tensors[0].index, 3u);
  EXPECT_EQ(plan.total_bytes, 626u);
  EXPECT_EQ(plan.max_bucket_bytes, 300u);
}

TEST(WeightBucketPlan, EveryTensorLiesInsideItsBucketAndNoBucketOverflowsUnlessAlone) {
  std::vector<std::uint64_t> sizes;
  for (int i = 0; i < 200; ++i)
    sizes.push_back(static_cast<std::uint64_t>((i * 7919) % 1500));
  auto m = manifest_of_bytes(sizes);
  auto plan = make_bucket_plan(m, 1024);
  std::size_t next = 0;
  std::uint64_t end = 0;
  for (const auto& b : plan.buckets) {
    EXPECT_GE(b.offset, end);
    EXPECT_EQ(b.offset % tensor_alignment, 0u);
    if (b.tensors.size() > 1) {
      EXPECT_LE(b.bytes, 1024u);
    }
    for (const auto& t : b.tensors) {
      EXPECT_EQ(t.index, next++);
      EXPECT_EQ(t.offset % tensor_alignment, 0u);
      EXPECT_GE(t.offset, b.offset);
      EXPECT_LE(t.offset + t.bytes, b.offset + b.bytes);
      EXPECT_EQ(t.bytes, sizes[t.index]);
    }
    end = b.offset + b.bytes;
  }
  EXPECT_EQ(next, sizes.size());
  EXPECT_EQ(plan.total_bytes, end);
}

TEST(WeightBucketPlan, EmptyManifestHasNoBucketsAndZeroBucketBytesIsAnError) {
  auto plan = make_bucket_plan(weight_manifest{}, 64);
  EXPECT_TRUE(plan.buckets.empty());
  EXPECT_EQ(plan.total_bytes, 0u);
  auto err = expect_error([] { make_bucket_plan(manifest_of_bytes({8}), 0); });
  EXPECT_EQ(err.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(err.what(), "bucket_bytes must be > 0, got 0")) << err.what();
}

TEST(WeightManifest, DescribesNamesDtypesShapesAndBytesInOrder) {
  auto m = make_manifest(model_weights(1.0));
  ASSERT_EQ(m.tensors.size(), 8u);
  EXPECT_EQ(m.tensors[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(m.tensors[1].dtype, at::kBFloat16);
  EXPECT_EQ(m.tensors[1].shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(m.tensors[1].bytes, 512u);
  EXPECT_EQ(m.tensors[4].shape, std::vector<int64_t>{});
  EXPECT_EQ(m.tensors[4].bytes, 4u);
  EXPECT_EQ(m.tensors[6].bytes, 0u);
  EXPECT_EQ(m.total_bytes(), 37u * 16 * 4 + 512 + 34 + 420 + 4 + 2 + 0 + 160);
}

TEST(WeightManifest, RejectsEmptyDuplicateAndUndefinedEntries) {
  auto t = pattern({2}, at::kFloat, 1.0);
  auto e1 = expect_error([&] { make_manifest({{"", t}}); });
  EXPECT_TRUE(contains(e1.what(), "tensor 0 has an empty name")) << e1.what();
  auto e2 = expect_error([&] { make_manifest({{"a", t}, {"a", t}}); });
  EXPECT_TRUE(contains(e2.what(), "tensor name 'a' appears more than once")) << e2.what();
  auto e3 = expect_error([&] { make_manifest({{"u", at::Tensor()}}); });
  EXPECT_TRUE(contains(e3.what(), "tensor 'u' is undefined")) << e3.what();
  for (const auto& e : {e1, e2, e3})
    EXPECT_EQ(e.code(), error_code::invalid_argument);
}

TEST(WeightTransferHeader, RoundTripsAndRejectsMalformedText) {
  auto m = make_manifest(model_weights(1.0));
  auto h = decode_transfer_header(encode_transfer_header(m, 42, 1024));
  EXPECT_EQ(h.version, 42u);
  EXPECT_EQ(h.bucket_bytes, 1024u);
  ASSERT_EQ(h.manifest.tensors.size(), m.tensors.size());
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    EXPECT_EQ(h.manifest.tensors[i].name, m.tensors[i].name);
    EXPECT_EQ(h.manifest.tensors[i].dtype, m.tensors[i].dtype);
    EXPECT_EQ(h.manifest.tensors[i].shape, m.tensors[i].shape);
    EXPECT_EQ(h.manifest.tensors[i].bytes, m.tensors[i].bytes);
  }
  auto good = encode_transfer_header(make_manifest({{"w", pattern({2, 3}, at::kHalf, 1)}}), 1, 8);
  auto replace = [&](const std::string& from, const std::string& to) {
    auto s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  for (const auto& [text, part] : std::vector<std::pair<std::string, std::string>>{
         {"{not json", "not JSON"},
         {replace("\"Half\"", "\"Complex\""), "unknown dtype 'Complex'"},
         {replace("\"bytes\":12", "\"bytes\":13"), "claims 13 bytes, its dtype and shape give 12"},
         {replace("rlforge.weights.v1", "other"), "format is not rlforge.weights.v1"},
         {replace("\"version\"", "\"versio\""), "malformed field"}}) {
    auto err = expect_error([&] { decode_transfer_header(text); });
    EXPECT_EQ(err.code(), error_code::decode_error);
    EXPECT_TRUE(contains(err.what(), part)) << "for " << text << ": " << err.what();
  }
}

TEST(WeightCheckTransfer, ListsEveryProblemWithExpectedAndActualValues) {
  auto w = model_weights(1.0);
  auto incoming = w;
  incoming[0].second = pattern({16, 37}, at::kFloat, 1.0);
  incoming[1].second = incoming[1].second.to(at::kHalf);
  auto err = expect_error([&] { check_transfer(make_manifest(incoming), 3, w, 0); });
  EXPECT_EQ(err.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(err.what(), "version 3 rejected (2 problems; weights unchanged)"))
      << err.what();
  EXPECT_TRUE(contains(err.what(), "has shape [16, 37], expected [37, 16]")) << err.what();
  EXPECT_TRUE(contains(err.what(), "has dtype Half, expected BFloat16")) << err.what();
  EXPECT_NO_THROW(check_transfer(make_manifest(w), 3, like(w), 2));
}

TEST(WeightBucketForLink, TwoMillisecondsOfTheLinkWithinBounds) {
  constexpr std::uint64_t mib = std::uint64_t{1} << 20, kib64 = std::uint64_t{64} << 10;
  EXPECT_EQ(bucket_bytes_for_link(0, std::uint64_t{1} << 30), 4 * mib); // never measured
  EXPECT_EQ(bucket_bytes_for_link(1e9, std::uint64_t{1} << 30), 2000000 / kib64 * kib64);
  EXPECT_EQ(bucket_bytes_for_link(1e12, std::uint64_t{1} << 30), 64 * mib);   // capped
  EXPECT_EQ(bucket_bytes_for_link(1e12, 8 * mib), 2 * mib);                   // a quarter
  EXPECT_EQ(bucket_bytes_for_link(1e3, std::uint64_t{1} << 30), mib);         // floor
  EXPECT_EQ(bucket_bytes_for_link(1e12, 1000), mib); // tiny transfers still get the floor
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto e = expect_error([&] { bucket_bytes_for_link(bad, 100); });
    EXPECT_EQ(e.code(), error_code::invalid_argument);
  }
}

TEST(WeightTransportOptions, RejectsZeroBucketBytesAndNonPositiveTimeout) {
  auto e1 = expect_error([] { in_process_channel ch(opts_with(0)); });
  EXPECT_TRUE(contains(e1.what(), "in-process channel: bucket_bytes must be > 0, got 0"));
  auto e2 = expect_error([] { shm_sender s(nullptr, opts_with(64, 0ms)); });
  EXPECT_TRUE(contains(e2.what(), "shm sender: timeout must be > 0 ms, got 0 ms")) << e2.what();
  auto e3 = expect_error([] { fake_channel ch(opts_with(0)); });
  EXPECT_EQ(e3.code(), error_code::invalid_argument);
  shm_options one_slot;
  one_slot.ring_slots = 1;
  auto e4 = expect_error([&] { shm_sender s(nullptr, opts_with(), one_slot); });
  EXPECT_TRUE(contains(e4.what(), "ring_slots must be >= 2 in ring mode, got 1")) << e4.what();
}

// -- in-process ------------------------------------------------------------------------------------

TEST(InProcessTransport, SenderTimesOutWhenNoReceiverComesAndCanSendLater) {
  auto ch = std::make_shared<in_process_channel>(opts_with(default_bucket_bytes, 200ms));
  in_process_sender s(ch);
  auto w = model_weights(1.0);
  auto err = expect_error([&] { s.send(w, 1); });
  EXPECT_EQ(err.code(), error_code::timeout);
  EXPECT_TRUE(contains(err.what(), "no receiver took version 1 within 200 ms")) << err.what();
  in_process_receiver r(ch);
  auto targets = like(w);
  std::thread t([&] { r.receive(targets); });
  s.send(w, 1);
  t.join();
  EXPECT_TRUE(same_weights(targets, w));
  EXPECT_EQ(r.version(), 1u);
}

TEST(InProcessTransport, NullChannelIsRejected) {
  auto e1 = expect_error([] { in_process_sender s(nullptr); });
  EXPECT_TRUE(contains(e1.what(), "channel is null"));
  auto e2 = expect_error([] { in_process_receiver r(nullptr); });
  EXPECT_EQ(e2.code(), error_code::invalid_argument);
}

TEST(InProcessTransport, NamedChannelsMeetByNameAndVanishWithTheirLastUser) {
  auto a = named_in_process_channel("sync-a", opts_with());
  auto same = named_in_process_channel("sync-a", opts_with());
  auto other = named_in_process_channel("sync-b", opts_with());
  EXPECT_EQ(a.get(), same.get());
  EXPECT_NE(a.get(), other.get());
  a.reset();
  same.reset();
  // Nobody holds "sync-a" any more: the name gives a fresh channel, which works end to end.
  auto fresh = named_in_process_channel("sync-a", opts_with());
  auto w = model_weights(1.0);
  auto targets = like(w);
  std::thread t([&] { in_process_receiver{named_in_process_channel("sync-a")}.receive(targets); });
  in_process_sender{fresh}.send(w, 1);
  t.join();
  EXPECT_TRUE(same_weights(targets, w));
  auto e = expect_error([] { named_in_process_channel(""); });
  EXPECT_EQ(e.code(), error_code::invalid_argument);
  auto e2 = expect_error([] { named_in_process_channel("x", opts_with(0)); });
  EXPECT_EQ(e2.code(), error_code::invalid_argument);
}

// -- fake ------------------------------------------------------------------------------------------

TEST(FakeTransport, RecordsHistoryAndInjectsFailuresOnEitherEnd) {
  auto ch = std::make_shared<fake_channel>(opts_with());
  fake_sender s(ch);
  fake_receiver r(ch);
  auto w1 = model_weights(1.0);
  auto targets = like(w1);

  ch->fail_next_send(error_code::backend_error, "trainer lost its group");
  auto e1 = expect_error([&] { s.send(w1, 1); });
  EXPECT_EQ(e1.code(), error_code::backend_error);
  EXPECT_TRUE(contains(e1.what(), "trainer lost its group"));

  ch->fail_next_receive(error_code::timeout, "engine asleep");
  std::optional<error> receiver_error;
  std::thread t([&] { receiver_error = capture([&] { r.receive(targets); }); });
  auto e2 = expect_error([&] { s.send(w1, 1); });
  t.join();
  EXPECT_EQ(e2.code(), error_code::timeout);
  ASSERT_TRUE(receiver_error);
  EXPECT_TRUE(contains(receiver_error->what(), "engine asleep"));
  EXPECT_TRUE(same_weights(targets, like(w1)));
  EXPECT_EQ(r.version(), 0u);

  std::thread t2([&] { r.receive(targets); });
  s.send(w1, 1);
  t2.join();
  EXPECT_TRUE(same_weights(targets, w1));

  auto h = ch->history();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_FALSE(h[0].committed);
  EXPECT_TRUE(contains(h[0].message, "trainer lost its group"));
  EXPECT_FALSE(h[1].committed);
  EXPECT_TRUE(h[2].committed);
  EXPECT_EQ(h[2].version, 1u);
  EXPECT_EQ(h[2].manifest.tensors.size(), w1.size());
}

// -- shared memory ---------------------------------------------------------------------------------

bool segment_exists(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0)
    return false;
  ::close(fd);
  return true;
}

TEST(ShmTransport, SegmentIsReusedAndUnlinkedOnDestructionAndAfterAFailedSend) {
  auto [a, b] = make_socket_link_pair();
  auto s = std::make_unique<shm_sender>(a, opts_with(1024));
  shm_receiver r(b, opts_with(1024));
  auto w = model_weights(1.0);
  auto targets = like(w);
  std::thread t([&] { r.receive(targets); });
  s->send(w, 1);
  t.join();
  auto name = s->segment_name();
  ASSERT_FALSE(name.empty());
  EXPECT_TRUE(segment_exists(name));

  // A second transfer of the same size reuses the segment.
  auto w2 = model_weights(2.0);
  std::thread t2([&] { r.receive(targets); });
  s->send(w2, 2);
  t2.join();
  EXPECT_EQ(s->segment_name(), name);
  EXPECT_TRUE(same_weights(targets, w2));

  // A rejected send unlinks it.
  auto bad = without(w2, "lm_head.weight");
  std::optional<error> receiver_error;
  std::thread t3([&] { receiver_error = capture([&] { r.receive(targets); }); });
  auto err = expect_error([&] { s->send(bad, 3); });
  t3.join();
  EXPECT_EQ(err.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(err.what(), "missing tensor 'lm_head.weight'")) << err.what();
  EXPECT_TRUE(s->segment_name().empty());
  EXPECT_FALSE(segment_exists(name));

  // A new segment for the next send; destruction unlinks it.
  std::thread t4([&] { r.receive(targets); });
  s->send(w, 4);
  t4.join();
  auto name2 = s->segment_name();
  EXPECT_NE(name2, name);
  EXPECT_TRUE(segment_exists(name2));
  s.reset();
  EXPECT_FALSE(segment_exists(name2));
  EXPECT_TRUE(same_weights(targets, w));
  EXPECT_EQ(r.version(), 4u);
}

TEST(ShmTransport, DescriptorTravelsWithoutALinkAndBadDescriptorsAreRejected) {
  shm_sender s(nullptr, opts_with(4096));
  shm_receiver r(nullptr, opts_with(4096));
  auto w = model_weights(1.0);
  auto targets = like(w);
  auto before = deep_copy(targets);
  auto d = s.write(w, 1);
  EXPECT_EQ(d.version, 1u);
  EXPECT_EQ(d.data_offset % 4096, 0u);

  auto bad_version = d;
  bad_version.version = 2;
  auto e1 = expect_error([&] { r.apply(bad_version, targets); });
  EXPECT_EQ(e1.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(e1.what(), "announces version 2, the segment holds version 1"))
      << e1.what();

  auto bad_layout = d;
  bad_layout.data_bytes = d.segment_bytes;
  auto e2 = expect_error([&] { r.apply(bad_layout, targets); });
  EXPECT_TRUE(contains(e2.what(), "do not fit a segment")) << e2.what();

  auto missing = d;
  missing.name = "/rlforge_w_no_such_segment";
  auto e3 = expect_error([&] { r.apply(missing, targets); });
  EXPECT_EQ(e3.code(), error_code::not_found);
  EXPECT_TRUE(contains(e3.what(), "/rlforge_w_no_such_segment")) << e3.what();

  auto wrong_size = d;
  wrong_size.segment_bytes = d.segment_bytes * 2;
  wrong_size.data_offset = d.data_offset;
  auto e4 = expect_error([&] { r.apply(wrong_size, targets); });
  EXPECT_TRUE(contains(e4.what(), "the descriptor says")) << e4.what();

  EXPECT_TRUE(same_weights(targets, before));
  EXPECT_EQ(r.version(), 0u);
  EXPECT_EQ(r.apply(d, targets), 1u);
  EXPECT_TRUE(same_weights(targets, w));

  auto e5 = expect_error([&] { s.send(w, 2); });
  EXPECT_EQ(e5.code(), error_code::unsupported);
  auto e6 = expect_error([&] { r.receive(targets); });
  EXPECT_EQ(e6.code(), error_code::unsupported);
}

TEST(ShmTransport, LinkTimesOutAndReportsAPeerThatWentAway) {
  auto [a, b] = make_socket_link_pair();
  auto e1 = expect_error([&] { b->wait_descriptor(100ms); });
  EXPECT_EQ(e1.code(), error_code::timeout);
  a.reset();
  auto e2 = expect_error([&] { b->wait_descriptor(1000ms); });
  EXPECT_EQ(e2.code(), error_code::io_error);
  EXPECT_TRUE(contains(e2.what(), "closed the link")) << e2.what();
  auto e3 = expect_error([&] { b->post_outcome(shm_outcome{}); });
  EXPECT_EQ(e3.code(), error_code::io_error);
}

TEST(ShmTransport, NamedSocketLinksConnectEitherWayRoundAndTimeOut) {
  auto w = model_weights(1.0);
  auto targets = like(w);
  std::string name = "rlforge-test-link-" + std::to_string(::getpid());
  // The receiver may come first: connect retries until the sender listens.
  std::thread receiver([&] {
    shm_receiver r(connect_socket_link(name, 5000ms), opts_with());
    r.receive(targets);
  });
  std::this_thread::sleep_for(20ms);
  shm_sender s(listen_socket_link(name, 5000ms), opts_with());
  s.send(w, 1);
  receiver.join();
  EXPECT_TRUE(same_weights(targets, w));
  auto e1 = expect_error([&] { listen_socket_link(name + "-nobody", 100ms); });
  EXPECT_EQ(e1.code(), error_code::timeout);
  EXPECT_TRUE(contains(e1.what(), "no receiver connected")) << e1.what();
  auto e2 = expect_error([&] { connect_socket_link(name + "-nobody", 100ms); });
  EXPECT_EQ(e2.code(), error_code::timeout);
  auto e3 = expect_error([] { listen_socket_link("", 100ms); });
  EXPECT_EQ(e3.code(), error_code::invalid_argument);
  auto e4 = expect_error([] { connect_socket_link(std::string(101, 'x'), 100ms); });
  EXPECT_EQ(e4.code(), error_code::invalid_argument);
}

// Child-process steps of the cross-process test; the exit code names the first failed step.
int run_receiver_child(shm_receiver& r, named_tensors& targets, const named_tensors& w1,
                       const named_tensors& w3) {
  try {
    if (r.receive(targets) != 1 || !same_weights(targets, w1))
      return 10;
  } catch (...) {
    return 11;
  }
  try {
    r.receive(targets);
    return 20;
  } catch (const error& e) {
    if (e.code() != error_code::invalid_argument || !same_weights(targets, w1) ||
        r.version() != 1)
      return 21;
  } catch (...) {
    return 22;
  }
  try {
    if (r.receive(targets) != 3 || !same_weights(targets, w3))
      return 30;
  } catch (...) {
    return 31;
  }
  return 0;
}

TEST(ShmTransport, TransfersToAnotherProcess) {
  auto w1 = model_weights(1.0);
  auto w3 = model_weights(3.0);
  auto bad = model_weights(2.0);
  bad[2].second = pattern({18}, at::kHalf, 2.0);
  auto targets = like(w1);
  auto [a, b] = make_socket_link_pair();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: only the receiving end; memcpy and parsing, no torch kernels, then _exit.
    a.reset();
    shm_receiver r(b, opts_with(512));
    ::_exit(run_receiver_child(r, targets, w1, w3));
  }
  b.reset();
  std::string segment;
  {
    shm_sender s(a, opts_with(512));
    EXPECT_NO_THROW(s.send(w1, 1));
    auto err = expect_error([&] { s.send(bad, 2); });
    EXPECT_EQ(err.code(), error_code::invalid_argument);
    EXPECT_TRUE(contains(err.what(),
                         "tensor 'model.layers.0.input_layernorm.weight' has shape [18], "
                         "expected [17]"))
        << err.what();
    EXPECT_NO_THROW(s.send(w3, 3));
    segment = s.segment_name();
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child failed at step " << WEXITSTATUS(status);
  EXPECT_FALSE(segment_exists(segment));
  // The parent's copy of the targets never changed: the data went to the child only.
  EXPECT_TRUE(same_weights(targets, like(w1)));
}

// -- gloo ------------------------------------------------------------------------------------------

TEST(GlooTransport, OneRejectingEngineAbortsTheTransferForAll) {
  auto e = gloo_kind::make(opts_with(1024));
  auto w1 = model_weights(1.0);
  std::vector<named_tensors> targets = {like(w1), like(w1)};
  expect_committed(transfer(e, w1, 1, targets), 1);
  // Rank 2's engine has a different model: its targets lack a tensor.
  targets[1] = without(targets[1], "model.layers.0.scale");
  auto before0 = deep_copy(targets[0]);
  auto o = transfer(e, model_weights(2.0), 2, targets);
  ASSERT_TRUE(o.sender_error);
  EXPECT_TRUE(contains(o.sender_error->what(), "rejected by rank(s) 2")) << o.sender_error->what();
  ASSERT_TRUE(o.receiver_errors[0]);
  EXPECT_TRUE(contains(o.receiver_errors[0]->what(), "aborted because rank(s) 2 rejected it"))
      << o.receiver_errors[0]->what();
  ASSERT_TRUE(o.receiver_errors[1]);
  EXPECT_TRUE(contains(o.receiver_errors[1]->what(), "unexpected tensor 'model.layers.0.scale'"))
      << o.receiver_errors[1]->what();
  EXPECT_TRUE(same_weights(targets[0], before0));
  EXPECT_EQ(o.versions[0], 1u);
  EXPECT_EQ(o.versions[1], 1u);
}

TEST(GlooTransport, WorksOverATcpStoreBetweenTwoRanks) {
  auto server = make_tcp_store("127.0.0.1", 0, true, 2, test_timeout);
  auto client = make_tcp_store("127.0.0.1", server.port(), false, 2, test_timeout);
  endpoints e;
  e.groups = make_groups({server, client}, test_timeout);
  e.sender = std::make_unique<gloo_sender>(*e.groups[0], opts_with(700));
  e.receivers.push_back(std::make_unique<gloo_receiver>(*e.groups[1], opts_with(700)));
  auto w = model_weights(4.0);
  std::vector<named_tensors> targets = {like(w)};
  expect_committed(transfer(e, w, 7, targets), 7);
  EXPECT_TRUE(same_weights(targets[0], w));
}

TEST(GlooTransport, ACommitSwapsInTheStagedBytesAndTwoBuffersAlternate) {
  endpoints e;
  e.groups = make_groups(std::vector<store_handle>(2, make_in_process_store()), test_timeout);
  e.sender = std::make_unique<gloo_sender>(*e.groups[0], opts_with(700));
  e.receivers.push_back(std::make_unique<gloo_receiver>(*e.groups[1], opts_with(700)));
  std::vector<named_tensors> targets = {like(model_weights(1.0))};
  auto pointers = [&] {
    std::vector<const void*> out;
    for (auto& [name, t] : targets[0])
      out.push_back(t.data_ptr());
    return out;
  };
  const auto own = pointers();
  std::vector<std::vector<const void*>> after;
  named_tensors kept; // a clone of what the second transfer delivered
  for (std::uint64_t v = 1; v <= 3; ++v) {
    auto w = model_weights(static_cast<double>(v) + 0.5);
    expect_committed(transfer(e, w, v, targets), v);
    EXPECT_TRUE(same_weights(targets[0], w)) << "transfer " << v;
    after.push_back(pointers());
    if (v == 2)
      kept = deep_copy(targets[0]);
  }
  // Each commit moved every target onto the buffer that took the transfer (no copy); the
  // third reused the first's buffer (nothing allocated), and a clone is not disturbed.
  for (size_t i = 0; i < own.size(); ++i) {
    if (targets[0][i].second.numel() == 0)
      continue; // no bytes, nothing moves
    EXPECT_NE(after[0][i], own[i]) << targets[0][i].first;
    EXPECT_NE(after[1][i], after[0][i]) << targets[0][i].first;
    EXPECT_EQ(after[2][i], after[0][i]) << targets[0][i].first;
  }
  EXPECT_TRUE(same_weights(kept, model_weights(2.5)));
}

TEST(GlooTransport, TheBucketSizeCanChangeBetweenTransfers) {
  endpoints e;
  e.groups = make_groups(std::vector<store_handle>(2, make_in_process_store()), test_timeout);
  auto sender = std::make_unique<gloo_sender>(*e.groups[0], opts_with(700));
  auto* s = sender.get();
  e.sender = std::move(sender);
  e.receivers.push_back(std::make_unique<gloo_receiver>(*e.groups[1], opts_with(700)));
  std::vector<named_tensors> targets = {like(model_weights(1.0))};
  for (std::uint64_t v = 1; v <= 3; ++v) {
    s->set_bucket_bytes(v == 2 ? 64 : 1 << 20);
    EXPECT_EQ(s->bucket_bytes(), v == 2 ? 64u : 1u << 20);
    auto w = model_weights(static_cast<double>(v));
    expect_committed(transfer(e, w, v, targets), v);
    EXPECT_TRUE(same_weights(targets[0], w)) << "transfer " << v;
  }
  EXPECT_EQ(expect_error([&] { s->set_bucket_bytes(0); }).code(), error_code::invalid_argument);
  EXPECT_EQ(s->bucket_bytes(), 1u << 20);
}

// `w` with every `every`-th element of each tensor (from the first) increased by one; with
// `every` 0, `w` itself (cloned).
named_tensors change_every(const named_tensors& w, int64_t every) {
  named_tensors out;
  for (const auto& [name, t] : w) {
    auto c = t.clone();
    if (every > 0 && c.numel() > 0) {
      auto flat = c.view({-1});
      auto idx = at::arange(0, c.numel(), every, at::kLong);
      flat.index_put_({idx}, flat.index({idx}) + 1.0);
    }
    out.emplace_back(name, c);
  }
  return out;
}

// Elements whose bits differ between `a` and `b` (same names, shapes and dtypes).
std::uint64_t changed_elements(const named_tensors& a, const named_tensors& b) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& x = a[i].second;
    const auto bits = x.element_size() == 2 ? at::kShort : at::kInt;
    n += static_cast<std::uint64_t>(
        x.contiguous().view(bits).ne(b[i].second.contiguous().view(bits)).sum().item<int64_t>());
  }
  return n;
}

// A delta-enabled sender and a plain one, each with two receivers: the same versions go to
// both, and the receivers' weights must agree bit for bit.
struct delta_pair {
  endpoints delta, full;
  gloo_sender* sender = nullptr;
  std::vector<named_tensors> delta_targets, full_targets;

  explicit delta_pair(std::uint64_t bucket_bytes) {
    delta = gloo_kind::make(opts_with(bucket_bytes));
    full = gloo_kind::make(opts_with(bucket_bytes));
    sender = dynamic_cast<gloo_sender*>(delta.sender.get());
    sender->set_delta(true);
    auto w = model_weights(1.0);
    delta_targets = {like(w), like(w, 98.0)};
    full_targets = {like(w), like(w, 98.0)};
  }

  ::testing::AssertionResult send(const named_tensors& w, std::uint64_t version) {
    auto d = transfer(delta, w, version, delta_targets);
    auto f = transfer(full, w, version, full_targets);
    expect_committed(d, version);
    expect_committed(f, version);
    for (std::size_t i = 0; i < delta_targets.size(); ++i) {
      auto same = same_weights(delta_targets[i], full_targets[i]);
      if (!same)
        return same << " (receiver " << i << " of version " << version << ")";
      same = same_weights(delta_targets[i], w);
      if (!same)
        return same << " (receiver " << i << " against the sender, version " << version << ")";
    }
    return ::testing::AssertionSuccess();
  }
};

TEST(GlooTransport, DeltaTransfersAreBitIdenticalToFullOnes) {
  delta_pair p(700);
  const auto directory = 8u * model_weights(1.0).size();
  auto w1 = model_weights(1.0);
  const auto payload = make_manifest(w1).total_bytes();
  // The first transfer has no base: full.
  ASSERT_TRUE(p.send(w1, 1));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  EXPECT_EQ(p.sender->last_transfer().payload_bytes, payload);
  // A sparse change: encoded, exactly the changed elements.
  auto w2 = change_every(w1, 7);
  ASSERT_TRUE(p.send(w2, 2));
  auto s = p.sender->last_transfer();
  EXPECT_TRUE(s.delta);
  EXPECT_EQ(s.changed, changed_elements(w1, w2));
  EXPECT_GT(s.wire_bytes, directory);
  EXPECT_LT(s.wire_bytes, payload);
  // No change: only the directories travel.
  ASSERT_TRUE(p.send(change_every(w2, 0), 3));
  s = p.sender->last_transfer();
  EXPECT_TRUE(s.delta);
  EXPECT_EQ(s.changed, 0u);
  EXPECT_EQ(s.wire_bytes, directory);
  // Every element changes: the full layout is smaller, and goes as it is.
  auto w4 = change_every(w2, 1);
  ASSERT_TRUE(p.send(w4, 4));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  // Bits that compare equal as numbers (-0.0 for 0.0, another NaN payload) are changes, and a
  // new bucket size does not matter (the layout does not depend on it).
  auto w5 = change_every(w4, 0);
  w5[0].second.view({-1})[0] = 0.0f;
  ASSERT_TRUE(p.send(w5, 5));
  auto w6 = change_every(w5, 0);
  w6[0].second.view({-1})[0] = -0.0f;
  w6[0].second.view({-1})[1] = std::numeric_limits<float>::quiet_NaN();
  p.sender->set_bucket_bytes(64);
  dynamic_cast<gloo_sender*>(p.full.sender.get())->set_bucket_bytes(64);
  ASSERT_TRUE(p.send(w6, 6));
  s = p.sender->last_transfer();
  EXPECT_TRUE(s.delta);
  EXPECT_EQ(s.changed, 2u);
  EXPECT_EQ(s.changed, changed_elements(w5, w6));
}

TEST(GlooTransport, ADeltaNeedsEveryReceiverToHoldItsBase) {
  delta_pair p(700);
  auto w1 = model_weights(1.0);
  ASSERT_TRUE(p.send(w1, 1));
  auto w2 = change_every(w1, 5);
  ASSERT_TRUE(p.send(w2, 2));
  EXPECT_TRUE(p.sender->last_transfer().delta);
  // Receiver 1's weights were replaced by other tensors (same values): they no longer view the
  // buffer of version 2, so version 3 comes whole, to both.
  p.delta_targets[1] = deep_copy(p.delta_targets[1]);
  auto w3 = change_every(w2, 5);
  ASSERT_TRUE(p.send(w3, 3));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  auto w4 = change_every(w3, 9);
  ASSERT_TRUE(p.send(w4, 4));
  EXPECT_TRUE(p.sender->last_transfer().delta);
  // Receiver 0's weights were written in place under the same version, and it says so.
  p.delta_targets[0][0].second.view({-1})[3] = 42.0f;
  p.full_targets[0][0].second.view({-1})[3] = 42.0f;
  dynamic_cast<gloo_receiver*>(p.delta.receivers[0].get())->forget_base();
  ASSERT_TRUE(p.send(change_every(w4, 9), 5));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  // A receiver that holds another version than the sender's base.
  p.delta.receivers[1]->assume_version(5);
  ASSERT_TRUE(p.send(change_every(w4, 3), 6));
  EXPECT_TRUE(p.sender->last_transfer().delta);
  p.delta.receivers[1]->assume_version(3);
  p.full.receivers[1]->assume_version(3);
  ASSERT_TRUE(p.send(change_every(w4, 4), 7));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  // Turning delta off frees the copy: the next transfer is full, and so is the one after.
  p.sender->set_delta(false);
  ASSERT_TRUE(p.send(change_every(w4, 6), 8));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  p.sender->set_delta(true);
  ASSERT_TRUE(p.send(change_every(w4, 8), 9));
  EXPECT_FALSE(p.sender->last_transfer().delta);
  ASSERT_TRUE(p.send(change_every(w4, 10), 10));
  EXPECT_TRUE(p.sender->last_transfer().delta);
}

// -- a peer that dies mid-transfer --------------------------------------------------------------
//
// The peer is a child process, SIGKILLed at several points of the second transfer. Its weights
// are made before the fork and each is larger than a bucket, so it sends and receives straight
// from them: the child runs no torch kernel (a parallel one could hang after fork).

// 32 fp32 tensors of 4 MiB: a transfer of tens of milliseconds over loopback.
named_tensors big_weights(double seed) {
  named_tensors w;
  for (int i = 0; i < 32; ++i)
    w.emplace_back("layer." + std::to_string(i), pattern({1 << 20}, at::kFloat, seed + i));
  return w;
}

constexpr std::uint64_t big_bucket = 1 << 20;

// Joins the two-rank group whose store `store` reaches. A receiver whose sender died while its
// bucket receives were posted learns it only from this timeout (Gloo does not fail pending
// receives when their pair closes), hence a short one.
std::unique_ptr<collective_group> join_weights_group(store_handle store, int rank) {
  collective_options co;
  co.timeout = std::chrono::milliseconds{3000};
  co.group_name = "weights";
  return collective_group::create(std::move(store), rank, 2, co);
}

// Forks the peer: it joins the group at `port` as `rank` and runs `body`, then exits 0 (1 when
// body throws).
pid_t fork_peer(std::uint16_t port, int rank,
                const std::function<void(collective_group&)>& body) {
  pid_t pid = ::fork();
  if (pid != 0)
    return pid;
  int code = 0;
  try {
    auto g = join_weights_group(make_tcp_store("127.0.0.1", port, false, 2, test_timeout), rank);
    body(*g);
  } catch (...) {
    code = 1;
  }
  ::_exit(code);
}

// Kills and reaps the child when the test leaves its scope, also on a failed assertion.
struct child_guard {
  pid_t pid;
  ~child_guard() {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
};

// SIGKILLs `pid` `delay` after it is started.
std::thread kill_after(pid_t pid, std::chrono::milliseconds delay) {
  return std::thread([=] {
    std::this_thread::sleep_for(delay);
    ::kill(pid, SIGKILL);
  });
}

TEST(GlooTransport, ASenderKilledMidTransferLeavesTheReceiverWholeOnItsVersion) {
  const auto w1 = big_weights(1.0), w2 = big_weights(2.0);
  int interrupted = 0;
  for (int delay : {0, 10, 40}) {
    auto server = make_tcp_store("127.0.0.1", 0, true, 2, test_timeout);
    const pid_t pid = fork_peer(server.port(), 0, [&](collective_group& g) {
      gloo_sender s(g, opts_with(big_bucket));
      s.send(w1, 1);
      s.send(w2, 2); // killed somewhere in here, or after
    });
    ASSERT_GE(pid, 0);
    child_guard guard{pid};
    auto g = join_weights_group(server, 1);
    gloo_receiver r(*g, opts_with(big_bucket));
    auto targets = like(w1);
    ASSERT_EQ(r.receive(targets), 1u);
    ASSERT_TRUE(same_weights(targets, w1));
    auto killer = kill_after(pid, std::chrono::milliseconds{delay});
    auto failed = capture([&] { r.receive(targets); });
    killer.join();
    // Either the transfer failed and nothing changed, or it committed whole before the kill.
    if (failed) {
      ++interrupted;
      EXPECT_EQ(r.version(), 1u) << "kill after " << delay << " ms";
      EXPECT_TRUE(same_weights(targets, w1)) << "kill after " << delay << " ms";
    } else {
      EXPECT_EQ(r.version(), 2u) << "kill after " << delay << " ms";
      EXPECT_TRUE(same_weights(targets, w2)) << "kill after " << delay << " ms";
    }
  }
  EXPECT_GT(interrupted, 0) << "no kill landed before the second transfer committed";
}

TEST(GlooTransport, AReceiverKilledMidTransferFailsTheSendAndTheSenderGoesOn) {
  const auto w1 = big_weights(1.0), w2 = big_weights(2.0);
  auto targets = like(w1); // the child's, made before the fork
  int interrupted = 0;
  for (int delay : {0, 5, 15, 30, 60}) {
    auto server = make_tcp_store("127.0.0.1", 0, true, 2, test_timeout);
    const pid_t pid = fork_peer(server.port(), 1, [&](collective_group& g) {
      gloo_receiver r(g, opts_with(big_bucket));
      r.receive(targets);
      r.receive(targets); // killed somewhere in here, or after
    });
    ASSERT_GE(pid, 0);
    child_guard guard{pid};
    auto g = join_weights_group(server, 0);
    gloo_sender s(*g, opts_with(big_bucket));
    ASSERT_NO_THROW(s.send(w1, 1));
    auto killer = kill_after(pid, std::chrono::milliseconds{delay});
    auto failed = capture([&] { s.send(w2, 2); });
    killer.join();
    if (failed) {
      ++interrupted;
      EXPECT_TRUE(failed->code() == error_code::backend_error ||
                  failed->code() == error_code::timeout)
          << describe(failed);
    }
  }
  EXPECT_GT(interrupted, 0) << "no kill landed before the second transfer committed";
  // The trainer goes on: a new channel to a new receiver carries the next version.
  endpoints e;
  e.groups = make_groups(std::vector<store_handle>(2, make_in_process_store()), test_timeout);
  e.sender = std::make_unique<gloo_sender>(*e.groups[0], opts_with(big_bucket));
  e.receivers.push_back(std::make_unique<gloo_receiver>(*e.groups[1], opts_with(big_bucket)));
  std::vector<named_tensors> fresh = {like(w1)};
  expect_committed(transfer(e, w2, 2, fresh), 2);
  EXPECT_TRUE(same_weights(fresh[0], w2));
}

TEST(GlooTransport, EndpointsCheckTheirRankRootAndGroup) {
  auto groups = make_groups(std::vector<store_handle>(2, make_in_process_store()), test_timeout);
  auto e1 = expect_error([&] { gloo_sender s(*groups[1]); });
  EXPECT_EQ(e1.code(), error_code::invalid_argument);
  EXPECT_TRUE(contains(e1.what(), "the sender must be the root rank 0, this is rank 1"))
      << e1.what();
  auto e2 = expect_error([&] { gloo_receiver r(*groups[0]); });
  EXPECT_TRUE(contains(e2.what(), "rank 0 is the root")) << e2.what();
  auto e3 = expect_error([&] { gloo_sender s(*groups[0], opts_with(), 2); });
  EXPECT_EQ(e3.code(), error_code::out_of_range);
  EXPECT_TRUE(contains(e3.what(), "root 2 is outside [0, 2)")) << e3.what();
  auto e4 = expect_error([&] { gloo_receiver r(*groups[1], opts_with(0)); });
  EXPECT_TRUE(contains(e4.what(), "bucket_bytes must be > 0, got 0")) << e4.what();
  // Rank 1 as the root: roles swap.
  EXPECT_NO_THROW((gloo_sender{*groups[1], opts_with(), 1}));
  EXPECT_NO_THROW((gloo_receiver{*groups[0], opts_with(), 1}));
}

// -- nccl ------------------------------------------------------------------------------------------

TEST(NcclTransport, SameProtocolOnCudaDevices) {
#ifndef RLFORGE_WITH_CUDA
  GTEST_SKIP() << "built without RLFORGE_WITH_CUDA: no NCCL transport";
#else
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda_device_count();
  auto store = make_in_process_store();
  std::vector<std::unique_ptr<collective_group>> groups(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      collective_options co;
      co.backend = "nccl";
      co.timeout = test_timeout;
      groups[std::size_t(r)] = collective_group::create(store, r, 2, co);
    });
  for (auto& t : threads)
    t.join();
  c10::Device d0(c10::kCUDA, 0), d1(c10::kCUDA, 1);
  named_tensors w, targets;
  for (const auto& [name, t] : model_weights(1.0)) {
    w.emplace_back(name, t.to(d0));
    targets.emplace_back(name, at::zeros_like(t).to(d1));
  }
  nccl_sender s(*groups[0], d0, opts_with(512));
  nccl_receiver r(*groups[1], d1, opts_with(512));
  std::thread rt([&] { r.receive(targets); });
  s.send(w, 1);
  rt.join();
  for (std::size_t i = 0; i < w.size(); ++i)
    EXPECT_TRUE(same_bits(targets[i].second.cpu(), w[i].second.cpu())) << w[i].first;
  EXPECT_EQ(r.version(), 1u);
#endif
}

} // namespace
