#include "service/http_server.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>
#include <utility>

#include "runtime/logging.hpp"
#include "service/future_store.hpp"
#include "service/tar_archive.hpp"
#include "service/tinker.pb.h"
#include "service/tinker_wire.hpp"

namespace rlforge::service {

bool constant_time_equal(const std::string& presented, const std::string& expected) {
  // Walk the expected string's length whatever was presented, so timing reveals neither the
  // position of the first difference nor (beyond "longer or not") the length.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* proto_type = "application/x-protobuf";
constexpr const char* json_type = "application/json";
constexpr const char* api = "/api/v1/";

/// An HTTP error with its status; everything else is mapped by `status_for`.
struct http_error : std::runtime_error {
  http_error(int status, const std::string& message)
      : std::runtime_error(message), status(status) {}
  int status;
};

int status_for_category(const std::string& category) {
  if (category == "user")
    return 400;
  if (category == "not_found")
    return 404;
  return 500;
}

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

/// Future error category for the SDK: it knows "user", "server" and "unknown".
std::string future_category(const std::string& category) {
  if (category == "user" || category == "not_found")
    return "user";
  if (category == "server")
    return "server";
  return "unknown";
}

void reply_json(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(), json_type);
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply_json(res, json{{"error", message}}, status);
}

/// FNV-1a over the endpoint, content type and body: equal retries hash equal, across restarts.
std::string payload_hash(const std::string& endpoint, const httplib::Request& req) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  mix(endpoint);
  mix(req.get_header_value("Content-Type"));
  mix(req.get_header_value("Content-Encoding"));
  mix(req.body);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

/// Best-effort (model_id, seq_id) of an ordered request whose body failed to decode, so its
/// seq_id can be consumed: JSON bodies and uncompressed protobuf bodies. Empty model_id = unknown.
std::pair<std::string, int64_t> peek_ids(const httplib::Request& req) {
  try {
    if (req.get_header_value("Content-Type").rfind("application/x-protobuf", 0) == 0) {
      auto enc = req.get_header_value("Content-Encoding");
      if (!enc.empty() && enc != "identity")
        return {"", -1};
      tinker_public::ForwardBackwardRequest p;
      if (!p.ParseFromString(req.body))
        return {"", -1};
      return {p.model_id(), p.seq_id()};
    }
    auto j = nlohmann::json::parse(req.body);
    if (j.is_object() && j.contains("model_id") && j["model_id"].is_string() &&
        j.contains("seq_id") && j["seq_id"].is_number_integer())
      return {j["model_id"].get<std::string>(), j["seq_id"].get<int64_t>()};
  } catch (const std::exception&) {
  }
  return {"", -1};
}

std::string iso_time(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
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

/// A non-negative integer query parameter, `fallback` when absent; 400 naming it otherwise.
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
  throw http_error(400, "query parameter " + name + " must be an integer in 0.." +
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

/// The parsed "tinker://<model_id>/<weights|sampler_weights>/<name>".
struct tinker_path_parts {
  std::string model_id;
  std::string kind;
  std::string name;
};

tinker_path_parts parse_tinker_path(const std::string& path) {
  const std::string prefix = "tinker://";
  if (path.rfind(prefix, 0) != 0)
    throw http_error(400, "checkpoint path '" + path + "' does not start with tinker://");
  auto rest = path.substr(prefix.size());
  auto a = rest.find('/');
  auto b = a == std::string::npos ? a : rest.find('/', a + 1);
  if (a == std::string::npos || b == std::string::npos || a == 0 || b + 1 >= rest.size() ||
      rest.find('/', b + 1) != std::string::npos)
    throw http_error(400, "checkpoint path '" + path +
                              "' is not tinker://<model_id>/{weights|sampler_weights}/<name>");
  tinker_path_parts p{rest.substr(0, a), rest.substr(a + 1, b - a - 1), rest.substr(b + 1)};
  if (p.kind != "weights" && p.kind != "sampler_weights")
    throw http_error(400, "checkpoint path '" + path + "' has kind '" + p.kind +
                              "'; expected weights or sampler_weights");
  return p;
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

} // namespace

struct http_server::impl {
  server_options opts;
  actors::tinker_backend& backend;
  future_store& store;
  std::shared_ptr<spdlog::logger> log = runtime::logger("service");
  httplib::Server svr;
  std::unique_ptr<request_scheduler> sched;
  std::thread listener;
  int bound_port = 0;
  bool started = false;

  /// Long-poll wake-ups: bumped whenever a future becomes final, and at stop.
  std::mutex poll_mutex;
  std::condition_variable poll_cv;
  uint64_t generation = 0;
  bool stopping = false;
  std::condition_variable stopped_cv;
  bool stopped = false;

  /// Serializes "record in the store, then queue in the scheduler", so a retry racing its
  /// original sees either nothing or the queued original.
  std::mutex submit_mutex;

  /// Short-lived archive download tokens → (tinker path, expiry).
  std::mutex archive_mutex;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> archives;

  wire_limits limits;

  impl(server_options o, actors::tinker_backend& b, future_store& s)
      : opts(std::move(o)), backend(b), store(s) {}

  void notify_final() {
    {
      std::lock_guard<std::mutex> guard(poll_mutex);
      ++generation;
    }
    poll_cv.notify_all();
  }

  void complete(const std::string& id, const std::string& bytes, const std::string& type) {
    try {
      store.complete(id, bytes, type);
    } catch (const std::exception& e) {
      log->error("event=complete_failed request_id={} error=\"{}\"", id, e.what());
    }
    notify_final();
  }

  void fail(const std::string& id, const failure& f) {
    try {
      store.fail(id, f.message, future_category(f.category));
    } catch (const std::exception& e) {
      log->error("event=fail_failed request_id={} error=\"{}\"", id, e.what());
    }
    notify_final();
  }

  template <class T>
  request_scheduler::completion<T> finish_with(const std::string& id,
                                               std::function<std::string(const T&)> encode,
                                               std::string content_type) {
    return {[this, id, encode, content_type](T x) {
              std::string bytes;
              try {
                bytes = encode(x);
              } catch (const tinker::request_error& e) {
                fail(id, failure{"server", e.what()});
                return;
              }
              complete(id, bytes, content_type);
            },
            [this, id](const failure& f) { fail(id, f); }};
  }

  request_scheduler::completion<std::string> finish_json(const std::string& id) {
    return finish_with<std::string>(
        id, [](const std::string& s) { return s; }, json_type);
  }

  /// Records a future; returns {request_id, true} when it is new and must be scheduled.
  std::pair<std::string, bool> record(const std::string& type, const std::string& model_id,
                                      int64_t seq_id, const httplib::Request& req,
                                      const std::string& endpoint) {
    auto r = store.submit(type, model_id, seq_id, req.get_header_value("X-Idempotency-Key"),
                          payload_hash(endpoint, req));
    if (r.conflict)
      throw http_error(409, r.message);
    return {r.request_id, r.created};
  }

  /// Queues `schedule` for a freshly recorded future; a refusal fails the future and the call.
  void schedule_or_fail(const std::string& id, const std::function<void()>& schedule) {
    try {
      schedule();
    } catch (const tinker::request_error& e) {
      fail(id, failure{e.category(), e.what()});
      throw;
    }
  }

  /// 404 unless the model exists in this process (created here or pending creation).
  void require_model(const std::string& model_id) {
    if (model_id.empty())
      throw http_error(400, "model_id is empty");
    if (sched->next_seq_id(model_id) >= 0)
      return;
    auto rec = store.get_model(model_id);
    if (rec && !rec->deleted && backend.has_model(model_id)) {
      sched->open_model(model_id, 1);
      return;
    }
    if (rec && !rec->deleted)
      throw http_error(404, "model '" + model_id +
                                "' is not loaded in this server process (it was created before "
                                "a restart); create it again or load a checkpoint");
    throw http_error(404, "unknown model '" + model_id + "'");
  }

  std::string checkpoint_path(const std::string& model_id, const std::string& kind,
                              const std::string& name) {
    return (fs::path(opts.checkpoint_dir) / model_id / kind / name).string();
  }

  std::optional<int64_t> expiry(bool has_ttl, int64_t ttl_seconds) {
    if (!has_ttl)
      return std::nullopt;
    return future_store::now_ms() + ttl_seconds * 1000;
  }

  /// Removes checkpoints whose ttl_seconds ran out (their directories, then their rows). Runs
  /// lazily, before the calls that list, save or hand out checkpoints.
  void purge_expired() {
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

  json submitted(const std::string& id, const std::string& model_id = "") {
    json j{{"request_id", id}};
    if (!model_id.empty())
      j["model_id"] = model_id;
    return j;
  }

  /// Consumes the seq_id of an ordered request that is refused before it is queued (bad input,
  /// unknown checkpoint, ...): the SDK has used that seq_id up, and the model's later requests
  /// must not wait for it. Disarmed once the request is queued or recognized as a retry.
  struct seq_guard {
    impl& s;
    std::string model_id;
    int64_t seq_id = -1;
    bool armed = false;
    seq_guard(impl& s, const httplib::Request& req) : s(s) {
      auto [m, q] = peek_ids(req);
      set(m, q);
    }
    void set(const std::string& m, int64_t q) {
      model_id = m;
      seq_id = q;
      armed = !m.empty() && q >= 0;
    }
    ~seq_guard() {
      if (armed && s.sched)
        s.sched->skip(model_id, seq_id);
    }
  };

  // ---- endpoints ------------------------------------------------------------------------------

  void client_config(const httplib::Request&, httplib::Response& res) {
    reply_json(res, json{{"use_pyqwest_transport", false},
                         {"pjwt_auth_enabled", false},
                         {"credential_default_source", "api_key"},
                         {"proto_compress_fwdbwd", false},
                         {"parallel_fwdbwd_chunks", true},
                         {"fwdbwd_max_chunk_len", 1024},
                         {"fwdbwd_max_chunk_bytes_count", 5000000},
                         {"fwdbwd_dispatch_bytes_semaphore_size", 50000000},
                         {"sample_dispatch_bytes_semaphore_size", 10 << 20},
                         {"inflight_response_bytes_semaphore_size", 50 << 20},
                         {"sample_no_retries", false},
                         {"sample_enable_stuck_detection", true},
                         {"sample_max_concurrent_requests", 2000},
                         {"billing_exception_max_pause_duration_sec", 3600},
                         {"create_model_via_load_weights", false}});
  }

  void create_session(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_create_session(req.body);
    json tags = r.tags;
    auto id = store.create_session(tags.dump(), metadata_json(r.user_metadata).dump());
    log->info("event=create_session session_id={}", id);
    reply_json(res, json{{"session_id", id}, {"type", "create_session"}});
  }

  void session_heartbeat(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_session_heartbeat(req.body);
    store.heartbeat(r.session_id);
    reply_json(res, json{{"type", "session_heartbeat"}});
  }

  void capabilities(httplib::Response& res) {
    reply_json(res,
               json{{"supported_models",
                     json::array({json{{"model_name", backend.base_model_name()},
                                       {"max_context_length", backend.max_context_length()}}})}});
  }

  void create_model(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_create_model(req.body);
    if (!store.get_session(r.session_id))
      throw http_error(404, "unknown session '" + r.session_id + "'");
    if (r.base_model != backend.base_model_name())
      throw http_error(400, "base_model '" + r.base_model +
                                "' is not served here; this server "
                                "serves '" +
                                backend.base_model_name() + "'");
    auto model_id = future_store::model_id_for(r.session_id, r.model_seq_id);
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record("create_model", model_id, 0, req, "create_model");
    if (created) {
      schedule_or_fail(id, [&] {
        sched->open_model(model_id, 1);
        sched->submit_unordered(
            model_id,
            [this, r, model_id] {
              try {
                backend.create_model(model_id, r.lora, r.role);
              } catch (...) {
                // No model: requests queued behind the creation fail as unknown-model ones would.
                sched->close_model(model_id);
                throw;
              }
              model_record m;
              m.model_id = model_id;
              m.session_id = r.session_id;
              m.model_seq_id = r.model_seq_id;
              m.base_model = r.base_model;
              m.lora_config_json = lora_json(r.lora).dump();
              m.role = r.role;
              m.user_metadata_json = metadata_json(r.user_metadata).dump();
              store.insert_model(m);
              log->info("event=create_model model_id={} lora_rank={}", model_id, r.lora.rank);
              return json{{"model_id", model_id}, {"type", "create_model"}}.dump();
            },
            finish_json(id));
      });
    }
    reply_json(res, submitted(id, model_id));
  }

  void get_info(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_get_info(req.body);
    auto m = store.get_model(r.model_id);
    if (!m || m->deleted)
      throw http_error(404, "unknown model '" + r.model_id + "'");
    auto lora = json::parse(m->lora_config_json);
    int64_t rank = lora.value("rank", int64_t{0});
    reply_json(res, json{{"model_id", m->model_id},
                         {"model_data", {{"model_name", m->base_model}}},
                         {"is_lora", rank > 0},
                         {"lora_rank", rank},
                         {"model_name", m->base_model},
                         {"type", "get_info"}});
  }

  void unload_model(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_unload_model(req.body);
    require_model(r.model_id);
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record("unload_model", r.model_id, -1, req, "unload_model");
    if (created) {
      auto model_id = r.model_id;
      schedule_or_fail(id, [&] {
        sched->submit_unordered(
            model_id,
            [this, model_id] {
              backend.delete_model(model_id);
              store.mark_model_deleted(model_id);
              sched->close_model(model_id);
              log->info("event=unload_model model_id={}", model_id);
              return json{{"model_id", model_id}, {"type", "unload_model"}}.dump();
            },
            finish_json(id));
      });
    }
    reply_json(res, submitted(id, r.model_id));
  }

  void forward_backward(const httplib::Request& req, httplib::Response& res,
                        const std::string& endpoint) {
    seq_guard g(*this, req);
    auto r = decode_forward_backward(req.body, req.get_header_value("Content-Type"),
                                     req.get_header_value("Content-Encoding"), limits);
    g.set(r.model_id, r.seq_id);
    if (endpoint == "forward")
      r.forward_only = true;
    require_model(r.model_id);
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record(r.forward_only ? "forward" : "forward_backward", r.model_id,
                                r.seq_id, req, endpoint);
    g.armed = false;
    if (created) {
      auto model_id = r.model_id;
      schedule_or_fail(id, [&] {
        sched->submit_forward_backward(std::move(r),
                                       finish_with<tinker::forward_backward_output>(
                                           id, encode_forward_backward_output_proto, proto_type));
      });
      reply_json(res, submitted(id, model_id));
      return;
    }
    reply_json(res, submitted(id, r.model_id));
  }

  void optim_step(const httplib::Request& req, httplib::Response& res) {
    seq_guard g(*this, req);
    auto r = decode_optim_step(req.body);
    require_model(r.model_id);
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record("optim_step", r.model_id, r.seq_id, req, "optim_step");
    g.armed = false;
    if (created) {
      schedule_or_fail(id, [&] {
        sched->submit_ordered(
            r.model_id, r.seq_id,
            [this, r] {
              auto metrics = backend.optim_step(r.model_id, r.adam);
              for (auto& [name, value] : metrics)
                validate_metric_name(name);
              return json{{"metrics", metrics}, {"type", "optim_step"}}.dump();
            },
            finish_json(id));
      });
    }
    reply_json(res, submitted(id, r.model_id));
  }

  void save_weights(const httplib::Request& req, httplib::Response& res) {
    seq_guard g(*this, req);
    auto r = decode_save_weights(req.body);
    require_model(r.model_id);
    if (r.path.empty())
      r.path = "step-" + std::to_string(r.seq_id);
    auto tinker_path = "tinker://" + r.model_id + "/weights/" + r.path;
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record("save_weights", r.model_id, r.seq_id, req, "save_weights");
    g.armed = false;
    if (created) {
      {
        auto expires = expiry(r.has_ttl, r.ttl_seconds);
        schedule_or_fail(id, [&] {
          sched->submit_ordered(
              r.model_id, r.seq_id,
              [this, r, tinker_path, expires] {
                // Checked in order, when the save runs: an earlier save may create the name.
                if (!r.overwrite && store.get_checkpoint(tinker_path))
                  throw tinker::request_error("user", "checkpoint " + tinker_path +
                                                          " exists; save under another name or "
                                                          "pass overwrite");
                auto dir = checkpoint_path(r.model_id, "weights", r.path);
                fs::remove_all(dir); // an overwrite must not mix old files with new ones
                fs::create_directories(dir);
                backend.save_checkpoint(r.model_id, dir, true);
                checkpoint_record c;
                c.tinker_path = tinker_path;
                c.model_id = r.model_id;
                c.kind = checkpoint_kind::weights;
                c.name = r.path;
                c.dir = dir;
                c.size_bytes = static_cast<int64_t>(tree_size(dir));
                c.expires_ms = expires;
                store.insert_checkpoint(c, r.overwrite);
                return json{{"path", tinker_path}, {"type", "save_weights"}}.dump();
              },
              finish_json(id));
        });
      }
    }
    reply_json(res, submitted(id, r.model_id));
  }

  void save_weights_for_sampler(const httplib::Request& req, httplib::Response& res) {
    seq_guard g(*this, req);
    auto r = decode_save_weights_for_sampler(req.body);
    require_model(r.model_id);
    auto model = store.get_model(r.model_id);
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] =
        record("save_weights_for_sampler", r.model_id, r.seq_id, req, "save_weights_for_sampler");
    g.armed = false;
    if (created) {
      auto expires = expiry(r.has_ttl, r.ttl_seconds);
      std::string session_id = model ? model->session_id : "";
      std::string base_model = model ? model->base_model : backend.base_model_name();
      schedule_or_fail(id, [&] {
        sched->submit_ordered(
            r.model_id, r.seq_id,
            [this, r, expires, session_id, base_model] {
              if (!r.path.empty()) {
                auto tinker_path = "tinker://" + r.model_id + "/sampler_weights/" + r.path;
                auto dir = checkpoint_path(r.model_id, "sampler_weights", r.path);
                fs::remove_all(dir);
                fs::create_directories(dir);
                backend.save_sampler_checkpoint(r.model_id, dir, true);
                checkpoint_record c;
                c.tinker_path = tinker_path;
                c.model_id = r.model_id;
                c.kind = checkpoint_kind::sampler_weights;
                c.name = r.path;
                c.dir = dir;
                c.size_bytes = static_cast<int64_t>(tree_size(dir));
                c.expires_ms = expires;
                store.insert_checkpoint(c, true);
                return json{{"path", tinker_path}, {"type", "save_weights_for_sampler"}}.dump();
              }
              // No name: sync the weights to the engines and hand out a sampling session.
              auto dir =
                  checkpoint_path(r.model_id, "ephemeral", "seq-" + std::to_string(r.seq_id));
              fs::create_directories(dir);
              backend.save_sampler_checkpoint(r.model_id, dir, false);
              sampling_session_record s;
              s.session_id = session_id;
              s.sampling_session_seq_id =
                  r.has_sampling_session_seq_id ? r.sampling_session_seq_id : -1;
              s.model_id = r.model_id;
              s.base_model = base_model;
              s.weights_version = r.seq_id;
              s.weights_dir = dir;
              auto sid = store.create_sampling_session(s);
              return json{{"sampling_session_id", sid}, {"type", "save_weights_for_sampler"}}
                  .dump();
            },
            finish_json(id));
      });
    }
    reply_json(res, submitted(id, r.model_id));
  }

  checkpoint_record require_checkpoint(const std::string& tinker_path) {
    purge_expired();
    parse_tinker_path(tinker_path);
    auto c = store.get_checkpoint(tinker_path);
    if (!c)
      throw http_error(404, "unknown checkpoint " + tinker_path);
    return *c;
  }

  void load_weights(const httplib::Request& req, httplib::Response& res) {
    seq_guard g(*this, req);
    auto r = decode_load_weights(req.body);
    if (r.create_via_load)
      throw http_error(400, "load_weights with session_id/model_seq_id (create_model_via_load_"
                            "weights) is not enabled on this server; call create_model first");
    require_model(r.model_id);
    auto c = require_checkpoint(r.path);
    if (c.kind != checkpoint_kind::weights)
      throw http_error(400, "checkpoint " + r.path +
                                " holds sampler weights; load_weights needs "
                                "a tinker://.../weights/... checkpoint");
    std::lock_guard<std::mutex> guard(submit_mutex);
    auto [id, created] = record("load_weights", r.model_id, r.seq_id, req, "load_weights");
    g.armed = false;
    if (created) {
      schedule_or_fail(id, [&] {
        sched->submit_ordered(
            r.model_id, r.seq_id,
            [this, r, dir = c.dir] {
              backend.load_checkpoint(r.model_id, dir, r.optimizer);
              return json{{"path", r.path}, {"model_id", r.model_id}, {"type", "load_weights"}}
                  .dump();
            },
            finish_json(id));
      });
    }
    reply_json(res, submitted(id, r.model_id));
  }

  void create_sampling_session(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_create_sampling_session(req.body);
    if (!r.session_id.empty() && !store.get_session(r.session_id))
      throw http_error(404, "unknown session '" + r.session_id + "'");
    sampling_session_record s;
    s.session_id = r.session_id;
    s.sampling_session_seq_id = r.sampling_session_seq_id;
    if (!r.model_path.empty()) {
      auto c = require_checkpoint(r.model_path);
      if (c.kind != checkpoint_kind::sampler_weights)
        throw http_error(400, "checkpoint " + r.model_path +
                                  " is training state; sampling needs "
                                  "a tinker://.../sampler_weights/... "
                                  "checkpoint");
      auto m = store.get_model(c.model_id);
      s.model_id = c.model_id;
      s.base_model = m ? m->base_model : backend.base_model_name();
      s.model_path = r.model_path;
      s.weights_dir = c.dir;
    } else {
      if (r.base_model != backend.base_model_name())
        throw http_error(400, "base_model '" + r.base_model +
                                  "' is not served here; this server "
                                  "serves '" +
                                  backend.base_model_name() + "'");
      s.base_model = r.base_model;
    }
    auto id = store.create_sampling_session(s);
    reply_json(res, json{{"sampling_session_id", id}, {"type", "create_sampling_session"}});
  }

  void get_sampler(const std::string& id, httplib::Response& res) {
    auto s = store.get_sampling_session(id);
    if (!s)
      throw http_error(404, "unknown sampling session '" + id + "'");
    json j{{"sampler_id", s->id}, {"base_model", s->base_model}};
    if (!s->model_path.empty())
      j["model_path"] = s->model_path;
    reply_json(res, j);
  }

  void asample(const httplib::Request& req, httplib::Response& res) {
    auto body = decode_sample(req.body, limits);
    std::string model_id;
    std::string key = body.request.sampling_session_id;
    if (!key.empty()) {
      auto s = store.get_sampling_session(key);
      if (!s)
        throw http_error(404, "unknown sampling session '" + key + "'");
      // A session on a saved sampler checkpoint samples exactly that checkpoint (its directory),
      // whatever the model did since and whether or not it is still loaded (e.g. after a
      // restart); ephemeral sessions sample their model's synced weights.
      model_id = s->model_path.empty() ? s->model_id : s->weights_dir;
    } else if (!body.model_path.empty()) {
      auto c = require_checkpoint(body.model_path);
      if (c.kind != checkpoint_kind::sampler_weights)
        throw http_error(400, "checkpoint " + body.model_path +
                                  " is training state; sampling needs "
                                  "a tinker://.../sampler_weights/... checkpoint");
      model_id = c.dir;
    } else if (body.base_model != backend.base_model_name()) {
      throw http_error(400, "base_model '" + body.base_model +
                                "' is not served here; this "
                                "server serves '" +
                                backend.base_model_name() + "'");
    }
    std::lock_guard<std::mutex> guard(submit_mutex);
    if (sched->pending_samples() >= opts.scheduler.max_pending_samples) {
      res.set_header("Retry-After", "1");
      throw http_error(429, "sampling queue full (" + std::to_string(sched->pending_samples()) +
                                " requests waiting); retry later");
    }
    // Only addressed sessions have a (session, seq_id) identity; other samples dedupe by key.
    auto [id, created] =
        record("sample", key, key.empty() ? -1 : body.request.seq_id, req, "asample");
    if (created) {
      bool queued = sched->try_submit_sample(
          model_id, body.request,
          finish_with<tinker::sample_response>(id, encode_sample_response_proto, proto_type));
      if (!queued) {
        fail(id, failure{"server", "sampling queue full"});
        res.set_header("Retry-After", "1");
        throw http_error(429, "sampling queue full; retry later");
      }
    }
    reply_json(res, submitted(id));
  }

  void retrieve_future(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_retrieve_future(req.body);
    auto deadline = std::chrono::steady_clock::now() + opts.long_poll_hold;
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> guard(poll_mutex);
        seen = generation;
      }
      auto f = store.get(r.request_id);
      if (!f)
        throw http_error(404, "unknown request_id '" + r.request_id + "'");
      if (f->state == future_state::failed) {
        reply_json(res, json{{"error", f->error}, {"category", f->category}});
        return;
      }
      if (f->state == future_state::complete) {
        std::string body = f->result;
        std::string type = f->result_content_type;
        if (type == proto_type && !accepts_proto(req)) {
          if (f->request_type == "sample")
            body = encode_sample_response_json(decode_sample_response_proto(body));
          else
            body = encode_forward_backward_output_json(decode_forward_backward_output_proto(body));
          type = json_type;
        }
        if (r.allow_metadata_only) {
          reply_json(res,
                     json{{"status", "complete_metadata"}, {"response_payload_size", body.size()}});
          return;
        }
        res.status = 200;
        res.set_content(body, type.c_str());
        return;
      }
      std::unique_lock<std::mutex> lock(poll_mutex);
      bool woke =
          poll_cv.wait_until(lock, deadline, [&] { return generation != seen || stopping; });
      if (!woke || stopping) {
        reply_json(
            res,
            json{{"type", "try_again"}, {"request_id", r.request_id}, {"queue_state", "active"}});
        return;
      }
    }
  }

  void weights_info(const httplib::Request& req, httplib::Response& res) {
    auto r = decode_weights_info(req.body);
    auto c = require_checkpoint(r.tinker_path);
    auto m = store.get_model(c.model_id);
    if (!m)
      throw http_error(404, "checkpoint " + r.tinker_path + " belongs to unknown model '" +
                                c.model_id + "'");
    auto lora = json::parse(m->lora_config_json);
    int64_t rank = lora.value("rank", int64_t{0});
    reply_json(res, json{{"base_model", m->base_model},
                         {"is_lora", rank > 0},
                         {"lora_rank", rank},
                         {"train_unembed", lora.value("train_unembed", true)},
                         {"train_mlp", lora.value("train_mlp", true)},
                         {"train_attn", lora.value("train_attn", true)}});
  }

  json training_run_json(const model_record& m) {
    auto lora = json::parse(m.lora_config_json);
    int64_t rank = lora.value("rank", int64_t{0});
    json j{{"training_run_id", m.model_id},
           {"base_model", m.base_model},
           {"model_owner", "local"},
           {"is_lora", rank > 0},
           {"corrupted", false},
           {"last_request_time", iso_time(m.created_ms)}};
    if (rank > 0)
      j["lora_rank"] = rank;
    const checkpoint_record* last = nullptr;
    const checkpoint_record* last_sampler = nullptr;
    auto cps = store.list_checkpoints(m.model_id);
    for (auto& c : cps)
      (c.kind == checkpoint_kind::weights ? last : last_sampler) = &c;
    if (last)
      j["last_checkpoint"] = checkpoint_json(*last);
    if (last_sampler)
      j["last_sampler_checkpoint"] = checkpoint_json(*last_sampler);
    auto meta = json::parse(m.user_metadata_json);
    json md = json::object();
    for (auto& [k, v] : meta.items())
      md[k] = v.is_string() ? v.get<std::string>() : v.dump();
    j["user_metadata"] = md;
    return j;
  }

  void list_training_runs(const httplib::Request& req, httplib::Response& res) {
    auto limit = query_int(req, "limit", 20, 10000);
    auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
    auto models = store.list_models();
    json runs = json::array();
    for (size_t i = static_cast<size_t>(offset);
         i < models.size() && runs.size() < static_cast<size_t>(limit); ++i)
      runs.push_back(training_run_json(models[i]));
    reply_json(res, json{{"training_runs", runs},
                         {"cursor",
                          {{"offset", offset}, {"limit", limit}, {"total_count", models.size()}}}});
  }

  void list_sessions(const httplib::Request& req, httplib::Response& res) {
    auto limit = query_int(req, "limit", 20, 10000);
    auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
    auto all = store.list_sessions();
    json ids = json::array();
    for (size_t i = static_cast<size_t>(offset);
         i < all.size() && ids.size() < static_cast<size_t>(limit); ++i)
      ids.push_back(all[i].session_id);
    reply_json(
        res, json{{"sessions", ids},
                  {"cursor", {{"offset", offset}, {"limit", limit}, {"total_count", all.size()}}}});
  }

  void get_session(const httplib::Request& req, const std::string& id, httplib::Response& res) {
    if (req.has_param("access_scope")) {
      auto scope = req.get_param_value("access_scope");
      if (scope != "owned" && scope != "accessible")
        throw http_error(400, "access_scope is '" + scope + "', expected owned or accessible");
    }
    if (!store.get_session(id))
      throw http_error(404, "unknown session '" + id + "'");
    json runs = json::array();
    for (auto& m : store.list_models(id))
      runs.push_back(m.model_id);
    json samplers = json::array();
    for (auto& s : store.list_sampling_sessions(id))
      samplers.push_back(s.id);
    reply_json(res, json{{"training_run_ids", runs}, {"sampler_ids", samplers}});
  }

  model_record require_run(const std::string& id) {
    auto m = store.get_model(id);
    if (!m || m->deleted)
      throw http_error(404, "unknown training run '" + id + "'");
    return *m;
  }

  void list_checkpoints(const std::string& model_id, httplib::Response& res) {
    purge_expired();
    require_run(model_id);
    json cps = json::array();
    for (auto& c : store.list_checkpoints(model_id))
      cps.push_back(checkpoint_json(c));
    reply_json(res, json{{"checkpoints", cps}});
  }

  void list_user_checkpoints(const httplib::Request& req, httplib::Response& res) {
    purge_expired();
    auto limit = query_int(req, "limit", 100, 10000);
    auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
    auto all = store.list_checkpoints();
    json cps = json::array();
    for (size_t i = static_cast<size_t>(offset);
         i < all.size() && cps.size() < static_cast<size_t>(limit); ++i)
      cps.push_back(checkpoint_json(all[i]));
    reply_json(
        res, json{{"checkpoints", cps},
                  {"cursor", {{"offset", offset}, {"limit", limit}, {"total_count", all.size()}}}});
  }

  checkpoint_record require_run_checkpoint(const std::string& model_id,
                                           const std::string& checkpoint_id) {
    require_run(model_id);
    auto path = "tinker://" + model_id + "/" + checkpoint_id;
    return require_checkpoint(path);
  }

  void delete_checkpoint(const std::string& model_id, const std::string& checkpoint_id,
                         httplib::Response& res) {
    auto c = require_run_checkpoint(model_id, checkpoint_id);
    std::error_code ec;
    fs::remove_all(c.dir, ec);
    if (ec)
      throw http_error(500, "cannot remove " + c.dir + ": " + ec.message());
    store.delete_checkpoint(c.tinker_path);
    log->info("event=delete_checkpoint path={}", c.tinker_path);
    reply_json(res, json::object());
  }

  /// `PUT .../ttl` `{"ttl_seconds": int >= 1 | null}`: expires the checkpoint that many seconds
  /// from now, or never (null).
  void set_checkpoint_ttl(const httplib::Request& req, const std::string& model_id,
                          const std::string& checkpoint_id, httplib::Response& res) {
    auto body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("ttl_seconds"))
      throw http_error(400, "set checkpoint ttl: the body must be a JSON object with "
                            "'ttl_seconds' (an integer >= 1, or null to never expire)");
    const auto& ttl = body.at("ttl_seconds");
    if (!ttl.is_null() && (!ttl.is_number_integer() || ttl.get<int64_t>() < 1 ||
                           ttl.get<int64_t>() > int64_t{1} << 40))
      throw http_error(400, "set checkpoint ttl: 'ttl_seconds' is " + ttl.dump() +
                                ", expected an integer >= 1 (seconds) or null");
    auto c = require_run_checkpoint(model_id, checkpoint_id);
    c.expires_ms = expiry(!ttl.is_null(), ttl.is_null() ? 0 : ttl.get<int64_t>());
    store.insert_checkpoint(c, true);
    log->info("event=set_checkpoint_ttl path={} ttl_seconds={}", c.tinker_path, ttl.dump());
    reply_json(res, json::object());
  }

