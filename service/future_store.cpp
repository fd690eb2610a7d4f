#include "service/future_store.hpp"
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

namespace {

[[noreturn]] void throw_error(store_errc code, const std::string& message) {
  throw store_error(code, "future_store: " + message);
}

/// Owns one prepared statement; the cache below keeps them for the connection's lifetime.
class statement {
public:
  statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v3(db, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) !=
        SQLITE_OK) {
      std::string msg = sqlite3_errmsg(db);
      sqlite3_finalize(stmt_);
      throw_error(store_errc::database, "cannot prepare '" + sql + "': " + msg);
    }
  }
  ~statement() { sqlite3_finalize(stmt_); }
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;

  sqlite3_stmt* get() const noexcept { return stmt_; }
  sqlite3* db() const noexcept { return db_; }

private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

/// One use of a cached statement: binds parameters, steps, reads columns, and resets the
/// statement (dropping its bindings) when it goes out of scope.
class query {
public:
  query(statement& s, const char* what) : s_(s), what_(what) {}
  ~query() {
    sqlite3_reset(s_.get());
    sqlite3_clear_bindings(s_.get());
  }
  query(const query&) = delete;
  query& operator=(const query&) = delete;

  query& bind(int i, const std::string& text) {
    check(sqlite3_bind_text(s_.get(), i, text.data(), static_cast<int>(text.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  query& bind(int i, const char* text) {
    check(sqlite3_bind_text(s_.get(), i, text, -1, SQLITE_TRANSIENT));
    return *this;
  }
  query& bind(int i, int64_t value) {
    check(sqlite3_bind_int64(s_.get(), i, value));
    return *this;
  }
  query& bind_blob(int i, const std::string& bytes) {
    // A zero-length blob must still be a blob, not NULL: pass a non-null pointer.
    static const char empty = 0;
    check(sqlite3_bind_blob64(s_.get(), i, bytes.empty() ? &empty : bytes.data(), bytes.size(),
                              SQLITE_TRANSIENT));
    return *this;
  }
  query& bind_null(int i) {
    check(sqlite3_bind_null(s_.get(), i));
    return *this;
  }
  /// Text or NULL (for an empty string).
  query& bind_optional(int i, const std::string& text) {
    return text.empty() ? bind_null(i) : bind(i, text);
  }

  /// Steps once: true when a row is available, false when done.
  bool step() {
    int rc = sqlite3_step(s_.get());
    if (rc == SQLITE_ROW)
      return true;
    if (rc == SQLITE_DONE)
      return false;
    fail(rc);
  }

  /// Steps a statement that returns no rows.
  void run() {
    while (step()) {
      // Statements run through `run` return no rows; drain them anyway.
    }
  }

  std::string text(int col) const {
    auto p = reinterpret_cast<const char*>(sqlite3_column_text(s_.get(), col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  std::string blob(int col) const {
    auto p = static_cast<const char*>(sqlite3_column_blob(s_.get(), col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(s_.get(), col); }
  bool is_null(int col) const { return sqlite3_column_type(s_.get(), col) == SQLITE_NULL; }

private:
  void check(int rc) {
    if (rc != SQLITE_OK)
      fail(rc);
  }
  [[noreturn]] void fail(int rc) {
    throw_error(store_errc::database, std::string(what_) + ": " + sqlite3_errmsg(s_.db()) + " (" +
                                          sqlite3_errstr(rc) + ")");
  }

  statement& s_;
  const char* what_;
};

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

future_state parse_state(const std::string& s) {
  if (s == "pending")
    return future_state::pending;
  if (s == "complete")
    return future_state::complete;
  if (s == "failed")
    return future_state::failed;
  throw_error(store_errc::database, "corrupt futures row: unknown state '" + s + "'");
}

checkpoint_kind parse_kind(const std::string& s) {
  if (s == "weights")
    return checkpoint_kind::weights;
  if (s == "sampler_weights")
    return checkpoint_kind::sampler_weights;
  throw_error(store_errc::database, "corrupt checkpoints row: unknown kind '" + s + "'");
}

/// `text` when it parses as JSON of the wanted shape (an empty string stands for `fallback`).
std::string checked_json(const std::string& text, bool want_array, const char* fallback,
                         const char* what) {
  if (text.empty())
    return fallback;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded())
    throw_error(store_errc::invalid, std::string(what) + " is not valid JSON: '" + text + "'");
  if (want_array ? !j.is_array() : !j.is_object())
    throw_error(store_errc::invalid, std::string(what) + " must be a JSON " +
                                         (want_array ? "array" : "object") + ", got '" + text +
                                         "'");
  return text;
}

} // namespace

/// The SQLite connection, its cached statements and the id generator; guarded by
/// `future_store::mtx_`.
struct future_store::connection {
  sqlite3* db = nullptr;
  std::map<std::string, std::unique_ptr<statement>> statements;
  std::mt19937_64 rng;

  explicit connection(sqlite3* handle) : db(handle) {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    rng.seed(seq);
  }
  ~connection() {
    statements.clear(); // finalize every statement before closing
    sqlite3_close(db);
  }

  statement& prepare(const std::string& sql) {
    auto& slot = statements[sql];
    if (!slot)
      slot = std::make_unique<statement>(db, sql);
    return *slot;
  }

  /// Runs statements without parameters or results (schema, pragmas, BEGIN/COMMIT).
  void exec(const std::string& sql, const std::string& what) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(db);
      sqlite3_free(err);
      throw_error(store_errc::database, what + ": " + msg);
    }
  }

  /// `prefix` + 32 random hex digits (128 bits).
  std::string random_id(const char* prefix) {
    std::array<char, 33> hex{};
    std::snprintf(hex.data(), hex.size(), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(rng()));
    return std::string(prefix) + hex.data();
  }
};

namespace {

/// BEGIN IMMEDIATE on construction, ROLLBACK on destruction unless `commit` ran.
class transaction {
public:
  explicit transaction(future_store::connection& c) : c_(c) {
    c_.exec("BEGIN IMMEDIATE", "begin transaction");
  }
  ~transaction() {
    if (!done_)
      sqlite3_exec(c_.db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  transaction(const transaction&) = delete;
  transaction& operator=(const transaction&) = delete;

  void commit() {
    c_.exec("COMMIT", "commit transaction");
    done_ = true;
  }

private:
  future_store::connection& c_;
  bool done_ = false;
};

future_record read_future(query& q) {
  future_record r;
  r.request_id = q.text(0);
  r.request_type = q.text(1);
  r.model_id = q.text(2);
  r.seq_id = q.integer(3);
  r.idempotency_key = q.text(4);
  r.payload_hash = q.text(5);
  r.state = parse_state(q.text(6));
  r.result = q.blob(7);
  r.result_content_type = q.text(8);
  r.error = q.text(9);
  r.category = q.text(10);
  r.created_ms = q.integer(11);
  r.completed_ms = q.integer(12);
  return r;
}

constexpr const char* future_columns =
    "request_id, request_type, model_id, seq_id, idempotency_key, payload_hash, state, result, "
    "result_content_type, error, category, created_ms, completed_ms";

model_record read_model(query& q) {
  model_record m;
  m.model_id = q.text(0);
  m.session_id = q.text(1);
  m.model_seq_id = q.integer(2);
  m.base_model = q.text(3);
  m.lora_config_json = q.text(4);
  m.role = q.text(5);
  m.user_metadata_json = q.text(6);
  m.created_ms = q.integer(7);
  m.deleted = q.integer(8) != 0;
  return m;
}

constexpr const char* model_columns =
    "model_id, session_id, model_seq_id, base_model, lora_config, role, user_metadata, "
    "created_ms, deleted";

checkpoint_record read_checkpoint(query& q) {
  checkpoint_record c;
  c.tinker_path = q.text(0);
  c.model_id = q.text(1);
  c.kind = parse_kind(q.text(2));
  c.name = q.text(3);
  c.dir = q.text(4);
  c.size_bytes = q.integer(5);
  c.created_ms = q.integer(6);
  if (!q.is_null(7))
    c.expires_ms = q.integer(7);
  return c;
}

constexpr const char* checkpoint_columns =
    "tinker_path, model_id, kind, name, dir, size_bytes, created_ms, expires_ms";

using strings::in_quotes;

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
