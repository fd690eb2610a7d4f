#include "service/wire/forward_backward_codec.hpp"

#include <set>

#include "service/wire/codec_support.hpp"
#include "service/wire/compression.hpp"

namespace rlforge::service {

using namespace wire_detail;

namespace {

struct field_layout {
  dtype type = dtype::float32;
  std::vector<int64_t> trailing;
};

/// Checks the per-datum outputs and metric names; returns each output's dtype and trailing shape.
std::map<std::string, field_layout> check_outputs(const tinker::forward_backward_output& out) {
  for (const auto& [name, v] : out.metrics)
    validate_metric_name(name);
  std::map<std::string, field_layout> layout;
  for (size_t i = 0; i < out.loss_fn_outputs.size(); ++i) {
    const auto& datum = out.loss_fn_outputs[i];
    const std::string at = "forward_backward output: datum " + std::to_string(i);
    if (i > 0 && datum.size() != layout.size())
      server_error(at + " has " + std::to_string(datum.size()) + " outputs, datum 0 has " +
                   std::to_string(layout.size()));
    for (const auto& [name, t] : datum) {
      const int64_t numel = checked_numel(t.shape, std::numeric_limits<int64_t>::max());
      if (numel < 0 || static_cast<size_t>(numel) != element_count(t))
        server_error(at + " output '" + name + "': shape " + shape_text(t.shape) +
                     " disagrees with " + std::to_string(element_count(t)) + " elements");
      field_layout l;
      l.type = t.type;
      if (t.shape.size() > 1)
        l.trailing.assign(t.shape.begin() + 1, t.shape.end());
      if (i == 0) {
        layout[name] = l;
        continue;
      }
      auto it = layout.find(name);
      if (it == layout.end())
        server_error(at + " has output '" + name + "' that datum 0 lacks");
      if (it->second.type != l.type || it->second.trailing != l.trailing)
        server_error(at + " output '" + name + "' is " + tinker::to_string(l.type) + " " +
                     shape_text(t.shape) + ", unlike datum 0 (" +
                     tinker::to_string(it->second.type) + ", trailing shape " +
                     shape_text(it->second.trailing) + ")");
    }
  }
  return layout;
}

} // namespace

void normalize_loss_inputs(tinker::datum& d) {
  for (auto& [name, t] : d.loss_fn_inputs) {
    if (name == "target_tokens" || tinker::is_floating(t.type))
      continue;
    t.floats.clear();
    for (auto v : t.ints)
      t.floats.push_back(static_cast<float>(v));
    t.ints.clear();
    t.type = dtype::float32;
  }
}

void validate_forward_backward(const tinker::forward_backward_request& r) {
  const std::string ep = "forward_backward: ";
  if (r.model_id.empty())
    user_error(ep + "'model_id' is required");
  if (r.seq_id < 0)
    user_error(ep + "'seq_id' must be >= 0, got " + std::to_string(r.seq_id));
  if (r.loss_fn.empty())
    user_error(ep + "'loss_fn' is required");
  for (size_t i = 0; i < r.data.size(); ++i)
    for (const auto& [name, t] : r.data[i].loss_fn_inputs) {
      const int64_t numel = checked_numel(t.shape, std::numeric_limits<int64_t>::max());
      if (numel < 0 || static_cast<size_t>(numel) != element_count(t))
        user_error(ep + "data[" + std::to_string(i) + "].loss_fn_inputs." + name + ": shape " +
                   shape_text(t.shape) + " disagrees with its " + std::to_string(element_count(t)) +
                   " elements");
    }
}

tinker::tensor_data decode_tensor_proto(std::string_view tensor_message, const std::string& where,
                                        const wire_limits& limits) {
  tinker_public::Tensor msg;
  parse_proto(msg, tensor_message, where, "Tensor", limits.max_body_bytes);
  return tensor_from_proto(msg, where, limits);
}

tinker::forward_backward_request decode_forward_backward_proto(std::string_view body,
                                                               const wire_limits& limits) {
  const std::string ep = "forward_backward";
  tinker_public::ForwardBackwardRequest msg;
  parse_proto(msg, body, ep, "ForwardBackwardRequest", limits.max_body_bytes);
  tinker::forward_backward_request r;
  r.model_id = msg.model_id();
  r.seq_id = msg.seq_id();
  r.loss_fn = msg.loss_fn();
  r.forward_only = msg.forward_only();
  r.loss_fn_config.insert(msg.loss_fn_config().begin(), msg.loss_fn_config().end());
  r.data.reserve(msg.data_size());
  for (int i = 0; i < msg.data_size(); ++i) {
    const auto& pd = msg.data(i);
    const std::string at = ep + ": data[" + std::to_string(i) + "]";
    tinker::datum d;
    for (int c = 0; c < pd.model_input_size(); ++c) {
      const auto& chunk = pd.model_input(c);
      const std::string where = at + ".model_input[" + std::to_string(c) + "]";
      switch (chunk.chunk_case()) {
      case tinker_public::Chunk::kEncodedText: {
        const auto& bytes = chunk.encoded_text().tokens();
        if (bytes.size() % 4 != 0)
          user_error(where + ": encoded_text has " + std::to_string(bytes.size()) +
                     " token bytes, not a whole number of int32 tokens");
        for (size_t k = 0; k < bytes.size(); k += 4)
          d.tokens.push_back(load<int32_t>(bytes.data() + k));
        break;
      }
      case tinker_public::Chunk::kImage:
        user_error(where + " is an image chunk; only encoded_text chunks are supported");
      case tinker_public::Chunk::kDmel:
        user_error(where + " is a dmel (audio) chunk; only encoded_text chunks are supported");
      case tinker_public::Chunk::CHUNK_NOT_SET:
        user_error(where + " is empty (no encoded_text)");
      }
    }
    for (const auto& [name, tensor] : pd.loss_fn_inputs())
      d.loss_fn_inputs[name] = tensor_from_proto(tensor, at + ".loss_fn_inputs." + name, limits);
    normalize_loss_inputs(d);
    r.data.push_back(std::move(d));
  }
  validate_forward_backward(r);
  return r;
}

tinker::forward_backward_request decode_forward_backward_json(std::string_view body,
                                                              const wire_limits& limits) {
  const std::string ep = "forward_backward";
  if (body.size() > limits.max_body_bytes)
    user_error(ep + ": body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(limits.max_body_bytes) + " bytes");
  const json j = parse_object(body, ep);
  fields top(j, ep);
  top.check_type({"forward_backward", "forward"});
  tinker::forward_backward_request r;
  r.model_id = top.str("model_id", true, true);
  r.seq_id = top.integer("seq_id", true);
  check_seq_id(top, r.seq_id);
  const bool fb = top.get("forward_backward_input") != nullptr;
  const bool fwd = top.get("forward_input") != nullptr;
  if (fb == fwd)
    user_error(ep + ": exactly one of 'forward_backward_input' and 'forward_input' is required");
  r.forward_only = fwd || top.boolean("forward_only", false);
  auto input = top.object(fb ? "forward_backward_input" : "forward_input", true);
  r.loss_fn = input.str("loss_fn", true, true);
  r.loss_fn_config = number_map(input, "loss_fn_config");
  const json& data = input.array("data", true);
  r.data.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string at = "data[" + std::to_string(i) + "]";
    if (!data[i].is_object())
      user_error(ep + ": '" + at + "' must be an object, got " + data[i].type_name());
    fields df(data[i], ep, at + ".");
    tinker::datum d;
    d.tokens = model_input_from_json(df, "model_input");
    auto inputs = df.object("loss_fn_inputs", false);
    for (auto it = inputs.raw().begin(); it != inputs.raw().end(); ++it) {
      const std::string name = it.key();
      if (!it->is_object())
        user_error(inputs.where(name.c_str()) + " must be an object (TensorData), got " +
                   it->type_name());
      fields tf(*it, ep, inputs.prefix() + name + ".");
      d.loss_fn_inputs[name] = tensor_from_json(tf, limits);
    }
    normalize_loss_inputs(d);
    r.data.push_back(std::move(d));
  }
  validate_forward_backward(r);
  return r;
}

tinker::forward_backward_request decode_forward_backward(std::string_view body,
                                                         std::string_view content_type,
                                                         std::string_view content_encoding,
                                                         const wire_limits& limits) {
  const auto type = lower_trim(content_type.substr(0, content_type.find(';')));
  if (type != "application/x-protobuf" && type != "application/protobuf" &&
      type != "application/json" && !type.empty())
    user_error("forward_backward: unsupported Content-Type \"" + std::string(content_type) +
               "\" (accepted: application/x-protobuf, application/json)");
  std::string plain;
  try {
    plain = decode_content(body, content_encoding, limits.max_body_bytes);
  } catch (const request_error& e) {
    user_error(std::string("forward_backward: ") + e.what());
  }
  if (type == "application/x-protobuf" || type == "application/protobuf")
    return decode_forward_backward_proto(plain, limits);
  return decode_forward_backward_json(plain, limits);
}

std::string encode_forward_backward_request_proto(const tinker::forward_backward_request& r) {
  if (r.seq_id < std::numeric_limits<int32_t>::min() ||
      r.seq_id > std::numeric_limits<int32_t>::max())
    user_error("forward_backward request: seq_id " + std::to_string(r.seq_id) +
               " does not fit the protobuf int32 field");
  tinker_public::ForwardBackwardRequest msg;
  msg.set_model_id(r.model_id);
  msg.set_seq_id(static_cast<int32_t>(r.seq_id));
  msg.set_loss_fn(r.loss_fn);
  msg.set_forward_only(r.forward_only);
  for (const auto& [k, v] : r.loss_fn_config)
    (*msg.mutable_loss_fn_config())[k] = v;
  for (size_t i = 0; i < r.data.size(); ++i) {
    const auto& d = r.data[i];
    auto* pd = msg.add_data();
    std::string tokens;
    for (auto t : d.tokens) {
      if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max())
        user_error("forward_backward request: data[" + std::to_string(i) + "] token " +
                   std::to_string(t) + " does not fit in int32");
      store(tokens, static_cast<int32_t>(t));
    }
    pd->add_model_input()->mutable_encoded_text()->set_tokens(std::move(tokens));
    for (const auto& [name, t] : d.loss_fn_inputs) {
      tinker_public::Tensor pt;
      pt.set_dtype(dtype_to_proto(t.type));
      for (auto s : t.shape)
        pt.add_shape(s);
      std::string bytes;
      append_bytes(t, bytes);
      pt.set_dense(std::move(bytes));
      (*pd->mutable_loss_fn_inputs())[name] = std::move(pt);
    }
  }
  return msg.SerializeAsString();
}

