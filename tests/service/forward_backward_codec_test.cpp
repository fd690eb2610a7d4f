#include "tests/service/wire_test_support.hpp"

#include "service/wire/compression.hpp"
#include "service/wire/forward_backward_codec.hpp"

namespace rlforge::service::test {
namespace {

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

TEST(TinkerWireForwardBackwardProto, RefusesTokenBytesThatAreNotInt32s) {
  auto m = sft_request();
  m.mutable_data(1)->mutable_model_input(0)->mutable_encoded_text()->set_tokens("12345");
  expect_user_error([&] { decode_proto(m); }, {"data[1].model_input[0]", "5 token bytes"});
}

// What a model accepts is not the decoder's to check: token ids outside any vocabulary, targets
// of another length, unknown or missing inputs, non-finite values and unknown losses all decode;
// the backend refuses them once, against the model (tests/tinker).
TEST(TinkerWireForwardBackwardProto, DecodesWhatOnlyTheModelCanRefuse) {
  auto m = sft_request();
  m.mutable_data(1)->mutable_model_input(0)->mutable_encoded_text()->set_tokens(
      raw_bytes<int32_t>({7, -3}));
  EXPECT_EQ(decode_proto(m).data[1].tokens, (std::vector<int64_t>{7, -3}));
  m = sft_request();
  (*m.mutable_data(1)->mutable_loss_fn_inputs())["target_tokens"] =
      dense_tensor(tinker_public::DTYPE_INT64, raw_bytes<int64_t>({8, 9, 10}), {3});
  EXPECT_EQ(decode_proto(m).data[1].loss_fn_inputs.at("target_tokens").ints.size(), 3u);
  m = rl_request();
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in["advantages"] =
      dense_tensor(tinker_public::DTYPE_FLOAT32,
                   raw_bytes<float>({0, std::numeric_limits<float>::infinity(), 1}), {3});
  in["mask"] = dense_tensor(tinker_public::DTYPE_FLOAT32, raw_bytes<float>({1, 1, 1}), {3});
  in.erase("logprobs");
  m.set_loss_fn("telepathy");
  auto r = decode_proto(m);
  EXPECT_TRUE(std::isinf(r.data[0].loss_fn_inputs.at("advantages").floats[1]));
  EXPECT_EQ(r.data[0].loss_fn_inputs.count("mask"), 1u);
  EXPECT_EQ(r.loss_fn, "telepathy");
  m.clear_data();
  EXPECT_TRUE(decode_proto(m).data.empty());
}

TEST(TinkerWireForwardBackwardProto, RefusesBadDtypes) {
  auto m = sft_request();
  auto& in = *m.mutable_data(0)->mutable_loss_fn_inputs();
  in["weights"].set_dtype(tinker_public::DTYPE_UNSPECIFIED);
  expect_user_error([&] { decode_proto(m); }, {"data[0].loss_fn_inputs.weights", "unspecified"});
  in["weights"].set_dtype(static_cast<tinker_public::DType>(9));
  expect_user_error([&] { decode_proto(m); }, {"loss_fn_inputs.weights", "unknown dtype code 9"});
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

TEST(TinkerWireForwardBackwardProto, RefusesBadRequestFields) {
  auto m = sft_request();
  m.set_model_id("");
  expect_user_error([&] { decode_proto(m); }, {"'model_id' is required"});
  m = sft_request();
  m.set_seq_id(-1);
  expect_user_error([&] { decode_proto(m); }, {"'seq_id' must be >= 0, got -1"});
  m = sft_request();
  m.set_loss_fn("");
  expect_user_error([&] { decode_proto(m); }, {"'loss_fn' is required"});
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
      EXPECT_EQ(e.category(), tinker::error_category::user);
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
  // Densified to [[0, 0, 1, 0, 2]] (that it is 2-D is the model-side check's to refuse).
  const auto r = decode_forward_backward_json(j.dump());
  const auto& t = r.data[0].loss_fn_inputs.at("weights");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(t.floats, (std::vector<double>{0, 0, 1, 0, 2}));
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
    expect_error([&] { validate_metric_name(bad); }, tinker::error_category::server,
                 {std::string("\"") + bad + "\""});
    auto out = two_datum_output();
    out.metrics[bad] = 1;
    expect_error([&] { encode_forward_backward_output_proto(out); }, tinker::error_category::server,
                 {bad});
    expect_error([&] { encode_forward_backward_output_json(out); }, tinker::error_category::server,
                 {bad});
  }
}

TEST(TinkerWireOutputs, RefusesInconsistentDatums) {
  auto out = two_datum_output();
  out.loss_fn_outputs[1].erase("elementwise_loss");
  expect_error([&] { encode_forward_backward_output_proto(out); }, tinker::error_category::server,
               {"datum 1 has 1 outputs, datum 0 has 2"});
  out = two_datum_output();
  out.loss_fn_outputs[1]["values"] = out.loss_fn_outputs[1]["elementwise_loss"];
  out.loss_fn_outputs[1].erase("elementwise_loss");
  expect_error([&] { encode_forward_backward_output_proto(out); }, tinker::error_category::server,
               {"datum 1 has output 'values' that datum 0 lacks"});
  out = two_datum_output();
  out.loss_fn_outputs[1]["logprobs"] = ints({1, 2});
  expect_error([&] { encode_forward_backward_output_proto(out); }, tinker::error_category::server,
               {"datum 1 output 'logprobs' is int64", "unlike datum 0 (float32"});
  out = two_datum_output();
  out.loss_fn_outputs[0]["logprobs"].shape = {4};
  expect_error([&] { encode_forward_backward_output_json(out); }, tinker::error_category::server,
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

} // namespace
} // namespace rlforge::service::test
