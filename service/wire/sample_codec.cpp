#include "service/wire/sample_codec.hpp"

#include "service/wire/codec_support.hpp"

namespace rlforge::service {

using namespace wire_detail;

namespace {

tinker_public::StopReason stop_reason_to_proto(const std::string& s, size_t i) {
  if (s == "stop")
    return tinker_public::STOP_REASON_STOP;
  if (s == "length")
    return tinker_public::STOP_REASON_LENGTH;
  server_error("sample response: sequence " + std::to_string(i) + " has stop_reason \"" + s +
               "\" (expected stop or length)");
}

void check_sequences(const tinker::sample_response& r) {
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    stop_reason_to_proto(s.stop_reason, i);
    if (s.logprobs.size() != s.tokens.size())
      server_error("sample response: sequence " + std::to_string(i) + " has " +
                   std::to_string(s.logprobs.size()) + " logprobs for " +
                   std::to_string(s.tokens.size()) + " tokens");
    for (auto t : s.tokens)
      if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max())
        server_error("sample response: sequence " + std::to_string(i) + " token " +
                     std::to_string(t) + " does not fit in int32");
  }
  if (r.topk < 0 || (r.topk > 0 && (r.topk_prompt_ids.size() % static_cast<size_t>(r.topk) != 0 ||
                                    r.topk_prompt_ids.size() != r.topk_prompt_logprobs.size())))
    server_error("sample response: top-k prompt log-probs of " +
                 std::to_string(r.topk_prompt_ids.size()) + " ids and " +
                 std::to_string(r.topk_prompt_logprobs.size()) + " log-probs are not rows of k = " +
                 std::to_string(r.topk));
}

} // namespace

sample_body decode_sample(std::string_view body, const wire_limits& limits) {
  const std::string ep = "asample";
  if (body.size() > limits.max_body_bytes)
    user_error(ep + ": body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(limits.max_body_bytes) + " bytes");
  const json j = parse_object(body, ep);
  fields f(j, ep);
  f.check_type({"sample"});
  sample_body out;
  auto& r = out.request;
  r.sampling_session_id = f.str("sampling_session_id", false);
  out.model_path = f.str("model_path", false);
  out.base_model = f.str("base_model", false);
  if (r.sampling_session_id.empty() && out.model_path.empty() && out.base_model.empty())
    user_error(ep + ": one of 'sampling_session_id', 'model_path' or 'base_model' is required");
  if (!out.model_path.empty() && !tinker_path(out.model_path))
    f.fail("model_path", "must start with tinker://, got \"" + out.model_path + "\"");
  bool has_seq = false;
  r.seq_id = f.integer("seq_id", false, 0, &has_seq, 0);
  if (!r.sampling_session_id.empty() && !has_seq)
    f.fail("seq_id", "is required with a sampling_session_id");
  r.num_samples = f.integer("num_samples", false, 1);
  r.prompt = model_input_from_json(f, "prompt");
  auto sp = f.object("sampling_params", true);
  auto& p = r.params;
  bool has_max = false;
  p.max_tokens = sp.integer("max_tokens", false, 0, &has_max);
  if (!has_max)
    sp.fail("max_tokens", "is required");
  p.seed = sp.integer("seed", false, 0, &p.has_seed);
  p.temperature = sp.number("temperature", false, 1.0);
  p.top_p = sp.number("top_p", false, 1.0);
  p.top_k = sp.integer("top_k", false, -1);
  if (p.top_k == 0)
    p.top_k = -1;
  if (auto* stop = sp.get("stop")) {
    if (stop->is_string()) {
      p.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      bool strings = false, ints = false;
      for (size_t i = 0; i < stop->size(); ++i) {
        const auto& s = (*stop)[i];
        int64_t tok = 0;
        if (s.is_string()) {
          strings = true;
          p.stop_strings.push_back(s.get<std::string>());
        } else if (fields::as_int(s, tok)) {
          ints = true;
          p.stop_tokens.push_back(tok);
        } else {
          sp.fail("stop", "entry " + std::to_string(i) + " must be a string or an integer, got " +
                              s.type_name());
        }
      }
      if (strings && ints)
        sp.fail("stop", "mixes strings and token ids; send one kind");
    } else {
      sp.fail("stop", std::string("must be a string or an array, got ") + stop->type_name());
    }
  }
  r.prompt_logprobs = f.boolean("prompt_logprobs", false);
  r.topk_prompt_logprobs = f.integer("topk_prompt_logprobs", false, 0);
  return out;
}

std::string encode_sample_response_proto(const tinker::sample_response& r) {
  check_sequences(r);
  tinker_public::SampleResponse msg;
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    auto* ps = msg.add_sequences();
    ps->set_stop_reason(stop_reason_to_proto(s.stop_reason, i));
    std::string tokens, logprobs;
    for (auto t : s.tokens)
      store(tokens, static_cast<int32_t>(t));
    for (auto v : s.logprobs)
      store(logprobs, static_cast<float>(v));
    ps->set_tokens(std::move(tokens));
    ps->set_logprobs(std::move(logprobs));
  }
  if (r.has_prompt_logprobs) {
    std::string bytes;
    for (size_t k = 0; k < r.prompt_logprobs.size(); ++k)
      store(bytes, k == 0 ? std::numeric_limits<float>::quiet_NaN()
                          : static_cast<float>(r.prompt_logprobs[k]));
    msg.set_prompt_logprobs(std::move(bytes));
  }
  if (r.topk > 0) {
    auto* top = msg.mutable_topk_prompt_logprobs();
    std::string ids, logprobs;
    for (auto id : r.topk_prompt_ids)
      store(ids, static_cast<int32_t>(id));
    for (auto lp : r.topk_prompt_logprobs)
      store(logprobs, static_cast<float>(lp));
    top->set_token_ids(std::move(ids));
    top->set_logprobs(std::move(logprobs));
    top->set_k(static_cast<uint32_t>(r.topk));
    top->set_prompt_length(static_cast<uint32_t>(r.topk_prompt_ids.size() / r.topk));
  }
  return msg.SerializeAsString();
}