void validate_metric_name(const std::string& name) {
  static const std::set<std::string> reductions = {"mean",  "sum",    "min",           "max",
                                                   "slack", "unique", "hash_unordered"};
  const auto colon = name.find(':');
  if (colon == std::string::npos || colon == 0 || name.find(':', colon + 1) != std::string::npos ||
      !reductions.count(name.substr(colon + 1)))
    server_error("metric name \"" + name +
                 "\" is not \"<name>:<reduction>\" with one colon and a reduction among mean, "
                 "sum, min, max, slack, hash_unordered, unique");
}

std::string encode_forward_backward_output_proto(const tinker::forward_backward_output& out) {
  const auto layout = check_outputs(out);
  tinker_public::ForwardBackwardOutput msg;
  msg.set_loss_fn_output_type(out.loss_fn_output_type);
  for (const auto& [k, v] : out.metrics)
    (*msg.mutable_metrics())[k] = v;
  auto* record = msg.add_loss_fn_outputs();
  record->set_type_tag("ArrayRecord");
  record->set_num_datums(static_cast<int64_t>(out.loss_fn_outputs.size()));
  for (const auto& [name, l] : layout) {
    tinker_public::BatchedTensor bt;
    bt.set_dtype(dtype_to_proto(l.type));
    for (auto s : l.trailing)
      bt.add_trailing_shape(s);
    std::string data, offsets;
    store<int64_t>(offsets, 0);
    for (const auto& datum : out.loss_fn_outputs) {
      append_bytes(datum.at(name), data);
      store(offsets, static_cast<int64_t>(data.size()));
    }
    bt.set_data(std::move(data));
    bt.set_offsets(std::move(offsets));
    (*record->mutable_fields())[name] = std::move(bt);
  }
  return msg.SerializeAsString();
}

