// Fuzzes the forward_backward request path of the Tinker service up to the model: the body
// decoder (service/wire/forward_backward_codec.hpp) and the one semantic check against a model
// (tinker/datum_check.hpp, with the loss catalog). The first input byte picks the form (0:
// protobuf, 1: zstd-compressed protobuf, 2: JSON), the rest is the body. Any input either decodes
// to a request that passes validate_forward_backward and whose protobuf re-encoding decodes to a
// fixed point, or fails with a request_error of category user naming forward_backward; a decoded
// request is then either accepted by the loss catalog and the datum check or refused by them with
// a user error. Nothing else may escape.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_target.hpp"
#include "service/wire/compression.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "tinker/datum_check.hpp"
#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

namespace rlforge::fuzz {

namespace {

using service::wire_limits;

template <class T> std::string raw(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  if (!v.empty())
    std::memcpy(out.data(), v.data(), out.size());
  return out;
}

tinker::tensor_data tensor(tinker::dtype type, std::vector<double> f, std::vector<int64_t> i) {
  tinker::tensor_data t;
  t.type = type;
  t.floats = std::move(f);
  t.ints = std::move(i);
  t.shape = {static_cast<int64_t>(t.floats.size() + t.ints.size())};
  return t;
}

tinker::forward_backward_request sample_request() {
  tinker::forward_backward_request r;
  r.model_id = "sess:train:0";
  r.seq_id = 2;
  r.loss_fn = "ppo";
  r.loss_fn_config = {{"clip_low_threshold", 0.8}, {"clip_high_threshold", 1.2}};
  tinker::datum d;
  d.tokens = {1, 2, 3};
  d.loss_fn_inputs["target_tokens"] = tensor(tinker::dtype::int64, {}, {2, 3, 4});
  d.loss_fn_inputs["logprobs"] = tensor(tinker::dtype::float32, {-1, -2, -0.5}, {});
  d.loss_fn_inputs["advantages"] = tensor(tinker::dtype::float32, {1, 0, -1}, {});
  d.loss_fn_inputs["weights"] = tensor(tinker::dtype::float32, {0, 1, 1}, {});
  r.data.push_back(d);
  return r;
}

/// Element-wise equality where NaN equals NaN (the codec checks syntax only: a NaN weight
/// decodes, and is refused later by the worker; it must survive a round trip as a NaN).
bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))))
      return false;
  return true;
}

/// The same names with the same values, NaN equal to NaN (a NaN setting decodes too).
template <class Map> bool same_settings(const Map& a, const Map& b) {
  if (a.size() != b.size())
    return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
    if (i->first != j->first || !same_values({i->second}, {j->second}))
      return false;
  return true;
}

bool same(const tinker::forward_backward_request& a, const tinker::forward_backward_request& b) {
  if (a.model_id != b.model_id || a.seq_id != b.seq_id || a.loss_fn != b.loss_fn ||
      !same_settings(a.loss_fn_config, b.loss_fn_config) || a.forward_only != b.forward_only ||
      a.data.size() != b.data.size())
    return false;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const auto& x = a.data[i];
    const auto& y = b.data[i];
    if (x.tokens != y.tokens || x.loss_fn_inputs.size() != y.loss_fn_inputs.size())
      return false;
    for (const auto& [name, t] : x.loss_fn_inputs) {
      auto it = y.loss_fn_inputs.find(name);
      if (it == y.loss_fn_inputs.end() || it->second.type != t.type ||
          it->second.shape != t.shape || !same_values(it->second.floats, t.floats) ||
          it->second.ints != t.ints)
        return false;
    }
  }
  return true;
}

wire_limits limits() {
  wire_limits l;
  l.max_body_bytes = size_t{1} << 20;
  return l;
}

} // namespace

std::vector<std::string> seeds() {
  const auto proto = service::encode_forward_backward_request_proto(sample_request());
  std::vector<std::string> out;
  out.push_back('\0' + proto);
  out.push_back('\1' + service::zstd_compress(proto));
  out.push_back(std::string(1, '\2') +
                R"({"forward_backward_input":{"data":[{"model_input":{"chunks":[)"
                R"({"tokens":[1,2],"type":"encoded_text"}]},"loss_fn_inputs":{)"
                R"("target_tokens":{"data":[2,3],"dtype":"int64","shape":[2]},)"
                R"("weights":{"data":[0.5,1],"dtype":"float32","shape":[1,2],)"
                R"("sparse_crow_indices":[0,2],"sparse_col_indices":[0,1]}}}],)"
                R"("loss_fn":"cross_entropy"},"model_id":"m","seq_id":1})");
  // Near misses: a truncated body, a bf16 tensor with an odd byte count, a dmel chunk.
  out.push_back('\0' + proto.substr(0, proto.size() / 2));
  auto odd = sample_request();
  odd.data[0].loss_fn_inputs["weights"].type = tinker::dtype::bfloat16;
  out.push_back('\0' + service::encode_forward_backward_request_proto(odd) + "\x01");
  out.push_back('\0' + proto + std::string("\x1a\x06\x0a\x04\x1a\x02\x0a\x00", 8));
  return out;
}

} // namespace rlforge::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlforge;
  using fuzz::check;
  if (size == 0)
    return 0;
  const int mode = data[0] % 3;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto l = fuzz::limits();
  tinker::forward_backward_request r;
  try {
    r = service::decode_forward_backward(body,
                                         mode == 2 ? "application/json" : "application/x-protobuf",
                                         mode == 1 ? "zstd" : "", l);
  } catch (const tinker::request_error& e) {
    check(e.category() == tinker::error_category::user,
          std::string("decode failed with category ") + tinker::to_string(e.category()));
    check(std::string(e.what()).rfind("forward_backward", 0) == 0,
          std::string("error does not name forward_backward: ") + e.what());
    return 0;
  } catch (const std::exception& e) {
    check(false, std::string("decode let a foreign exception escape: ") + e.what());
  }

  // What the decoder returns is valid by the decoder's own rules.
  try {
    service::validate_forward_backward(r);
  } catch (const std::exception& e) {
    check(false, std::string("a decoded request fails validation: ") + e.what());
  }

  // The model-side check accepts the request or refuses it as the user's, for either role.
  for (auto role : {tinker::model_role::policy, tinker::model_role::critic}) {
    try {
      auto loss = tinker::resolve_loss(r.loss_fn, r.loss_fn_config, role);
      tinker::check_datums(r.data, loss, tinker::model_limits{512, 64}, "forward_backward(m)");
    } catch (const tinker::request_error& e) {
      check(e.category() == tinker::error_category::user,
            std::string("the model-side check failed with category ") +
                tinker::to_string(e.category()));
    } catch (const std::exception& e) {
      check(false, std::string("the model-side check let a foreign exception escape: ") + e.what());
    }
  }

  // Re-encoding as protobuf gives back the same request (values are held at their dtype's
  // precision). Ids that do not fit the protobuf int32 fields are refused.
  std::string once;
  try {
    once = service::encode_forward_backward_request_proto(r);
  } catch (const tinker::request_error& e) {
    check(std::string(e.what()).find("int32") != std::string::npos,
          std::string("encode refused a valid request: ") + e.what());
    return 0;
  }
  try {
    const auto again = service::decode_forward_backward_proto(once, l);
    check(fuzz::same(r, again), "decode(encode(x)) differs from x");
  } catch (const std::exception& e) {
    check(false, std::string("a re-encoded valid request was refused: ") + e.what());
  }
  return 0;
}
