// `future_store`'s models, sampling sessions and checkpoints (future_store.hpp); the SQLite
// plumbing is future_store_sqlite.hpp.
#include "service/future_store.hpp"
#include "service/future_store_sqlite.hpp"

#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlforge::service {

using namespace store_detail;

// ---- models ---------------------------------------------------------------------------------

std::string future_store::model_id_for(const std::string& session_id, int64_t model_seq_id) {
  return session_id + ":train:" + std::to_string(model_seq_id);
}

namespace {

bool session_exists(future_store::connection& c, const std::string& session_id) {
  query q{c.prepare("SELECT 1 FROM sessions WHERE session_id = ?"), "look up session"};
  q.bind(1, session_id);
  return q.step();
}

bool model_exists(future_store::connection& c, const std::string& model_id) {
  query q{c.prepare("SELECT 1 FROM models WHERE model_id = ?"), "look up model"};
  q.bind(1, model_id);
  return q.step();
}

} // namespace

std::string future_store::next_model_id(const std::string& session_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  if (!session_exists(c, session_id))
    throw_error(store_errc::not_found, "next_model_id: no session " + in_quotes(session_id));
  query q{c.prepare("SELECT max(model_seq_id) FROM models WHERE session_id = ?"), "next_model_id"};
  q.bind(1, session_id);
  q.step();
  int64_t next = q.is_null(0) ? 0 : q.integer(0) + 1;
  return model_id_for(session_id, next);
}

void future_store::insert_model(const model_record& model) {
  if (model.model_id.empty())
    throw_error(store_errc::invalid, "insert_model: empty model id");
  if (model.base_model.empty())
    throw_error(store_errc::invalid,
                "insert_model: empty base model for model " + in_quotes(model.model_id));
  if (model.role != "policy" && model.role != "critic")
    throw_error(store_errc::invalid, "insert_model: role " + in_quotes(model.role) + " of model " +
                                         in_quotes(model.model_id) +
                                         " is neither 'policy' nor 'critic'");
  if (model.model_seq_id < -1)
    throw_error(store_errc::invalid, "insert_model: model_seq_id " +
                                         std::to_string(model.model_seq_id) + " is negative");
  auto lora = checked_json(model.lora_config_json, false, "{}", "insert_model: lora_config");
  auto meta = checked_json(model.user_metadata_json, false, "{}", "insert_model: user_metadata");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  if (!model.session_id.empty() && !session_exists(c, model.session_id))
    throw_error(store_errc::not_found, "insert_model: no session " + in_quotes(model.session_id) +
                                           " for model " + in_quotes(model.model_id));
  if (model_exists(c, model.model_id))
    throw_error(store_errc::conflict,
                "insert_model: model id " + in_quotes(model.model_id) + " is already taken");
  query q{c.prepare(std::string("INSERT INTO models (") + model_columns +
                    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)"),
          "insert_model"};
  q.bind(1, model.model_id)
      .bind(2, model.session_id)
      .bind(3, model.model_seq_id)
      .bind(4, model.base_model)
      .bind(5, lora)
      .bind(6, model.role)
      .bind(7, meta)
      .bind(8, now_ms())
      .run();
  tx.commit();
}

std::optional<model_record> future_store::get_model(const std::string& model_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + model_columns + " FROM models WHERE model_id = ?"),
          "get model"};
  q.bind(1, model_id);
  if (!q.step())
    return std::nullopt;
  return read_model(q);
}

std::vector<model_record> future_store::list_models(const std::string& session_id,
                                                    bool include_deleted) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + model_columns +
                       " FROM models WHERE (?1 = '' OR session_id = ?1) "
                       "AND (?2 <> 0 OR deleted = 0) ORDER BY created_ms, rowid"),
          "list models"};
  q.bind(1, session_id).bind(2, static_cast<int64_t>(include_deleted));
  std::vector<model_record> out;
  while (q.step())
    out.push_back(read_model(q));
  return out;
}

void future_store::mark_model_deleted(const std::string& model_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  {
    query q{c.prepare("SELECT deleted FROM models WHERE model_id = ?"), "mark_model_deleted"};
    q.bind(1, model_id);
    if (!q.step())
      throw_error(store_errc::not_found, "mark_model_deleted: no model " + in_quotes(model_id));
    if (q.integer(0) != 0)
      throw_error(store_errc::conflict,
                  "mark_model_deleted: model " + in_quotes(model_id) + " is already deleted");
  }
  query q{c.prepare("UPDATE models SET deleted = 1 WHERE model_id = ?"), "mark_model_deleted"};
  q.bind(1, model_id).run();
  tx.commit();
}