  void archive_url(const httplib::Request& req, const std::string& model_id,
                   const std::string& checkpoint_id, httplib::Response& res) {
    auto c = require_run_checkpoint(model_id, checkpoint_id);
    auto token = random_token();
    auto ttl = opts.archive_url_ttl;
    {
      std::lock_guard<std::mutex> guard(archive_mutex);
      auto now = std::chrono::steady_clock::now();
      for (auto i = archives.begin(); i != archives.end();)
        i = i->second.second < now ? archives.erase(i) : std::next(i);
      archives[token] = {c.tinker_path, now + ttl};
    }
    auto host = req.get_header_value("Host");
    if (host.empty())
      host = opts.host + ":" + std::to_string(bound_port);
    auto expires_ms = future_store::now_ms() + static_cast<int64_t>(ttl.count()) * 1000;
    std::time_t secs = static_cast<std::time_t>(expires_ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char http_date[64];
    std::strftime(http_date, sizeof(http_date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    res.set_header("Location", "http://" + host + api + "checkpoint_archives/" + token);
    res.set_header("Expires", http_date);
    reply_json(res,
               json{{"url", std::string("http://") + host + api + "checkpoint_archives/" + token},
                    {"expires", iso_time(expires_ms)}},
               302);
  }

  void download_archive(const std::string& token, httplib::Response& res) {
    std::string tinker_path;
    {
      std::lock_guard<std::mutex> guard(archive_mutex);
      auto i = archives.find(token);
      if (i == archives.end() || i->second.second < std::chrono::steady_clock::now())
        throw http_error(404, "unknown or expired archive link");
      tinker_path = i->second.first;
    }
    auto c = require_checkpoint(tinker_path);
    fs::path dir = c.dir;
    uint64_t size = tar_archive_size(dir);
    auto name = c.name;
    res.set_header("Content-Disposition", "attachment; filename=\"" + name + ".tar\"");
    // Streamed: the provider runs once and pushes the whole archive through the sink in 64 KiB
    // pieces; the archive never exists in memory.
    res.set_content_provider(static_cast<size_t>(size), "application/x-tar",
                             [dir, log = log](size_t offset, size_t, httplib::DataSink& sink) {
                               if (offset != 0)
                                 return false;
                               try {
                                 write_tar(dir, [&sink](const char* data, size_t n) {
                                   if (!sink.write(data, n))
                                     throw tar_error("client went away");
                                 });
                               } catch (const std::exception& e) {
                                 log->warn("event=archive_aborted dir={} error=\"{}\"",
                                           dir.string(), e.what());
                                 return false;
                               }
                               return true;
                             });
  }
};

http_server::http_server(server_options opts, actors::tinker_backend& backend,
                         future_store& store) {
  if (opts.api_key.empty() && !opts.insecure_no_auth)
    throw std::invalid_argument("http_server: api_key is empty (set one, or insecure_no_auth to "
                                "serve without authentication)");
  if (opts.checkpoint_dir.empty())
    throw std::invalid_argument("http_server: checkpoint_dir is empty");
  if (opts.long_poll_hold.count() <= 0)
    throw std::invalid_argument("http_server: long_poll_hold must be > 0 ms");
  if (opts.http_threads == 0)
    throw std::invalid_argument("http_server: http_threads must be >= 1");
  if (opts.max_body_bytes == 0)
    throw std::invalid_argument("http_server: max_body_bytes must be >= 1");
  if (opts.port < 0 || opts.port > 65535)
    throw std::invalid_argument("http_server: port must be in 0..65535, got " +
                                std::to_string(opts.port));
  impl_ = std::make_unique<impl>(std::move(opts), backend, store);
  auto& s = *impl_;
  s.limits.max_body_bytes = s.opts.max_body_bytes;
  s.limits.vocab_size = backend.vocab_size();
  s.limits.max_context_length = backend.max_context_length();
  s.sched = std::make_unique<request_scheduler>(
      s.opts.scheduler,
      [&backend](const std::vector<tinker::forward_backward_request>& batch) {
        return backend.forward_backward(batch);
      },
      [&backend](const std::string& model_id, const std::vector<tinker::sample_request>& rs) {
        return backend.sample(model_id, rs);
      });

  auto& svr = s.svr;
  size_t threads = s.opts.http_threads;
  // cpp-httplib takes ownership of the queue it gets from this factory.
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(s.opts.max_body_bytes);
  svr.set_tcp_nodelay(true);
  // cpp-httplib's default also sets SO_REUSEPORT, which lets a second server bind a port in use
  // and silently share its connections: only SO_REUSEADDR (restart while TIME_WAIT lingers).
  svr.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.set_keep_alive_max_count(10000);
  svr.set_keep_alive_timeout(5);

  svr.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/api/v1/healthz" || req.path.rfind("/api/v1/checkpoint_archives/", 0) == 0 ||
        s.opts.insecure_no_auth)
      return httplib::Server::HandlerResponse::Unhandled;
    if (!req.has_header("X-API-Key")) {
      res.set_header("Connection", "close");
      reply_error(res, 401, "missing X-API-Key header");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!constant_time_equal(req.get_header_value("X-API-Key"), s.opts.api_key)) {
      res.set_header("Connection", "close");
      reply_error(res, 401, "invalid API key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  httplib::Server::HandlerWithResponse on_error = [&s](const httplib::Request& req,
                                                       httplib::Response& res) {
    if (!res.body.empty())
      return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413)
      reply_error(res, 413,
                  "request body larger than the limit of " + std::to_string(s.opts.max_body_bytes) +
                      " bytes");
    else if (res.status == 404)
      reply_error(res, 404, "no endpoint " + req.method + " " + req.path);
    else
      reply_error(res, res.status, "HTTP " + std::to_string(res.status));
    return httplib::Server::HandlerResponse::Handled;
  };
  svr.set_error_handler(std::move(on_error));

  using handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  auto guarded = [&s](handler fn) {
    return [&s, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const http_error& e) {
        reply_error(res, e.status, e.what());
      } catch (const tinker::request_error& e) {
        reply_error(res, status_for_category(e.category()), e.what());
      } catch (const store_error& e) {
        reply_error(res, status_for_store(e.code()), e.what());
      } catch (const tar_error& e) {
        reply_error(res, 500, e.what());
      } catch (const json::exception& e) {
        reply_error(res, 500, std::string("stored JSON is unreadable: ") + e.what());
      } catch (const std::exception& e) {
        s.log->error("event=handler_failed path={} error=\"{}\"", req.path, e.what());
        reply_error(res, 500, e.what());
      }
      if (res.status >= 400)
        s.log->info("event=request_refused method={} path={} status={}", req.method, req.path,
                    res.status);
    };
  };
  auto post = [&](const std::string& name, handler fn) {
    svr.Post(std::string(api) + name, guarded(std::move(fn)));
  };
  auto get = [&](const std::string& pattern, handler fn) {
    svr.Get(std::string(api) + pattern, guarded(std::move(fn)));
  };

  get("healthz", [](auto&, auto& res) { reply_json(res, json{{"status", "ok"}}); });
  post("client/config", [&s](auto& req, auto& res) { s.client_config(req, res); });
  post("client/dynamic_config", [](auto&, auto& res) {
    reply_json(res, json{{"refresh_interval_sec", 300}});
  });
  post("create_session", [&s](auto& req, auto& res) { s.create_session(req, res); });
  post("session_heartbeat", [&s](auto& req, auto& res) { s.session_heartbeat(req, res); });
  post("telemetry", [](auto&, auto& res) { reply_json(res, json{{"status", "accepted"}}); });
  get("get_server_capabilities", [&s](auto&, auto& res) { s.capabilities(res); });
  post("create_model", [&s](auto& req, auto& res) { s.create_model(req, res); });
  post("get_info", [&s](auto& req, auto& res) { s.get_info(req, res); });
  post("unload_model", [&s](auto& req, auto& res) { s.unload_model(req, res); });
  post("forward_backward",
       [&s](auto& req, auto& res) { s.forward_backward(req, res, "forward_backward"); });
  post("forward", [&s](auto& req, auto& res) { s.forward_backward(req, res, "forward"); });
  post("optim_step", [&s](auto& req, auto& res) { s.optim_step(req, res); });
  post("save_weights", [&s](auto& req, auto& res) { s.save_weights(req, res); });
  post("save_weights_for_sampler",
       [&s](auto& req, auto& res) { s.save_weights_for_sampler(req, res); });
  post("load_weights", [&s](auto& req, auto& res) { s.load_weights(req, res); });
  post("create_sampling_session",
       [&s](auto& req, auto& res) { s.create_sampling_session(req, res); });
  post("asample", [&s](auto& req, auto& res) { s.asample(req, res); });
  post("retrieve_future", [&s](auto& req, auto& res) { s.retrieve_future(req, res); });
  post("weights_info", [&s](auto& req, auto& res) { s.weights_info(req, res); });
  get("samplers/([^/]+)", [&s](auto& req, auto& res) { s.get_sampler(req.matches[1], res); });
  get("training_runs", [&s](auto& req, auto& res) { s.list_training_runs(req, res); });
  get("training_runs/([^/]+)", [&s](auto& req, auto& res) {
    reply_json(res, s.training_run_json(s.require_run(req.matches[1])));
  });
  get("training_runs/([^/]+)/checkpoints",
      [&s](auto& req, auto& res) { s.list_checkpoints(req.matches[1], res); });
  get("models/([^/]+)/checkpoints",
      [&s](auto& req, auto& res) { s.list_checkpoints(req.matches[1], res); });
  get("checkpoints", [&s](auto& req, auto& res) { s.list_user_checkpoints(req, res); });
  get("sessions", [&s](auto& req, auto& res) { s.list_sessions(req, res); });
  get("sessions/([^/]+)", [&s](auto& req, auto& res) { s.get_session(req, req.matches[1], res); });
  get("training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)/archive",
      [&s](auto& req, auto& res) { s.archive_url(req, req.matches[1], req.matches[2], res); });
  get("checkpoint_archives/([0-9a-f]+)",
      [&s](auto& req, auto& res) { s.download_archive(req.matches[1], res); });
  svr.Put(std::string(api) + "training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)/ttl",
          guarded([&s](auto& req, auto& res) {
            s.set_checkpoint_ttl(req, req.matches[1], req.matches[2], res);
          }));
  svr.Delete(std::string(api) + "training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)",
             guarded([&s](auto& req, auto& res) {
               s.delete_checkpoint(req.matches[1], req.matches[2], res);
             }));
}

http_server::~http_server() {
  stop();
}

int http_server::start() {
  auto& s = *impl_;
  if (s.started)
    throw std::runtime_error("http_server: start called twice");
  fs::create_directories(s.opts.checkpoint_dir);
  int port = s.opts.port;
  if (port == 0) {
    port = s.svr.bind_to_any_port(s.opts.host);
    if (port <= 0)
      throw std::runtime_error("http_server: cannot bind " + s.opts.host + " on an ephemeral port");
  } else if (!s.svr.bind_to_port(s.opts.host, port)) {
    throw std::runtime_error("http_server: cannot bind " + s.opts.host + ":" +
                             std::to_string(port) + " (in use, or not a local address?)");
  }
  s.bound_port = port;
  s.started = true;
  s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
  // cpp-httplib's stop() does nothing until the accept loop runs: wait for it, so that a stop()
  // right after start() cannot leave the loop running forever.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!s.svr.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      s.svr.stop();
      s.listener.join();
      throw std::runtime_error("http_server: the accept loop on " + s.opts.host + ":"
                               + std::to_string(port) + " did not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.log->info("event=listening host={} port={} auth={}", s.opts.host, port,
              s.opts.insecure_no_auth ? "off" : "api_key");
  return port;
}

int http_server::port() const {
  return impl_->bound_port;
}

void http_server::wait() {
  auto& s = *impl_;
  std::unique_lock<std::mutex> lock(s.poll_mutex);
  s.stopped_cv.wait(lock, [&] { return s.stopped; });
}

void http_server::stop() {
  auto& s = *impl_;
  {
    std::lock_guard<std::mutex> guard(s.poll_mutex);
    if (s.stopped)
      return;
    s.stopping = true;
  }
  s.poll_cv.notify_all();
  if (s.started) {
    s.svr.stop();
    if (s.listener.joinable())
      s.listener.join();
  }
  s.sched.reset();
  {
    std::lock_guard<std::mutex> guard(s.poll_mutex);
    s.stopped = true;
  }
  s.stopped_cv.notify_all();
}

} // namespace rlforge::service
