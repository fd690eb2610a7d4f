#include "service/tinker_client.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <thread>
#include <utility>

#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/sample_codec.hpp"

namespace rlforge::service {

namespace {

using json = nlohmann::json;

client_response convert(const httplib::Result& r) {
  client_response out;
  if (!r)
    return out;
  out.status = r->status;
  out.body = r->body;
  out.content_type = r->get_header_value("Content-Type");
  for (auto& [k, v] : r->headers)
    out.headers[k] = v;
  return out;
}

/// The "error" text of an error answer, or the raw body when it is not JSON.
std::string error_text(const client_response& r) {
  if (r.status == 0)
    return "no answer from the server (connection failed)";
  try {
    auto j = json::parse(r.body);
    if (j.is_object() && j.contains("error") && j["error"].is_string())
      return j["error"].get<std::string>();
  } catch (const json::exception&) {
  }
  return "HTTP " + std::to_string(r.status) + ": " + r.body;
}

/// Throws unless `r` is a 2xx answer.
const client_response& expect_ok(const client_response& r) {
  if (r.status < 200 || r.status >= 300)
    throw client_error(r.status, "", error_text(r));
  return r;
}

/// Parses a final future answer as JSON; a `{"error"}` answer throws with its category.
json final_json(const client_response& r) {
  expect_ok(r);
  auto j = json::parse(r.body);
  if (j.is_object() && j.contains("error"))
    throw client_error(r.status, j.value("category", std::string("unknown")),
                       j["error"].get<std::string>());
  return j;
}

} // namespace

client_error::client_error(int status, std::string category, const std::string& message)
    : std::runtime_error(message), status_(status), category_(std::move(category)) {}

tinker_client::tinker_client(std::string host, int port, std::string api_key)
    : host_(std::move(host)), port_(port), api_key_(std::move(api_key)) {}

client_response tinker_client::post(const std::string& endpoint, const std::string& body,
                                    const std::string& content_type,
                                    const std::map<std::string, std::string>& headers) const {
  httplib::Client cli(host_, port_);
  cli.set_read_timeout(60, 0);
  httplib::Headers h;
  if (!api_key_.empty())
    h.emplace("X-API-Key", api_key_);
  for (auto& [k, v] : headers)
    h.emplace(k, v);
  return convert(cli.Post(("/api/v1/" + endpoint).c_str(), h, body, content_type.c_str()));
}

client_response tinker_client::get(const std::string& path,
                                   const std::map<std::string, std::string>& headers) const {
  httplib::Client cli(host_, port_);
  cli.set_read_timeout(60, 0);
  httplib::Headers h;
  if (!api_key_.empty())
    h.emplace("X-API-Key", api_key_);
  for (auto& [k, v] : headers)
    h.emplace(k, v);
  return convert(cli.Get(("/api/v1/" + path).c_str(), h));
}

client_response tinker_client::get_url(const std::string& url,
                                       const std::map<std::string, std::string>& headers) const {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    throw client_error(0, "", "not an http:// URL: " + url);
  auto slash = url.find('/', scheme.size());
  auto authority = url.substr(scheme.size(), slash - scheme.size());
  auto path = slash == std::string::npos ? "/" : url.substr(slash);
  auto colon = authority.rfind(':');
  std::string host = authority.substr(0, colon);
  int port = colon == std::string::npos ? 80 : std::stoi(authority.substr(colon + 1));
  httplib::Client cli(host, port);
  cli.set_read_timeout(60, 0);
  httplib::Headers h(headers.begin(), headers.end());
  return convert(cli.Get(path.c_str(), h));
}

client_response tinker_client::del(const std::string& path) const {
  httplib::Client cli(host_, port_);
  httplib::Headers h;
  if (!api_key_.empty())
    h.emplace("X-API-Key", api_key_);
  return convert(cli.Delete(("/api/v1/" + path).c_str(), h));
}

client_response tinker_client::put(const std::string& path, const std::string& body) const {
  httplib::Client cli(host_, port_);
  cli.set_read_timeout(60, 0);
  httplib::Headers h;
  if (!api_key_.empty())
    h.emplace("X-API-Key", api_key_);
  return convert(cli.Put(("/api/v1/" + path).c_str(), h, body, "application/json"));
}

std::string tinker_client::request_id_of(const client_response& r) {
  expect_ok(r);
  auto j = json::parse(r.body);
  if (!j.is_object() || !j.contains("request_id"))
    throw client_error(r.status, "", "submit answer without request_id: " + r.body);
  return j["request_id"].get<std::string>();
}

client_response tinker_client::wait_future(const std::string& request_id, bool accept_proto,
                                           std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  json body{{"request_id", request_id}, {"allow_metadata_only", false}};
  std::map<std::string, std::string> headers{
      {"Accept", accept_proto ? "application/x-protobuf" : "application/json"}};
  for (int iteration = 0;; ++iteration) {
    headers["X-Tinker-Request-Iteration"] = std::to_string(iteration);
    auto r = post("retrieve_future", body.dump(), "application/json", headers);
    if (r.status == 200 && r.content_type.find("application/json") == 0) {
      auto j = json::parse(r.body);
      if (!(j.is_object() && j.value("type", std::string()) == "try_again"))
        return r;
    } else if (r.status == 200) {
      return r;
    } else if (r.status != 408 && r.status < 500) {
      expect_ok(r);
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw client_error(408, "",
                         "future " + request_id + " not final after " +
                             std::to_string(timeout.count()) + " ms");
  }
}

std::string tinker_client::create_session() const {
  auto r = expect_ok(post("create_session", R"({"tags":[],"user_metadata":{},)"
                                            R"("sdk_version":"0.25.0","type":"create_session"})"));
  return json::parse(r.body).at("session_id").get<std::string>();
}

std::string tinker_client::create_model(const std::string& session_id, int64_t model_seq_id,
                                        const std::string& base_model,
                                        const tinker::lora_config& lora) const {
  json l{{"rank", lora.rank},
         {"train_unembed", lora.train_unembed},
         {"train_mlp", lora.train_mlp},
         {"train_attn", lora.train_attn}};
  if (lora.has_seed)
    l["seed"] = lora.seed;
  json body{{"session_id", session_id},
            {"model_seq_id", model_seq_id},
            {"base_model", base_model},
            {"lora_config", l},
            {"type", "create_model"}};
  auto id = request_id_of(post("create_model", body.dump()));
  return final_json(wait_future(id, false)).at("model_id").get<std::string>();
}

std::string
tinker_client::submit_forward_backward(const tinker::forward_backward_request& r) const {
  return request_id_of(
      post("forward_backward", encode_forward_backward_request_proto(r), "application/x-protobuf"));
}

tinker::forward_backward_output
tinker_client::forward_backward(const tinker::forward_backward_request& r) const {
  auto res = wait_future(submit_forward_backward(r), true);
  if (res.content_type != "application/x-protobuf")
    final_json(res); // throws for an error answer
  return decode_forward_backward_output_proto(res.body);
}

std::map<std::string, double> tinker_client::optim_step(const std::string& model_id, int64_t seq_id,
                                                        const tinker::adam_params& p) const {
  json body{{"model_id", model_id},
            {"seq_id", seq_id},
            {"adam_params",
             {{"learning_rate", p.learning_rate},
              {"beta1", p.beta1},
              {"beta2", p.beta2},
              {"eps", p.eps},
              {"weight_decay", p.weight_decay},
              {"grad_clip_norm", p.grad_clip_norm}}},
            {"type", "optim_step"}};
  auto j = final_json(wait_future(request_id_of(post("optim_step", body.dump())), false));
  return j.value("metrics", std::map<std::string, double>{});
}

std::string tinker_client::save_weights(const std::string& model_id, int64_t seq_id,
                                        const std::string& name) const {
  json body{{"model_id", model_id}, {"seq_id", seq_id}, {"path", name}, {"type", "save_weights"}};
  auto j = final_json(wait_future(request_id_of(post("save_weights", body.dump())), false));
  return j.at("path").get<std::string>();
}

std::string tinker_client::save_weights_for_sampler(const std::string& model_id, int64_t seq_id,
                                                    const std::string& name) const {
  json body{{"model_id", model_id},
            {"seq_id", seq_id},
            {"path", name},
            {"type", "save_weights_for_sampler"}};
  auto j =
      final_json(wait_future(request_id_of(post("save_weights_for_sampler", body.dump())), false));
  return j.at("path").get<std::string>();
}

void tinker_client::load_weights(const std::string& model_id, int64_t seq_id,
                                 const std::string& path, bool optimizer) const {
  json body{{"model_id", model_id},
            {"seq_id", seq_id},
            {"path", path},
            {"optimizer", optimizer},
            {"type", "load_weights"}};
  final_json(wait_future(request_id_of(post("load_weights", body.dump())), false));
}

std::string tinker_client::create_sampling_session(const std::string& session_id, int64_t seq_id,
                                                   const std::string& model_path,
                                                   const std::string& base_model) const {
  json body{{"session_id", session_id},
            {"sampling_session_seq_id", seq_id},
            {"type", "create_sampling_session"}};
  if (!model_path.empty())
    body["model_path"] = model_path;
  else
    body["base_model"] = base_model;
  auto r = expect_ok(post("create_sampling_session", body.dump()));
  return json::parse(r.body).at("sampling_session_id").get<std::string>();
}

std::string tinker_client::sample_body(const std::string& sampling_session_id, int64_t seq_id,
                                       const std::vector<int64_t>& prompt, int64_t num_samples,
                                       int64_t max_tokens, std::optional<int64_t> seed) {
  json body{{"num_samples", num_samples},
            {"prompt", {{"chunks", json::array({{{"tokens", prompt}, {"type", "encoded_text"}}})}}},
            {"sampling_params",
             {{"max_tokens", max_tokens}, {"temperature", 1.0}, {"top_k", -1}, {"top_p", 1.0}}},
            {"sampling_session_id", sampling_session_id},
            {"seq_id", seq_id},
            {"prompt_logprobs", false},
            {"topk_prompt_logprobs", 0},
            {"type", "sample"}};
  if (seed)
    body["sampling_params"]["seed"] = *seed;
  return body.dump();
}

tinker::sample_response tinker_client::sample(const std::string& sampling_session_id,
                                              int64_t seq_id, const std::vector<int64_t>& prompt,
                                              int64_t num_samples, int64_t max_tokens,
                                              std::optional<int64_t> seed) const {
  auto body = sample_body(sampling_session_id, seq_id, prompt, num_samples, max_tokens, seed);
  auto res = wait_future(request_id_of(post("asample", body, "application/json",
                                            {{"X-Tinker-Sampling-Backpressure", "1"}})),
                         true);
  if (res.content_type != "application/x-protobuf")
    final_json(res);
  return decode_sample_response_proto(res.body);
}

} // namespace rlforge::service
