// Checkpoints: save_weights, save_weights_for_sampler, load_weights, weights_info, and the REST
// listing, archive download, TTL and deletion of training runs' checkpoints.
#include <ctime>
#include <limits>

#include "service/http/server_state.hpp"
#include "service/tar_archive.hpp"
#include "service/wire/json_bodies.hpp"

namespace rlforge::service::http {

namespace {

void save_weights(server_state& s, const httplib::Request& req, httplib::Response& res) {
  seq_guard g(s, req);
  auto r = decode_save_weights(req.body);
  s.require_model(r.model_id);
  if (r.path.empty())
    r.path = "step-" + std::to_string(r.seq_id);
  auto tinker_path = "tinker://" + r.model_id + "/weights/" + r.path;
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record("save_weights", r.model_id, r.seq_id, req, "save_weights");
  g.armed = false;
  if (!created) {
    reply_json(res, s.submitted(id, r.model_id));
    return;
  }
  auto expires = s.expiry(r.has_ttl, r.ttl_seconds);
  s.schedule_or_fail(id, [&] {
    s.sched->submit_ordered(
        r.model_id, r.seq_id,
        [&s, r, tinker_path, expires] {
          // Checked in order, when the save runs: an earlier save may create the name.
          if (!r.overwrite && s.store.get_checkpoint(tinker_path))
            tinker::fail_user("checkpoint " + tinker_path +
                              " exists; save under another name or pass overwrite");
          auto dir = s.checkpoint_path(r.model_id, "weights", r.path);
          fs::remove_all(dir); // an overwrite must not mix old files with new ones
          fs::create_directories(dir);
          s.backend.save_checkpoint(r.model_id, {dir, tinker_path}, true);
          checkpoint_record c;
          c.tinker_path = tinker_path;
          c.model_id = r.model_id;
          c.kind = checkpoint_kind::weights;
          c.name = r.path;
          c.dir = dir;
          c.size_bytes = static_cast<int64_t>(tree_size(dir));
          c.expires_ms = expires;
          s.store.insert_checkpoint(c, r.overwrite);
          return json{{"path", tinker_path}, {"type", "save_weights"}}.dump();
        },
        s.finish_json(id));
  });
  reply_json(res, s.submitted(id, r.model_id));
}

void save_weights_for_sampler(server_state& s, const httplib::Request& req,
                              httplib::Response& res) {
  seq_guard g(s, req);
  auto r = decode_save_weights_for_sampler(req.body);
  s.require_model(r.model_id);
  auto model = s.store.get_model(r.model_id);
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] =
      s.record("save_weights_for_sampler", r.model_id, r.seq_id, req, "save_weights_for_sampler");
  g.armed = false;
  if (!created) {
    reply_json(res, s.submitted(id, r.model_id));
    return;
  }
  auto expires = s.expiry(r.has_ttl, r.ttl_seconds);
  std::string session_id = model ? model->session_id : "";
  std::string base_model = model ? model->base_model : s.backend.base_model_name();
  s.schedule_or_fail(id, [&] {
    s.sched->submit_ordered(
        r.model_id, r.seq_id,
        [&s, r, expires, session_id, base_model] {
          if (!r.path.empty()) {
            // A named sampler checkpoint: an export on disk, sampled from an engine loaded from
            // it, exactly these weights whatever the model does later.
            auto tinker_path = "tinker://" + r.model_id + "/sampler_weights/" + r.path;
            auto dir = s.checkpoint_path(r.model_id, "sampler_weights", r.path);
            fs::remove_all(dir);
            fs::create_directories(dir);
            s.backend.export_sampler_weights(r.model_id, {dir, tinker_path});
            checkpoint_record c;
            c.tinker_path = tinker_path;
            c.model_id = r.model_id;
            c.kind = checkpoint_kind::sampler_weights;
            c.name = r.path;
            c.dir = dir;
            c.size_bytes = static_cast<int64_t>(tree_size(dir));
            c.expires_ms = expires;
            s.store.insert_checkpoint(c, true);
            return json{{"path", tinker_path}, {"type", "save_weights_for_sampler"}}.dump();
          }
          // No name: a sampling session bound to a snapshot of the current weights.
          auto version = s.backend.save_sampler_snapshot(r.model_id);
          sampling_session_record x;
          x.session_id = session_id;
          x.sampling_session_seq_id =
              r.has_sampling_session_seq_id ? r.sampling_session_seq_id : -1;
          x.model_id = r.model_id;
          x.base_model = base_model;
          x.weights_version = version;
          auto sid = s.store.create_sampling_session(x);
          return json{{"sampling_session_id", sid}, {"type", "save_weights_for_sampler"}}.dump();
        },
        s.finish_json(id));
  });
  reply_json(res, s.submitted(id, r.model_id));
}

void load_weights(server_state& s, const httplib::Request& req, httplib::Response& res) {
  seq_guard g(s, req);
  auto r = decode_load_weights(req.body);
  if (r.create_via_load)
    throw http_error(http_status::bad_request, "load_weights with session_id/model_seq_id (create_model_via_load_"
                          "weights) is not enabled on this server; call create_model first");
  s.require_model(r.model_id);
  auto c = s.require_checkpoint(r.path);
  if (c.kind != checkpoint_kind::weights)
    throw http_error(http_status::bad_request, "checkpoint " + r.path +
                              " holds sampler weights; load_weights needs "
                              "a tinker://.../weights/... checkpoint");
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record("load_weights", r.model_id, r.seq_id, req, "load_weights");
  g.armed = false;
  if (created) {
    s.schedule_or_fail(id, [&] {
      s.sched->submit_ordered(
          r.model_id, r.seq_id,
          [&s, r, dir = c.dir] {
            s.backend.load_checkpoint(r.model_id, {dir, r.path}, r.optimizer);
            return json{{"path", r.path}, {"model_id", r.model_id}, {"type", "load_weights"}}
                .dump();
          },
          s.finish_json(id));
    });
  }
  reply_json(res, s.submitted(id, r.model_id));
}

void weights_info(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_weights_info(req.body);
  auto c = s.require_checkpoint(r.tinker_path);
  auto m = s.store.get_model(c.model_id);
  if (!m)
    throw http_error(http_status::not_found, "checkpoint " + r.tinker_path + " belongs to unknown model '" +
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

json training_run_json(server_state& s, const model_record& m) {
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
  auto cps = s.store.list_checkpoints(m.model_id);
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

model_record require_run(server_state& s, const std::string& id) {
  auto m = s.store.get_model(id);
  if (!m || m->deleted)
    throw http_error(http_status::not_found, "unknown training run '" + id + "'");
  return *m;
}

void list_training_runs(server_state& s, const httplib::Request& req, httplib::Response& res) {
  // One API key owns everything here: access scopes "owned" and "accessible" list the same
  // runs. There are no projects, so a project filter cannot be honoured: it is refused.
  if (req.has_param("project_id"))
    throw http_error(http_status::bad_request, "project_id: rlforge serve has no projects; list without it");
  auto limit = query_int(req, "limit", 20, 10000);
  auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
  auto models = s.store.list_models();
  json runs = json::array();
  for (size_t i = static_cast<size_t>(offset);
       i < models.size() && runs.size() < static_cast<size_t>(limit); ++i)
    runs.push_back(training_run_json(s, models[i]));
  reply_json(res, json{{"training_runs", runs},
                       {"cursor",
                        {{"offset", offset}, {"limit", limit}, {"total_count", models.size()}}}});
}

void list_checkpoints(server_state& s, const std::string& model_id, httplib::Response& res) {
  s.purge_expired();
  require_run(s, model_id);
  json cps = json::array();
  for (auto& c : s.store.list_checkpoints(model_id))
    cps.push_back(checkpoint_json(c));
  reply_json(res, json{{"checkpoints", cps}});
}

void list_user_checkpoints(server_state& s, const httplib::Request& req, httplib::Response& res) {
  s.purge_expired();
  auto limit = query_int(req, "limit", 100, 10000);
  auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
  auto all = s.store.list_checkpoints();
  json cps = json::array();
  for (size_t i = static_cast<size_t>(offset);
       i < all.size() && cps.size() < static_cast<size_t>(limit); ++i)
    cps.push_back(checkpoint_json(all[i]));
  reply_json(res,
             json{{"checkpoints", cps},
                  {"cursor", {{"offset", offset}, {"limit", limit}, {"total_count", all.size()}}}});
}

checkpoint_record require_run_checkpoint(server_state& s, const std::string& model_id,
                                         const std::string& checkpoint_id) {
  require_run(s, model_id);
  return s.require_checkpoint("tinker://" + model_id + "/" + checkpoint_id);
}

void delete_checkpoint(server_state& s, const std::string& model_id,
                       const std::string& checkpoint_id, httplib::Response& res) {
  auto c = require_run_checkpoint(s, model_id, checkpoint_id);
  std::error_code ec;
  fs::remove_all(c.dir, ec);
  if (ec) {
    s.log->error("event=delete_failed path={} dir={} error=\"{}\"", c.tinker_path, c.dir,
                 ec.message());
    throw http_error(http_status::internal_error, "cannot remove checkpoint " + c.tinker_path + ": " + ec.message());
  }
  s.store.delete_checkpoint(c.tinker_path);
  s.log->info("event=delete_checkpoint path={}", c.tinker_path);
  reply_json(res, json::object());
}

/// `PUT .../ttl` `{"ttl_seconds": int >= 1 | null}`: expires the checkpoint that many seconds
/// from now, or never (null).
void set_checkpoint_ttl(server_state& s, const httplib::Request& req, const std::string& model_id,
                        const std::string& checkpoint_id, httplib::Response& res) {
  auto body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("ttl_seconds"))
    throw http_error(http_status::bad_request, "set checkpoint ttl: the body must be a JSON object with "
                          "'ttl_seconds' (an integer >= 1, or null to never expire)");
  const auto& ttl = body.at("ttl_seconds");
  if (!ttl.is_null() &&
      (!ttl.is_number_integer() || ttl.get<int64_t>() < 1 || ttl.get<int64_t>() > int64_t{1} << 40))
    throw http_error(http_status::bad_request, "set checkpoint ttl: 'ttl_seconds' is " + ttl.dump() +
                              ", expected an integer >= 1 (seconds) or null");
  auto c = require_run_checkpoint(s, model_id, checkpoint_id);
  c.expires_ms = s.expiry(!ttl.is_null(), ttl.is_null() ? 0 : ttl.get<int64_t>());
  s.store.insert_checkpoint(c, true);
  s.log->info("event=set_checkpoint_ttl path={} ttl_seconds={}", c.tinker_path, ttl.dump());
  reply_json(res, json::object());
}

void archive_url(server_state& s, const httplib::Request& req, const std::string& model_id,
                 const std::string& checkpoint_id, httplib::Response& res) {
  auto c = require_run_checkpoint(s, model_id, checkpoint_id);
  auto token = random_token();
  auto ttl = s.opts.archive_url_ttl;
  {
    std::lock_guard<std::mutex> guard(s.archive_mutex);
    auto now = std::chrono::steady_clock::now();
    for (auto i = s.archives.begin(); i != s.archives.end();)
      i = i->second.second < now ? s.archives.erase(i) : std::next(i);
    s.archives[token] = {c.tinker_path, now + ttl};
  }
  auto host = req.get_header_value("Host");
  if (host.empty())
    host = s.opts.host + ":" + std::to_string(s.bound_port);
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

void download_archive(server_state& s, const std::string& token, httplib::Response& res) {
  std::string tinker_path;
  {
    std::lock_guard<std::mutex> guard(s.archive_mutex);
    auto i = s.archives.find(token);
    if (i == s.archives.end() || i->second.second < std::chrono::steady_clock::now())
      throw http_error(http_status::not_found, "unknown or expired archive link");
    tinker_path = i->second.first;
  }
  auto c = s.require_checkpoint(tinker_path);
  fs::path dir = c.dir;
  uint64_t size = tar_archive_size(dir);
  auto name = c.name;
  res.set_header("Content-Disposition", "attachment; filename=\"" + name + ".tar\"");
  // Streamed: the provider runs once and pushes the whole archive through the sink in 64 KiB
  // pieces; the archive never exists in memory.
  res.set_content_provider(static_cast<size_t>(size), "application/x-tar",
                           [dir, log = s.log](size_t offset, size_t, httplib::DataSink& sink) {
                             if (offset != 0)
                               return false;
                             try {
                               write_tar(dir, [&sink](const char* data, size_t n) {
                                 if (!sink.write(data, n))
                                   throw tar_error("client went away");
                               });
                             } catch (const std::exception& e) {
                               log->warn("event=archive_aborted dir={} error=\"{}\"", dir.string(),
                                         e.what());
                               return false;
                             }
                             return true;
                           });
}

} // namespace

void add_checkpoint_endpoints(server_state& s, routes& r) {
  r.post("save_weights", [&s](auto& req, auto& res) { save_weights(s, req, res); });
  r.post("save_weights_for_sampler",
         [&s](auto& req, auto& res) { save_weights_for_sampler(s, req, res); });
  r.post("load_weights", [&s](auto& req, auto& res) { load_weights(s, req, res); });
  r.post("weights_info", [&s](auto& req, auto& res) { weights_info(s, req, res); });
  r.get("training_runs", [&s](auto& req, auto& res) { list_training_runs(s, req, res); });
  r.get("training_runs/([^/]+)", [&s](auto& req, auto& res) {
    reply_json(res, training_run_json(s, require_run(s, req.matches[1])));
  });
  r.get("training_runs/([^/]+)/checkpoints",
        [&s](auto& req, auto& res) { list_checkpoints(s, req.matches[1], res); });
  r.get("models/([^/]+)/checkpoints",
        [&s](auto& req, auto& res) { list_checkpoints(s, req.matches[1], res); });
  r.get("checkpoints", [&s](auto& req, auto& res) { list_user_checkpoints(s, req, res); });
  r.get("training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)/archive",
        [&s](auto& req, auto& res) { archive_url(s, req, req.matches[1], req.matches[2], res); });
  r.get("checkpoint_archives/([0-9a-f]+)",
        [&s](auto& req, auto& res) { download_archive(s, req.matches[1], res); });
  r.put("training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)/ttl", [&s](auto& req, auto& res) {
    set_checkpoint_ttl(s, req, req.matches[1], req.matches[2], res);
  });
  r.del("training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)",
        [&s](auto& req, auto& res) { delete_checkpoint(s, req.matches[1], req.matches[2], res); });
}

} // namespace rlforge::service::http
