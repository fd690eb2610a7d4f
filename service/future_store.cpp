#include "service/future_store.hpp"
#include "service/future_store_sqlite.hpp"
#include "strings/format.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <utility>

#include <sqlite3.h>

#include <nlohmann/json.hpp>

namespace rlforge::service {

store_error::store_error(store_errc code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

const char* to_string(future_state x) noexcept {
  switch (x) {
  case future_state::pending:
    return "pending";
  case future_state::complete:
    return "complete";
  case future_state::failed:
    return "failed";
  }
  return "unknown";
}

const char* to_string(checkpoint_kind x) noexcept {
  switch (x) {
  case checkpoint_kind::weights:
    return "weights";
  case checkpoint_kind::sampler_weights:
    return "sampler_weights";
  }
  return "unknown";
}


using namespace store_detail;

namespace {

constexpr const char* schema_sql = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE futures (
  request_id TEXT PRIMARY KEY,
  request_type TEXT NOT NULL,
  model_id TEXT NOT NULL,
  seq_id INTEGER NOT NULL,
  idempotency_key TEXT,
  payload_hash TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'complete', 'failed')),
  result BLOB,
  result_content_type TEXT,
  error TEXT,
  category TEXT,
  created_ms INTEGER NOT NULL,
  completed_ms INTEGER);
CREATE UNIQUE INDEX futures_by_key ON futures(idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX futures_by_seq ON futures(model_id, seq_id) WHERE seq_id >= 0;
CREATE INDEX futures_by_state ON futures(state);
CREATE TABLE sessions (
  session_id TEXT PRIMARY KEY,
  created_ms INTEGER NOT NULL,
  last_heartbeat_ms INTEGER NOT NULL,
  tags TEXT NOT NULL,
  user_metadata TEXT NOT NULL);
CREATE TABLE models (
  model_id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  model_seq_id INTEGER NOT NULL,
  base_model TEXT NOT NULL,
  lora_config TEXT NOT NULL,
  role TEXT NOT NULL CHECK (role IN ('policy', 'critic')),
  user_metadata TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX models_by_session ON models(session_id);
CREATE TABLE sampling_sessions (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  sampling_session_seq_id INTEGER NOT NULL,
  model_id TEXT NOT NULL,
  base_model TEXT NOT NULL,
  model_path TEXT NOT NULL,
  weights_version INTEGER NOT NULL,
  weights_dir TEXT NOT NULL,
  created_ms INTEGER NOT NULL);
CREATE UNIQUE INDEX sampling_by_seq ON sampling_sessions(session_id, sampling_session_seq_id)
  WHERE session_id <> '' AND sampling_session_seq_id >= 0;
CREATE TABLE checkpoints (
  tinker_path TEXT PRIMARY KEY,
  model_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('weights', 'sampler_weights')),
  name TEXT NOT NULL,
  dir TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  expires_ms INTEGER);
CREATE INDEX checkpoints_by_model ON checkpoints(model_id);
)sql";

} // namespace

// ---- open / close ---------------------------------------------------------------------------

future_store::future_store(std::string path, std::unique_ptr<connection> db)
    : path_(std::move(path)), db_(std::move(db)) {}

future_store::~future_store() = default;

