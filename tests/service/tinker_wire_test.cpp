#include "service/tinker_wire.hpp"

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
#include <zstd.h>

#include "runtime/tinker_types.hpp"
#include "service/tinker.pb.h"

namespace rlforge::service {
namespace {

using json = nlohmann::json;
using tinker::dtype;
using tinker::request_error;

// -- helpers ------------------------------------------------------------------------------------

template <class T> std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty())
    std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <class T> std::vector<T> from_raw(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty())
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

/// Runs `f`, expects a request_error of `category` whose message contains every `parts` entry.
void expect_error(const std::function<void()>& f, const std::string& category,
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

void expect_user_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  expect_error(f, "user", parts);
}

tinker_public::Tensor dense_tensor(tinker_public::DType type, std::string bytes,
                                   std::vector<int64_t> shape) {
  tinker_public::Tensor t;
  t.set_dtype(type);
  t.set_dense(std::move(bytes));
  for (auto s : shape)
    t.add_shape(s);
  return t;
}

void add_text_chunk(tinker_public::Datum* d, const std::vector<int32_t>& tokens) {
  d->add_model_input()->mutable_encoded_text()->set_tokens(raw_bytes(tokens));
}

/// A cross_entropy request as the SDK sends it: datum 0 has two chunks (prompt + completion).
tinker_public::ForwardBackwardRequest sft_request() {
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
tinker_public::ForwardBackwardRequest rl_request() {
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

std::string serialize(const google::protobuf::Message& m) {
  return m.SerializeAsString();
}

tinker::forward_backward_request decode_proto(const tinker_public::ForwardBackwardRequest& m,
                                              const wire_limits& limits = {}) {
  return decode_forward_backward_proto(serialize(m), limits);
}

tinker::tensor_data floats(std::vector<double> v, std::vector<int64_t> shape = {}) {
  tinker::tensor_data t;
  t.type = dtype::float32;
  t.shape = shape.empty() ? std::vector<int64_t>{static_cast<int64_t>(v.size())} : shape;
  t.floats = std::move(v);
  return t;
}

tinker::tensor_data ints(std::vector<int64_t> v, dtype type = dtype::int64) {
  tinker::tensor_data t;
  t.type = type;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

const char* sft_json = R"({"forward_backward_input":{"data":[
  {"model_input":{"chunks":[{"tokens":[11,12,13],"type":"encoded_text"},
                            {"tokens":[14,15],"type":"encoded_text"}]},
   "loss_fn_inputs":{"target_tokens":{"data":[12,13,14,15,16],"dtype":"int64","shape":[5]},
                     "weights":{"data":[0.0,0.0,1.0,1.0,1.0],"dtype":"float32","shape":[5]}}}],
  "loss_fn":"cross_entropy"},"model_id":"sess-1:train:0","seq_id":1})";

// -- runtime/tinker_types.hpp -------------------------------------------------------------------

TEST(TinkerTypes, DtypeNamesRoundTrip) {
  for (auto t : {dtype::float32, dtype::int64, dtype::int32, dtype::bfloat16})
    EXPECT_EQ(tinker::parse_dtype(tinker::to_string(t)), t);
  EXPECT_STREQ(tinker::to_string(dtype::bfloat16), "bfloat16");
  EXPECT_TRUE(tinker::is_floating(dtype::bfloat16));
  EXPECT_FALSE(tinker::is_floating(dtype::int32));
}

TEST(TinkerTypes, ParseDtypeRefusesUnknownNames) {
  for (const char* bad : {"float64", "Float32", "", "int8"})
    expect_user_error([&] { tinker::parse_dtype(bad); },
                      {"unknown dtype", std::string("\"") + bad});
}

TEST(TinkerTypes, NumelIsTheShapeProduct) {
  tinker::tensor_data t;
  EXPECT_EQ(t.numel(), 1); // a scalar
  t.shape = {2, 3};
  EXPECT_EQ(t.numel(), 6);
  t.shape = {4, 0};
  EXPECT_EQ(t.numel(), 0);
}

TEST(TinkerTypes, RequestErrorKeepsCategoryAndMessage) {
  request_error e("not_found", "model 'x' does not exist");
  EXPECT_EQ(e.category(), "not_found");
  EXPECT_STREQ(e.what(), "model 'x' does not exist");
}

// -- zstd ---------------------------------------------------------------------------------------

std::string sample_text(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i)
    s += "token " + std::to_string(i % 977) + ";";
  s.resize(n);
  return s;
}

TEST(TinkerWireZstd, RoundTripsOneAndSeveralFrames) {
  const auto text = sample_text(300000);
  const auto packed = zstd_compress(text);
  EXPECT_LT(packed.size(), text.size());
  EXPECT_EQ(zstd_decompress(packed, text.size()), text);
  const auto two = zstd_compress("abc", 1) + zstd_compress("def", 19);
  EXPECT_EQ(zstd_decompress(two, 6), "abcdef");
  EXPECT_EQ(zstd_decompress(zstd_compress(""), 0), "");
}

TEST(TinkerWireZstd, RefusesGarbageTruncationAndEmptyInput) {
  expect_user_error([] { zstd_decompress("definitely not zstd", 1000); }, {"zstd", "corrupt"});
  const auto packed = zstd_compress(sample_text(100000));
  expect_user_error([&] { zstd_decompress(packed.substr(0, packed.size() / 2), 1 << 20); },
                    {"zstd", "truncated"});
  expect_user_error([&] { zstd_decompress(packed + "junk", 1 << 20); }, {"zstd"});
  expect_user_error([] { zstd_decompress("", 10); }, {"empty"});
}

TEST(TinkerWireZstd, StopsAtTheOutputLimit) {
  const std::string zeros(8 << 20, '\0');
  const auto bomb = zstd_compress(zeros);
  EXPECT_LT(bomb.size(), 4096u);
  expect_user_error([&] { zstd_decompress(bomb, 1 << 20); }, {"exceeds the limit of 1048576"});
  EXPECT_EQ(zstd_decompress(bomb, zeros.size()).size(), zeros.size());
  expect_user_error([&] { zstd_decompress(bomb, zeros.size() - 1); }, {"exceeds the limit"});
}

TEST(TinkerWireZstd, RefusesWindowsFarBeyondTheOutputLimit) {
  // A streamed frame without a content size keeps its 16 MiB window even for 3 bytes of content.
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> c(ZSTD_createCCtx(), ZSTD_freeCCtx);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_windowLog, 24);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_contentSizeFlag, 0);
  std::string frame(256, '\0');
  ZSTD_outBuffer out{frame.data(), frame.size(), 0};
  ZSTD_inBuffer in{"abc", 3, 0};
  ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(c.get(), &out, &in, ZSTD_e_continue)));
  ZSTD_inBuffer none{nullptr, 0, 0};
  ASSERT_EQ(ZSTD_compressStream2(c.get(), &out, &none, ZSTD_e_end), 0u);
  frame.resize(out.pos);
  EXPECT_EQ(zstd_decompress(frame, 8 << 20), "abc"); // 16 MiB <= 2 x 8 MiB
  expect_user_error([&] { zstd_decompress(frame, 1 << 20); }, {"zstd: corrupt or unsupported"});
}

TEST(TinkerWireZstd, CompressRefusesLevelsOutOfRange) {
  expect_error([] { zstd_compress("x", 0); }, "server", {"level 0"});
  expect_error([] { zstd_compress("x", 20); }, "server", {"level 20"});
}

TEST(TinkerWireZstd, DecodeContentHandlesIdentityZstdAndRefusesOthers) {
  EXPECT_EQ(decode_content("plain", "", 100), "plain");
  EXPECT_EQ(decode_content("plain", "identity", 100), "plain");
  EXPECT_EQ(decode_content(zstd_compress("packed"), " ZSTD ", 100), "packed");
  expect_user_error([] { decode_content("x", "gzip", 100); }, {"Content-Encoding", "gzip"});
  expect_user_error([] { decode_content("x", "zstd, gzip", 100); }, {"zstd, gzip"});
  expect_user_error([] { decode_content("too long", "", 3); }, {"exceeds the limit of 3"});
}

// -- forward_backward: protobuf -----------------------------------------------------------------