tinker::sample_response decode_sample_response_proto(std::string_view body) {
  const std::string ep = "SampleResponse";
  tinker_public::SampleResponse msg;
  parse_proto(msg, body, ep, "SampleResponse", static_cast<size_t>(INT_MAX));
  tinker::sample_response out;
  for (int i = 0; i < msg.sequences_size(); ++i) {
    const auto& ps = msg.sequences(i);
    const std::string where = ep + ": sequence " + std::to_string(i);
    tinker::sampled_sequence s;
    if (ps.stop_reason() == tinker_public::STOP_REASON_STOP)
      s.stop_reason = "stop";
    else if (ps.stop_reason() == tinker_public::STOP_REASON_LENGTH)
      s.stop_reason = "length";
    else
      user_error(where + ": unknown stop_reason " + std::to_string(ps.stop_reason()));
    whole_elements(ps.tokens(), dtype::int32, where, "tokens");
    tinker::tensor_data t;
    t.type = dtype::int32;
    append_elements(dtype::int32, ps.tokens(), t);
    s.tokens = std::move(t.ints);
    whole_elements(ps.logprobs(), dtype::float32, where, "logprobs");
    tinker::tensor_data lp;
    append_elements(dtype::float32, ps.logprobs(), lp);
    s.logprobs = std::move(lp.floats);
    out.sequences.push_back(std::move(s));
  }
  if (msg.has_prompt_logprobs()) {
    whole_elements(msg.prompt_logprobs(), dtype::float32, ep, "prompt_logprobs");
    tinker::tensor_data lp;
    append_elements(dtype::float32, msg.prompt_logprobs(), lp);
    out.has_prompt_logprobs = true;
    out.prompt_logprobs = std::move(lp.floats);
  }
  if (msg.has_topk_prompt_logprobs()) {
    const auto& top = msg.topk_prompt_logprobs();
    const uint64_t cells = uint64_t{top.k()} * top.prompt_length();
    whole_elements(top.token_ids(), dtype::int32, ep, "topk_prompt_logprobs.token_ids");
    whole_elements(top.logprobs(), dtype::float32, ep, "topk_prompt_logprobs.logprobs");
    tinker::tensor_data ids, lps;
    append_elements(dtype::int32, top.token_ids(), ids);
    append_elements(dtype::float32, top.logprobs(), lps);
    if (ids.ints.size() != cells || lps.floats.size() != cells)
      user_error(ep + ": topk_prompt_logprobs holds " + std::to_string(ids.ints.size()) +
                 " ids and " + std::to_string(lps.floats.size()) + " log-probs for " +
                 std::to_string(top.prompt_length()) + " x " + std::to_string(top.k()) + " cells");
    out.topk = top.k();
    out.topk_prompt_ids = std::move(ids.ints);
    out.topk_prompt_logprobs = std::move(lps.floats);
  }
  return out;
}

std::string encode_sample_response_json(const tinker::sample_response& r) {
  check_sequences(r);
  json j;
  j["sequences"] = json::array();
  for (const auto& s : r.sequences) {
    json lp = json::array();
    for (auto v : s.logprobs)
      lp.push_back(float_json(v));
    j["sequences"].push_back(
        {{"stop_reason", s.stop_reason}, {"tokens", s.tokens}, {"logprobs", std::move(lp)}});
  }
  if (r.has_prompt_logprobs) {
    json lp = json::array();
    for (size_t k = 0; k < r.prompt_logprobs.size(); ++k)
      lp.push_back(k == 0 ? json(nullptr) : float_json(r.prompt_logprobs[k]));
    j["prompt_logprobs"] = std::move(lp);
  }
  if (r.topk > 0) {
    // Per prompt position: null (nothing predicts the first token), else [[id, log-prob], ...].
    json rows = json::array();
    const auto k = static_cast<size_t>(r.topk);
    for (size_t row = 0; row * k < r.topk_prompt_ids.size(); ++row) {
      if (row == 0) {
        rows.push_back(nullptr);
        continue;
      }
      json cells = json::array();
      for (size_t c = row * k; c < (row + 1) * k; ++c)
        cells.push_back({r.topk_prompt_ids[c], float_json(r.topk_prompt_logprobs[c])});
      rows.push_back(std::move(cells));
    }
    j["topk_prompt_logprobs"] = std::move(rows);
  }
  j["type"] = "sample";
  return j.dump();
}

} // namespace rlforge::service