int64_t future_store::now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::unique_ptr<future_store> future_store::open(const std::string& path) {
  if (path.empty())
    throw_error(store_errc::invalid, "empty database path");
  sqlite3* raw = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    throw_error(store_errc::database,
                "cannot open " + in_quotes(path) + ": " + msg +
                    " (does the directory exist, and may this process write there?)");
  }
  auto conn = std::make_unique<connection>(raw);
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, 10000);

  auto refuse = [&](const std::string& why) {
    throw_error(store_errc::database, "cannot use " + in_quotes(path) + ": " + why);
  };
  // The first statement that reads the file is where SQLite notices a file that is not a
  // database; name the file and say so.
  std::string mode;
  {
    char* err = nullptr;
    rc = sqlite3_exec(
        raw, "PRAGMA journal_mode=WAL",
        [](void* out, int, char** values, char**) {
          *static_cast<std::string*>(out) = values[0] ? values[0] : "";
          return 0;
        },
        &mode, &err);
    if (rc != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(raw);
      sqlite3_free(err);
      if ((rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT)
        refuse("it is not an SQLite database, or it is corrupt (" + msg + ")");
      refuse(msg + " (may this process write the file and its directory?)");
    }
  }
  bool in_memory = path == ":memory:";
  if (mode != "wal" && !(in_memory && mode == "memory"))
    refuse("SQLite did not switch to WAL journal mode (got '" + mode + "')");
  conn->exec("PRAGMA synchronous=NORMAL", "set synchronous mode");

  auto store = std::unique_ptr<future_store>(new future_store(path, std::move(conn)));
  try {
    auto& c = *store->db_;
    transaction tx{c};
    bool has_version_table = false;
    int64_t other_tables = 0;
    {
      query q{c.prepare("SELECT name FROM sqlite_master WHERE type = 'table' "
                        "AND name NOT LIKE 'sqlite_%'"),
              "read schema"};
      while (q.step()) {
        if (q.text(0) == "schema_version")
          has_version_table = true;
        else
          ++other_tables;
      }
    }
    if (!has_version_table) {
      if (other_tables > 0)
        refuse("it is an SQLite database that this store did not create (it has tables but no "
               "schema_version table)");
      c.exec(schema_sql, "create schema");
      query q{c.prepare("INSERT INTO schema_version (version) VALUES (?)"), "write schema version"};
      q.bind(1, schema_version).run();
    } else {
      std::vector<int64_t> versions;
      query q{c.prepare("SELECT version FROM schema_version"), "read schema version"};
      while (q.step())
        versions.push_back(q.integer(0));
      if (versions.size() != 1)
        refuse("its schema_version table holds " + std::to_string(versions.size()) +
               " rows instead of one");
      if (versions[0] != schema_version)
        refuse("it has schema version " + std::to_string(versions[0]) + ", this build reads only " +
               std::to_string(schema_version) +
               (versions[0] > schema_version ? " (written by a newer rlforge?)" : ""));
    }
    {
      query q{c.prepare("UPDATE futures SET state = 'failed', error = ?, category = 'server', "
                        "completed_ms = ? WHERE state = 'pending'"),
              "fail pending futures"};
      q.bind(1, restart_failure_message).bind(2, now_ms()).run();
      store->failed_at_open_ = static_cast<size_t>(sqlite3_changes(c.db));
    }
    tx.commit();
  } catch (const store_error& e) {
    // A corrupt page shows up in whichever statement reads it first: name the file.
    std::string what = e.what();
    if (what.find(in_quotes(path)) != std::string::npos)
      throw;
    static const std::string prefix = "future_store: ";
    if (what.compare(0, prefix.size(), prefix) == 0)
      what.erase(0, prefix.size());
    refuse(what + " (is the file corrupt?)");
  }
  return store;
}

// ---- futures --------------------------------------------------------------------------------

submit_result future_store::submit(const std::string& request_type, const std::string& model_id,
                                   int64_t seq_id, const std::string& idempotency_key,
                                   const std::string& payload_hash) {
  if (request_type.empty())
    throw_error(store_errc::invalid, "submit: empty request type");
  if (payload_hash.empty())
    throw_error(store_errc::invalid, "submit: empty payload hash");
  if (seq_id < -1)
    throw_error(store_errc::invalid,
                "submit: seq_id " + std::to_string(seq_id) + " is negative (use -1 for none)");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  auto earlier = [&](const std::string& id, const std::string& hash, const std::string& what) {
    submit_result r;
    r.request_id = id;
    if (hash != payload_hash) {
      r.conflict = true;
      r.message = what + " was already used by request " + id + " with a different payload";
    }
    return r;
  };
  if (!idempotency_key.empty()) {
    query q{c.prepare("SELECT request_id, payload_hash FROM futures WHERE idempotency_key = ?"),
            "submit: look up idempotency key"};
    q.bind(1, idempotency_key);
    if (q.step())
      return earlier(q.text(0), q.text(1), "idempotency key " + in_quotes(idempotency_key));
  }
  if (seq_id >= 0) {
    query q{c.prepare("SELECT request_id, payload_hash FROM futures "
                      "WHERE model_id = ? AND seq_id = ?"),
            "submit: look up seq_id"};
    q.bind(1, model_id).bind(2, seq_id);
    if (q.step())
      return earlier(q.text(0), q.text(1),
                     "seq_id " + std::to_string(seq_id) + " of model " + in_quotes(model_id));
  }
  submit_result r;
  r.request_id = c.random_id("req-");
  r.created = true;
  {
    query q{c.prepare("INSERT INTO futures (request_id, request_type, model_id, seq_id, "
                      "idempotency_key, payload_hash, state, created_ms) "
                      "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)"),
            "submit: insert future"};
    q.bind(1, r.request_id)
        .bind(2, request_type)
        .bind(3, model_id)
        .bind(4, seq_id)
        .bind_optional(5, idempotency_key)
        .bind(6, payload_hash)
        .bind(7, now_ms())
        .run();
  }
  tx.commit();
  return r;
}