TEST(TinkerWireForwardBackwardProto, DecodesTheSdkRequest) {
  const auto r = decode_proto(sft_request());
  EXPECT_EQ(r.model_id, "sess-1:train:0");
  EXPECT_EQ(r.seq_id, 3);
  EXPECT_EQ(r.loss_fn, "cross_entropy");
  EXPECT_FALSE(r.forward_only);
  EXPECT_TRUE(r.loss_fn_config.empty());
  ASSERT_EQ(r.data.size(), 2u);
  EXPECT_EQ(r.data[0].tokens, (std::vector<int64_t>{11, 12, 13, 14, 15}));
  EXPECT_EQ(r.data[1].tokens, (std::vector<int64_t>{7, 8}));
  const auto& target = r.data[0].loss_fn_inputs.at("target_tokens");
  EXPECT_EQ(target.type, dtype::int64);
  EXPECT_EQ(target.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(target.ints, (std::vector<int64_t>{12, 13, 14, 15, 16}));
  EXPECT_TRUE(target.floats.empty());
  const auto& w = r.data[1].loss_fn_inputs.at("weights");
  EXPECT_EQ(w.type, dtype::float32);
  EXPECT_EQ(w.floats, (std::vector<double>{1.0, 0.5}));
}

// Field numbers and encodings pinned independently of service/tinker.proto: these bytes were
// assembled by hand from the SDK 0.25 descriptor (model_id=1, seq_id=2, data=3, loss_fn=4; Datum
// model_input=1, loss_fn_inputs=2; Chunk encoded_text=1; Tensor dense=1, dtype=3, shape=4).
TEST(TinkerWireForwardBackwardProto, DecodesHandAssembledSdkBytes) {
  const std::string body(
      "\x0a\x01\x6d\x10\x01\x1a\x38\x0a\x0c\x0a\x0a\x0a\x08\x05\x00\x00\x00\x06\x00\x00\x00\x12\x28"
      "\x0a\x0d\x74\x61\x72\x67\x65\x74\x5f\x74\x6f\x6b\x65\x6e\x73\x12\x17\x0a\x10\x06\x00\x00\x00"
      "\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x18\x02\x22\x01\x02\x22\x0d\x63\x72\x6f\x73"
      "\x73\x5f\x65\x6e\x74\x72\x6f\x70\x79",
      78);
  const auto r = decode_forward_backward_proto(body);
  EXPECT_EQ(r.model_id, "m");
  EXPECT_EQ(r.seq_id, 1);
  EXPECT_EQ(r.loss_fn, "cross_entropy");
  ASSERT_EQ(r.data.size(), 1u);
  EXPECT_EQ(r.data[0].tokens, (std::vector<int64_t>{5, 6}));
  const auto& t = r.data[0].loss_fn_inputs.at("target_tokens");
  EXPECT_EQ(t.type, dtype::int64);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(t.ints, (std::vector<int64_t>{6, 7}));
}

TEST(TinkerWireForwardBackwardProto, KeepsForwardOnlyAndLossConfig) {
  auto m = rl_request();
  m.set_loss_fn("ppo");
  m.set_forward_only(true);
  (*m.mutable_loss_fn_config())["clip_low_threshold"] = 0.7;
  (*m.mutable_loss_fn_config())["clip_high_threshold"] = 1.3;
  const auto r = decode_proto(m);
  EXPECT_TRUE(r.forward_only);
  EXPECT_EQ(r.loss_fn_config.at("clip_low_threshold"), 0.7);
  EXPECT_EQ(r.loss_fn_config.at("clip_high_threshold"), 1.3);
}

TEST(TinkerWireForwardBackwardProto, WidensBfloat16AndInt32AndConvertsIntegerWeights) {
  auto m = sft_request();
  auto& in = *m.mutable_data(1)->mutable_loss_fn_inputs();
  in["target_tokens"] = dense_tensor(tinker_public::DTYPE_INT32, raw_bytes<int32_t>({8, 9}), {2});
  // bf16 bits of 1.0 (0x3f80) and 0.5 (0x3f00) are exact.
  in["weights"] =
      dense_tensor(tinker_public::DTYPE_BFLOAT16, raw_bytes<uint16_t>({0x3f80, 0x3f00}), {2});
  auto r = decode_proto(m);
  EXPECT_EQ(r.data[1].loss_fn_inputs.at("target_tokens").type, dtype::int32);
  EXPECT_EQ(r.data[1].loss_fn_inputs.at("target_tokens").ints, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(r.data[1].loss_fn_inputs.at("weights").type, dtype::bfloat16);
  EXPECT_EQ(r.data[1].loss_fn_inputs.at("weights").floats, (std::vector<double>{1.0, 0.5}));

  in["weights"] = dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({1, 0}), {2});
  r = decode_proto(m);
  const auto& w = r.data[1].loss_fn_inputs.at("weights");
  EXPECT_EQ(w.type, dtype::float32);
  EXPECT_EQ(w.floats, (std::vector<double>{1.0, 0.0}));
  EXPECT_TRUE(w.ints.empty());
}

TEST(TinkerWireForwardBackwardProto, ShapelessTensorsAreOneDimensional) {
  auto m = sft_request();
  (*m.mutable_data(1)->mutable_loss_fn_inputs())["weights"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1}), {});
  EXPECT_EQ(decode_proto(m).data[1].loss_fn_inputs.at("weights").shape, (std::vector<int64_t>{2}));
}

TEST(TinkerWireForwardBackwardProto, EncoderRoundTrips) {
  const auto r = decode_proto(rl_request());
  const auto again = decode_forward_backward_proto(encode_forward_backward_request_proto(r));
  EXPECT_EQ(again.model_id, r.model_id);
  EXPECT_EQ(again.seq_id, r.seq_id);
  EXPECT_EQ(again.loss_fn, r.loss_fn);
  ASSERT_EQ(again.data.size(), 1u);
  EXPECT_EQ(again.data[0].tokens, r.data[0].tokens);
  for (const auto& [name, t] : r.data[0].loss_fn_inputs) {
    const auto& u = again.data[0].loss_fn_inputs.at(name);
    EXPECT_EQ(u.type, t.type) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.floats, t.floats) << name;
    EXPECT_EQ(u.ints, t.ints) << name;
  }
  auto big = r;
  big.seq_id = int64_t{1} << 40;
  expect_user_error([&] { encode_forward_backward_request_proto(big); }, {"seq_id", "int32"});
}

TEST(TinkerWireForwardBackwardProto, RefusesBytesThatDoNotParse) {
  expect_user_error([] { decode_forward_backward_proto("\xff\xff\xff\xff"); },
                    {"forward_backward", "not a valid ForwardBackwardRequest"});
  const auto body = serialize(sft_request());
  expect_user_error([&] { decode_forward_backward_proto(body.substr(0, body.size() - 3)); },
                    {"not a valid ForwardBackwardRequest"});
  wire_limits small;
  small.max_body_bytes = 16;
  expect_user_error([&] { decode_forward_backward_proto(body, small); },
                    {"exceeds the limit of 16"});
}

TEST(TinkerWireForwardBackwardProto, RefusesImageDmelAndEmptyChunks) {
  auto m = sft_request();
  m.mutable_data(1)->add_model_input()->mutable_image()->set_format("png");
  expect_user_error([&] { decode_proto(m); }, {"data[1].model_input[1]", "image chunk"});
  m = sft_request();
  m.mutable_data(0)->mutable_model_input(0)->mutable_dmel()->set_dmel("x");
  expect_user_error([&] { decode_proto(m); }, {"data[0].model_input[0]", "dmel"});
  m = sft_request();
  m.mutable_data(1)->add_model_input();
  expect_user_error([&] { decode_proto(m); }, {"data[1].model_input[1]", "empty"});
}

TEST(TinkerWireForwardBackwardProto, RefusesBadTokens) {
  auto m = sft_request();
  m.mutable_data(1)->mutable_model_input(0)->mutable_encoded_text()->set_tokens("12345");
  expect_user_error([&] { decode_proto(m); }, {"data[1].model_input[0]", "5 token bytes"});
  m = sft_request();
  m.mutable_data(1)->mutable_model_input(0)->mutable_encoded_text()->set_tokens(
      raw_bytes<int32_t>({7, -3}));
  expect_user_error([&] { decode_proto(m); }, {"data[1]", "token 1 = -3 is negative"});
  wire_limits limits;
  limits.vocab_size = 16;
  expect_user_error([&] { decode_proto(sft_request(), limits); },
                    {"data[0].loss_fn_inputs.target_tokens[4] = 16", "vocabulary of 16"});
  limits.vocab_size = 15;
  expect_user_error([&] { decode_proto(sft_request(), limits); },
                    {"data[0]: model_input token 4 = 15", "vocabulary of 15"});
  wire_limits context;
  context.max_context_length = 5;
  expect_user_error([&] { decode_proto(sft_request(), context); },
                    {"data[0]", "5 tokens", "context holds 5"});
  m = sft_request();
  m.mutable_data(1)->clear_model_input();
  expect_user_error([&] { decode_proto(m); }, {"data[1]: model_input has no tokens"});
}

TEST(TinkerWireForwardBackwardProto, RefusesBadDtypes) {
  auto m = sft_request();
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in["weights"].set_dtype(tinker_public::DTYPE_UNSPECIFIED);
  expect_user_error([&] { decode_proto(m); }, {"data[0].loss_fn_inputs.weights", "unspecified"});
  in["weights"].set_dtype(static_cast<tinker_public::DType>(9));
  expect_user_error([&] { decode_proto(m); }, {"loss_fn_inputs.weights", "unknown dtype code 9"});
  in["weights"].set_dtype(tinker_public::DTYPE_FLOAT32);
  in["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 2, 3, 4, 5}), {5});
  expect_user_error([&] { decode_proto(m); }, {"data[0].loss_fn_inputs.target_tokens",
                                               "float32 is not accepted", "int64 or int32"});
}

TEST(TinkerWireForwardBackwardProto, RefusesDataThatDisagreesWithItsShape) {
  auto m = sft_request();
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in["weights"].set_dense(std::string(7, '\0'));
  expect_user_error([&] { decode_proto(m); },
                    {"data[0].loss_fn_inputs.weights", "7 bytes", "float32"});
  in["weights"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1, 1, 1}), {5});
  expect_user_error([&] { decode_proto(m); },
                    {"loss_fn_inputs.weights", "shape [5] disagrees with its 4 elements"});
  in["weights"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1, 1, 1}), {-2, -2});
  expect_user_error([&] { decode_proto(m); }, {"shape [-2, -2] disagrees"});
  in["weights"].clear_encoding();
  expect_user_error([&] { decode_proto(m); },
                    {"loss_fn_inputs.weights", "neither dense nor sparse_csr"});
}

