#include "service/http/server_state.hpp"

#include <cstdio>
#include <ctime>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>

#include <openssl/evp.h>

#include "service/http/request_ids.hpp"
#include "service/tar_archive.hpp"

namespace rlforge::service::http {

namespace {

/// SHA-256 over the endpoint, content type, content encoding and body, each prefixed by its
/// length (so no two different requests frame to the same bytes): equal retries hash equal,
/// across restarts, and a different request cannot pass for a retry (a 64-bit FNV-1a could
/// collide and hand one request another's future). "sha256:" + 64 hex digits.
std::string payload_hash(const std::string& endpoint, const httplib::Request& req) {
  // Digested part by part: a body of many MiB is not copied.
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("payload_hash: OpenSSL cannot start a SHA-256 digest");
  const std::string content_type = req.get_header_value("Content-Type");
  const std::string encoding = req.get_header_value("Content-Encoding");
  for (const std::string* part : {&endpoint, &content_type, &encoding, &req.body}) {
    const std::string length = std::to_string(part->size()) + ":";
    EVP_DigestUpdate(ctx.get(), length.data(), length.size());
    EVP_DigestUpdate(ctx.get(), part->data(), part->size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  std::string out = "sha256:";
  char hex[3];
  for (unsigned int i = 0; i < size; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", digest[i]);
    out += hex;
  }
  return out;
}

} // namespace

void reply_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(), json_type);
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply_json(res, json{{"error", message}}, status);
}

std::string random_token() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

bool accepts_proto(const httplib::Request& req) {
  return req.get_header_value("Accept").find(proto_type) != std::string::npos;
}

int64_t query_int(const httplib::Request& req, const std::string& name, int64_t fallback,
                  int64_t max) {
  if (!req.has_param(name))
    return fallback;
  auto text = req.get_param_value(name);
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 0 && v <= max)
      return v;
  } catch (const std::exception&) {
  }
  throw http_error(http_status::bad_request, "query parameter " + name + " must be an integer in 0.." +
                            std::to_string(max) + ", got '" + text + "'");
}

json lora_json(const tinker::lora_config& l) {
  json j{{"rank", l.rank},
         {"train_unembed", l.train_unembed},
         {"train_mlp", l.train_mlp},
         {"train_attn", l.train_attn}};
  if (l.has_seed)
    j["seed"] = l.seed;
  return j;
}

json metadata_json(const std::map<std::string, std::string>& m) {
  json j = json::object();
  for (auto& [k, v] : m)
    j[k] = v;
  return j;
}

tinker_path_parts parse_tinker_path(const std::string& path) {
  const std::string prefix = "tinker://";
  if (path.rfind(prefix, 0) != 0)
    throw http_error(http_status::bad_request, "checkpoint path '" + path + "' does not start with tinker://");
  auto rest = path.substr(prefix.size());
  auto a = rest.find('/');
  auto b = a == std::string::npos ? a : rest.find('/', a + 1);
  if (a == std::string::npos || b == std::string::npos || a == 0 || b + 1 >= rest.size() ||
      rest.find('/', b + 1) != std::string::npos)
    throw http_error(http_status::bad_request, "checkpoint path '" + path +
                              "' is not tinker://<model_id>/{weights|sampler_weights}/<name>");
  tinker_path_parts p{rest.substr(0, a), rest.substr(a + 1, b - a - 1), rest.substr(b + 1)};
  if (p.kind != "weights" && p.kind != "sampler_weights")
    throw http_error(http_status::bad_request, "checkpoint path '" + path + "' has kind '" + p.kind +
                              "'; expected weights or sampler_weights");
  return p;
}

void require_sampler_kind(const checkpoint_record& c) {
  if (c.kind != checkpoint_kind::sampler_weights)
    throw http_error(http_status::bad_request, "checkpoint " + c.tinker_path +
                              " is training state; sampling needs a "
                              "tinker://.../sampler_weights/... checkpoint");
}

uint64_t tree_size(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec))
      total += it->file_size(ec);
  return total;
}

json checkpoint_json(const checkpoint_record& c) {
  json j{{"checkpoint_id", std::string(to_string(c.kind)) + "/" + c.name},
         {"checkpoint_type", c.kind == checkpoint_kind::weights ? "training" : "sampler"},
         {"time", iso_time(c.created_ms)},
         {"tinker_path", c.tinker_path},
         {"size_bytes", c.size_bytes},
         {"public", false}};
  if (c.expires_ms)
    j["expires_at"] = iso_time(*c.expires_ms);
  return j;
}

void server_state::notify_final() {
  {
    std::lock_guard<std::mutex> guard(poll_mutex);
    ++generation;
  }
  poll_cv.notify_all();
}

void server_state::future_final(const std::string& id, const std::string& outcome) {
  std::pair<std::string, std::chrono::steady_clock::time_point> began;
  {
    std::lock_guard<std::mutex> guard(in_flight_mutex);
    auto it = in_flight.find(id);
    if (it == in_flight.end())
      return;
    began = it->second;
    in_flight.erase(it);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began.second).count();
  metrics.observe("rlforge_future_latency_seconds",
                  "From a request's arrival to its future's result, by request type.",
                  {{"type", began.first}}, seconds, runtime::latency_buckets_seconds());
  metrics.add("rlforge_futures_total", "Futures final, by request type and outcome (ok, or the "
              "failure's category).",
              {{"type", began.first}, {"outcome", outcome}});
}

void server_state::complete(const std::string& id, const std::string& bytes,
                            const std::string& type) {
  try {
    store.complete(id, bytes, type);
  } catch (const std::exception& e) {
    log->error("event=complete_failed request_id={} error=\"{}\"", id, e.what());
  }
  future_final(id, "ok");
  notify_final();
}