tinker::forward_backward_output decode_forward_backward_output_proto(std::string_view body) {
  const std::string ep = "ForwardBackwardOutput";
  tinker_public::ForwardBackwardOutput msg;
  parse_proto(msg, body, ep, "ForwardBackwardOutput", static_cast<size_t>(INT_MAX));
  tinker::forward_backward_output out;
  out.loss_fn_output_type = msg.loss_fn_output_type();
  out.metrics.insert(msg.metrics().begin(), msg.metrics().end());
  for (int r = 0; r < msg.loss_fn_outputs_size(); ++r) {
    const auto& rec = msg.loss_fn_outputs(r);
    const size_t base = out.loss_fn_outputs.size();
    int64_t count = rec.num_datums();
    if (count == 0 && !rec.fields().empty())
      count = static_cast<int64_t>(rec.fields().begin()->second.offsets().size() / 8) - 1;
    if (count < 0 || count > static_cast<int64_t>(body.size()) + 1)
      user_error(ep + ": record " + std::to_string(r) + " has an invalid datum count " +
                 std::to_string(count));
    out.loss_fn_outputs.resize(base + static_cast<size_t>(count));
    for (const auto& [name, bt] : rec.fields()) {
      const std::string where = ep + ": field '" + name + "'";
      const dtype t = dtype_from_proto(bt.dtype(), where);
      const size_t es = element_size(t);
      auto offsets = int64_bytes(bt.offsets(), where + " offsets");
      if (offsets.size() != static_cast<size_t>(count) + 1)
        user_error(where + ": " + std::to_string(offsets.size()) + " offsets for " +
                   std::to_string(count) + " datums");
      std::vector<int64_t> trailing(bt.trailing_shape().begin(), bt.trailing_shape().end());
      const int64_t per_row = checked_numel(trailing, std::numeric_limits<int32_t>::max());
      if (per_row < 0)
        user_error(where + ": invalid trailing_shape " + shape_text(trailing));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t b = offsets[i], e = offsets[i + 1];
        if (b < 0 || e < b || e > static_cast<int64_t>(bt.data().size()) || b % es || e % es)
          user_error(where + ": offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                     ") of datum " + std::to_string(i) + " are outside the " +
                     std::to_string(bt.data().size()) + " data bytes or not element-aligned");
        tinker::tensor_data td;
        td.type = t;
        append_elements(t, std::string_view(bt.data()).substr(b, e - b), td);
        const auto n = static_cast<int64_t>(element_count(td));
        if (per_row == 0 ? n != 0 : n % per_row != 0)
          user_error(where + ": datum " + std::to_string(i) + " has " + std::to_string(n) +
                     " elements, not a multiple of trailing_shape " + shape_text(trailing));
        td.shape = {per_row == 0 ? 0 : n / per_row};
        td.shape.insert(td.shape.end(), trailing.begin(), trailing.end());
        out.loss_fn_outputs[base + i][name] = std::move(td);
      }
    }
  }
  return out;
}

std::string encode_forward_backward_output_json(const tinker::forward_backward_output& out) {
  check_outputs(out);
  json j;
  j["loss_fn_output_type"] = out.loss_fn_output_type;
  j["loss_fn_outputs"] = json::array();
  for (const auto& datum : out.loss_fn_outputs) {
    json d = json::object();
    for (const auto& [name, t] : datum) {
      json data = json::array();
      if (tinker::is_floating(t.type))
        for (double v : t.floats)
          data.push_back(float_json(v));
      else
        for (int64_t v : t.ints)
          data.push_back(v);
      d[name] = {{"data", std::move(data)}, {"dtype", public_dtype(t.type)}, {"shape", t.shape}};
    }
    j["loss_fn_outputs"].push_back(std::move(d));
  }
  json metrics = json::object();
  for (const auto& [k, v] : out.metrics)
    metrics[k] = std::isfinite(v) ? json(v) : json(nullptr);
  j["metrics"] = std::move(metrics);
  return j.dump();
}

} // namespace rlforge::service
