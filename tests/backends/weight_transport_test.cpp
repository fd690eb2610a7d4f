// The weight transports (backends/weights/): one typed suite over in-process, shared memory,
// Gloo and the fake; manifests, bucket plans and headers; each transport's own cases (Gloo's
// are in weight_transport_gloo_test.cpp); NCCL in CUDA builds.
#include "backends/weights/weight_transport.hpp"
#include "tests/backends/weight_transport_support.hpp"

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

using namespace rlforge::backends::weights_test;

namespace {

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