void server_state::fail(const std::string& id, const failure& f) {
  const std::string category = tinker::future_category(f.category);
  try {
    store.fail(id, f.message, category);
  } catch (const std::exception& e) {
    log->error("event=fail_failed request_id={} error=\"{}\"", id, e.what());
  }
  log->info("event=future_failed request_id={} category={} error=\"{}\"", id, category,
            f.message);
  future_final(id, category);
  notify_final();
}

request_scheduler::completion<std::string> server_state::finish_json(const std::string& id) {
  return finish_with<std::string>(
      id, [](const std::string& s) { return s; }, json_type);
}

std::pair<std::string, bool> server_state::record(const std::string& type,
                                                  const std::string& model_id, int64_t seq_id,
                                                  const httplib::Request& req,
                                                  const std::string& endpoint) {
  auto r = store.submit(type, model_id, seq_id, req.get_header_value("X-Idempotency-Key"),
                        payload_hash(endpoint, req));
  if (r.conflict)
    throw http_error(http_status::conflict, r.message);
  if (r.created) {
    std::lock_guard<std::mutex> guard(in_flight_mutex);
    in_flight[r.request_id] = {type, std::chrono::steady_clock::now()};
  }
  return {r.request_id, r.created};
}

void server_state::schedule_or_fail(const std::string& id, const std::function<void()>& schedule) {
  try {
    schedule();
  } catch (const tinker::request_error& e) {
    fail(id, failure{e.category(), e.what()});
    throw;
  }
}

void server_state::require_model(const std::string& model_id) {
  if (model_id.empty())
    throw http_error(http_status::bad_request, "model_id is empty");
  if (sched->next_seq_id(model_id) >= 0)
    return;
  auto rec = store.get_model(model_id);
  if (rec && !rec->deleted && backend.has_model(model_id)) {
    sched->open_model(model_id, 1);
    return;
  }
  if (rec && !rec->deleted)
    throw http_error(http_status::not_found, "model '" + model_id +
                              "' is not loaded in this server process (it was created before "
                              "a restart); create it again or load a checkpoint");
  throw http_error(http_status::not_found, "unknown model '" + model_id + "'");
}

checkpoint_record server_state::require_checkpoint(const std::string& tinker_path) {
  purge_expired();
  parse_tinker_path(tinker_path);
  auto c = store.get_checkpoint(tinker_path);
  if (!c)
    throw http_error(http_status::not_found, "unknown checkpoint " + tinker_path);
  return *c;
}

std::string server_state::checkpoint_path(const std::string& model_id, const std::string& kind,
                                          const std::string& name) const {
  return (fs::path(opts.checkpoint_dir) / model_id / kind / name).string();
}

std::optional<int64_t> server_state::expiry(bool has_ttl, int64_t ttl_seconds) const {
  if (!has_ttl)
    return std::nullopt;
  return future_store::now_ms() + ttl_seconds * 1000;
}

void server_state::purge_expired() {
  for (auto& c : store.list_expired_checkpoints(future_store::now_ms())) {
    std::error_code ec;
    fs::remove_all(c.dir, ec);
    if (ec) {
      log->warn("event=expire_failed path={} dir={} error=\"{}\"", c.tinker_path, c.dir,
                ec.message());
      continue;
    }
    try {
      store.delete_checkpoint(c.tinker_path);
      log->info("event=checkpoint_expired path={}", c.tinker_path);
    } catch (const store_error&) {
      // Deleted concurrently by another call: nothing left to do.
    }
  }
}

json server_state::submitted(const std::string& id, const std::string& model_id) const {
  json j{{"request_id", id}};
  if (!model_id.empty())
    j["model_id"] = model_id;
  return j;
}

seq_guard::seq_guard(server_state& s, const httplib::Request& req) : s(s) {
  auto [m, q] = ordered_request_ids(req.get_header_value("Content-Type"),
                                    req.get_header_value("Content-Encoding"), req.body,
                                    s.opts.max_body_bytes);
  set(m, q);
}

void seq_guard::set(const std::string& m, int64_t q) {
  model_id = m;
  seq_id = q;
  armed = !m.empty() && q >= 0;
}

seq_guard::~seq_guard() {
  if (armed && s.sched)
    s.sched->skip(model_id, seq_id);
}

namespace {

int status_for_store(store_errc code) {
  switch (code) {
  case store_errc::not_found:
    return 404;
  case store_errc::conflict:
    return 409;
  case store_errc::invalid:
    return 400;
  case store_errc::database:
    return 500;
  }
  return 500;
}

} // namespace

http_failure current_http_failure(server_state& s, const httplib::Request& req) {
  try {
    throw;
  } catch (const http_error& e) {
    return {e.status, e.what()};
  } catch (const tinker::request_error& e) {
    return {tinker::http_status(e.category()), e.what()};
  } catch (const store_error& e) {
    return {status_for_store(e.code()), e.what()};
  } catch (const tar_error& e) {
    return {500, e.what()};
  } catch (const json::exception& e) {
    return {500, std::string("stored JSON is unreadable: ") + e.what()};
  } catch (const std::exception& e) {
    s.log->error("event=handler_failed path={} error=\"{}\"", req.path, e.what());
    return {500, e.what()};
  } catch (...) {
    s.log->error("event=handler_failed path={} error=\"unknown exception\"", req.path);
    return {500, "unknown exception"};
  }
}

void finish_request(server_state& s, const httplib::Request& req, const httplib::Response& res,
                    const std::string& endpoint) {
  if (res.status >= 400)
    s.log->info("event=request_refused method={} path={} status={}", req.method, req.path,
                res.status);
  count_request(s, endpoint, res.status);
}

} // namespace rlforge::service::http