// ---- sampling sessions ----------------------------------------------------------------------

namespace {

sampling_session_record read_sampling(query& q) {
  sampling_session_record s;
  s.id = q.text(0);
  s.session_id = q.text(1);
  s.sampling_session_seq_id = q.integer(2);
  s.model_id = q.text(3);
  s.base_model = q.text(4);
  s.model_path = q.text(5);
  s.weights_version = q.integer(6);
  s.weights_dir = q.text(7);
  s.created_ms = q.integer(8);
  return s;
}

constexpr const char* sampling_columns =
    "id, session_id, sampling_session_seq_id, model_id, base_model, model_path, weights_version, "
    "weights_dir, created_ms";

} // namespace

std::string future_store::create_sampling_session(const sampling_session_record& s) {
  if (s.model_id.empty() && s.base_model.empty())
    throw_error(store_errc::invalid,
                "create_sampling_session: neither a model id nor a base model was given");
  if (s.weights_version < 0)
    throw_error(store_errc::invalid, "create_sampling_session: weights version " +
                                         std::to_string(s.weights_version) + " is negative");
  if (s.sampling_session_seq_id < -1)
    throw_error(store_errc::invalid, "create_sampling_session: sampling_session_seq_id " +
                                         std::to_string(s.sampling_session_seq_id) +
                                         " is negative");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  if (!s.session_id.empty()) {
    if (!session_exists(c, s.session_id))
      throw_error(store_errc::not_found,
                  "create_sampling_session: no session " + in_quotes(s.session_id));
    if (s.sampling_session_seq_id >= 0) {
      query q{c.prepare("SELECT id FROM sampling_sessions WHERE session_id = ? "
                        "AND sampling_session_seq_id = ?"),
              "create_sampling_session: look up retry"};
      q.bind(1, s.session_id).bind(2, s.sampling_session_seq_id);
      if (q.step())
        return q.text(0);
    }
  }
  if (!s.model_id.empty() && !model_exists(c, s.model_id))
    throw_error(store_errc::not_found,
                "create_sampling_session: no model " + in_quotes(s.model_id));
  auto id = c.random_id("samp-");
  query q{c.prepare(std::string("INSERT INTO sampling_sessions (") + sampling_columns +
                    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
          "create_sampling_session"};
  q.bind(1, id)
      .bind(2, s.session_id)
      .bind(3, s.sampling_session_seq_id)
      .bind(4, s.model_id)
      .bind(5, s.base_model)
      .bind(6, s.model_path)
      .bind(7, s.weights_version)
      .bind(8, s.weights_dir)
      .bind(9, now_ms())
      .run();
  tx.commit();
  return id;
}

std::optional<sampling_session_record> future_store::get_sampling_session(const std::string& id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + sampling_columns +
                       " FROM sampling_sessions WHERE id = ?"),
          "get sampling session"};
  q.bind(1, id);
  if (!q.step())
    return std::nullopt;
  return read_sampling(q);
}

std::vector<sampling_session_record>
future_store::list_sampling_sessions(const std::string& session_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + sampling_columns +
                       " FROM sampling_sessions WHERE session_id = ? ORDER BY created_ms, rowid"),
          "list sampling sessions"};
  q.bind(1, session_id);
  std::vector<sampling_session_record> out;
  while (q.step())
    out.push_back(read_sampling(q));
  return out;
}

void future_store::update_sampling_weights(const std::string& id, int64_t weights_version,
                                           const std::string& weights_dir) {
  if (weights_version < 0)
    throw_error(store_errc::invalid, "update_sampling_weights: weights version " +
                                         std::to_string(weights_version) + " is negative");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  query q{c.prepare("UPDATE sampling_sessions SET weights_version = ?, weights_dir = ? "
                    "WHERE id = ?"),
          "update_sampling_weights"};
  q.bind(1, weights_version).bind(2, weights_dir).bind(3, id).run();
  if (sqlite3_changes(c.db) == 0)
    throw_error(store_errc::not_found,
                "update_sampling_weights: no sampling session " + in_quotes(id));
}

// ---- checkpoints ----------------------------------------------------------------------------

