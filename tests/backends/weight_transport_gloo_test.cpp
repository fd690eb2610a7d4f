// The Gloo weight transport's own cases (backends/weights/gloo_transport.hpp): refusals, TCP
// stores, the commit by swap, bucket changes, delta transfers, and a peer process killed
// mid-transfer.
#include "backends/weights/gloo_transport.hpp"
#include "tests/backends/weight_transport_support.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace rlforge::backends::weights_test;

namespace {

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

} // namespace