namespace {

/// Throws `not_found` / `conflict` unless `request_id` names a pending future.
void require_pending(future_store::connection& c, const std::string& request_id, const char* op) {
  query q{c.prepare("SELECT state FROM futures WHERE request_id = ?"), op};
  q.bind(1, request_id);
  if (!q.step())
    throw_error(store_errc::not_found,
                std::string(op) + ": no request with id " + in_quotes(request_id));
  auto state = q.text(0);
  if (state != "pending")
    throw_error(store_errc::conflict,
                std::string(op) + ": request " + in_quotes(request_id) + " is already " + state);
}

} // namespace

void future_store::complete(const std::string& request_id, const std::string& bytes,
                            const std::string& content_type) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  require_pending(c, request_id, "complete");
  query q{c.prepare("UPDATE futures SET state = 'complete', result = ?, result_content_type = ?, "
                    "completed_ms = ? WHERE request_id = ?"),
          "complete: update future"};
  q.bind_blob(1, bytes).bind(2, content_type).bind(3, now_ms()).bind(4, request_id).run();
  tx.commit();
}

void future_store::fail(const std::string& request_id, const std::string& message,
                        const std::string& category) {
  if (category != "user" && category != "server" && category != "unknown")
    throw_error(store_errc::invalid, "fail: category " + in_quotes(category) +
                                         " is not one of 'user', 'server', 'unknown'");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  transaction tx{c};
  require_pending(c, request_id, "fail");
  query q{c.prepare("UPDATE futures SET state = 'failed', error = ?, category = ?, "
                    "completed_ms = ? WHERE request_id = ?"),
          "fail: update future"};
  q.bind(1, message).bind(2, category).bind(3, now_ms()).bind(4, request_id).run();
  tx.commit();
}

std::optional<future_record> future_store::get(const std::string& request_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{
      db_->prepare(std::string("SELECT ") + future_columns + " FROM futures WHERE request_id = ?"),
      "get future"};
  q.bind(1, request_id);
  if (!q.step())
    return std::nullopt;
  return read_future(q);
}

size_t future_store::count_futures(future_state state) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare("SELECT count(*) FROM futures WHERE state = ?"), "count futures"};
  q.bind(1, to_string(state));
  q.step();
  return static_cast<size_t>(q.integer(0));
}

size_t future_store::purge_finished_futures(int64_t before_ms) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  query q{c.prepare("DELETE FROM futures WHERE state <> 'pending' AND completed_ms < ?"),
          "purge futures"};
  q.bind(1, before_ms).run();
  return static_cast<size_t>(sqlite3_changes(c.db));
}

// ---- sessions -------------------------------------------------------------------------------

std::string future_store::create_session(const std::string& tags_json,
                                         const std::string& user_metadata_json) {
  auto tags = checked_json(tags_json, true, "[]", "create_session: tags");
  auto meta = checked_json(user_metadata_json, false, "{}", "create_session: user_metadata");
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  auto id = c.random_id("sess-");
  auto now = now_ms();
  query q{c.prepare("INSERT INTO sessions (session_id, created_ms, last_heartbeat_ms, tags, "
                    "user_metadata) VALUES (?, ?, ?, ?, ?)"),
          "create_session"};
  q.bind(1, id).bind(2, now).bind(3, now).bind(4, tags).bind(5, meta).run();
  return id;
}

void future_store::heartbeat(const std::string& session_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = *db_;
  query q{c.prepare("UPDATE sessions SET last_heartbeat_ms = ? WHERE session_id = ?"), "heartbeat"};
  q.bind(1, now_ms()).bind(2, session_id).run();
  if (sqlite3_changes(c.db) == 0)
    throw_error(store_errc::not_found, "heartbeat: no session " + in_quotes(session_id));
}

std::optional<session_record> future_store::get_session(const std::string& session_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare("SELECT session_id, created_ms, last_heartbeat_ms, tags, user_metadata "
                       "FROM sessions WHERE session_id = ?"),
          "get session"};
  q.bind(1, session_id);
  if (!q.step())
    return std::nullopt;
  session_record s;
  s.session_id = q.text(0);
  s.created_ms = q.integer(1);
  s.last_heartbeat_ms = q.integer(2);
  s.tags_json = q.text(3);
  s.user_metadata_json = q.text(4);
  return s;
}

std::vector<session_record> future_store::list_sessions() {
  std::lock_guard<std::mutex> guard{mtx_};
  query q{db_->prepare("SELECT session_id, created_ms, last_heartbeat_ms, tags, user_metadata "
                       "FROM sessions ORDER BY created_ms, rowid"),
          "list sessions"};
  std::vector<session_record> out;
  while (q.step()) {
    session_record s;
    s.session_id = q.text(0);
    s.created_ms = q.integer(1);
    s.last_heartbeat_ms = q.integer(2);
    s.tags_json = q.text(3);
    s.user_metadata_json = q.text(4);
    out.push_back(std::move(s));
  }
  return out;
}

} // namespace rlforge::service