void future_store::insert_checkpoint(const checkpoint_record& c_in, bool overwrite) {
  checkpoint_record c = c_in;
  static const std::string scheme = "tinker://";
  if (c.tinker_path.compare(0, scheme.size(), scheme) != 0 || c.tinker_path.size() == scheme.size())
    throw_error(store_errc::invalid, "insert_checkpoint: path " + in_quotes(c.tinker_path) +
                                         " does not start with 'tinker://'");
  if (c.model_id.empty())
    throw_error(store_errc::invalid,
                "insert_checkpoint: empty model id for " + in_quotes(c.tinker_path));
  if (c.dir.empty())
    throw_error(store_errc::invalid,
                "insert_checkpoint: empty directory for " + in_quotes(c.tinker_path));
  if (c.size_bytes < 0)
    throw_error(store_errc::invalid, "insert_checkpoint: negative size " +
                                         std::to_string(c.size_bytes) + " for " +
                                         in_quotes(c.tinker_path));
  if (c.created_ms == 0)
    c.created_ms = now_ms();
  if (c.expires_ms && *c.expires_ms < c.created_ms)
    throw_error(store_errc::invalid, "insert_checkpoint: " + in_quotes(c.tinker_path) +
                                         " expires (" + std::to_string(*c.expires_ms) +
                                         " ms) before it was created (" +
                                         std::to_string(c.created_ms) + " ms)");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& db = *db_;
  transaction tx{db};
  {
    query q{db.prepare("SELECT 1 FROM checkpoints WHERE tinker_path = ?"), "insert_checkpoint"};
    q.bind(1, c.tinker_path);
    if (q.step() && !overwrite)
      throw_error(store_errc::conflict, "insert_checkpoint: a checkpoint " +
                                            in_quotes(c.tinker_path) + " already exists");
  }
  query q{db.prepare(std::string("INSERT OR REPLACE INTO checkpoints (") + checkpoint_columns +
                     ") VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
          "insert_checkpoint"};
  q.bind(1, c.tinker_path)
      .bind(2, c.model_id)
      .bind(3, to_string(c.kind))
      .bind(4, c.name)
      .bind(5, c.dir)
      .bind(6, c.size_bytes)
      .bind(7, c.created_ms);
  if (c.expires_ms)
    q.bind(8, *c.expires_ms);
  else
    q.bind_null(8);
  q.run();
  tx.commit();
}

std::optional<checkpoint_record> future_store::get_checkpoint(const std::string& tinker_path) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + checkpoint_columns +
                       " FROM checkpoints WHERE tinker_path = ?"),
          "get checkpoint"};
  q.bind(1, tinker_path);
  if (!q.step())
    return std::nullopt;
  return read_checkpoint(q);
}

std::vector<checkpoint_record> future_store::list_checkpoints(const std::string& model_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + checkpoint_columns +
                       " FROM checkpoints WHERE (?1 = '' OR model_id = ?1) "
                       "ORDER BY created_ms, rowid"),
          "list checkpoints"};
  q.bind(1, model_id);
  std::vector<checkpoint_record> out;
  while (q.step())
    out.push_back(read_checkpoint(q));
  return out;
}

std::vector<checkpoint_record> future_store::list_expired_checkpoints(int64_t now) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare(std::string("SELECT ") + checkpoint_columns +
                       " FROM checkpoints WHERE expires_ms IS NOT NULL AND expires_ms <= ? "
                       "ORDER BY created_ms, rowid"),
          "list expired checkpoints"};
  q.bind(1, now);
  std::vector<checkpoint_record> out;
  while (q.step())
    out.push_back(read_checkpoint(q));
  return out;
}

checkpoint_record future_store::delete_checkpoint(const std::string& tinker_path) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  checkpoint_record rec;
  {
    query q{c.prepare(std::string("SELECT ") + checkpoint_columns +
                      " FROM checkpoints WHERE tinker_path = ?"),
            "delete_checkpoint"};
    q.bind(1, tinker_path);
    if (!q.step())
      throw_error(store_errc::not_found,
                  "delete_checkpoint: no checkpoint " + in_quotes(tinker_path));
    rec = read_checkpoint(q);
  }
  query q{c.prepare("DELETE FROM checkpoints WHERE tinker_path = ?"), "delete_checkpoint"};
  q.bind(1, tinker_path).run();
  tx.commit();
  return rec;
}

} // namespace rlforge::service
