#pragma once

// Shared by the tests of the Tinker wire codecs (tests/service/*_codec_test.cpp,
// compression_test.cpp, json_bodies_test.cpp): byte helpers, an expected-error check and the
// requests the SDK sends.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "service/tinker.pb.h"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/limits.hpp"
#include "tinker/error.hpp"
#include "tinker/types.hpp"
#include "tests/support/raw_bytes.hpp"

namespace rlforge::service::test {
using test_support::from_raw;
using test_support::raw_bytes;

using json = nlohmann::json;
using tinker::dtype;
using tinker::request_error;

// -- helpers ------------------------------------------------------------------------------------

/// Runs `f`, expects a request_error of `category` whose message contains every `parts` entry.
inline void expect_error(const std::function<void()>& f, tinker::error_category category,
                         std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const request_error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    return;
  }
  ADD_FAILURE() << "no request_error thrown (expected one mentioning " << *parts.begin() << ")";
}

inline void expect_user_error(const std::function<void()>& f,
                              std::initializer_list<std::string> parts) {
  expect_error(f, tinker::error_category::user, parts);
}

inline tinker_public::Tensor dense_tensor(tinker_public::DType type, std::string bytes,
                                          std::vector<int64_t> shape) {
  tinker_public::Tensor t;
  t.set_dtype(type);
  t.set_dense(std::move(bytes));
  for (auto s : shape)
    t.add_shape(s);
  return t;
}

inline void add_text_chunk(tinker_public::Datum* d, const std::vector<int32_t>& tokens) {
  d->add_model_input()->mutable_encoded_text()->set_tokens(raw_bytes(tokens));
}

/// A cross_entropy request as the SDK sends it: datum 0 has two chunks (prompt + completion).
inline tinker_public::ForwardBackwardRequest sft_request() {
  tinker_public::ForwardBackwardRequest msg;
  msg.set_model_id("sess-1:train:0");
  msg.set_seq_id(3);
  msg.set_loss_fn("cross_entropy");
  auto* d0 = msg.add_data();
  add_text_chunk(d0, {11, 12, 13});
  add_text_chunk(d0, {14, 15});
  (*d0->mutable_loss_fn_inputs())["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({12, 13, 14, 15, 16}), {5});
  (*d0->mutable_loss_fn_inputs())["weights"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, 0, 1, 1, 1}), {5});
  auto* d1 = msg.add_data();
  add_text_chunk(d1, {7, 8});
  (*d1->mutable_loss_fn_inputs())["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({8, 9}), {2});
  (*d1->mutable_loss_fn_inputs())["weights"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 0.5f}), {2});
  return msg;
}

/// The importance_sampling datum the cookbook's RL loop sends.
inline tinker_public::ForwardBackwardRequest rl_request() {
  tinker_public::ForwardBackwardRequest msg;
  msg.set_model_id("m");
  msg.set_seq_id(1);
  msg.set_loss_fn("importance_sampling");
  auto* d = msg.add_data();
  add_text_chunk(d, {1, 2, 3});
  auto& in = *d->mutable_loss_fn_inputs();
  in["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({2, 3, 4}), {3});
  in["logprobs"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, -1, -2}), {3});
  in["advantages"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, 1, 1}), {3});
  return msg;
}

inline std::string serialize(const google::protobuf::Message& m) {
  return m.SerializeAsString();
}

inline tinker::forward_backward_request decode_proto(const tinker_public::ForwardBackwardRequest& m,
                                                     const wire_limits& limits = {}) {
  return decode_forward_backward_proto(serialize(m), limits);
}

inline tinker::tensor_data floats(std::vector<double> v, std::vector<int64_t> shape = {}) {
  tinker::tensor_data t;
  t.type = dtype::float32;
  t.shape = shape.empty() ? std::vector<int64_t>{static_cast<int64_t>(v.size())} : shape;
  t.floats = std::move(v);
  return t;
}

inline tinker::tensor_data ints(std::vector<int64_t> v, dtype type = dtype::int64) {
  tinker::tensor_data t;
  t.type = type;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

inline const char* sft_json = R"({"forward_backward_input":{"data":[
  {"model_input":{"chunks":[{"tokens":[11,12,13],"type":"encoded_text"},
                            {"tokens":[14,15],"type":"encoded_text"}]},
   "loss_fn_inputs":{"target_tokens":{"data":[12,13,14,15,16],"dtype":"int64","shape":[5]},
                     "weights":{"data":[0.0,0.0,1.0,1.0,1.0],"dtype":"float32","shape":[5]}}}],
  "loss_fn":"cross_entropy"},"model_id":"sess-1:train:0","seq_id":1})";

// -- tinker/types.hpp -------------------------------------------------------------------

} // namespace rlforge::service::test