TEST(TinkerWireForwardBackwardProto, RefusesTargetsOfAnotherLength) {
  auto m = sft_request();
  (*m.mutable_data(1)->mutable_loss_fn_inputs())["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({8, 9, 10}), {3});
  expect_user_error([&] { decode_proto(m); },
                    {"data[1].loss_fn_inputs.target_tokens", "shape [3] must be [2]"});
  (*m.mutable_data(1)->mutable_loss_fn_inputs())["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({8, 9}), {1, 2});
  expect_user_error([&] { decode_proto(m); }, {"shape [1, 2] must be [2]"});
}

TEST(TinkerWireForwardBackwardProto, RefusesNonFiniteAndNegativeWeights) {
  auto m = rl_request();
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in["advantages"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32,
                   raw_bytes<float>({0, std::numeric_limits<float>::infinity(), 1}), {3});
  expect_user_error([&] { decode_proto(m); },
                    {"data[0].loss_fn_inputs.advantages[1] is not finite"});
  in["advantages"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, 1, std::nanf("")}), {3});
  expect_user_error([&] { decode_proto(m); }, {"advantages[2] is not finite"});
  m = sft_request();
  (*m.mutable_data(0)->mutable_loss_fn_inputs())["weights"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, 0, 1, -1, 1}), {5});
  expect_user_error([&] { decode_proto(m); }, {"weights[3] = -1 is negative"});
}

TEST(TinkerWireForwardBackwardProto, RefusesUnknownAndMissingInputs) {
  auto m = sft_request();
  (*m.mutable_data(0)->mutable_loss_fn_inputs())["mask"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1, 1, 1, 1}), {5});
  expect_user_error([&] { decode_proto(m); },
                    {"data[0]", "unknown loss_fn_inputs entry 'mask'", "target_tokens, weights"});
  m = sft_request();
  m.mutable_data(1)->mutable_loss_fn_inputs()->erase("target_tokens");
  expect_user_error([&] { decode_proto(m); }, {"data[1]", "lacks 'target_tokens'"});
  m = rl_request();
  m.mutable_data(0)->mutable_loss_fn_inputs()->erase("advantages");
  expect_user_error([&] { decode_proto(m); },
                    {"lacks 'advantages'", "loss 'importance_sampling' needs"});
  m.set_loss_fn("ppo");
  expect_user_error([&] { decode_proto(m); }, {"lacks 'advantages'", "'ppo'"});
  // ppo on a critic: returns instead of logprobs / advantages.
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in.erase("logprobs");
  in["returns"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1, 1}), {3});
  expect_user_error([&] { decode_proto(m); }, {"lacks 'values'", "'ppo'"});
  in["values"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({0, 0, 0}), {3});
  EXPECT_EQ(decode_proto(m).data[0].loss_fn_inputs.count("returns"), 1u);
  m.set_loss_fn("ppo_critic");
  EXPECT_EQ(decode_proto(m).data[0].loss_fn_inputs.count("values"), 1u);
  in.erase("values");
  expect_user_error([&] { decode_proto(m); }, {"lacks 'values'", "'ppo_critic'"});
  in.erase("returns");
  expect_user_error([&] { decode_proto(m); }, {"lacks 'returns'", "'ppo_critic'"});
}

TEST(TinkerWireForwardBackwardProto, RefusesBadRequestFields) {
  auto m = sft_request();
  m.set_model_id("");
  expect_user_error([&] { decode_proto(m); }, {"'model_id' is required"});
  m = sft_request();
  m.set_seq_id(-1);
  expect_user_error([&] { decode_proto(m); }, {"'seq_id' must be >= 0, got -1"});
  m = sft_request();
  m.clear_data();
  expect_user_error([&] { decode_proto(m); }, {"'data' is empty"});
  m = sft_request();
  m.set_loss_fn("dpo");
  expect_user_error([&] { decode_proto(m); }, {"unknown loss_fn 'dpo'", "cross_entropy"});
  m = sft_request();
  (*m.mutable_loss_fn_config())["beta"] = 0.1;
  expect_user_error([&] { decode_proto(m); },
                    {"loss 'cross_entropy'", "unknown loss_fn_config key 'beta'"});
}

TEST(TinkerWireForwardBackwardProto, DecodesSparseCsrToDense) {
  tinker_public::Tensor t;
  t.set_dtype(tinker_public::DTYPE_FLOAT32);
  t.add_shape(2);
  t.add_shape(3);
  // [[0, 5, 0], [7, 0, 9]]
  t.mutable_sparse_csr()->set_values(raw_bytes<float>({5, 7, 9}));
  t.mutable_sparse_csr()->set_crow_indices(raw_bytes<int64_t>({0, 1, 3}));
  t.mutable_sparse_csr()->set_col_indices(raw_bytes<int64_t>({1, 0, 2}));
  const auto d = decode_tensor_proto(serialize(t), "t");
  EXPECT_EQ(d.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(d.floats, (std::vector<double>{0, 5, 0, 7, 0, 9}));

  tinker_public::Tensor i;
  i.set_dtype(tinker_public::DTYPE_INT64);
  i.add_shape(1);
  i.add_shape(4);
  i.mutable_sparse_csr()->set_values(raw_bytes<int64_t>({3}));
  i.mutable_sparse_csr()->set_crow_indices(raw_bytes<int64_t>({0, 1}));
  i.mutable_sparse_csr()->set_col_indices(raw_bytes<int64_t>({3}));
  EXPECT_EQ(decode_tensor_proto(serialize(i), "i").ints, (std::vector<int64_t>{0, 0, 0, 3}));
}

TEST(TinkerWireForwardBackwardProto, RefusesInconsistentSparseCsr) {
  auto make = [](std::vector<int64_t> shape, std::vector<float> values, std::vector<int64_t> crow,
                 std::vector<int64_t> col) {
    tinker_public::Tensor t;
    t.set_dtype(tinker_public::DTYPE_FLOAT32);
    for (auto s : shape)
      t.add_shape(s);
    t.mutable_sparse_csr()->set_values(raw_bytes(values));
    t.mutable_sparse_csr()->set_crow_indices(raw_bytes(crow));
    t.mutable_sparse_csr()->set_col_indices(raw_bytes(col));
    return serialize(t);
  };
  expect_user_error(
      [&] {
        decode_tensor_proto(make({3}, {1}, {0, 1}, {0}), "w");
      },
      {"w: a sparse_csr tensor needs a 2-D shape, got [3]"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({2, 2}, {1}, {0, 1}, {0}), "w");
      },
      {"crow_indices has 2 entries, expected rows + 1 = 3"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({1, 2}, {1, 2}, {0, 2}, {0}), "w");
      },
      {"col_indices has 1 entries but there are 2 values"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({1, 2}, {1}, {1, 1}, {0}), "w");
      },
      {"start at 0 and end at the value count 1"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({2, 2}, {1, 2}, {0, 2, 1}, {0, 1}), "w");
      },
      {"must start at 0 and end"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({3, 2}, {1, 2}, {0, 2, 1, 2}, {0, 1}), "w");
      },
      {"crow_indices decrease at row 1"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({1, 2}, {1}, {0, 1}, {2}), "w");
      },
      {"col_indices[0] = 2 is outside [0, 2)"});
  expect_user_error(
      [&] {
        decode_tensor_proto(make({int64_t{1} << 40, int64_t{1} << 40}, {}, {0}, {}), "w");
      },
      {"exceeds the body limit when dense"});
  tinker_public::Tensor odd;
  odd.set_dtype(tinker_public::DTYPE_FLOAT32);
  odd.add_shape(1);
  odd.add_shape(1);
  odd.mutable_sparse_csr()->set_crow_indices("123");
  expect_user_error([&] { decode_tensor_proto(serialize(odd), "w"); },
                    {"crow_indices", "3 bytes is not a whole number of int64"});
}

// -- forward_backward: JSON and dispatch --------------------------------------------------------

TEST(TinkerWireForwardBackwardJson, DecodesTheOlderSdkBody) {
  const auto r = decode_forward_backward_json(sft_json);
  EXPECT_EQ(r.model_id, "sess-1:train:0");
  EXPECT_EQ(r.seq_id, 1);
  EXPECT_EQ(r.loss_fn, "cross_entropy");
  EXPECT_FALSE(r.forward_only);
  ASSERT_EQ(r.data.size(), 1u);
  EXPECT_EQ(r.data[0].tokens, (std::vector<int64_t>{11, 12, 13, 14, 15}));
  EXPECT_EQ(r.data[0].loss_fn_inputs.at("target_tokens").ints,
            (std::vector<int64_t>{12, 13, 14, 15, 16}));
  EXPECT_EQ(r.data[0].loss_fn_inputs.at("weights").floats, (std::vector<double>{0, 0, 1, 1, 1}));
}

