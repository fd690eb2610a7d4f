#pragma once

// What the weight-transport tests share (weight_transport_test.cpp, weight_transport_gloo_test.cpp):
// deterministic weights, the transports under test as sender/receiver endpoints, one transfer
// run across threads, and checks of its outcome. Header-only.

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

namespace rlforge::backends::weights_test {

using namespace rlforge::backends;
using namespace std::chrono_literals;
using rlforge::backends::testing::same_bits;

// Bounds a failing test only; healthy transfers here take milliseconds.
inline constexpr std::chrono::milliseconds test_timeout{20000};

inline transport_options opts_with(std::uint64_t bucket_bytes = default_bucket_bytes,
                            std::chrono::milliseconds timeout = test_timeout) {
  transport_options o;
  o.bucket_bytes = bucket_bytes;
  o.timeout = timeout;
  return o;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <class F> inline error expect_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e;
  }
  ADD_FAILURE() << "expected rlforge::backends::error";
  return error(error_code::internal, "no error was thrown");
}

// A deterministic tensor whose values depend on `seed` and on every element's position.
inline at::Tensor pattern(std::vector<int64_t> shape, at::ScalarType dtype, double seed) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  auto v = at::arange(n, at::kDouble).mul(0.731 * seed + 0.1).sin().mul(3.0);
  return v.to(dtype).reshape(shape).contiguous();
}

// Assorted shapes (0-d, odd sizes that break 4-byte alignment, an empty tensor) and the
// dtypes an engine meets: fp32, bf16, f16.
inline named_tensors model_weights(double seed) {
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
inline named_tensors like(const named_tensors& w, double seed = 99.0) {
  named_tensors out;
  for (const auto& [name, t] : w)
    out.emplace_back(name, pattern(t.sizes().vec(), t.scalar_type(), seed));
  return out;
}

inline named_tensors deep_copy(const named_tensors& w) {
  named_tensors out;
  for (const auto& [name, t] : w)
    out.emplace_back(name, t.clone());
  return out;
}

inline ::testing::AssertionResult same_weights(const named_tensors& a, const named_tensors& b) {
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

inline named_tensors without(named_tensors w, const std::string& name) {
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
inline std::vector<std::unique_ptr<collective_group>>
make_groups(const std::vector<store_handle>& stores, std::chrono::milliseconds timeout) {
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

inline std::optional<error> capture(const std::function<void()>& f) {
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
inline outcome transfer(endpoints& e, const named_tensors& weights, std::uint64_t version,
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

inline std::string describe(const std::optional<error>& e) {
  return e ? std::string(to_string(e->code())) + ": " + e->what() : "no error";
}

inline void expect_committed(const outcome& o, std::uint64_t version) {
  EXPECT_FALSE(o.sender_error) << describe(o.sender_error);
  for (std::size_t i = 0; i < o.receiver_errors.size(); ++i) {
    EXPECT_FALSE(o.receiver_errors[i]) << "receiver " << i << ": "
                                       << describe(o.receiver_errors[i]);
    EXPECT_EQ(o.versions[i], version) << "receiver " << i;
  }
}

} // namespace rlforge::backends::weights_test