TEST(TinkerWireForwardBackwardJson, FloatsAreHeldAtTheirDtypePrecision) {
  auto j = json::parse(sft_json);
  auto& in = j["forward_backward_input"]["data"][0]["loss_fn_inputs"];
  in["weights"]["data"] = {0.1, 1, 1, 1, 1};
  in["logprobs"] = {{"data", {-0.1, 0, 0, 0, 1.00390625}}, {"dtype", "bfloat16"}};
  in["advantages"] = {{"data", {16777217, 0, 0, 0, 0}}, {"dtype", "int64"}};
  const auto r = decode_forward_backward_json(j.dump());
  const auto& d = r.data[0].loss_fn_inputs;
  EXPECT_EQ(d.at("weights").floats[0], static_cast<double>(0.1f));
  EXPECT_EQ(d.at("logprobs").floats[0], -0.10009765625); // nearest bf16 of -0.1
  EXPECT_EQ(d.at("logprobs").floats[4], 1.0);            // a tie, rounded to even
  EXPECT_EQ(d.at("logprobs").shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(d.at("advantages").type, dtype::float32); // integer input converted
  EXPECT_EQ(d.at("advantages").floats[0], 16777216.0);
}

TEST(TinkerWireForwardBackwardJson, ForwardInputSetsForwardOnly) {
  auto j = json::parse(sft_json);
  j["forward_input"] = j["forward_backward_input"];
  j.erase("forward_backward_input");
  j["type"] = "forward";
  EXPECT_TRUE(decode_forward_backward_json(j.dump()).forward_only);
  auto k = json::parse(sft_json);
  k["forward_only"] = true;
  EXPECT_TRUE(decode_forward_backward_json(k.dump()).forward_only);
}

TEST(TinkerWireForwardBackwardJson, JsonAndProtoDecodeAlike) {
  auto m = sft_request();
  m.set_seq_id(1);
  m.mutable_data()->DeleteSubrange(1, 1);
  const auto a = decode_proto(m);
  const auto b = decode_forward_backward_json(sft_json);
  ASSERT_EQ(a.data.size(), b.data.size());
  EXPECT_EQ(a.data[0].tokens, b.data[0].tokens);
  for (const auto& [name, t] : a.data[0].loss_fn_inputs) {
    EXPECT_EQ(b.data[0].loss_fn_inputs.at(name).floats, t.floats) << name;
    EXPECT_EQ(b.data[0].loss_fn_inputs.at(name).ints, t.ints) << name;
  }
}

TEST(TinkerWireForwardBackwardJson, RefusesMalformedBodies) {
  expect_user_error([] { decode_forward_backward_json("{\"model_id\": "); },
                    {"forward_backward: malformed JSON"});
  expect_user_error([] { decode_forward_backward_json("[1, 2]"); },
                    {"must be a JSON object, got array"});
  auto with = [](const std::function<void(json&)>& edit) {
    auto j = json::parse(sft_json);
    edit(j);
    return j.dump();
  };
  struct bad_case {
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<bad_case> cases = {
      {[](json& j) { j.erase("model_id"); }, {"'model_id' is required"}},
      {[](json& j) { j["model_id"] = 7; }, {"'model_id' must be a string, got number"}},
      {[](json& j) { j["seq_id"] = "1"; }, {"'seq_id' must be an integer"}},
      {[](json& j) { j["seq_id"] = 1.5; }, {"'seq_id' must be an integer", "1.5"}},
      {[](json& j) { j["seq_id"] = -4; }, {"'seq_id' must be >= 0, got -4"}},
      {[](json& j) { j["type"] = "optim_step"; }, {"'type' is \"optim_step\""}},
      {[](json& j) { j.erase("forward_backward_input"); }, {"exactly one of"}},
      {[](json& j) { j["forward_input"] = j["forward_backward_input"]; }, {"exactly one of"}},
      {[](json& j) { j["forward_backward_input"]["data"] = 3; },
       {"'forward_backward_input.data' must be an array"}},
      {[](json& j) { j["forward_backward_input"].erase("loss_fn"); },
       {"'forward_backward_input.loss_fn' is required"}},
      {[](json& j) {
         j["forward_backward_input"]["loss_fn_config"] = {{"beta", "x"}};
       },
       {"loss_fn_config' entry 'beta' must be a number"}},
      {[](json& j) { j["forward_backward_input"]["data"][0] = 5; },
       {"'data[0]' must be an object"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["model_input"]["chunks"][1]["tokens"][0] = 1.5;
       },
       {"data[0].model_input.chunks[1].tokens[0]' must be an integer"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["model_input"]["chunks"][0]["type"] = "image";
       },
       {"chunks[0].type' is \"image\"", "only encoded_text"}},
      {[](json& j) { j["forward_backward_input"]["data"][0].erase("model_input"); },
       {"'data[0].model_input' is required"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"]["dtype"] = "float64";
       },
       {"data[0].loss_fn_inputs.weights'", "unknown dtype \"float64\""}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["target_tokens"]["data"][2] = 2.5;
       },
       {"loss_fn_inputs.target_tokens'", "data[2] must be an integer for dtype int64"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"]["data"][1] = "a";
       },
       {"loss_fn_inputs.weights'", "data[1] must be a number"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"]["shape"] = {6};
       },
       {"loss_fn_inputs.weights'", "shape [6] disagrees with its 5 elements"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"]["data"][3] = 1e300;
       },
       {"loss_fn_inputs.weights'", "data[3] = 1e+300 is outside the float32 range"}},
      {[](json& j) { j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"] = 1; },
       {"loss_fn_inputs.weights' must be an object (TensorData)"}},
      {[](json& j) {
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["target_tokens"]["data"] =
             json::array({12, 13, 14, 15});
         j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["target_tokens"]["shape"] = {4};
       },
       {"data[0].loss_fn_inputs.target_tokens", "shape [4] must be [5]"}},
      {[](json& j) {
         auto& w = j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"];
         w["sparse_crow_indices"] = {0, 1};
         w["sparse_col_indices"] = {0};
         w["shape"] = {1, 5};
       },
       {"loss_fn_inputs.weights'", "col_indices has 1 entries but there are 5 values"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto body = with(cases[i].edit);
    try {
      decode_forward_backward_json(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const request_error& e) {
      EXPECT_EQ(e.category(), "user");
      for (const auto& p : cases[i].parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
}

TEST(TinkerWireForwardBackwardJson, SparseJsonTensorsAreDensified) {
  auto j = json::parse(sft_json);
  auto& w = j["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"];
  w = {{"data", {1.0, 2.0}},
       {"dtype", "float32"},
       {"shape", {1, 5}},
       {"sparse_crow_indices", {0, 2}},
       {"sparse_col_indices", {2, 4}}};
  // Densified to [[0, 0, 1, 0, 2]]: decoded fine, then refused only for being 2-D.
  expect_user_error([&] { decode_forward_backward_json(j.dump()); },
                    {"loss_fn_inputs.weights: shape [1, 5] must be [5]"});
  w.erase("shape");
  expect_user_error([&] { decode_forward_backward_json(j.dump()); },
                    {"a sparse tensor needs a shape"});
}

TEST(TinkerWireForwardBackwardDispatch, ChoosesTheDecoderByContentTypeAndEncoding) {
  const auto proto = serialize(sft_request());
  EXPECT_EQ(decode_forward_backward(proto, "application/x-protobuf", "").seq_id, 3);
  EXPECT_EQ(decode_forward_backward(zstd_compress(proto), "application/x-protobuf", "zstd").seq_id,
            3);
  EXPECT_EQ(decode_forward_backward(sft_json, "application/json; charset=utf-8", "").seq_id, 1);
  EXPECT_EQ(decode_forward_backward(zstd_compress(sft_json), "", "zstd").seq_id, 1);
  expect_user_error([&] { decode_forward_backward(proto, "text/plain", ""); },
                    {"unsupported Content-Type \"text/plain\""});
  expect_user_error([&] { decode_forward_backward(proto, "application/x-protobuf", "br"); },
                    {"forward_backward: unsupported Content-Encoding \"br\""});
  expect_user_error([&] { decode_forward_backward(proto, "application/x-protobuf", "zstd"); },
                    {"forward_backward: zstd"});
  wire_limits small;
  small.max_body_bytes = 64;
  expect_user_error(
      [&] {
        decode_forward_backward(zstd_compress(proto), "application/x-protobuf", "zstd", small);
      },
      {"exceeds the limit of 64"});
}

// -- forward_backward outputs -------------------------------------------------------------------

tinker::forward_backward_output two_datum_output() {
  tinker::forward_backward_output out;
  out.loss_fn_outputs.resize(2);
  out.loss_fn_outputs[0]["logprobs"] = floats({-0.5, -1.5, -2.5});
  out.loss_fn_outputs[0]["elementwise_loss"] = floats({0.5, 1.5, 2.5});
  out.loss_fn_outputs[1]["logprobs"] = floats({-0.25, -4.0});
  out.loss_fn_outputs[1]["elementwise_loss"] = floats({0.25, 4.0});
  out.metrics = {{"loss:sum", 11.25}, {"entropy:mean", 0.5}};
  return out;
}

TEST(TinkerWireOutputs, ExactBatchedTensorLayout) {
  const auto body = encode_forward_backward_output_proto(two_datum_output());
  tinker_public::ForwardBackwardOutput msg;
  ASSERT_TRUE(msg.ParseFromString(body));
  EXPECT_EQ(msg.loss_fn_output_type(), "ArrayRecord");
  ASSERT_EQ(msg.loss_fn_outputs_size(), 1);
  const auto& rec = msg.loss_fn_outputs(0);
  EXPECT_EQ(rec.type_tag(), "ArrayRecord");
  EXPECT_EQ(rec.num_datums(), 2);
  ASSERT_EQ(rec.fields().size(), 2u);
  const auto& lp = rec.fields().at("logprobs");
  EXPECT_EQ(lp.dtype(), tinker_public::DTYPE_FLOAT32);
  EXPECT_EQ(lp.trailing_shape_size(), 0);
  EXPECT_EQ(from_raw<int64_t>(lp.offsets()), (std::vector<int64_t>{0, 12, 20}));
  EXPECT_EQ(from_raw<float>(lp.data()), (std::vector<float>{-0.5f, -1.5f, -2.5f, -0.25f, -4.0f}));
  EXPECT_EQ(from_raw<float>(rec.fields().at("elementwise_loss").data()),
            (std::vector<float>{0.5f, 1.5f, 2.5f, 0.25f, 4.0f}));
  ASSERT_EQ(msg.metrics().size(), 2u);
  EXPECT_EQ(msg.metrics().at("loss:sum"), 11.25);
  EXPECT_EQ(msg.metrics().at("entropy:mean"), 0.5);
}

TEST(TinkerWireOutputs, IntegerAndTwoDimensionalOutputs) {
  tinker::forward_backward_output out;
  out.loss_fn_outputs.resize(2);
  out.loss_fn_outputs[0]["ids"] = ints({1, 2});
  out.loss_fn_outputs[1]["ids"] = ints({3});
  out.loss_fn_outputs[0]["topk"] = floats({1, 2, 3, 4}, {2, 2});
  out.loss_fn_outputs[1]["topk"] = floats({5, 6}, {1, 2});
  tinker_public::ForwardBackwardOutput msg;
  ASSERT_TRUE(msg.ParseFromString(encode_forward_backward_output_proto(out)));
  const auto& ids = msg.loss_fn_outputs(0).fields().at("ids");
  EXPECT_EQ(ids.dtype(), tinker_public::DTYPE_INT64);
  EXPECT_EQ(from_raw<int64_t>(ids.offsets()), (std::vector<int64_t>{0, 16, 24}));
  EXPECT_EQ(from_raw<int64_t>(ids.data()), (std::vector<int64_t>{1, 2, 3}));
  const auto& topk = msg.loss_fn_outputs(0).fields().at("topk");
  ASSERT_EQ(topk.trailing_shape_size(), 1);
  EXPECT_EQ(topk.trailing_shape(0), 2);
  EXPECT_EQ(from_raw<int64_t>(topk.offsets()), (std::vector<int64_t>{0, 16, 24}));

  const auto back = decode_forward_backward_output_proto(encode_forward_backward_output_proto(out));
  ASSERT_EQ(back.loss_fn_outputs.size(), 2u);
  EXPECT_EQ(back.loss_fn_outputs[1].at("topk").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(back.loss_fn_outputs[1].at("topk").floats, (std::vector<double>{5, 6}));
  EXPECT_EQ(back.loss_fn_outputs[0].at("ids").ints, (std::vector<int64_t>{1, 2}));
}

TEST(TinkerWireOutputs, ProtoRoundTripKeepsEveryDatum) {
  const auto out = two_datum_output();
  const auto back = decode_forward_backward_output_proto(encode_forward_backward_output_proto(out));
  EXPECT_EQ(back.loss_fn_output_type, "ArrayRecord");
  EXPECT_EQ(back.metrics, out.metrics);
  ASSERT_EQ(back.loss_fn_outputs.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    for (const auto& [name, t] : out.loss_fn_outputs[i]) {
      EXPECT_EQ(back.loss_fn_outputs[i].at(name).shape, t.shape);
      EXPECT_EQ(back.loss_fn_outputs[i].at(name).floats, t.floats);
    }
  tinker::forward_backward_output empty;
  empty.metrics["loss:sum"] = 0;
  EXPECT_TRUE(decode_forward_backward_output_proto(encode_forward_backward_output_proto(empty))
                  .loss_fn_outputs.empty());
}

TEST(TinkerWireOutputs, Bfloat16OutputsRoundToNearest) {
  tinker::forward_backward_output out;
  out.loss_fn_outputs.resize(1);
  auto t = floats({1.0, 1.0 + 1.0 / 256, -2.0});
  t.type = dtype::bfloat16;
  out.loss_fn_outputs[0]["x"] = t;
  tinker_public::ForwardBackwardOutput msg;
  ASSERT_TRUE(msg.ParseFromString(encode_forward_backward_output_proto(out)));
  // 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: round to even keeps 0x3f80.
  EXPECT_EQ(from_raw<uint16_t>(msg.loss_fn_outputs(0).fields().at("x").data()),
            (std::vector<uint16_t>{0x3f80, 0x3f80, 0xc000}));
}

TEST(TinkerWireOutputs, MetricNamesNeedExactlyOneKnownReduction) {
  for (const char* ok :
       {"loss:sum", "entropy:mean", "x:min", "x:max", "x:slack", "x:unique", "x:hash_unordered"})
    EXPECT_NO_THROW(validate_metric_name(ok)) << ok;
  for (const char* bad : {"loss", "loss:sum:x", "loss:avg", ":sum", "loss:"}) {
    expect_error([&] { validate_metric_name(bad); }, "server", {std::string("\"") + bad + "\""});
    auto out = two_datum_output();
    out.metrics[bad] = 1;
    expect_error([&] { encode_forward_backward_output_proto(out); }, "server", {bad});
    expect_error([&] { encode_forward_backward_output_json(out); }, "server", {bad});
  }
}

TEST(TinkerWireOutputs, RefusesInconsistentDatums) {
  auto out = two_datum_output();
  out.loss_fn_outputs[1].erase("elementwise_loss");
  expect_error([&] { encode_forward_backward_output_proto(out); }, "server",
               {"datum 1 has 1 outputs, datum 0 has 2"});
  out = two_datum_output();
  out.loss_fn_outputs[1]["values"] = out.loss_fn_outputs[1]["elementwise_loss"];
  out.loss_fn_outputs[1].erase("elementwise_loss");
  expect_error([&] { encode_forward_backward_output_proto(out); }, "server",
               {"datum 1 has output 'values' that datum 0 lacks"});
  out = two_datum_output();
  out.loss_fn_outputs[1]["logprobs"] = ints({1, 2});
  expect_error([&] { encode_forward_backward_output_proto(out); }, "server",
               {"datum 1 output 'logprobs' is int64", "unlike datum 0 (float32"});
  out = two_datum_output();
  out.loss_fn_outputs[0]["logprobs"].shape = {4};
  expect_error([&] { encode_forward_backward_output_json(out); }, "server",
               {"datum 0 output 'logprobs': shape [4] disagrees with 3 elements"});
}

TEST(TinkerWireOutputs, RefusesBrokenProtoOutputs) {
  expect_user_error([] { decode_forward_backward_output_proto("\xff\xff"); },
                    {"not a valid ForwardBackwardOutput"});
  tinker_public::ForwardBackwardOutput msg;
  auto* rec = msg.add_loss_fn_outputs();
  rec->set_num_datums(2);
  auto& bt = (*rec->mutable_fields())["logprobs"];
  bt.set_dtype(tinker_public::DTYPE_FLOAT32);
  bt.set_data(raw_bytes<float>({1, 2}));
  bt.set_offsets(raw_bytes<int64_t>({0, 4}));
  expect_user_error([&] { decode_forward_backward_output_proto(serialize(msg)); },
                    {"2 offsets for 2 datums"});
  bt.set_offsets(raw_bytes<int64_t>({0, 4, 12}));
  expect_user_error([&] { decode_forward_backward_output_proto(serialize(msg)); },
                    {"offsets [4, 12) of datum 1"});
}

TEST(TinkerWireOutputs, JsonOutputCollapsesDtypesAndNullsNonFinite) {
  auto out = two_datum_output();
  out.loss_fn_outputs[0]["logprobs"].floats[1] = -std::numeric_limits<double>::infinity();
  out.loss_fn_outputs[0]["elementwise_loss"].type = dtype::bfloat16;
  out.loss_fn_outputs[1]["elementwise_loss"].type = dtype::bfloat16;
  out.metrics["loss:sum"] = std::nan("");
  const auto j = json::parse(encode_forward_backward_output_json(out));
  EXPECT_EQ(j["loss_fn_output_type"], "ArrayRecord");
  ASSERT_EQ(j["loss_fn_outputs"].size(), 2u);
  const auto& lp = j["loss_fn_outputs"][0]["logprobs"];
  EXPECT_EQ(lp["dtype"], "float32");
  EXPECT_EQ(lp["shape"], json::array({3}));
  EXPECT_EQ(lp["data"][0], -0.5);
  EXPECT_TRUE(lp["data"][1].is_null());
  EXPECT_EQ(j["loss_fn_outputs"][1]["elementwise_loss"]["dtype"], "float32");
  EXPECT_TRUE(j["metrics"]["loss:sum"].is_null());
  EXPECT_EQ(j["metrics"]["entropy:mean"], 0.5);
}

// -- sampling -----------------------------------------------------------------------------------

const char* sample_json = R"({"num_samples":4,
  "prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
  "sampling_params":{"max_tokens":16,"seed":7,"stop":[5,6],"temperature":0.7,"top_k":-1,
                     "top_p":0.9},
  "sampling_session_id":"sess-1:sample:0","seq_id":2,"prompt_logprobs":true,
  "topk_prompt_logprobs":0,"type":"sample"})";

std::string edit_sample(const std::function<void(json&)>& edit) {
  auto j = json::parse(sample_json);
  edit(j);
  return j.dump();
}

TEST(TinkerWireSample, DecodesTheSdkBody) {
  const auto b = decode_sample(sample_json);
  const auto& r = b.request;
  EXPECT_EQ(r.sampling_session_id, "sess-1:sample:0");
  EXPECT_EQ(r.seq_id, 2);
  EXPECT_EQ(r.num_samples, 4);
  EXPECT_EQ(r.prompt, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(r.prompt_logprobs);
  EXPECT_EQ(r.topk_prompt_logprobs, 0);
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(r.params.seed, 7);
  EXPECT_EQ(r.params.stop_tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(r.params.stop_strings.empty());
  EXPECT_DOUBLE_EQ(r.params.temperature, 0.7);
  EXPECT_EQ(r.params.top_k, -1);
  EXPECT_DOUBLE_EQ(r.params.top_p, 0.9);
  EXPECT_TRUE(b.model_path.empty());
}

TEST(TinkerWireSample, DefaultsStopStringsAndOlderAddressing) {
  const auto b = decode_sample(R"({"prompt":{"chunks":[{"tokens":[4],"type":"encoded_text"}]},
    "sampling_params":{"max_tokens":1,"stop":"\n\n","top_k":0},
    "model_path":"tinker://run/sampler_weights/1"})");
  EXPECT_EQ(b.model_path, "tinker://run/sampler_weights/1");
  EXPECT_EQ(b.request.num_samples, 1);
  EXPECT_FALSE(b.request.params.has_seed);
  EXPECT_EQ(b.request.params.stop_strings, (std::vector<std::string>{"\n\n"}));
  EXPECT_EQ(b.request.params.top_k, -1); // 0 means off
  EXPECT_DOUBLE_EQ(b.request.params.temperature, 1.0);
  EXPECT_FALSE(b.request.prompt_logprobs);
  const auto s = decode_sample(edit_sample([](json& j) {
    j["sampling_params"]["stop"] = {"a", "b"};
  }));
  EXPECT_EQ(s.request.params.stop_strings, (std::vector<std::string>{"a", "b"}));
}

TEST(TinkerWireSample, RefusesBadBodies) {
  struct bad_case {
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<bad_case> cases = {
      {[](json& j) { j.erase("sampling_session_id"); },
       {"one of 'sampling_session_id', 'model_path' or 'base_model' is required"}},
      {[](json& j) { j.erase("seq_id"); }, {"'seq_id' is required with a sampling_session_id"}},
      {[](json& j) { j["model_path"] = "/tmp/x"; }, {"'model_path' must start with tinker://"}},
      {[](json& j) { j["num_samples"] = 0; }, {"'num_samples' must be >= 1, got 0"}},
      {[](json& j) { j["prompt"]["chunks"][0]["tokens"] = json::array(); },
       {"'prompt' has no tokens"}},
      {[](json& j) { j["prompt"]["chunks"][0]["tokens"][1] = -2; },
       {"'prompt' token 1 = -2 is negative"}},
      {[](json& j) { j["prompt"]["chunks"][0]["type"] = "image_asset_pointer"; },
       {"only encoded_text"}},
      {[](json& j) { j.erase("sampling_params"); }, {"'sampling_params' is required"}},
      {[](json& j) { j["sampling_params"].erase("max_tokens"); },
       {"'sampling_params.max_tokens' is required"}},
      {[](json& j) { j["sampling_params"]["max_tokens"] = 0; },
       {"'sampling_params.max_tokens' must be >= 1, got 0"}},
      {[](json& j) { j["sampling_params"]["temperature"] = -0.1; },
       {"'sampling_params.temperature' must be a finite number >= 0"}},
      {[](json& j) { j["sampling_params"]["top_p"] = 0; },
       {"'sampling_params.top_p' must be in (0, 1]"}},
      {[](json& j) { j["sampling_params"]["top_p"] = 1.5; }, {"top_p' must be in (0, 1], got 1.5"}},
      {[](json& j) { j["sampling_params"]["top_k"] = -2; }, {"'sampling_params.top_k' must be -1"}},
      {[](json& j) {
         j["sampling_params"]["stop"] = {1, "x"};
       },
       {"'sampling_params.stop' mixes"}},
      {[](json& j) { j["sampling_params"]["stop"] = {-1}; }, {"stop' token 0 = -1 is negative"}},
      {[](json& j) { j["sampling_params"]["stop"] = 3; }, {"stop' must be a string or an array"}},
      {[](json& j) { j["sampling_params"]["stop"] = {true}; },
       {"stop' entry 0 must be a string or an integer"}},
      {[](json& j) { j["topk_prompt_logprobs"] = 5; },
       {"'topk_prompt_logprobs' = 5 is not supported"}},
      {[](json& j) { j["topk_prompt_logprobs"] = -1; }, {"'topk_prompt_logprobs' must be >= 0"}},
      {[](json& j) { j["prompt_logprobs"] = 1; }, {"'prompt_logprobs' must be a boolean"}},
      {[](json& j) { j["type"] = "asample"; }, {"'type' is \"asample\", expected \"sample\""}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto body = edit_sample(cases[i].edit);
    try {
      decode_sample(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const request_error& e) {
      EXPECT_EQ(e.category(), "user");
      EXPECT_EQ(std::string(e.what()).rfind("asample: ", 0), 0u) << e.what();
      for (const auto& p : cases[i].parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
  wire_limits limits;
  limits.vocab_size = 3;
  expect_user_error([&] { decode_sample(sample_json, limits); },
                    {"'prompt' token 2 = 3 is outside the vocabulary of 3"});
  limits = {};
  limits.max_context_length = 3;
  expect_user_error([&] { decode_sample(sample_json, limits); },
                    {"'prompt' has 3 tokens", "context of 3"});
}

tinker::sample_response two_sequences() {
  tinker::sample_response r;
  r.sequences.push_back({"stop", {5, 6, 2}, {-0.5, -0.25, -1.0}});
  r.sequences.push_back({"length", {7}, {-2.0}});
  r.has_prompt_logprobs = true;
  r.prompt_logprobs = {0.0, -3.0, -4.5};
  return r;
}

TEST(TinkerWireSample, EncodesTheProtoResponse) {
  tinker_public::SampleResponse msg;
  ASSERT_TRUE(msg.ParseFromString(encode_sample_response_proto(two_sequences())));
  ASSERT_EQ(msg.sequences_size(), 2);
  EXPECT_EQ(msg.sequences(0).stop_reason(), tinker_public::STOP_REASON_STOP);
  EXPECT_EQ(msg.sequences(1).stop_reason(), tinker_public::STOP_REASON_LENGTH);
  EXPECT_EQ(from_raw<int32_t>(msg.sequences(0).tokens()), (std::vector<int32_t>{5, 6, 2}));
  ASSERT_TRUE(msg.sequences(0).has_logprobs());
  EXPECT_EQ(from_raw<float>(msg.sequences(0).logprobs()),
            (std::vector<float>{-0.5f, -0.25f, -1.0f}));
  ASSERT_TRUE(msg.has_prompt_logprobs());
  const auto plp = from_raw<float>(msg.prompt_logprobs());
  ASSERT_EQ(plp.size(), 3u);
  EXPECT_TRUE(std::isnan(plp[0])); // forced NaN: the SDK maps it to None
  EXPECT_EQ(plp[1], -3.0f);
  EXPECT_EQ(plp[2], -4.5f);
  EXPECT_FALSE(msg.has_topk_prompt_logprobs());

  auto plain = two_sequences();
  plain.has_prompt_logprobs = false;
  ASSERT_TRUE(msg.ParseFromString(encode_sample_response_proto(plain)));
  EXPECT_FALSE(msg.has_prompt_logprobs());
}

// SampleResponse sequences=1; SampledSequence stop_reason=1 (LENGTH=1), tokens=2 (int32),
// logprobs=3 (float32), assembled by hand from the SDK descriptor.
TEST(TinkerWireSample, EncodesHandCheckedBytes) {
  tinker::sample_response r;
  r.sequences.push_back({"length", {5}, {-0.5}});
  EXPECT_EQ(encode_sample_response_proto(r),
            std::string("\x0a\x0e\x08\x01\x12\x04\x05\x00\x00\x00\x1a\x04\x00\x00\x00\xbf", 16));
}

TEST(TinkerWireSample, ProtoResponseRoundTrips) {
  const auto back = decode_sample_response_proto(encode_sample_response_proto(two_sequences()));
  ASSERT_EQ(back.sequences.size(), 2u);
  EXPECT_EQ(back.sequences[0].stop_reason, "stop");
  EXPECT_EQ(back.sequences[1].stop_reason, "length");
  EXPECT_EQ(back.sequences[0].tokens, (std::vector<int64_t>{5, 6, 2}));
  EXPECT_EQ(back.sequences[1].logprobs, (std::vector<double>{-2.0}));
  EXPECT_TRUE(back.has_prompt_logprobs);
  expect_user_error([] { decode_sample_response_proto("\x0a\x05\x12\x03xyz"); },
                    {"tokens has 3 bytes"});
}

TEST(TinkerWireSample, RefusesBrokenResults) {
  auto r = two_sequences();
  r.sequences[1].stop_reason = "eos";
  expect_error([&] { encode_sample_response_proto(r); }, "server",
               {"sequence 1 has stop_reason \"eos\""});
  r = two_sequences();
  r.sequences[0].logprobs.pop_back();
  expect_error([&] { encode_sample_response_json(r); }, "server",
               {"sequence 0 has 2 logprobs for 3 tokens"});
  r = two_sequences();
  r.sequences[1].tokens[0] = int64_t{1} << 33;
  r.sequences[1].logprobs = {0};
  expect_error([&] { encode_sample_response_proto(r); }, "server", {"does not fit in int32"});
}

TEST(TinkerWireSample, JsonResponseHasNullFirstPromptLogprob) {
  const auto j = json::parse(encode_sample_response_json(two_sequences()));
  EXPECT_EQ(j["type"], "sample");
  ASSERT_EQ(j["sequences"].size(), 2u);
  EXPECT_EQ(j["sequences"][0]["stop_reason"], "stop");
  EXPECT_EQ(j["sequences"][0]["tokens"], json::array({5, 6, 2}));
  EXPECT_EQ(j["sequences"][1]["logprobs"], json::array({-2.0}));
  ASSERT_EQ(j["prompt_logprobs"].size(), 3u);
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
  EXPECT_EQ(j["prompt_logprobs"][2], -4.5);
  auto plain = two_sequences();
  plain.has_prompt_logprobs = false;
  EXPECT_FALSE(json::parse(encode_sample_response_json(plain)).contains("prompt_logprobs"));
}

// -- the other JSON bodies ----------------------------------------------------------------------

TEST(TinkerWireBodies, SessionBodies) {
  const auto s = decode_create_session(
      R"({"tags":["a","b"],"user_metadata":{"who":"me","n":3},"sdk_version":"0.25.0",)"
      R"("type":"create_session"})");
  EXPECT_EQ(s.tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.user_metadata.at("who"), "me");
  EXPECT_EQ(s.user_metadata.at("n"), "3");
  EXPECT_EQ(s.sdk_version, "0.25.0");
  EXPECT_TRUE(s.project_id.empty());
  expect_user_error([] { decode_create_session(R"({"tags":"a"})"); },
                    {"create_session: 'tags' must be an array, got string"});
  expect_user_error([] { decode_create_session(R"({"tags":[1]})"); },
                    {"'tags' entry 0 must be a string"});
  expect_user_error([] { decode_create_session(R"({"user_metadata":[1]})"); },
                    {"'user_metadata' must be an object"});
  EXPECT_EQ(
      decode_session_heartbeat(R"({"session_id":"sess-1","type":"session_heartbeat"})").session_id,
      "sess-1");
  expect_user_error([] { decode_session_heartbeat("{}"); },
                    {"session_heartbeat: 'session_id' is required"});
  expect_user_error([] { decode_session_heartbeat(R"({"session_id":""})"); },
                    {"'session_id' must not be empty"});
  expect_user_error([] { decode_session_heartbeat("nope"); }, {"malformed JSON"});
}

TEST(TinkerWireBodies, CreateModel) {
  const auto m = decode_create_model(
      R"({"session_id":"sess-1","model_seq_id":0,"base_model":"toy","lora_config":{"rank":8,)"
      R"("seed":3,"train_unembed":false,"train_mlp":true,"train_attn":true},"type":"create_model"})");
  EXPECT_EQ(m.session_id, "sess-1");
  EXPECT_EQ(m.model_seq_id, 0);
  EXPECT_EQ(m.base_model, "toy");
  EXPECT_EQ(m.lora.rank, 8);
  EXPECT_TRUE(m.lora.has_seed);
  EXPECT_EQ(m.lora.seed, 3);
  EXPECT_FALSE(m.lora.train_unembed);
  EXPECT_TRUE(m.lora.train_mlp);
  EXPECT_EQ(m.role, "policy");
  const auto c = decode_create_model(
      R"({"session_id":"s","model_seq_id":2,"base_model":"toy","model_role":"critic"})");
  EXPECT_EQ(c.lora.rank, 0);
  EXPECT_FALSE(c.lora.has_seed);
  EXPECT_EQ(c.role, "critic");
  expect_user_error([] { decode_create_model(R"({"session_id":"s","model_seq_id":0})"); },
                    {"create_model: 'base_model' is required"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","lora_config":{"rank":-1}})");
      },
      {"'lora_config.rank' must be >= 0, got -1"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","lora_config":{}})");
      },
      {"'lora_config.rank' is required"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","model_role":"actor"})");
      },
      {"'model_role' is \"actor\", expected policy or critic"});
  expect_user_error(
      [] { decode_create_model(R"({"session_id":"s","model_seq_id":-1,"base_model":"b"})"); },
      {"'model_seq_id' must be >= 0"});
}

TEST(TinkerWireBodies, OptimStep) {
  const auto o = decode_optim_step(
      R"({"adam_params":{"learning_rate":0.001,"beta1":0.8,"beta2":0.99,"eps":1e-8,)"
      R"("weight_decay":0.1,"grad_clip_norm":1},"model_id":"m","seq_id":4,"type":"optim_step"})");
  EXPECT_EQ(o.model_id, "m");
  EXPECT_EQ(o.seq_id, 4);
  EXPECT_DOUBLE_EQ(o.adam.learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(o.adam.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.adam.beta2, 0.99);
  EXPECT_DOUBLE_EQ(o.adam.eps, 1e-8);
  EXPECT_DOUBLE_EQ(o.adam.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(o.adam.grad_clip_norm, 1.0);
  const auto d = decode_optim_step(R"({"adam_params":{},"model_id":"m","seq_id":0})");
  EXPECT_DOUBLE_EQ(d.adam.learning_rate, 1e-4);
  EXPECT_DOUBLE_EQ(d.adam.beta2, 0.95);
  EXPECT_DOUBLE_EQ(d.adam.eps, 1e-12);
  auto bad = [](const std::string& adam) {
    return R"({"model_id":"m","seq_id":1,"adam_params":)" + adam + "}";
  };
  expect_user_error([&] { decode_optim_step(bad(R"({"beta1":1.0})")); },
                    {"optim_step: 'adam_params.beta1' must be in [0, 1), got 1"});
  expect_user_error([&] { decode_optim_step(bad(R"({"learning_rate":-1})")); },
                    {"'adam_params.learning_rate' must be a finite number >= 0"});
  expect_user_error([&] { decode_optim_step(bad(R"({"eps":0})")); }, {"'adam_params.eps'"});
  expect_user_error([&] { decode_optim_step(bad(R"({"grad_clip_norm":"1"})")); },
                    {"'adam_params.grad_clip_norm' must be a number, got string"});
  expect_user_error([&] { decode_optim_step(bad(R"({"weight_decay":1e400})")); },
                    {"malformed JSON"});
  expect_user_error([] { decode_optim_step(R"({"model_id":"m","seq_id":1})"); },
                    {"'adam_params' is required"});
  expect_user_error([] { decode_optim_step(R"({"model_id":"m","adam_params":{}})"); },
                    {"'seq_id' is required"});
}

TEST(TinkerWireBodies, SaveWeightsAndForSampler) {
  const auto s = decode_save_weights(
      R"({"model_id":"m","path":"step_000010","seq_id":5,"ttl_seconds":60,"overwrite":true})");
  EXPECT_EQ(s.path, "step_000010");
  EXPECT_TRUE(s.has_ttl);
  EXPECT_EQ(s.ttl_seconds, 60);
  EXPECT_TRUE(s.overwrite);
  for (const char* bad : {"../x", "a/b", ".hidden", "a b"})
    expect_user_error(
        [&] {
          decode_save_weights(std::string(R"({"model_id":"m","seq_id":1,"path":")") + bad + "\"}");
        },
        {"save_weights: 'path'", "is not a checkpoint name"});
  expect_user_error([] { decode_save_weights(R"({"model_id":"m","seq_id":1,"ttl_seconds":0})"); },
                    {"'ttl_seconds' must be >= 1, got 0"});
  const auto f = decode_save_weights_for_sampler(
      R"({"model_id":"m","seq_id":2,"sampling_session_seq_id":0,"type":"save_weights_for_sampler"})");
  EXPECT_TRUE(f.path.empty());
  EXPECT_TRUE(f.has_sampling_session_seq_id);
  EXPECT_EQ(f.sampling_session_seq_id, 0);
  EXPECT_FALSE(f.has_ttl);
  const auto p = decode_save_weights_for_sampler(R"({"model_id":"m","seq_id":2,"path":"final"})");
  EXPECT_EQ(p.path, "final");
  EXPECT_FALSE(p.has_sampling_session_seq_id);
  expect_user_error(
      [] { decode_save_weights_for_sampler(R"({"model_id":"m","seq_id":2,"path":"x/../../y"})"); },
      {"save_weights_for_sampler: 'path'"});
  expect_user_error([] { decode_save_weights_for_sampler(R"({"seq_id":2})"); },
                    {"'model_id' is required"});
}

TEST(TinkerWireBodies, LoadWeightsInBothAddressingModes) {
  const auto l = decode_load_weights(
      R"({"model_id":"m","seq_id":1,"path":"tinker://run/weights/a","optimizer":true})");
  EXPECT_FALSE(l.create_via_load);
  EXPECT_EQ(l.model_id, "m");
  EXPECT_EQ(l.seq_id, 1);
  EXPECT_TRUE(l.optimizer);
  const auto c = decode_load_weights(
      R"({"session_id":"s","model_seq_id":1,"base_model":"toy","path":"tinker://run/weights/a",)"
      R"("optimizer":false})");
  EXPECT_TRUE(c.create_via_load);
  EXPECT_EQ(c.session_id, "s");
  EXPECT_EQ(c.model_seq_id, 1);
  EXPECT_EQ(c.base_model, "toy");
  expect_user_error(
      [] {
        decode_load_weights(
            R"({"model_id":"m","seq_id":1,"session_id":"s","model_seq_id":1,"path":"tinker://a","optimizer":true})");
      },
      {"not both"});
  expect_user_error([] { decode_load_weights(R"({"path":"tinker://a","optimizer":true})"); },
                    {"are required"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","seq_id":1,"path":"/etc","optimizer":true})"); },
      {"'path' must start with tinker://"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","seq_id":1,"path":"tinker://a"})"); },
      {"'optimizer' is required"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","path":"tinker://a","optimizer":true})"); },
      {"'seq_id' is required"});
}

TEST(TinkerWireBodies, SamplingSessionFutureAndInfoBodies) {
  const auto s = decode_create_sampling_session(
      R"({"session_id":"s","sampling_session_seq_id":3,"model_path":"tinker://r/sampler_weights/x"})");
  EXPECT_EQ(s.sampling_session_seq_id, 3);
  EXPECT_EQ(s.model_path, "tinker://r/sampler_weights/x");
  EXPECT_EQ(decode_create_sampling_session(
                R"({"session_id":"s","sampling_session_seq_id":0,"base_model":"toy"})")
                .base_model,
            "toy");
  expect_user_error(
      [] { decode_create_sampling_session(R"({"session_id":"s","sampling_session_seq_id":0})"); },
      {"one of 'model_path' or 'base_model' is required"});
  expect_user_error(
      [] {
        decode_create_sampling_session(
            R"({"session_id":"s","sampling_session_seq_id":0,"model_path":"tinker://"})");
      },
      {"'model_path' must start with tinker://"});

  const auto f = decode_retrieve_future(R"({"request_id":"req-9","allow_metadata_only":true})");
  EXPECT_EQ(f.request_id, "req-9");
  EXPECT_TRUE(f.allow_metadata_only);
  EXPECT_FALSE(decode_retrieve_future(R"({"request_id":"r"})").allow_metadata_only);
  expect_user_error([] { decode_retrieve_future(R"({"request_id":5})"); },
                    {"retrieve_future: 'request_id' must be a string, got number"});
  expect_user_error(
      [] { decode_retrieve_future(R"({"request_id":"r","allow_metadata_only":"yes"})"); },
      {"'allow_metadata_only' must be a boolean"});

  EXPECT_EQ(decode_weights_info(R"({"tinker_path":"tinker://r/weights/a"})").tinker_path,
            "tinker://r/weights/a");
  expect_user_error([] { decode_weights_info(R"({"tinker_path":"r/weights/a"})"); },
                    {"weights_info: 'tinker_path' must start with tinker://"});
  EXPECT_EQ(decode_get_info(R"({"model_id":"m","type":"get_info"})").model_id, "m");
  expect_user_error([] { decode_get_info(R"({"model_id":"m","type":"unload_model"})"); },
                    {"get_info: 'type' is \"unload_model\""});
  EXPECT_EQ(decode_unload_model(R"({"model_id":"m","type":"unload_model"})").model_id, "m");
  expect_user_error([] { decode_unload_model(R"({"model_id":null})"); },
                    {"unload_model: 'model_id' is required"});
}

// -- losses -------------------------------------------------------------------------------------

TEST(TinkerWireLoss, NamesAndKeys) {
  const auto& names = loss_names();
  for (const char* n : {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo",
                        "dppo", "ppo_critic"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(loss_config_keys("ppo"),
            (std::vector<std::string>{"clip_high_threshold", "clip_low_threshold", "value_clip"}));
  EXPECT_EQ(loss_config_keys("dro"), (std::vector<std::string>{"beta"}));
  EXPECT_TRUE(loss_config_keys("cross_entropy").empty());
  expect_user_error([] { loss_config_keys("grpo"); }, {"unknown loss_fn 'grpo'", "ppo_critic"});
}

TEST(TinkerWireLoss, ValidatesKeysAndDomains) {
  EXPECT_NO_THROW(
      validate_loss_config("ppo", {{"clip_low_threshold", 0.8}, {"clip_high_threshold", 1.28}}));
  EXPECT_NO_THROW(
      validate_loss_config("cispo", {{"clip_low_threshold", 0.0}, {"clip_high_threshold", 4.0}}));
  EXPECT_NO_THROW(validate_loss_config("dro", {{"beta", 0.05}}));
  EXPECT_NO_THROW(validate_loss_config("ppo_critic",
                                       {{"value_clip", std::numeric_limits<double>::infinity()}}));
  EXPECT_NO_THROW(validate_loss_config("importance_sampling", {}));
  expect_user_error(
      [] {
        validate_loss_config("ppo", {{"clip_ratio", 0.2}});
      },
      {"unknown loss_fn_config key 'clip_ratio'",
       "allowed keys: clip_high_threshold, clip_low_threshold, value_clip"});
  expect_user_error(
      [] {
        validate_loss_config("importance_sampling", {{"beta", 1}});
      },
      {"unknown loss_fn_config key 'beta'", "allowed keys: (none)"});
  expect_user_error(
      [] {
        validate_loss_config("ppo", {{"clip_low_threshold", 1.5}});
      },
      {"'clip_low_threshold' must be in [0, 1], got 1.5"});
  expect_user_error(
      [] {
        validate_loss_config("cispo", {{"clip_high_threshold", 0.9}});
      },
      {"'clip_high_threshold' must be a finite number >= 1, got 0.9"});
  expect_user_error(
      [] {
        validate_loss_config("ppo", {{"clip_high_threshold", std::nan("")}});
      },
      {"must be a number, got nan"});
  expect_user_error([] { validate_loss_config("dro", {}); }, {"'beta' is required"});
  expect_user_error(
      [] {
        validate_loss_config("dro", {{"beta", -1}});
      },
      {"'beta' must be a finite number >= 0, got -1"});
  expect_user_error(
      [] {
        validate_loss_config("dppo", {{"delta_low", -0.1}});
      },
      {"'delta_low' must be a finite number >= 0"});
  expect_user_error(
      [] {
        validate_loss_config("ppo_critic", {{"value_clip", -1}});
      },
      {"'value_clip' must be a number >= 0"});
}

TEST(TinkerWireLoss, PpoMapsToRegularClipEpsilons) {
  auto d = ppo_to_regular({});
  EXPECT_NEAR(d.at("eps_clip_low"), 0.2, 1e-12);
  EXPECT_NEAR(d.at("eps_clip_high"), 0.2, 1e-12);
  EXPECT_EQ(d.size(), 2u);
  auto c = ppo_to_regular(
      {{"clip_low_threshold", 0.7}, {"clip_high_threshold", 1.28}, {"value_clip", 0.5}});
  EXPECT_NEAR(c.at("eps_clip_low"), 0.3, 1e-12);
  EXPECT_NEAR(c.at("eps_clip_high"), 0.28, 1e-12);
  EXPECT_EQ(c.size(), 2u);
  expect_user_error(
      [] {
        ppo_to_regular({{"clip_low_threshold", -0.1}});
      },
      {"'clip_low_threshold' must be in [0, 1]"});
  expect_user_error([] { ppo_to_regular({{"eps", 0.1}}); }, {"unknown loss_fn_config key 'eps'"});
}

} // namespace
} // namespace rlforge::service
